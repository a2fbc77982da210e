"""Start and stop a fault filesystem process; stopping never hangs, whatever the test left.

::

    with FaultFS(backing_dir, mount_dir) as fs:
        fs.ctl.fail("write", "EIO")
        (fs.mountpoint / "x").write_bytes(b"...")   # OSError: [Errno 5]

Stopping goes from gentle to certain: ask the filesystem to release every blocked call,
unmount (lazily if a user is still inside), wait for the process, kill it if it lingers (the
kernel then fails whatever is still pending with ENOTCONN), and unmount whatever is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .faultctl import FaultControl, FaultControlError
from .faults import DEFAULT_MAX_HOLD
from .mountinfo import is_mounted, unmount

REPO_ROOT = Path(__file__).resolve().parents[2]


#: A Unix socket path must fit in sun_path: 108 bytes with the terminating NUL.
_SOCKET_PATH_MAX = 107


def _private_short_directory() -> Path:
    """A fresh directory for the control socket and the log, private to this user.

    Under $TMPDIR when the socket path fits there, else under /tmp: a deep $TMPDIR (a job's
    scratch directory) must not make every mount fail with "AF_UNIX path too long".
    """
    for base in (None, "/tmp"):
        directory = Path(tempfile.mkdtemp(prefix="faultfs-", dir=base))
        if len(os.fsencode(directory / "control.sock")) <= _SOCKET_PATH_MAX:
            return directory
        directory.rmdir()
    raise RuntimeError("no directory short enough for a Unix socket, not even /tmp")


def _libfuse3_environment() -> dict[str, str]:
    """The environment of the filesystem process, with libfuse 3 chosen explicitly.

    Left to itself, mfusepy loads ``libfuse.so.2`` where libfuse2 is installed beside
    libfuse3, and every mount then fails (``unknown option 'max_threads=64'``). An explicit
    FUSE_LIBRARY_PATH of the caller's still wins.
    """
    environment = dict(os.environ)
    if "FUSE_LIBRARY_PATH" not in environment:
        environment["FUSE_LIBRARY_NAME"] = "fuse3"
    return environment


class FaultFS:
    """One fault filesystem: `backing` shown at `mountpoint`, driven through `ctl`."""

    def __init__(
        self,
        backing: str | os.PathLike[str],
        mountpoint: str | os.PathLike[str],
        *,
        direct_io: bool = False,
        max_block: float = DEFAULT_MAX_HOLD,
        hidden_removes: bool = False,
    ) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.direct_io = direct_io
        self.max_block = max_block
        #: A file removed while open stays, as ``.fuse_hidden*``, until its last close: what
        #: libfuse does by default and NFS does with ``.nfs*`` (its "silly rename").
        self.hidden_removes = hidden_removes
        self._rundir = _private_short_directory()
        self.socket_path = self._rundir / "control.sock"
        self.log_path = self._rundir / "faultfs.log"
        self.ctl = FaultControl(str(self.socket_path))
        self.proc: subprocess.Popen[bytes] | None = None
        self.output = ""  # the process's stdout and stderr, kept once it stopped

    def start(self, timeout: float = 10.0) -> FaultFS:
        """Mount and wait until the filesystem answers; RuntimeError with its log if not."""
        command = [
            sys.executable,
            "-m",
            "tests.support.faultfs",
            str(self.backing),
            str(self.mountpoint),
            "--control",
            str(self.socket_path),
            "--max-block",
            str(self.max_block),
        ]
        if self.direct_io:
            command.append("--direct-io")
        if self.hidden_removes:
            command.append("--hidden-removes")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=_libfuse3_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C meant for pytest must not reach it first
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"faultfs did not mount {self.mountpoint}:\n{self.output}")
            time.sleep(0.02)
        return self

    def _ready(self) -> bool:
        try:
            mounted = self.ctl.ping()["mounted"]
        except FaultControlError:
            return False
        return mounted and is_mounted(self.mountpoint)

    def stop(self, timeout: float = 5.0) -> None:
        """Unmount and end the process; safe to call twice and while calls are blocked."""
        if self.proc is not None:
            self._stop_process(timeout)
            self.output = self.log_path.read_text(errors="replace")
            self.proc = None
        shutil.rmtree(self._rundir, ignore_errors=True)

    def _stop_process(self, timeout: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            try:
                FaultControl(str(self.socket_path), timeout=1.0).shutdown()
            except FaultControlError:
                # Hung or dying: kill it first, so that the kernel fails every pending call
                # and nothing below can wait on the filesystem.
                self.proc.kill()
        unmount(self.mountpoint)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        unmount(self.mountpoint)

    def remount(self, *, readonly: bool) -> None:
        """Remount read-only (or back): statvfs then shows ST_RDONLY and the kernel itself
        refuses changes with EROFS, as on a client that remounted a failing target read-only.
        ``ctl.set_readonly`` is the other way, refused by the filesystem, invisible to statvfs.
        """
        option = "remount,ro" if readonly else "remount,rw"
        # -i: no mount.fuse helper, which would try to start the filesystem anew.
        result = subprocess.run(
            ["mount", "-i", "-o", option, str(self.mountpoint)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"cannot {option} {self.mountpoint}: {result.stderr.strip()}")

    def problems(self) -> list[str]:
        """Lines of the stopped process's output that show a bug in the filesystem itself.

        An exception other than OSError inside an operation reaches the caller as a bare EINVAL;
        the traceback in the log is the only trace of it, so the fixtures fail on it.
        """
        return [
            line
            for line in self.output.splitlines()
            if line.startswith(("faultfs ERROR", "faultfs CRITICAL", "Traceback"))
        ]

    def __enter__(self) -> FaultFS:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
