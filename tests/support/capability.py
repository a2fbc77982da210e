"""What this machine can do for the tests, and the one place where a test may skip for it.

Every test that needs something from its environment (root, a mount, a command such as
``promtool``, an optional framework, IPv6) asks here. Each check answers why not, or None, and
:func:`require` turns a reason into a skip on a developer's machine, or into a failure where
the environment is part of what is tested (``FSPROBE_REQUIRE_MOUNT_TESTS=1``, as in CI): there
a missing ``shellcheck`` must not turn a run green by leaving out what it would have checked.
tests/harness/test_skips_are_central.py makes sure no test skips any other way.

The mount checks try the real thing once per session (a probe mount), because the reasons a
mount fails in a container are many and only the attempt knows them all.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import importlib
import importlib.util
import os
import resource
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from .faultmount import FaultFS
from .tmpfs import Tmpfs

REQUIRE_ENV = "FSPROBE_REQUIRE_MOUNT_TESTS"


def require(problem: str | None) -> None:
    """Skip the running test (or module) because of `problem`, or fail it where the
    environment is required. Nothing happens when `problem` is None."""
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{problem} ({REQUIRE_ENV}=1: this test must run here)", pytrace=False)
    pytest.skip(f"{problem} (set {REQUIRE_ENV}=1 to make this a failure)", allow_module_level=True)


# -- privileges ------------------------------------------------------------------------------


def root_problem(what: str) -> str | None:
    return None if os.geteuid() == 0 else f"{what} needs root"


def need_root(what: str) -> None:
    """For what only root can set up (another user's file, a bind mount)."""
    require(root_problem(what))


# -- commands and modules --------------------------------------------------------------------


def command_problem(name: str, package: str) -> str | None:
    if shutil.which(name) is None:
        return f"{name} not found on PATH (apt-get install {package})"
    return None


def need_command(name: str, package: str) -> str:
    """The path of command `name`; `package` is the Debian package that installs it."""
    require(command_problem(name, package))
    return shutil.which(name) or name


def need_module(name: str) -> ModuleType:
    """Import an optional module (a framework the integration tests drive), like
    ``pytest.importorskip`` but under the same rule as everything else."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        require(f"cannot import {name} ({error}; pip install -e '.[test]')")
        raise  # not reached: require skipped or failed


# -- resources -------------------------------------------------------------------------------


@contextlib.contextmanager
def open_files(count: int) -> Iterator[None]:
    """Let this process (and the children it starts meanwhile) open `count` files.

    The soft limit is raised up to the hard one, as any user may; an ordinary login often gets
    1024, root here 20000, and a test that opens 1500 sockets must not depend on which.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        if hard != resource.RLIM_INFINITY and hard < count:
            require(f"{count} open files needed, the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- network ---------------------------------------------------------------------------------


@functools.cache
def ipv6_problem() -> str | None:
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        return f"cannot bind the IPv6 loopback ::1: {error}"
    return None


# -- mounts ----------------------------------------------------------------------------------


@functools.cache
def tmpfs_problem() -> str | None:
    if os.geteuid() != 0:
        return "mounting tmpfs needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount not found on PATH"
    try:
        with Tmpfs(size="64k"):
            pass
    except (RuntimeError, OSError) as exc:
        return f"a probe tmpfs mount failed: {exc}"
    return None


@functools.cache
def fuse_problem() -> str | None:
    if os.geteuid() != 0:
        return "the FUSE fault filesystem needs root (allow_other, chown to test users)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (load the fuse module, or pass --device /dev/fuse to the container)"
    if shutil.which("fusermount3") is None:
        return "fusermount3 not found on PATH (apt-get install fuse3)"
    if ctypes.util.find_library("fuse3") is None:
        return "libfuse3 not found (apt-get install libfuse3-3)"
    if importlib.util.find_spec("mfusepy") is None:
        return "mfusepy is not installed (pip install -e '.[test]')"
    with tempfile.TemporaryDirectory(prefix="faultfs-probe-") as scratch:
        backing, mountpoint = Path(scratch, "backing"), Path(scratch, "mnt")
        backing.mkdir()
        mountpoint.mkdir()
        try:
            with FaultFS(backing, mountpoint) as fs:
                (fs.mountpoint / "probe").write_bytes(b"probe")
                seen = (backing / "probe").read_bytes()
        except (RuntimeError, OSError) as exc:
            return f"a probe FUSE mount failed: {exc}"
    if seen != b"probe":
        return "a probe FUSE mount did not pass data through"
    return None
