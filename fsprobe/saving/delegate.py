"""Root acting for a user: run ``fsprobe`` as that user, never act on their files as root.

A user's fallback area holds what only that user wrote: their manifest says where their copies
go. Root acting on it with root's own rights would let the user aim root at anything (issue: a
manifest line pointing through a symlink at ``/etc/shadow``). So root never does: it starts
``fsprobe`` as the user, with the user's uid, primary gid and groups, and the kernel applies
the user's permissions to everything that run does. Root only reads the run's report.

The run is started like ``su`` should be and ``sudo`` is: no shell, the interpreter isolated
(``-I``: no current directory, no ``PYTHON*`` variables, no user site-packages), ``/`` as its
directory, a new session without a terminal (no ``TIOCSTI`` into root's), only the environment
fsprobe needs, a deadline after which it is killed, and a cap on what root reads from it: the
user can trace and steer their own process, so its output is data to check, never to act on.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fsprobe.lustre import children

#: More than any report of a real run; a run that says more is killed and disbelieved.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
#: The environment a run as a user gets from root's: where tools are, the language, fsprobe's.
_PASSED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_NOT_PASSED = ("FSPROBE_STATE_DIR", "FSPROBE_FALLBACK_DIRS")
#: How long a killed run is waited for (one stuck in the kernel cannot die yet).
_REAP_SECONDS = 5.0


class DelegationFailed(Exception):
    """The run as the user could not be made, did not finish in time, or said nonsense."""


def _environment(environ: Mapping[str, str]) -> dict[str, str]:
    kept = {
        name: value
        for name, value in environ.items()
        if name in _PASSED or (name.startswith("FSPROBE_") and name not in _NOT_PASSED)
    }
    kept.setdefault("PATH", os.defpath)
    return kept


def _read_until(fd: int, deadline: float, cap: int) -> tuple[bytes, bool]:
    """(what `fd` gave until EOF, the deadline or more than `cap` bytes; whether it overran)."""
    output = bytearray()
    while len(output) <= cap:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(output), True
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        output += chunk
    return bytes(output), False


def _start(uid: int, gid: int, groups: list[int], arguments: Sequence[str]) -> subprocess.Popen:
    # Started as a known child: the probe worker, where the daemon's sync task runs, kills
    # every child it did not start itself whenever an `lfs` run ends (what lfs left behind).
    return children.start(
        [sys.executable, "-I", "-m", "fsprobe", *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env=_environment(os.environ),
        user=uid,
        group=gid,
        extra_groups=groups,
        umask=0o022,
        start_new_session=True,
        close_fds=True,
    )


def run_as(uid: int, arguments: Sequence[str], timeout: float) -> dict[str, Any]:
    """``fsprobe ARGUMENTS`` as user `uid`; the JSON object it prints on stdout.

    Raises `DelegationFailed` if `uid` has no account (its groups cannot be known), the run
    overran `timeout` (it is killed, with whatever it started in its session), printed more
    than `MAX_OUTPUT_BYTES`, or printed something that is not one JSON object.
    """
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        raise DelegationFailed(f"uid {uid} has no account here; not acting for it") from None
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    try:
        process = _start(uid, account.pw_gid, groups, arguments)
    except OSError as error:
        raise DelegationFailed(f"cannot start fsprobe as uid {uid}: {error}") from None
    assert process.stdout is not None
    with process.stdout:
        output, overran = _read_until(
            process.stdout.fileno(), time.monotonic() + timeout, MAX_OUTPUT_BYTES
        )
    if overran or len(output) > MAX_OUTPUT_BYTES:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own session's group, nobody else's
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(_REAP_SECONDS)  # a run stuck in the kernel is left to the reaper
    children.finish(process)
    if overran:
        raise DelegationFailed(f"fsprobe as uid {uid} did not finish within {timeout:g} s")
    if len(output) > MAX_OUTPUT_BYTES:
        raise DelegationFailed(f"fsprobe as uid {uid} printed more than {MAX_OUTPUT_BYTES} bytes")
    try:
        document = json.loads(output)
    except ValueError as error:
        raise DelegationFailed(f"fsprobe as uid {uid} did not print JSON: {error}") from None
    if not isinstance(document, dict):
        raise DelegationFailed(f"fsprobe as uid {uid} printed JSON that is not an object")
    return document
