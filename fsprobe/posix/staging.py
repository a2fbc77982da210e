"""A hidden directory beside a checkpoint's destination that becomes it in one rename.

The directory analogue of `fsprobe.posix.atomic.TempFile`, used by saves and by the sync.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable

from fsprobe.posix.atomic import CLAIMS, claim, temp_name, unclaim
from fsprobe.posix.swap import exchange, replace_if_unchanged, replace_in_two_steps
from fsprobe.posix.tree import (
    TreeSize,
    drop_cached_pages,
    measure_tree,
    open_directory,
    opened,
    remove_tree,
    sync_tree,
)

log = logging.getLogger("fsprobe.save")

#: Write permission for group or others: while staging, nobody but the owner may add entries.
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def open_parent(path: str) -> int:
    """The directory a checkpoint goes into (symlinks on the way are the caller's choice)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


class Staging:
    """A hidden directory beside the destination that becomes the checkpoint in one rename.

    Holds descriptors of the parent and of itself: syncing, publishing and removing go through
    them, not through path strings. `path` is what the writer fills.
    """

    def __init__(self, final: str, parent_fd: int | None = None) -> None:
        """`parent_fd`: the parent, opened already (a copy of it is kept); else by its path."""
        self.final = final
        self.parent, self.name = os.path.split(final)
        self.staging = temp_name(self.name)
        self.path = os.path.join(self.parent, self.staging)
        self.parent_fd = open_parent(self.parent) if parent_fd is None else os.dup(parent_fd)
        self.fd: int | None = None
        self.claimed: tuple[int, int] | None = None
        self.replaced_fd: int | None = None
        self.replaced: tuple[int, int] | None = None
        self.created = self.published = False
        try:
            os.mkdir(self.staging, 0o777, dir_fd=self.parent_fd)  # the umask applies
            self.created = True
            self.fd = open_directory(self.staging, self.parent_fd)
            self.claimed = claim(self.fd)  # locked while written: others' cleanup keeps it
            self.mode = stat.S_IMODE(os.fstat(self.fd).st_mode)
            if self.mode & _SHARED_WRITE:
                os.fchmod(self.fd, stat.S_IRWXU)
                if os.listdir(self.fd):  # planted before the chmod closed it
                    raise OSError(errno.EEXIST, "the new staging directory is not empty", self.path)
        except BaseException:
            self.close()
            raise
        self._drop_replaced_pages()

    def _drop_replaced_pages(self) -> None:
        """Drop the page cache of the checkpoint this one will replace, if there is one.

        Old and new must both be on disk until the new one is complete; the old one's cached
        pages (clean, never read again by the saver) would otherwise stay while the new one is
        written, and every page the writes need would wait for the kernel to reclaim one:
        DCP's 256 MiB save over an existing checkpoint took 1.4x its time in place, 1.05x
        with this (benchmarks/dcp_writer.py). On this node only; best effort.
        """
        try:
            with opened(open_directory(self.name, self.parent_fd)) as fd:
                drop_cached_pages(fd)
        except OSError:
            pass  # no checkpoint there yet (or not a directory, or not ours to read)

    def _open_up(self) -> None:
        """Give it `mode`, the mode it keeps as the checkpoint (no longer the owner's alone)."""
        assert self.fd is not None
        if stat.S_IMODE(os.fstat(self.fd).st_mode) != self.mode:
            os.fchmod(self.fd, self.mode)

    def sync(self, files: bool = True) -> TreeSize:
        """fsync every file (unless `files` is False) and directory in it, itself last."""
        assert self.fd is not None
        self._open_up()  # before the fsync: the mode is made durable with the rest
        return sync_tree(self.fd, files=files)

    def measure(self) -> TreeSize:
        assert self.fd is not None
        self._open_up()
        return measure_tree(self.fd)

    def swap_in(self) -> str | None:
        """Rename the staging directory to the final name; returns where the old one went.

        No checkpoint there yet: a plain rename. Else an atomic exchange, or two renames where
        the filesystem cannot exchange (`fsprobe.posix.swap`).
        """
        try:
            os.stat(self.name, dir_fd=self.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(self.staging, self.name, src_dir_fd=self.parent_fd, dst_dir_fd=self.parent_fd)
            self.published = True
            return None
        # The old checkpoint goes under a temp name until it is removed: claim it meanwhile,
        # or another process's cleanup would take it for a crashed save's leftover.
        self.replaced_fd = open_directory(self.name, self.parent_fd)
        self.replaced = claim(self.replaced_fd)
        if exchange(self.parent_fd, self.staging, self.name):
            self.published = True
            return self.staging  # the old checkpoint, now under the staging name
        retired = replace_in_two_steps(self.parent_fd, self.staging, self.name)
        self.published = True
        return retired

    def swap_in_if_unchanged(self, expected: os.stat_result | None) -> tuple[bool, str | None]:
        """`swap_in`, but only over the version `expected` (None: only where nothing is).

        For a copy that must never replace a checkpoint saved while it was being made.
        Returns (published, where the replaced checkpoint went).
        """
        if expected is not None:  # claimed like any checkpoint being replaced (`swap_in`)
            with contextlib.suppress(FileNotFoundError):
                self.replaced_fd = open_directory(self.name, self.parent_fd)
                self.replaced = claim(self.replaced_fd)
        published, replaced = replace_if_unchanged(
            self.parent_fd, self.staging, self.name, expected
        )
        self.published = published
        return published, replaced

    def sync_parent(self) -> None:
        os.fsync(self.parent_fd)

    def publish(self, fsync: bool, at: Callable[[str], object]) -> None:
        """Make it the checkpoint: rename it into place (`swap_in`), fsync the parent (with
        `fsync`), remove the checkpoint it replaced. `at(step)` hears each step as it starts,
        so that a failure or a hang is reported at the step it happened in."""
        at("rename")
        replaced = self.swap_in()
        if fsync:
            at("fsync_dir")
            self.sync_parent()
        if replaced is not None:
            self.remove(replaced)

    def remove(self, name: str) -> bool:
        """Remove `name` (the staging dir, or the replaced checkpoint) beside the destination;
        whether it is gone.

        Never raises: what cannot be removed now is logged, and the next save's cleanup of
        crashed saves gets another chance.
        """
        try:
            if remove_tree(self.parent_fd, name):
                return True
            log.warning("could not remove all of %s in %s", name, self.parent)
        except OSError as error:
            log.warning("could not remove %s in %s: %s", name, self.parent, error)
        return False

    def close(self) -> None:
        """Close the descriptors; the staging directory is removed unless it was published."""
        identity = self.claimed
        for claimed in (self.claimed, self.replaced):
            if claimed is not None:
                unclaim(claimed)
        self.claimed = self.replaced = None
        if self.replaced_fd is not None:
            os.close(self.replaced_fd)
            self.replaced_fd = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.created and not self.published:
            if not self.remove(self.staging) and identity is not None:
                # Left by this very attempt: the next attempt removes it, however young.
                CLAIMS.abandon(identity, self.parent)
            self.created = False
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1
