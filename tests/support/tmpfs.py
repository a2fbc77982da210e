"""Small real filesystems that really run out: tmpfs with a tiny ``size`` and ``nr_inodes``.

::

    with Tmpfs(size="1M", nr_inodes=32) as fs:
        created = fill_inodes(fs.path, 0.9)      # 90 % of the inodes now in use
        filler = fill_bytes(fs.path, leave_free=64 * 1024)

A tmpfs counts its root directory as one inode, so ``nr_inodes=32`` leaves 31 to create.
The fill helpers create their own files only (``O_CREAT|O_EXCL|O_NOFOLLOW``) and return their
paths, so a test removes exactly what it made.
"""

from __future__ import annotations

import errno
import math
import os
import subprocess
import tempfile
from pathlib import Path

from .mountinfo import unmount

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Tmpfs:
    """A tmpfs mounted at a fresh temporary directory, removed again on :meth:`unmount`."""

    def __init__(self, size: str | int = "1M", nr_inodes: int | None = None, mode: int = 0o755):
        self.size = size
        self.nr_inodes = nr_inodes
        self.mode = mode
        self.path: Path | None = None

    def mount(self) -> Path:
        options = [f"size={self.size}", f"mode={self.mode:o}"]
        if self.nr_inodes is not None:
            options.append(f"nr_inodes={self.nr_inodes}")
        path = Path(tempfile.mkdtemp(prefix="fsprobe-tmpfs-"))
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "fsprobe-test", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            path.rmdir()
            raise RuntimeError(f"cannot mount tmpfs ({','.join(options)}): {result.stderr.strip()}")
        self.path = path
        return path

    def unmount(self) -> None:
        """Unmount (lazily if busy) and remove the mount point; safe to call twice."""
        if self.path is None:
            return
        unmount(self.path)
        self.path.rmdir()
        self.path = None

    def __enter__(self) -> Tmpfs:
        self.mount()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unmount()


def inode_fraction_used(path: str | os.PathLike[str]) -> float:
    st = os.statvfs(path)
    return (st.f_files - st.f_ffree) / st.f_files


def fill_inodes(path: str | os.PathLike[str], fraction_used: float) -> list[Path]:
    """Create empty files in `path` until at least `fraction_used` of the inodes are in use.

    ``1.0`` fills the filesystem until creation fails with ENOSPC. Returns the files created.
    """
    if not 0 < fraction_used <= 1:
        raise ValueError("fraction_used must be in (0, 1]")
    directory = Path(path)
    created: list[Path] = []
    st = os.statvfs(directory)
    wanted = math.ceil(fraction_used * st.f_files) - (st.f_files - st.f_ffree)
    for _ in range(wanted):
        name = directory / f".fill-inode-{len(created):06d}"
        try:
            os.close(os.open(name, _CREATE, 0o600))
        except OSError as exc:
            if exc.errno == errno.ENOSPC and fraction_used == 1:
                break
            raise
        created.append(name)
    if inode_fraction_used(directory) < fraction_used:
        raise RuntimeError(f"created {len(created)} files, yet {directory} is not that full")
    return created


def fill_bytes(path: str | os.PathLike[str], leave_free: int = 0) -> Path:
    """Write one file of zeros into `path` until at most `leave_free` bytes stay available.

    tmpfs allocates whole pages, so what is left is `leave_free` rounded down to the block
    size. Meant for small filesystems: it writes what it fills. Returns the file it made.
    """
    directory = Path(path)
    filler = directory / ".fill-bytes"
    st = os.statvfs(directory)
    to_write = max(0, st.f_bavail * st.f_frsize - leave_free)
    to_write -= to_write % st.f_frsize
    chunk = bytes(min(to_write, 1 << 20))
    fd = os.open(filler, _CREATE, 0o600)
    try:
        while to_write > 0:
            to_write -= os.write(fd, chunk[:to_write])
    except OSError as exc:
        if exc.errno != errno.ENOSPC or leave_free > 0:
            raise
    finally:
        os.close(fd)
    return filler


def free_bytes(path: str | os.PathLike[str]) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
