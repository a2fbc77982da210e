"""Can this machine mount what the tests need? Each check answers why not, or None.

The checks try the real thing once per session (a probe mount), because the reasons a mount
fails in a container are many and only the attempt knows them all. :func:`require` turns a
reason into a skip, or into a failure where mount tests are mandatory
(``FSPROBE_REQUIRE_MOUNT_TESTS=1``, as in CI).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from .faultmount import FaultFS
from .tmpfs import Tmpfs

REQUIRE_ENV = "FSPROBE_REQUIRE_MOUNT_TESTS"


def require(problem: str | None) -> None:
    """Skip the running test because of `problem`, or fail it if mount tests are required."""
    if problem is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{problem} ({REQUIRE_ENV}=1: mount tests must run here)", pytrace=False)
    pytest.skip(f"{problem} (set {REQUIRE_ENV}=1 to make this a failure)")


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
    try:
        import mfusepy  # noqa: F401  (loads libfuse3)
    except (ImportError, OSError) as exc:
        return f"mfusepy or libfuse3 cannot be loaded: {exc}"
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
