"""The primitives of an atomic save, shared by the write probe, `fsprobe.save` and `sync`.

Temp names ``.fsprobe~<host>~<pid>~<token>~<name>.tmp``; a `TempFile` is ``flock``ed by its
writer, and a lock that can be taken proves the writer gone (docs/security.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from dataclasses import dataclass

#: Flags for creating a file that is ours alone: never an existing file, never through a symlink.
EXCLUSIVE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: What `flock` raises on a filesystem without locks (Lustre ``noflock``, some FUSE and NFS),
#: or on a directory where locks are byte-range locks underneath (NFS: EBADF).
LOCK_UNSUPPORTED = frozenset(
    {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}
)

_PREFIX = ".fsprobe~"
_SUFFIX = ".tmp"
_NAME = re.compile(
    r"^\.fsprobe~(?P<host>[^~/]+)~(?P<pid>\d+)~(?P<token>[0-9a-f]+)~(?P<base>.*)\.tmp$"
)
#: Room left for the final name inside NAME_MAX (255) after prefix, host, pid, token and suffix.
_MAX_BASE = 96


class Claims:
    """(st_dev, st_ino) of the temp files and staging directories this process is writing: its
    own threads' saves. A lock is no proof of life within one process on NFS (whose flock is a
    per-process POSIX lock), so cleanup asks this too. Also those it gave up and could not
    remove (`abandoned`, with the directory each lies in): certainly dead, whatever their age,
    and removed by this process's next attempt, wherever that goes. One per process (`CLAIMS`).
    No lock: a set's or a dict's add, discard and lookup are atomic, and a lock held at a fork
    would stay held."""

    def __init__(self) -> None:
        self._live: set[tuple[int, int]] = set()
        self.abandoned: dict[tuple[int, int], str] = {}

    def abandon(self, identity: tuple[int, int], directory: str) -> None:
        """`identity`, in `directory`, was given up and could not be removed: the next attempt
        of this process removes it (`fsprobe.saving.stale.clean_abandoned`)."""
        self.abandoned[identity] = directory

    def add(self, identity: tuple[int, int]) -> None:
        self._live.add(identity)

    def discard(self, identity: tuple[int, int]) -> None:
        self._live.discard(identity)

    def __contains__(self, identity: object) -> bool:
        return identity in self._live


CLAIMS = Claims()


@dataclass(frozen=True)
class TempName:
    """What a temporary name says about the writer that created it."""

    host: str
    pid: int
    base: str


def hostname() -> str:
    """This host's short name, made safe for a file name."""
    # os.uname() is what socket.gethostname() asks on POSIX, without loading `socket`.
    return re.sub(r"[^A-Za-z0-9.-]", "_", os.uname().nodename.split(".")[0]) or "localhost"


def temp_name(base: str) -> str:
    """A fresh hidden temporary name for a file that will be renamed to `base`."""
    return f"{_PREFIX}{hostname()}~{os.getpid()}~{os.urandom(4).hex()}~{base[:_MAX_BASE]}{_SUFFIX}"


def parse_temp_name(name: str) -> TempName | None:
    """The writer of a temporary name, or None when the name is not one of ours."""
    match = _NAME.match(name)
    if match is None:
        return None
    return TempName(match["host"], int(match["pid"]), match["base"])


def is_live_here(info: os.stat_result) -> bool:
    """Whether a file is a temp file that this process is writing right now."""
    return (info.st_dev, info.st_ino) in CLAIMS


def claim(fd: int) -> tuple[int, int]:
    """Mark the open temp file or staging directory `fd` as being written by this process.

    Locks it (``flock``, where the filesystem has locks: the proof of life that other
    processes' cleanup looks for) and remembers it; the lock lasts as long as `fd` stays open.
    Returns its identity, to `unclaim` when it is no longer written.
    """
    info = os.fstat(fd)
    identity = (info.st_dev, info.st_ino)
    CLAIMS.add(identity)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in LOCK_UNSUPPORTED:
            CLAIMS.discard(identity)
            raise
    return identity


def lock_within(fd: int, seconds: float, poll: float) -> bool:
    """Take the exclusive ``flock`` of `fd`, trying again every `poll` seconds for `seconds`;
    False if another holder kept it all that time.

    Never a blocking ``flock``: nothing could bound its wait. Any other OSError (a filesystem
    without locks) is the caller's to judge.
    """
    give_up = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= give_up:
                return False
            time.sleep(poll)


def unclaim(identity: tuple[int, int]) -> None:
    """The temp file or directory of `claim` is no longer being written by this process."""
    CLAIMS.discard(identity)


class TempFile:
    """A temp file of this process: created exclusively, locked until `release`.

    `name` is relative to `dir_fd`, or a path when `dir_fd` is None; `identity` is its
    (st_dev, st_ino). `fd` (open for writing, and reading if `readable`) belongs to the
    TempFile and is closed by `release`: the lock lives as long as it does. A writer that
    closes its own stream opens it on a duplicate. As a context manager, a TempFile that was
    not renamed is removed on the way out.
    """

    def __init__(
        self, dir_fd: int | None, name: str, mode: int = 0o600, readable: bool = False
    ) -> None:
        self.dir_fd = dir_fd
        self.name = name
        flags = EXCLUSIVE_FLAGS & ~os.O_WRONLY | os.O_RDWR if readable else EXCLUSIVE_FLAGS
        self.fd = os.open(name, flags, mode, dir_fd=dir_fd)
        self.renamed = False
        info = os.fstat(self.fd)
        self.identity = (info.st_dev, info.st_ino)
        try:
            claim(self.fd)
        except OSError:
            self.discard()
            raise

    def rename(self, final: str) -> None:
        """Replace `final` (in the same directory) with this file, which is then `final`."""
        os.replace(self.name, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.name, self.renamed = final, True

    def replace_if_unchanged(self, final: str, expected: os.stat_result | None) -> bool:
        """Put this file at `final` only if `final` is still `expected` (None: still absent).

        No system call compares and renames in one step, so a present `final` is first moved
        aside (atomically: a save that lands at the same moment either lands before, and is
        what gets moved aside, or after, and then the link below refuses to replace it), the
        moved file is compared with `expected`, and this file is linked in with link(2), which
        never replaces anything. When `final` had changed, what was moved aside goes back
        (unless an even newer save took the name meanwhile) and False is returned. A reader
        may find no `final` for the few calls in between; a crash there leaves this verified
        file in place and the old one under a temp name.
        """
        moved = None
        if expected is not None:
            aside = temp_name(final)
            try:
                os.rename(final, aside, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                moved = os.stat(aside, dir_fd=self.dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                pass  # removed meanwhile: nothing newer to protect
            if moved is not None and not same_version(moved, expected):
                with contextlib.suppress(FileExistsError):
                    os.link(aside, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                os.unlink(aside, dir_fd=self.dir_fd)
                return False
        try:
            os.link(self.name, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            published = True
        except FileExistsError:
            published = False  # a save landed in between: it is newer
        if moved is not None:
            os.unlink(aside, dir_fd=self.dir_fd)  # the old version, replaced either way
        if published:
            os.unlink(self.name, dir_fd=self.dir_fd)
            self.renamed = True
        return published

    def discard(self) -> None:
        """Remove the file (if it still is ours) and release it."""
        try:
            self.remove()
        finally:
            self.release()

    def remove(self) -> None:
        """Remove the file if its name is still this file (not released: `release` closes)."""
        try:
            named = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
            if (named.st_dev, named.st_ino) == self.identity:
                os.unlink(self.name, dir_fd=self.dir_fd)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Close the descriptor, which drops the lock; the file is no longer being written."""
        unclaim(self.identity)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> TempFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.renamed:
            self.release()
        else:
            self.discard()


def same_version(first: os.stat_result, second: os.stat_result) -> bool:
    """The same version of a file or directory: one inode, not changed since (size, mtime)."""
    return (first.st_dev, first.st_ino, first.st_size, first.st_mtime_ns) == (
        second.st_dev,
        second.st_ino,
        second.st_size,
        second.st_mtime_ns,
    )


def fsync_directory(path: str) -> None:
    """Make a rename in `path` durable: without this a crash can undo it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
