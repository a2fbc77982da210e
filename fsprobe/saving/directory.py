"""`fsprobe.save_dir()`: a checkpoint directory, committed whole or not at all, through a
staging directory beside it (`fsprobe.posix.staging`); one attempt is docs/design.md §7.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from fsprobe.posix.staging import Staging, open_parent
from fsprobe.posix.tree import opened, remove_tree
from fsprobe.redirect.manifest import sha256_of_directory
from fsprobe.saving.context import SaveContext
from fsprobe.saving.deadline import Progress, bounded
from fsprobe.saving.options import SaveOptions, save_options
from fsprobe.saving.retry import FailedAttempt, SaveResult, SaveSteps, failure_of, run_attempts

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.options import SaveOverrides

log = logging.getLogger("fsprobe.save")


def write_directory_once(
    final: str, write: Callable[[str], object], fsync: bool, progress: Progress
) -> int:
    """One attempt: staging dir, write, fsync all, publish, fsync parent. Returns the bytes.

    Raises `FailedAttempt` for an I/O failure; anything else `write` raises (a bug) is
    re-raised as it is. The staging directory is removed on every way out but success, and
    an attempt that its save abandoned at the deadline (`progress`) publishes nothing.
    """
    progress.step = "mkdir"
    try:
        staging = Staging(final)
    except OSError as error:
        raise FailedAttempt.of(error, "mkdir") from error
    try:
        progress.made(functools.partial(_remove_staging, staging))
        try:
            progress.step = "write"
            write(staging.path)
        except Exception as error:
            failure = failure_of(error, "write", where=staging.path)
            if failure is None:
                raise
            try:
                raise failure from error
            finally:  # no reference cycle through this frame (`fsprobe.saving.stale`)
                del failure
        progress.step = "fsync"
        size = staging.sync() if fsync else staging.measure()
        progress.publishing()
        staging.publish(fsync, progress.at)
        return size.bytes
    except OSError as error:
        raise FailedAttempt.of(error, progress.step) from error
    finally:
        staging.close()


def _remove_staging(staging: Staging) -> None:
    """Remove the staging directory from the thread that waits for an attempt it abandons
    (`fsprobe.saving.deadline.Progress.interrupt`): through a descriptor of its own, since the
    attempt's thread may close the staging's any moment."""
    try:
        with opened(open_parent(staging.parent)) as parent:
            if not remove_tree(parent, staging.staging):
                log.warning("could not remove all of %s", staging.path)
    except OSError as error:
        log.warning("could not remove %s: %s", staging.path, error)


def save_dir(
    path: str | os.PathLike[str],
    write: Callable[[str], object],
    *,
    options: SaveOptions | None = None,
    context: SaveContext | None = None,
    **overrides: Unpack[SaveOverrides],
) -> SaveResult:
    """Save the directory `path` whole through `write(staging_dir)`, retrying and redirecting.

    `path` is the checkpoint directory itself (``ckpt/step-100``), which need not exist yet;
    the preflight judges the directory that holds it, where the staging directory goes.
    `write` gets the path of an empty hidden directory beside `path` and fills it (any files,
    any sub-directories); it is called again from scratch, with a fresh directory, on every
    attempt. `need_bytes` defaults to the size of the last directory saved there (times 1.1);
    `options`, the keyword overrides and `context` are those of `fsprobe.atomic_write`
    (`save_timeout` bounds each attempt, `write` included). Raises `SaveError` when every
    attempt failed; `path` is then as it was before.
    """
    chosen = save_options(options, overrides)
    return run_attempts(
        path,
        chosen,
        SaveSteps(
            write=functools.partial(
                bounded,
                chosen.save_timeout,
                lambda destination, progress: write_directory_once(
                    destination, write, chosen.fsync, progress
                ),
            ),
            digest=sha256_of_directory,
        ),
        context,
    )
