"""Walking a checkpoint directory from its descriptor: fsync, measure, hash, remove.

Links never followed, only regular files opened, removals only of the user's own entries,
entries streamed and charged to an `EntryBudget` (docs/security.md).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

log = logging.getLogger("fsprobe.save")

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Directories deeper than this are refused: no checkpoint nests that far, a loop might.
MAX_DEPTH = 64
READ_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class TreeSize:
    """What a directory tree holds: bytes of its regular files, its files, its directories,
    and the newest modification time of any of them (when it was last written to)."""

    bytes: int
    files: int
    directories: int  # the root included
    newest_mtime: float

    def __add__(self, other: TreeSize) -> TreeSize:
        return TreeSize(
            self.bytes + other.bytes,
            self.files + other.files,
            self.directories + other.directories,
            max(self.newest_mtime, other.newest_mtime),
        )


def open_directory(name: str, dir_fd: int | None = None) -> int:
    """Open a directory (relative to `dir_fd`), never through a symbolic link at `name`."""
    return os.open(name, _DIRECTORY_FLAGS, dir_fd=dir_fd)


def open_regular(name: str, dir_fd: int | None = None) -> int:
    """Open a regular file for reading without blocking on a FIFO or following a symlink."""
    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", name)
    return fd


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    """Close a descriptor at the end of a `with` block."""
    try:
        yield fd
    finally:
        os.close(fd)


class TooManyEntries(OSError):
    """A walk met more entries than its `EntryBudget` allows; it went no further."""


class EntryBudget:
    """How many more entries (files, directories, anything) the walks sharing it may meet.

    A directory someone else filled (a million empty files in a user's fallback area) is
    walked as far as the budget, never to its end: its entries are streamed, so memory does
    not grow with them, and the budget bounds the time.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self) -> None:
        """One more entry met; `TooManyEntries` once the budget is spent."""
        if self.left <= 0:
            raise TooManyEntries(errno.E2BIG, f"more than {self.limit} entries")
        self.left -= 1


def entries(dir_fd: int, budget: EntryBudget | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """The entries of a directory with their `lstat`, in the directory's own order.

    Streamed (``scandir`` of the descriptor, a batch of names at a time): a directory of a
    million entries costs no more memory than one of ten. Each entry is charged to `budget`.
    """
    with os.scandir(dir_fd) as listing:
        for item in listing:
            if budget is not None:
                budget.take()
            try:
                info = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed meanwhile: not ours to judge
                continue
            yield item.name, info


def _nothing(*_: object) -> None:
    pass


def _walk(
    dir_fd: int,
    on_file: Callable[[int, str, str], None] = _nothing,
    after_directory: Callable[[int], None] = _nothing,
    prefix: str = "",
    depth: int = 0,
    budget: EntryBudget | None = None,
) -> TreeSize:
    """Depth first: `on_file(dir_fd, name, relative path)` for every regular file, then
    `after_directory(dir_fd)` for each directory once everything below it is done."""
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"deeper than {MAX_DEPTH} directories", prefix)
    total = TreeSize(0, 0, 1, os.fstat(dir_fd).st_mtime)
    for name, info in entries(dir_fd, budget):
        relative = f"{prefix}{name}"
        if stat.S_ISREG(info.st_mode):
            on_file(dir_fd, name, relative)
            total += TreeSize(info.st_size, 1, 0, info.st_mtime)
        elif stat.S_ISDIR(info.st_mode):
            with opened(open_directory(name, dir_fd)) as child:
                total += _walk(child, on_file, after_directory, f"{relative}/", depth + 1, budget)
    after_directory(dir_fd)
    return total


def _sync_file(dir_fd: int, name: str, _relative: str = "") -> None:
    with opened(open_regular(name, dir_fd)) as fd:
        os.fsync(fd)


def sync_tree(root_fd: int, *, files: bool = True, directories: bool = True) -> TreeSize:
    """fsync every regular file and then every directory, bottom up (either can be left out).

    Each directory is synced after everything in it, the root last: once this returns, a crash
    cannot lose a file's data nor its name. Symbolic links and special files are not opened
    (their directory's fsync makes them durable). Returns what the tree holds.
    """
    return _walk(root_fd, _sync_file if files else _nothing, os.fsync if directories else _nothing)


def sync_file_at(root_fd: int, relative: str) -> None:
    """fsync the regular file at `relative` (``a/b.pt``) below `root_fd`, following no link."""
    *directories, name = [part for part in relative.split("/") if part not in ("", ".")]
    fd = os.dup(root_fd)
    try:
        for directory in directories:
            child = open_directory(directory, fd)
            os.close(fd)
            fd = child
        _sync_file(fd, name)
    finally:
        os.close(fd)


def drop_cached_pages(root_fd: int) -> TreeSize:
    """Tell the kernel the cached pages of every file in the tree will not be read again."""

    def drop(dir_fd: int, name: str, _relative: str) -> None:
        with opened(open_regular(name, dir_fd)) as fd:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    return _walk(root_fd, drop)


def measure_tree(root_fd: int, budget: EntryBudget | None = None) -> TreeSize:
    """What the tree holds, without syncing anything (each entry charged to `budget`)."""
    return _walk(root_fd, budget=budget)


def digest_tree(root_fd: int) -> dict[str, str]:
    """The sha256 of every regular file, by its path relative to the root (``a/b.pt``)."""
    import hashlib  # loads OpenSSL: only a redirect or a sync ever hashes

    digests: dict[str, str] = {}

    def digest(dir_fd: int, name: str, relative: str) -> None:
        hasher = hashlib.sha256()
        with opened(open_regular(name, dir_fd)) as fd:
            while chunk := os.read(fd, READ_CHUNK):
                hasher.update(chunk)
        digests[relative] = hasher.hexdigest()

    _walk(root_fd, digest)
    return digests


def tree_digest(files: dict[str, str]) -> str:
    """One sha256 for a whole directory: of its files' relative paths and sha256s, sorted."""
    import hashlib

    listing = "".join(f"{name}\0{digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(listing.encode("utf-8", "surrogateescape")).hexdigest()


def remove_tree(parent_fd: int, name: str) -> bool:
    """Remove `name` in `parent_fd` and all below it, if all of it belongs to this user.

    What another user owns is left where it is (with its directories, which cannot be empty
    then): fsprobe never acts as root on a file someone else wrote. A symlink is removed as
    a link, never followed. Bounded like every walk here: entries are streamed, never listed
    whole (a copy grown to millions of files costs no memory), and a branch deeper than
    `MAX_DEPTH` is refused (ELOOP, its deepest part left) instead of running out of Python's
    stack or of descriptors. Returns whether `name` is gone.
    """
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return _remove(parent_fd, name, info, 0)


def remove_checkpoint(path: str) -> None:
    """Remove the checkpoint at `path` as every tree here (`remove_tree`), relative to its
    directory opened once (the directories on the way are the caller's, as for a save there):
    only this user's entries go, whatever another user put at the name or in it; what is left,
    and why, is logged. Never raises: a rotation goes on."""
    try:
        directory = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with opened(directory) as parent:
            if not remove_tree(parent, os.path.basename(path)):
                log.warning("%s is not all this user's: what is not was left", path)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("not deleting %s: %s", path, error)


#: Listings of one directory while removing its entries: a filesystem may skip an entry of a
#: directory whose other entries are removed during its listing (NFS cookies), and the user
#: whose tree it is may add more; the directory's removal then fails, as it should, and the
#: next cleanup tries again.
_REMOVAL_PASSES = 3


def _remove(parent_fd: int, name: str, info: os.stat_result, depth: int) -> bool:
    if info.st_uid != os.geteuid():
        log.warning("not removing %s: it belongs to uid %d, not to this user", name, info.st_uid)
        return False
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return True
    if depth >= MAX_DEPTH:
        raise OSError(errno.ELOOP, f"deeper than {MAX_DEPTH} directories", name)
    with opened(open_directory(name, parent_fd)) as fd:
        if not os.path.samestat(os.fstat(fd), info):  # swapped since the lstat
            return False
        if not _empty(fd, depth + 1):
            return False
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=parent_fd)
    return True


def _empty(dir_fd: int, depth: int) -> bool:
    """Remove what is this user's in the open directory; whether it is empty now."""
    for _ in range(_REMOVAL_PASSES):
        removed = kept = 0
        for name, info in entries(dir_fd):
            if _remove(dir_fd, name, info, depth):
                removed += 1
            else:
                kept += 1
        if kept or not removed:
            return not kept
    return False
