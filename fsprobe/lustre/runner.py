"""Running `lfs`: an argv list (never a shell), a deadline, and the whole process group killed.

`lfs` talks to the metadata server; on a hung filesystem it blocks, and so may any helper it
starts. It therefore runs in a session of its own, and at the deadline the whole process group is
sent SIGKILL, so nothing it started survives. A process stuck in the kernel (state D) only dies
when the kernel lets go of it; it is then reaped by a background thread instead of blocking the
probe, which reports TIMEOUT at once.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fsprobe.errors import ProbeFailure, errno_name
from fsprobe.model import TIMEOUT

#: Environment variable naming the `lfs` binary when no --lfs/config value is given.
ENV_LFS = "FSPROBE_LFS"

#: `lfs` exits with this status after printing its usage text (CMD_HELP); it is not an errno.
USAGE_STATUS = 4

#: How long to wait for the killed process group before leaving the reaping to a thread.
KILL_GRACE = 1.0

_HOW_TO_FIX = (
    "install the Lustre client tools, or name the binary with --lfs BIN, "
    f"the {ENV_LFS} environment variable or `lfs` in the configuration"
)


@dataclass(frozen=True)
class LfsRun:
    """One finished `lfs` run; `status` is negative when a signal ended it."""

    argv: tuple[str, ...]
    stdout: str
    stderr: str
    status: int
    started_at: float  # Unix time: lfs computes grace countdowns relative to it
    duration: float

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def status_error_name(status: int) -> str:
    """The error name of an lfs exit status: its errno, but usage (4) is EINVAL, not EINTR."""
    if status < 0:
        try:
            return signal.Signals(-status).name
        except ValueError:
            return f"SIG{-status}"
    if status == USAGE_STATUS:
        return "EINVAL"
    return errno_name(status)


def lfs_binary(explicit: str | None = None) -> str:
    """The binary to run: `explicit` (--lfs / config), else $FSPROBE_LFS, else ``lfs``."""
    return explicit or os.environ.get(ENV_LFS) or "lfs"


def resolve(binary: str) -> str:
    """The path of `binary`, searched on PATH unless it has a slash; OSError when missing."""
    if os.sep in binary:
        if not os.path.exists(binary):
            raise FileNotFoundError(errno.ENOENT, f"{binary} does not exist; {_HOW_TO_FIX}", binary)
        return binary
    found = shutil.which(binary)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"{binary!r} is not on PATH; {_HOW_TO_FIX}", binary)
    return found


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group, reap it, and never block longer than `KILL_GRACE` doing it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        # Still alive (stuck in the kernel) or a descendant that left the group holds the pipes:
        # stop reading, and let a thread reap the process whenever it dies.
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        threading.Thread(target=process.wait, name=f"reap-lfs-{process.pid}", daemon=True).start()


def run_lfs(args: Sequence[str], *, binary: str, timeout: float) -> LfsRun:
    """Run ``binary args...`` with stdin closed and the C locale, within `timeout` seconds.

    Raises OSError when the binary cannot be started (with what to do about it), and
    ProbeFailure("TIMEOUT") when the deadline passed, after the process group was killed.
    """
    argv = (resolve(binary), *args)
    if timeout <= 0:
        raise ProbeFailure(TIMEOUT, f"no time left to run {shlex.join(argv)}")
    environment = {**os.environ, "LC_ALL": "C"}  # English messages: they are parsed
    started_at, started = time.time(), time.monotonic()
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=environment,
        )
    except PermissionError as error:
        raise PermissionError(
            error.errno, f"cannot run {argv[0]}: {error.strerror}; {_HOW_TO_FIX}", argv[0]
        ) from None
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise ProbeFailure(
            TIMEOUT,
            f"{shlex.join(argv)} did not finish within {timeout:.3g} s "
            "(a hung filesystem?); it was killed with its process group",
        ) from None
    except BaseException:
        _kill_group(process)
        raise
    return LfsRun(
        argv=argv,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        status=process.returncode,
        started_at=started_at,
        duration=time.monotonic() - started,
    )
