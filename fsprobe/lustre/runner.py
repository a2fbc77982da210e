"""Running `lfs`: an argv list (never a shell), a deadline, a byte cap, nothing left behind.

The bounds and why: docs/security.md, "`lfs`: bounded in time, output and processes".
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
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
from fsprobe.posix import children
from fsprobe.posix.identity import Identity, exec_as

#: Environment variable naming the `lfs` binary when no --lfs/config value is given.
ENV_LFS = "FSPROBE_LFS"

#: `lfs` exits with this status after printing its usage text (CMD_HELP); it is not an errno.
USAGE_STATUS = 4

#: How long to wait for the killed process group before leaving the reaping to a thread.
KILL_GRACE = 1.0

#: The most `lfs` may print. `lfs df -v` of a filesystem with 4,000 OSTs prints about 400 KiB;
#: what fsprobe runs prints far less. Past the cap the run is stopped and reported as E2BIG.
MAX_STDOUT = 8 * 1024 * 1024
MAX_STDERR = 256 * 1024
#: After `lfs` has exited, how long its pipes may stay open: only a helper it left behind
#: holds them then, and nothing it prints is an answer of `lfs`.
DRAIN_GRACE = 0.5
#: How often a read wakes up to see whether `lfs` has exited.
POLL_INTERVAL = 0.1
_CHUNK = 64 * 1024

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


def absolute_binary(binary: str | None, base: str | None = None) -> str | None:
    """`binary` as the probe worker, which runs in ``/``, must be told it: a name with a slash
    (``./bin/lfs``) made absolute against `base` (default: the working directory, now, at
    start); a bare name (``lfs``) stays a search on PATH."""
    if not binary or os.sep not in binary:
        return binary
    expanded = os.path.expanduser(binary)
    return os.path.abspath(os.path.join(base, expanded) if base else expanded)


def resolve(binary: str, how_to_fix: str = _HOW_TO_FIX) -> str:
    """The path of `binary`, searched on PATH unless it has a slash; OSError when missing."""
    if os.sep in binary:
        if not os.path.exists(binary):
            raise FileNotFoundError(errno.ENOENT, f"{binary} does not exist; {how_to_fix}", binary)
        return binary
    found = shutil.which(binary)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"{binary!r} is not on PATH; {how_to_fix}", binary)
    return found


class _Overflow(Exception):
    def __init__(self, stream: str, cap: int) -> None:
        super().__init__(stream)
        self.stream, self.cap = stream, cap


def _has_exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, without reaping it: while it is a zombie its pid (and
    so its process group ID) cannot be reused, so the group kill cannot hit a stranger."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _read_output(process: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """stdout and stderr, read until the process has exited and both pipes are closed.

    Reading stops `DRAIN_GRACE` after the exit even if a helper still holds a pipe. Raises
    `_Overflow` past a cap and `subprocess.TimeoutExpired` at the deadline.
    """
    assert process.stdout is not None and process.stderr is not None  # started with PIPEs
    caps = {process.stdout: ("stdout", MAX_STDOUT), process.stderr: ("stderr", MAX_STDERR)}
    received: dict[object, bytearray] = {pipe: bytearray() for pipe in caps}
    exited_at: float | None = None
    pause = 0.001  # between exit checks once the pipes are closed: the exit is imminent
    with selectors.DefaultSelector() as selector:
        for pipe in caps:
            selector.register(pipe, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and _has_exited(process):
                exited_at = now
            if exited_at is not None and (not selector.get_map() or now - exited_at > DRAIN_GRACE):
                break
            if now >= deadline:
                raise subprocess.TimeoutExpired(process.args, 0)
            if not selector.get_map():
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, POLL_INTERVAL)
                continue
            for key, _events in selector.select(min(deadline - now, POLL_INTERVAL)):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = received[key.fileobj]
                buffer += chunk
                stream, cap = caps[key.fileobj]  # type: ignore[index]
                if len(buffer) > cap:
                    raise _Overflow(stream, cap)
    return bytes(received[process.stdout]), bytes(received[process.stderr])


def _end(process: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the run's process group, reap it, and reap the helpers that left it.

    Never blocks longer than `KILL_GRACE`: a process stuck in the kernel is left to a thread.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    try:
        process.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        threading.Thread(
            target=_wait_then_finish, args=(process,), name=f"reap-lfs-{process.pid}", daemon=True
        ).start()
    else:
        children.finish(process)
    children.reap_orphans()


def _wait_then_finish(process: subprocess.Popen[bytes]) -> None:
    process.wait()
    children.finish(process)


def run_lfs(
    args: Sequence[str],
    *,
    binary: str,
    timeout: float,
    identity: Identity | None = None,
    how_to_fix: str = _HOW_TO_FIX,
) -> LfsRun:
    """Run ``binary args...`` with stdin closed and the C locale, within `timeout` seconds.

    With `identity`, `lfs` runs as that user (`fsprobe.posix.identity.exec_as`: its own IDs, no
    capability, not traceable by the user): Lustre lets anyone read their own quota, and only
    CAP_SYS_ADMIN read someone else's.

    Raises OSError when the binary cannot be started (with what to do about it),
    ProbeFailure("TIMEOUT") when the deadline passed and ProbeFailure("E2BIG") when it printed
    more than the caps allow; either way after the process group was killed.
    """
    argv = (resolve(binary, how_to_fix), *args)
    if timeout <= 0:
        raise ProbeFailure(TIMEOUT, f"no time left to run {shlex.join(argv)}")
    environment = {**os.environ, "LC_ALL": "C"}  # English messages: they are parsed
    started_at, started = time.time(), time.monotonic()
    try:
        process = children.start(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=environment,
            preexec_fn=None if identity is None or identity.is_process() else exec_as(identity),
        )
    except PermissionError as error:
        raise PermissionError(
            error.errno, f"cannot run {argv[0]}: {error.strerror}; {how_to_fix}", argv[0]
        ) from None
    try:
        stdout, stderr = _read_output(process, started + timeout)
    except subprocess.TimeoutExpired:
        raise ProbeFailure(
            TIMEOUT,
            f"{shlex.join(argv)} did not finish within {timeout:.3g} s "
            "(a hung filesystem?); it was killed with its process group",
        ) from None
    except _Overflow as overflow:
        raise ProbeFailure(
            "E2BIG",
            f"{shlex.join(argv)} printed more than {overflow.cap // 1024} KiB on "
            f"{overflow.stream}; it was stopped and killed, its output not read",
        ) from None
    finally:
        _end(process)
    return LfsRun(
        argv=argv,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        status=process.returncode,
        started_at=started_at,
        duration=time.monotonic() - started,
    )
