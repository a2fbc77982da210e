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


def _remove_if_stale(dir_fd: int, directory: str, entry: str, now: float) -> bool:
    name = parse_temp_name(entry)
    if name is None:
        return False
    try:  # only a regular file of ours is ever opened (opening a device may act on it)
        named = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(named.st_mode) or named.st_uid != os.geteuid():
            return False
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
        CLAIMS.abandoned.discard(identity)
    except FileNotFoundError:
        return False
    except OSError as error:
        log.warning("cannot remove the stale temp file %s/%s: %s", directory, entry, error)
        return False
    finally:
        os.close(fd)
    log.info(
        "removed %s/%s (%d bytes), left by a crashed save (pid %d on %s)",
        directory,
        entry,
        info.st_size,
        name.pid,
        name.host,
    )
    return True


def remove_stale_temps(directory: str) -> list[str]:
    """Remove stale temp files of crashed saves in `directory`, and those an attempt of this
    process gave up and could not remove (`CLAIMS.abandoned`: at once, whatever their age);
    returns the paths removed.

    Never raises: cleaning up is a courtesy, and must not be why a save fails.
    """
    now = time.time()
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
        return []
    try:
        names = os.listdir(dir_fd)
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
        names = []
    try:
        return [
            os.path.join(directory, entry)
            for entry in names
            if _remove_if_stale(dir_fd, directory, entry, now)
        ]
    finally:
        os.close(dir_fd)


def remove_stale_staging(directory: str) -> None:
    """Clean up after crashed directory saves in `directory`: their staging directories, and
    checkpoints they retired (restored if nothing took their place, removed otherwise).

    The authorship rule of temp files (`remove_stale_temps`), applied to directories owned by
    this user; from another host, the newest write anywhere in the tree counts. Never raises.
    """
    this_host, now, euid = hostname(), time.time(), os.geteuid()
    try:
        parent_fd = open_parent(directory)
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
        return
    try:
        for name in os.listdir(parent_fd):
            temp, retired = parse_temp_name(name), parse_retired_name(name)
            writer = temp or (retired and retired[0])
            if not writer:
                continue
            try:
                info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode) or info.st_uid != euid:
                    continue
                identity = (info.st_dev, info.st_ino)
                with opened(open_directory(name, parent_fd)) as fd:
                    alive = True if is_live_here(os.fstat(fd)) else writer_alive(fd)
                    mtime = info.st_mtime
                    if writer.host != this_host:
                        mtime = measure_tree(fd).newest_mtime
                if not is_stale(writer, mtime, alive, now, identity):
                    continue
                if retired:
                    restore_or_remove_retired(parent_fd, name, retired[1])
                elif remove_tree(parent_fd, name):
                    CLAIMS.abandoned.discard(identity)
                    log.info(
                        "removed %s in %s, left by a crashed save (pid %d on %s)",
                        name,
                        directory,
                        writer.pid,
                        writer.host,
                    )
            except OSError as error:
                log.warning("cannot clean up %s in %s: %s", name, directory, error)
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
    finally:
        os.close(parent_fd)


def clean_directory(directory: str) -> None:
    """Before the first attempt into `directory`: the leftovers of crashed saves, files and dirs."""
    remove_stale_temps(directory)
    remove_stale_staging(directory)
