"""Lightning strategies whose checkpoints are directories, committed whole by fsprobe.

They run the strategy's own `save_checkpoint` into a collective `save_dir` (docs/integrations.md);
apart from `lightning` because they need the full Lightning and its model-parallel strategy.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, ParallelStrategy
from torch.distributed.checkpoint.api import CheckpointException

from fsprobe import distributed as collective
from fsprobe import save_dir
from fsprobe.errors import errno_code
from fsprobe.integrations.lightning import FsprobeCheckpointIO
from fsprobe.redirect.locate import locate
from fsprobe.saving.commit import SaveOptions, SaveResult, failure_of

_DEFAULTS = SaveOptions()


def _io_error_of(error: CheckpointException, staging: str) -> OSError | None:
    """DCP's error for a failed save, as the I/O error of the first rank it names.

    DCP gathers every rank's exception into one `CheckpointException`, raised on every rank;
    the gathering pickles them, which drops the OSError that torch had chained, so the errno
    is read the way `failure_of` reads it without one (a full target is still ENOSPC). Each
    rank turns the error into the same OSError, so that the collective save sees an I/O
    failure to retry or redirect; None when some rank failed for another reason (a bug, to be
    raised as it is).
    """
    first: OSError | None = None
    for rank, (exception, _trace) in sorted(error.failures.items()):
        failure = failure_of(exception, "write", where=staging)
        if failure is None:
            return None
        if first is None:
            first = OSError(errno_code(failure.errno), f"rank {rank}: {failure.message}")
    return first


class DirectoryCheckpoints(ParallelStrategy):
    """Mixin for a Lightning strategy that saves directories: see the module docstring.

    A subclass names the strategy second (``class S(DirectoryCheckpoints, FSDPStrategy)``):
    what this calls on `super()` is that strategy's. It says when its checkpoint is a
    directory (`writes_directory`). `last_result` is the `SaveResult` of the last directory
    saved.
    """

    last_result: SaveResult | None = None

    def writes_directory(self) -> bool:
        raise NotImplementedError

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = FsprobeCheckpointIO()
        return super().checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: CheckpointIO) -> None:
        self._checkpoint_io = io

    def _options(self) -> SaveOptions:
        """The `FsprobeCheckpointIO`'s options, but for a file's own need."""
        io = self.checkpoint_io
        if not isinstance(io, FsprobeCheckpointIO):
            return _DEFAULTS
        return dataclasses.replace(
            io.options, need_bytes=_DEFAULTS.need_bytes, need_inodes=_DEFAULTS.need_inodes
        )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not self.writes_directory():
            super().save_checkpoint(checkpoint, filepath, storage_options)  # refused or a file
            return
        requested = self.broadcast(os.path.abspath(os.fspath(filepath)))
        if self.is_global_zero:  # Lightning creates the checkpoint's directory as it saves
            os.makedirs(os.path.dirname(requested), exist_ok=True)
        save = super().save_checkpoint

        def write(staging: str) -> None:
            try:
                save(dict(checkpoint), staging)  # a copy: Lightning pops what it writes
            except CheckpointException as error:
                translated = _io_error_of(error, staging)
                if translated is None:
                    raise
                raise translated from error

        if dist.is_available() and dist.is_initialized():
            self.last_result = collective.save_dir(requested, write, options=self._options())
        else:
            self.last_result = save_dir(requested, write, options=self._options())

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Load `checkpoint_path`, or its newer redirected copy (rank 0 decides for all)."""
        where = os.fspath(checkpoint_path)  # on the other ranks, replaced by rank 0's
        if self.is_global_zero:
            where = locate(checkpoint_path, fallback_dirs=self._options().fallback_dirs)
        return super().load_checkpoint(self.broadcast(where), *args, **kwargs)


class FsprobeModelParallelStrategy(DirectoryCheckpoints, ModelParallelStrategy):
    """`ModelParallelStrategy` whose distributed checkpoints are fsprobe directory saves."""

    def writes_directory(self) -> bool:
        return self._save_distributed_checkpoint


class FsprobeFSDPStrategy(DirectoryCheckpoints, FSDPStrategy):
    """`FSDPStrategy` whose sharded checkpoints are fsprobe directory saves."""

    def writes_directory(self) -> bool:
        return self._state_dict_type == "sharded"
