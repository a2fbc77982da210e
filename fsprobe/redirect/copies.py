"""Copying a redirected checkpoint back: the bytes of one file, or a whole tree, bounded.

Only root's sync back copies (`fsprobe.redirect.sync`); everything copied must be the area's
owner's, and no copy goes past the bytes the manifest recorded.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from fsprobe.posix.atomic import EXCLUSIVE_FLAGS
from fsprobe.posix.owned import NotTrusted, check_owned, open_file
from fsprobe.posix.tree import (
    MAX_DEPTH,
    READ_CHUNK,
    EntryBudget,
    TreeSize,
    entries,
    open_directory,
    opened,
)

#: Told the bytes of each chunk as it is copied (a progress meter).
Copied = Callable[[int], object]


def copy_tree(
    source_fd: int,
    target_fd: int,
    owner: int,
    limit: int,
    budget: EntryBudget | None = None,
    depth: int = 0,
    copied: Copied | None = None,
) -> TreeSize:
    """Copy the tree below `source_fd` into the empty directory `target_fd`, modes kept.

    At most `limit` bytes of files in all (what the manifest recorded): a tree that holds
    more is refused with EFBIG as soon as it shows, never copied to its end; and at most
    `budget` entries if given (streamed, `TooManyEntries` past it).

    Every file and directory copied must be `owner`'s (`fsprobe.posix.owned`): anything else, and
    anything that is neither (a symlink, a FIFO), is refused with `NotTrusted`, and nothing
    of it is read. New files are created exclusively, never through a symlink. Nothing is
    fsynced here (`sync_tree` does that once, for the whole copy). `copied` hears every chunk.
    """
    if depth > MAX_DEPTH:
        raise OSError(errno.ELOOP, f"deeper than {MAX_DEPTH} directories")
    total = TreeSize(0, 0, 1, os.fstat(source_fd).st_mtime)
    for name, info in entries(source_fd, budget):
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            with opened(open_directory(name, source_fd)) as source:
                check_owned(os.fstat(source), owner, name, private=False)
                os.mkdir(name, stat.S_IRWXU, dir_fd=target_fd)
                with opened(open_directory(name, target_fd)) as target:
                    total += copy_tree(
                        source, target, owner, limit - total.bytes, budget, depth + 1, copied
                    )
                    os.fchmod(target, mode)
        elif stat.S_ISREG(info.st_mode):
            with opened(open_file(source_fd, name, os.O_RDONLY, owner, private=False)) as source:
                new = os.open(name, EXCLUSIVE_FLAGS, stat.S_IRUSR | stat.S_IWUSR, dir_fd=target_fd)
                with opened(new) as target:
                    nbytes = copy_bytes(source, target, limit - total.bytes, copied)
                    os.fchmod(target, mode)
            total += TreeSize(nbytes, 1, 0, info.st_mtime)
        else:
            raise NotTrusted(f"{name} is neither a regular file nor a directory; not copying it")
    return total


def copy_bytes(source: int, target: int, limit: int, copied: Copied | None = None) -> int:
    """The bytes of the open file `source`, from its start, appended to `target`; their count.

    At most `limit` of them: a source that holds more (grown since it was recorded, by whoever
    could write it) is refused with EFBIG after `limit` bytes, never copied to its end.
    `copied` hears each chunk's bytes once written.
    """
    offset = 0
    while chunk := os.pread(source, min(READ_CHUNK, limit - offset + 1), offset):
        if offset + len(chunk) > limit:
            raise OSError(errno.EFBIG, f"holds more than the {limit} bytes recorded")
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]
        offset += len(chunk)
        if copied is not None:
            copied(len(chunk))
    return offset
