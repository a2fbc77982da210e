"""The save path's interface for the integrations (names only, defined elsewhere in `saving/`):
commit a checkpoint directory (`Staging`: stage, write, sync, publish), and the attempts around
it (`start` and a `RetryState`, `attempt_until_done`, `failure_of`). docs/design.md §12.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsprobe.posix.staging import Staging
from fsprobe.posix.tree import sync_file_at
from fsprobe.redirect.manifest import sha256_of, sha256_of_directory
from fsprobe.saving.context import SaveContext, default_context
from fsprobe.saving.deadline import Progress
from fsprobe.saving.options import (
    DEFAULT_ATTEMPTS,
    DEFAULT_TIMEOUT,
    OPTION_NAMES,
    Backoff,
    SaveOptions,
    save_options,
    split_keywords,
)
from fsprobe.saving.preflight import NEED_MARGIN, Decision
from fsprobe.saving.retry import (
    FailedAttempt,
    NextAttempt,
    RetryState,
    SaveError,
    SaveResult,
    SaveSteps,
    attempt_until_done,
    collective_failure,
    deciding,
    failure_of,
    run_attempts,
    start,
)

if TYPE_CHECKING:  # for type checkers only, as in `saving/options.py`
    from fsprobe.saving.options import SaveOverrides as SaveOverrides

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_TIMEOUT",
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
    "attempt_until_done",
    "collective_failure",
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
