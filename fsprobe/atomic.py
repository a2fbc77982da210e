"""The primitives of an atomic save, shared by the write probe and by `fsprobe.save`.

An atomic save is: create a uniquely named hidden file in the destination directory, write it,
fsync it, rename it over the final name, fsync the directory. The write probe rehearses exactly
this sequence, so both use the same primitives and the same naming.

Temporary names look like ``.fsprobe~<host>~<pid>~<token>~<name>.tmp``: hidden (no ``*`` glob
matches them), ending in ``.tmp`` (no ``*.pt`` filter matches them either), and carrying the host
and pid of their writer, so that a later save can tell a crashed writer's leftovers from a live
writer's file in progress.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

#: Flags for creating a file that is ours alone: never an existing file, never through a symlink.
EXCLUSIVE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_PREFIX = ".fsprobe~"
_SUFFIX = ".tmp"
_NAME = re.compile(
    r"^\.fsprobe~(?P<host>[^~/]+)~(?P<pid>\d+)~(?P<token>[0-9a-f]+)~(?P<base>.*)\.tmp$"
)
#: Room left for the final name inside NAME_MAX (255) after prefix, host, pid, token and suffix.
_MAX_BASE = 96


@dataclass(frozen=True)
class TempName:
    """What a temporary name says about the writer that created it."""

    host: str
    pid: int
    base: str


def hostname() -> str:
    """This host's short name, made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname().split(".")[0]) or "localhost"


def temp_name(base: str) -> str:
    """A fresh hidden temporary name for a file that will be renamed to `base`."""
    return f"{_PREFIX}{hostname()}~{os.getpid()}~{os.urandom(4).hex()}~{base[:_MAX_BASE]}{_SUFFIX}"


def parse_temp_name(name: str) -> TempName | None:
    """The writer of a temporary name, or None when the name is not one of ours."""
    match = _NAME.match(name)
    if match is None:
        return None
    return TempName(match["host"], int(match["pid"]), match["base"])


def open_exclusive(path: str, mode: int = 0o600) -> int:
    """Create `path` for writing; fails if anything (a file, a symlink) is already there."""
    return os.open(path, EXCLUSIVE_FLAGS, mode)


def publish_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` so that a reader sees the old content or the new, never half.

    For what fsprobe publishes for others to read (the state file, the node_exporter textfile):
    a temp file of ours in the same directory, then a rename. No fsync: these files are
    rewritten every few seconds, and after a crash the next probe round writes them again.
    """
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, temp_name(name))
    fd = open_exclusive(temporary, mode)
    try:
        with os.fdopen(fd, "wb") as stream:
            os.fchmod(stream.fileno(), mode)  # exactly `mode`, whatever the umask
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def fsync_directory(path: str) -> None:
    """Make a rename in `path` durable: without this a crash can undo it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
