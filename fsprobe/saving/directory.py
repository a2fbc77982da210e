"""`fsprobe.save_dir()`: a checkpoint directory, committed whole or not at all.

Hugging Face writes ``checkpoint-N/``, DCP a directory of shards and a ``.metadata``: a
checkpoint that is many files. One attempt (DESIGN §7): remove the leftovers of crashed saves;
create a hidden staging directory beside the destination (same filesystem, named like a temp
file so that no checkpoint glob matches it); let `write(staging_dir)` fill it; fsync every file
and then every directory in it, bottom up; put it in place with one rename (`fsprobe.saving.swap`:
an existing checkpoint of the same name is replaced only now, when the new one is complete);
fsync the parent directory; remove the old checkpoint. A failure at any step removes the staging
directory and leaves the previous checkpoint as it was; the retries and redirects around the
attempts are those of every save (`fsprobe.saving.retry`).

While `write` fills it, the staging directory is closed to everyone but its owner (even with a
group-writable umask), so that nothing another user plants can become part of the checkpoint;
it gets the mode a plain `mkdir` would have given it when it is published.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable

from fsprobe.atomic import claim, hostname, is_live_here, parse_temp_name, temp_name, unclaim
from fsprobe.saving.deadline import Progress, bounded
from fsprobe.saving.manifest import sha256_of_directory
from fsprobe.saving.preflight import DEFAULT_TIMEOUT
from fsprobe.saving.retry import (
    DEFAULT_ATTEMPTS,
    Attempt,
    Backoff,
    FailedAttempt,
    SaveOptions,
    SaveResult,
    failure_of,
    run_attempts,
)
from fsprobe.saving.stale import is_stale, remove_stale_temps, writer_alive
from fsprobe.saving.swap import (
    exchange,
    parse_retired_name,
    replace_if_unchanged,
    replace_in_two_steps,
    restore_or_remove_retired,
)
from fsprobe.saving.tree import (
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

    def __init__(self, final: str) -> None:
        self.final = final
        self.parent, self.name = os.path.split(final)
        self.staging = temp_name(self.name)
        self.path = os.path.join(self.parent, self.staging)
        self.parent_fd = open_parent(self.parent)
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
        the filesystem cannot exchange (`fsprobe.saving.swap`).
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

    def remove(self, name: str) -> None:
        """Remove `name` (the staging dir, or the replaced checkpoint) beside the destination.

        Never raises: what cannot be removed now is logged, and the next save's cleanup of
        crashed saves gets another chance.
        """
        try:
            if not remove_tree(self.parent_fd, name):
                log.warning("could not remove all of %s in %s", name, self.parent)
        except OSError as error:
            log.warning("could not remove %s in %s: %s", name, self.parent, error)

    def close(self) -> None:
        """Close the descriptors; the staging directory is removed unless it was published."""
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
            self.remove(self.staging)
            self.created = False
        if self.parent_fd >= 0:
            os.close(self.parent_fd)
            self.parent_fd = -1


def write_directory_once(
    final: str, write: Callable[[str], object], fsync: bool, progress: Progress
) -> int:
    """One attempt: staging dir, write, fsync all, publish, fsync parent. Returns the bytes.

    Raises `FailedAttempt` for an I/O failure; anything else `write` raises (a bug) is
    re-raised as it is. The staging directory is removed on every way out but success, and
    an attempt that its save abandoned at the deadline (`progress`) publishes nothing.
    """
    progress.at("mkdir")
    try:
        staging = Staging(final)
    except OSError as error:
        raise FailedAttempt.of(error, "mkdir") from error
    try:
        try:
            progress.at("write")
            write(staging.path)
        except Exception as error:
            failure = failure_of(error, "write", where=staging.path)
            if failure is None:
                raise
            raise failure from error
        progress.at("fsync")
        size = staging.sync() if fsync else staging.measure()
        progress.before_publishing()
        staging.publish(fsync, progress.at)
        return size.bytes
    except OSError as error:
        raise FailedAttempt.of(error, progress.step) from error
    finally:
        staging.close()


def remove_stale_staging(directory: str) -> None:
    """Clean up after crashed directory saves in `directory`: their staging directories, and
    checkpoints they retired (restored if nothing took their place, removed otherwise).

    The authorship rule of temp files (`fsprobe.saving.stale`), applied to directories owned by
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
                with opened(open_directory(name, parent_fd)) as fd:
                    alive = True if is_live_here(os.fstat(fd)) else writer_alive(fd)
                    mtime = info.st_mtime
                    if writer.host != this_host:
                        mtime = measure_tree(fd).newest_mtime
                if not is_stale(writer, mtime, alive, now):
                    continue
                if retired:
                    restore_or_remove_retired(parent_fd, name, retired[1])
                elif remove_tree(parent_fd, name):
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


def save_dir(
    path: str | os.PathLike[str],
    write: Callable[[str], object],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: Backoff | None = None,
    fallback_dirs: Iterable[str | os.PathLike[str]] = (),
    max_wait: float = 0.0,
    need_bytes: int | None = None,
    need_inodes: int | None = 1,
    preflight: bool = True,
    fsync: bool = True,
    redirect: bool = True,
    on_unhealthy: str = "proceed",
    state_dir: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    save_timeout: float | None = None,
) -> SaveResult:
    """Save the directory `path` whole through `write(staging_dir)`, retrying and redirecting.

    `write` gets the path of an empty hidden directory beside `path` and fills it (any files,
    any sub-directories); it is called again from scratch, with a fresh directory, on every
    attempt. `need_bytes` defaults to the size of the last directory saved there (times 1.1);
    the other arguments are those of `fsprobe.atomic_write` (`save_timeout` bounds each
    attempt, `write` included). Raises `SaveError` when every attempt failed; `path` is then
    as it was before.
    """
    options = SaveOptions.of(
        attempts=attempts,
        backoff=backoff,
        fallback_dirs=fallback_dirs,
        redirect=redirect,
        max_wait=max_wait,
        need_bytes=need_bytes,
        need_inodes=need_inodes,
        preflight=preflight,
        on_unhealthy=on_unhealthy,
        state_dir=state_dir,
        timeout=timeout,
        save_timeout=save_timeout,
    )
    return run_attempts(
        path,
        options,
        Attempt(
            write=bounded(
                options.save_timeout,
                lambda destination, progress: write_directory_once(
                    destination, write, fsync, progress
                ),
            ),
            clean=clean_directory,
            digest=sha256_of_directory,
        ),
    )
