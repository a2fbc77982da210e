"""Lightning's `ModelCheckpoint`, its lookups seeing the checkpoints fsprobe redirected.

``fit(ckpt_path="last")`` lists the checkpoint directory through the callback before any
`CheckpointIO` is asked (docs/integrations.md); apart from `lightning` because it needs the full
Lightning, not only ``lightning.fabric``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from fsprobe.integrations.lightning import FsprobeCheckpointIO, is_local
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate
from fsprobe.redirect.manifest import pending


def fallbacks_of(trainer: Trainer) -> tuple[str, ...]:
    """The fallback directories of `trainer`'s `FsprobeCheckpointIO` and of the environment."""
    io = trainer.strategy.checkpoint_io
    given = io.options.fallback_dirs if isinstance(io, FsprobeCheckpointIO) else ()
    return all_fallback_dirs(given)


class FsprobeModelCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` whose last-checkpoint lookup and version counter count the copies
    fsprobe redirected, as Lightning counts the files in its directory.

    ``fit(ckpt_path="last")`` resumes from the newest ``last*.ckpt`` wherever it landed (its
    redirected copy is the path Lightning loads and names), and a checkpoint name taken by a
    redirected copy gets Lightning's ``-v1`` as one taken at the target does. The fallback
    directories are the trainer's `FsprobeCheckpointIO`'s (and ``FSPROBE_FALLBACK_DIRS``).
    Its state in a checkpoint is `ModelCheckpoint`'s, under `ModelCheckpoint`'s key: a run
    saved by either resumes with either.
    """

    @property
    def state_key(self) -> str:
        key = super().state_key
        ours = f"{FsprobeModelCheckpoint.__qualname__}{{"
        if key.startswith(ours):  # not a subclass of this one: that names itself
            key = f"{ModelCheckpoint.__qualname__}{{{key[len(ours) :]}"
        return key

    def _find_last_checkpoints(self, trainer: Trainer) -> set[str]:
        found = super()._find_last_checkpoints(trainer)
        # ModelCheckpoint's own resolution of its directory (dirpath, else the logger's).
        directory = self._ModelCheckpoint__resolve_ckpt_dir(trainer)  # type: ignore[attr-defined]
        if not is_local(directory):
            return found
        fallbacks = fallbacks_of(trainer)
        directory = os.path.abspath(directory)
        last = re.compile(rf"^{re.escape(self.CHECKPOINT_NAME_LAST)}(-(\d+))?")
        for entry in pending(fallbacks, mine=True):
            path = Path(entry.requested)
            in_directory = str(path.parent) == directory and path.suffix == self.FILE_EXTENSION
            if in_directory and last.match(path.stem):
                found.add(entry.requested)
        located = {locate(path, fallback_dirs=fallbacks) for path in found}
        return {path for path in located if os.path.isfile(path)}

    def file_exists(self, filepath: Any, trainer: Trainer) -> bool:
        if trainer.is_global_zero and is_local(filepath):
            filepath = locate(filepath, fallback_dirs=fallbacks_of(trainer))
        return super().file_exists(filepath, trainer)
