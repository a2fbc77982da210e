"""Cleaning up after crashed saves: a leftover is removed only when provably theirs
(docs/design.md §7, "Which leftovers are a crashed save's").
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time

from fsprobe.posix.atomic import (
    CLAIMS,
    LOCK_UNSUPPORTED,
    TempName,
    hostname,
    is_live_here,
    parse_temp_name,
)
from fsprobe.posix.staging import open_parent
from fsprobe.posix.swap import parse_retired_name, restore_or_remove_retired
from fsprobe.posix.tree import measure_tree, open_directory, opened, remove_tree

log = logging.getLogger("fsprobe.save")

#: A temp file whose writer cannot be checked (another host, no locks) is stale after this.
FOREIGN_STALE_SECONDS = 3600.0
#: No temp file younger than this is removed (between create and lock its writer looks dead).
MIN_AGE_SECONDS = 60.0

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def writer_alive(fd: int) -> bool | None:
    """True if the writer of the temp file or directory `fd` holds its lock (`claim`), False
    if it is gone, None if locks do not work here."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as error:
        if error.errno in LOCK_UNSUPPORTED:
            return None
        raise
    return False


def is_stale(
    name: TempName,
    mtime: float,
    alive: bool | None,
    now: float,
    identity: tuple[int, int] | None = None,
) -> bool:
    """Whether a temp of ours (by name and owner) was certainly abandoned by its writer.

    `mtime` is when it was last written, `alive` what `writer_alive` said, `identity` its
    (st_dev, st_ino): one that an attempt of this process gave up and could not remove
    (`CLAIMS.abandoned`) is stale at once, whatever its age. A temp that this process is
    writing (`fsprobe.posix.atomic.is_live_here`) is the caller's to rule out first.
    """
    here = name.host == hostname()
    if alive:
        return False
    if here and name.pid == os.getpid() and identity in CLAIMS.abandoned:
        return True
    age = now - mtime
    return age >= MIN_AGE_SECONDS and ((alive is False and here) or age > FOREIGN_STALE_SECONDS)


def clean_directory(directory: str) -> list[str]:
    """Remove the leftovers of crashed saves in `directory`, each only once its writer is
    certainly gone (`is_stale`): temp files, staging directories, and checkpoints a two-step
    replace retired (restored if nothing took their place, removed otherwise). Returns the temp
    files and staging directories removed.

    Never raises: cleaning up is a courtesy, and must not be why a save fails.
    """
    now, removed = time.time(), []
    try:
        dir_fd = open_parent(directory)
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
        return []
    try:
        for name in os.listdir(dir_fd):
            if _clean(dir_fd, directory, name, now):
                removed.append(os.path.join(directory, name))
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
    finally:
        os.close(dir_fd)
    return removed


def _clean(dir_fd: int, directory: str, name: str, now: float) -> bool:
    """Remove `name` if it is a leftover of ours that is stale; whether it was removed."""
    temp, retired = parse_temp_name(name), parse_retired_name(name)
    writer = temp or (retired and retired[0])
    if not writer:
        return False
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False  # gone meanwhile
    if info.st_uid != os.geteuid():
        return False  # nobody, root included, removes another user's
    if stat.S_ISDIR(info.st_mode):
        removed = _clean_tree(dir_fd, directory, name, writer, info, now)
    elif temp is not None and stat.S_ISREG(info.st_mode):  # a device is never opened
        removed = _remove_temp_file(dir_fd, directory, name, temp, now)
    else:
        return False
    if removed:
        size = f" ({info.st_size} bytes)" if stat.S_ISREG(info.st_mode) else ""
        what = f"{name} in {directory}{size}, left by a crashed save"
        log.info("removed %s (pid %d on %s)", what, writer.pid, writer.host)
    return removed


def _remove_temp_file(dir_fd: int, directory: str, entry: str, name: TempName, now: float) -> bool:
    try:
        fd = os.open(entry, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False  # gone meanwhile, replaced by a symlink (ELOOP), or not ours to read
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return False
        identity = (info.st_dev, info.st_ino)
        if is_live_here(info) or not is_stale(name, info.st_mtime, writer_alive(fd), now, identity):
            return False
        # Still the file that was checked? (Only its owner could have swapped it meanwhile.)
        if not os.path.samestat(info, os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)):
            return False
        os.unlink(entry, dir_fd=dir_fd)
        CLAIMS.abandoned.pop(identity, None)
    except FileNotFoundError:
        return False
    except OSError as error:
        log.warning("cannot remove the stale temp file %s/%s: %s", directory, entry, error)
        return False
    finally:
        os.close(fd)
    return True


def _clean_tree(
    dir_fd: int, directory: str, name: str, writer: TempName, info: os.stat_result, now: float
) -> bool:
    """A staging directory or retired checkpoint; from another host its newest write counts."""
    identity = (info.st_dev, info.st_ino)
    try:
        with opened(open_directory(name, dir_fd)) as fd:
            alive = True if is_live_here(os.fstat(fd)) else writer_alive(fd)
            mtime = info.st_mtime
            if writer.host != hostname():
                mtime = measure_tree(fd).newest_mtime
        if not is_stale(writer, mtime, alive, now, identity):
            return False
        retired = parse_retired_name(name)
        if retired is not None:
            restore_or_remove_retired(dir_fd, name, retired[1])
            return False
        if not remove_tree(dir_fd, name):
            return False
    except OSError as error:
        log.warning("cannot clean up %s in %s: %s", name, directory, error)
        return False
    CLAIMS.abandoned.pop(identity, None)
    return True


def clean_abandoned() -> list[str]:
    """Remove what this process's own attempts gave up and could not remove
    (`CLAIMS.abandoned`), in whichever directories they lie: before each attempt, wherever it
    goes, so that a failed attempt's inode outlives it by one attempt at most. Returns what was
    removed; an entry that is gone, with its directory or by another hand, is forgotten."""
    removed: list[str] = []
    for directory in set(CLAIMS.abandoned.values()):
        removed += clean_directory(directory)
        left = {key for key, where in CLAIMS.abandoned.items() if where == directory}
        for key in left - _temp_identities(directory):
            CLAIMS.abandoned.pop(key, None)
    return removed


def _temp_identities(directory: str) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of the temp files and staging directories in `directory` (none if it
    cannot be read)."""
    found = set()
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if parse_temp_name(entry.name) is not None:
                    info = entry.stat(follow_symlinks=False)
                    found.add((info.st_dev, info.st_ino))
    except OSError:
        pass
    return found
