"""The save path's interface for the integrations: commit a checkpoint, and decide what a
failure means next. The DCP, Lightning and Hugging Face integrations use this module and
nothing else of `fsprobe.saving`; see docs/design.md, "The integration API".

Committing a directory (what DCP's writer does across its calls):

1. **stage**: ``Staging(destination)`` makes the hidden staging directory beside the
   destination, closed to others while it is filled;
2. **write**: the framework writes into ``staging.path`` (retrying a file on a transient error
   as `failure_of` says), steps reported to a `Progress`;
3. **sync**: ``staging.sync()`` fsyncs every file and directory (``sync_file_at`` one file);
4. **publish**: ``staging.publish(fsync, progress.at)`` renames it into place, replacing the
   previous checkpoint only now; ``staging.close()`` removes it on any other way out.

Around the attempts, a `RetryState` decides (``start`` makes one and runs the preflight):
``failed(failure)`` says what comes next (a `NextAttempt`: where and after how long; None:
give up), ``follow`` takes it, ``error()`` is the `SaveError` of a save that gave up, and
``committed(state, nbytes, digest)`` makes the `SaveResult` of a save that succeeded.
`run_attempts` is that loop for a save made in one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from fsprobe.posix.staging import Staging
from fsprobe.posix.tree import sync_file_at
from fsprobe.redirect.manifest import sha256_of, sha256_of_directory
from fsprobe.saving.deadline import Progress
from fsprobe.saving.options import (
    DEFAULT_ATTEMPTS,
    DEFAULT_TIMEOUT,
    NEED_INODES,
    OPTION_NAMES,
    Backoff,
    SaveOptions,
    save_options,
    split_keywords,
)
from fsprobe.saving.preflight import NEED_MARGIN, Decision, SaveContext, default_context
from fsprobe.saving.retry import (
    FailedAttempt,
    NextAttempt,
    RetryState,
    SaveError,
    SaveResult,
    collective_failure,
    deciding,
    failure_of,
)
from fsprobe.saving.stale import clean_directory

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_TIMEOUT",
    "NEED_INODES",
    "NEED_MARGIN",
    "OPTION_NAMES",
    "Backoff",
    "Decision",
    "FailedAttempt",
    "NextAttempt",
    "Progress",
    "RetryState",
    "SaveContext",
    "SaveError",
    "SaveOptions",
    "SaveResult",
    "SaveSteps",
    "Staging",
    "clean_directory",
    "collective_failure",
    "committed",
    "deciding",
    "default_context",
    "failure_of",
    "run_attempts",
    "save_options",
    "sha256_of",
    "sha256_of_directory",
    "split_keywords",
    "start",
    "sync_file_at",
]


class SaveSteps(NamedTuple):
    """What one kind of save does in the loop of `run_attempts`.

    `write(destination)` makes one attempt and returns the bytes written, raising
    `FailedAttempt` for an I/O failure (anything else it raises ends the save as it is);
    `clean(directory)` removes the leftovers of crashed saves there, once per directory before
    the first attempt into it; `digest(destination)` is the sha256 that the fallback's
    manifest records for a redirected save.
    """

    write: Callable[[str], int]
    clean: Callable[[str], object]
    digest: Callable[[str], str]


def start(
    path: str | os.PathLike[str],
    options: SaveOptions,
    ranks: int = 1,
    context: SaveContext | None = None,
) -> RetryState:
    """The `RetryState` of a new save of `path`, its preflight run (`SaveError` if it says
    ``fail``): its `destination` is where the first attempt goes."""
    state = RetryState(os.path.abspath(os.fspath(path)), options, ranks, context)
    state.preflight()
    return state


def committed(state: RetryState, nbytes: int, digest: Callable[[str], str]) -> SaveResult:
    """The attempt at `state.destination` is published with `nbytes`: its `SaveResult`, and
    the size remembered as the default need of the next save there."""
    result = state.succeeded(nbytes, digest)
    state.context.remember_save(state.requested, nbytes)
    return result


def run_attempts(
    path: str | os.PathLike[str],
    options: SaveOptions,
    steps: SaveSteps,
    context: SaveContext | None = None,
) -> SaveResult:
    """Save `path`: preflight, then attempt until one succeeds or the attempts give up
    (`SaveError`, also when the preflight says ``fail``)."""
    state = start(path, options, context=context)
    cleaned: set[str] = set()
    while True:
        try:
            try:
                state.prepare(steps.clean, cleaned)
            except OSError as error:
                raise FailedAttempt.of(error, "mkdir") from error
            nbytes = steps.write(state.destination)
        except FailedAttempt as failure:
            plan = state.failed(failure)
            if plan is None:
                raise state.error() from None
            state.follow(plan)
            continue
        return committed(state, nbytes, steps.digest)
