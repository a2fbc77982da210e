"""Opening what provably belongs to a user, beneath a directory, without following anything.

Walked one name at a time with ``O_NOFOLLOW``, owner and mode checked on each descriptor;
files opened ``O_NONBLOCK`` (docs/security.md, "Paths that other users can write").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

#: Opening a directory of a walk: never through a symlink, never inherited by a child.
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Added to every file opened here: no symlink, no blocking open of a FIFO or a device.
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class NotTrusted(PermissionError):
    """A name on the way is not provably the caller's (a symlink, another owner, open to others).

    A `PermissionError` (EACCES), so that a save treats it like any directory it may not write:
    give up that place and go elsewhere, never retry it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.EACCES, message)

    def __str__(self) -> str:
        return str(self.strerror)


def components(relative: str) -> list[str]:
    """The names of a relative path, refusing any that could leave or blur the walk."""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise NotTrusted(f"{relative!r} is not a plain relative path")
    return parts


def check_owned(info: os.stat_result, owner: int, what: str, private: bool = True) -> None:
    """Refuse `info` unless `owner` owns it and, if `private`, nobody else may write it."""
    if info.st_uid != owner:
        raise NotTrusted(f"{what} belongs to uid {info.st_uid}, not to uid {owner}")
    if private and info.st_mode & _OTHERS_WRITE:
        raise NotTrusted(f"{what} is writable by group or others ({stat.filemode(info.st_mode)})")


def _refusal(dir_fd: int, name: str, what: str, kind: str, error: OSError) -> OSError:
    """Why opening `name` failed: a symlink or another `kind` of file is a refusal."""
    if error.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
        return error
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return error
    if stat.S_ISLNK(mode):
        return NotTrusted(f"{what} is a symbolic link; not following it")
    return NotTrusted(f"{what} is not a {kind}")


def walk(
    dir_fd: int,
    names: list[str],
    owner: int,
    *,
    create: bool = False,
    where: str = "",
) -> int:
    """Open the directory `names` beneath `dir_fd`, each step owned by `owner` and private.

    With `create`, missing directories are made (mode 0755: others may read a checkpoint,
    never change one). Returns a new descriptor of the last directory (`dir_fd` itself is
    duplicated when `names` is empty); the caller closes it. `where` names `dir_fd` in errors.
    """
    current = os.dup(dir_fd)
    try:
        for name in names:
            where = f"{where}/{name}" if where else name
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=current)
            try:
                following = os.open(name, _DIRECTORY_FLAGS, dir_fd=current)
            except OSError as error:
                raise _refusal(current, name, where, "directory", error) from error
            os.close(current)
            current = following
            check_owned(os.fstat(current), owner, where)
        return current
    except BaseException:
        os.close(current)
        raise


def open_file(
    dir_fd: int,
    name: str,
    flags: int,
    owner: int,
    *,
    mode: int = 0o600,
    private: bool = True,
    where: str = "",
) -> int:
    """Open the regular file `name` in `dir_fd`, owned by `owner` (and private if asked).

    ``O_NOFOLLOW | O_NONBLOCK`` are added, and the type and owner are checked on the open
    descriptor before it is returned in blocking mode: a symlink, a FIFO, a device or a file
    of someone else is refused without ever waiting on it.
    """
    what = f"{where}/{name}" if where else name
    try:
        fd = os.open(name, flags | _FILE_FLAGS, mode, dir_fd=dir_fd)
    except OSError as error:
        raise _refusal(dir_fd, name, what, "regular file", error) from error
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotTrusted(f"{what} is not a regular file")
        check_owned(info, owner, what, private)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd
    except BaseException:
        os.close(fd)
        raise
