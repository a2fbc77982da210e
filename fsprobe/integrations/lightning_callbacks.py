"""Lightning's own checkpoint lookups seeing the checkpoints fsprobe redirected.

``fit(ckpt_path="last")`` lists the checkpoint directory through each `ModelCheckpoint`, and
``"hpc"`` (and SLURM's requeue) the trainer's root directory through its checkpoint connector,
before any `CheckpointIO` is asked (docs/integrations.md): `FsprobeModelCheckpoint` extends the
first, the connector's HPC lookup and numbering are extended when this module is imported. Apart
from `lightning` because it needs the full Lightning, not only ``lightning.fabric``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import lightning
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

from fsprobe import atomic_write
from fsprobe.integrations.lightning import FsprobeCheckpointIO, is_local
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate, numbered_checkpoints
from fsprobe.redirect.manifest import pending

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

Folder = Union[str, os.PathLike[str]]  # a runtime alias: no `|` before Python 3.10

#: The name Lightning gives an HPC checkpoint (`_CheckpointConnector.hpc_save_path`).
HPC_CHECKPOINT = re.compile(r"hpc_ckpt_(\d+)\.ckpt$")


def fallbacks_of(trainer: Trainer) -> tuple[str, ...]:
    """The fallback directories of `trainer`'s `FsprobeCheckpointIO` and of the environment."""
    io = trainer.strategy.checkpoint_io
    given = io.options.fallback_dirs if isinstance(io, FsprobeCheckpointIO) else ()
    return all_fallback_dirs(given)


def redirects(trainer: Trainer) -> bool:
    """Whether `trainer` saves through an `FsprobeCheckpointIO` (its saves may be redirected)."""
    return isinstance(trainer.strategy.checkpoint_io, FsprobeCheckpointIO)


def newest(path: str, fallbacks: tuple[str, ...]) -> str:
    """`path` (a checkpoint, or ``save_last="link"``'s symlink to one), or the redirected copy
    of the file it names when that copy is the newest."""
    linked = (
        os.path.join(os.path.dirname(path), os.readlink(path)) if os.path.islink(path) else path
    )
    found = locate(linked, fallback_dirs=fallbacks)
    return path if found == os.path.abspath(linked) else found


def copy_from(source: str, stream: SupportsWrite[bytes]) -> None:
    """Write the file `source` into `stream` (an attempt of a save)."""
    with open(source, "rb") as copied:
        shutil.copyfileobj(copied, stream)


class FsprobeModelCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` whose last-checkpoint lookup and version counter count the copies
    fsprobe redirected, as Lightning counts the files in its directory.

    ``fit(ckpt_path="last")`` resumes from the newest ``last*.ckpt`` wherever it landed (its
    redirected copy is the path Lightning loads and names; with ``save_last="link"``, the
    newest copy of the file it links to), and a checkpoint name taken by a
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
        return {
            path for path in (newest(path, fallbacks) for path in found) if os.path.isfile(path)
        }

    @staticmethod
    def _link_checkpoint(trainer: Trainer, filepath: str, linkpath: str) -> None:
        """``save_last="link"``: Lightning's symlink, else its copy at the target; when neither
        could be made (the file was redirected, the target is full), the copy saved by fsprobe.
        """
        try:
            ModelCheckpoint._link_checkpoint(trainer, filepath, linkpath)
        except OSError:  # raised on rank 0 alone, before Lightning's barrier
            io = trainer.strategy.checkpoint_io
            if not isinstance(io, FsprobeCheckpointIO) or not is_local(linkpath):
                raise
            with contextlib.suppress(FileNotFoundError):
                os.remove(linkpath)  # what Lightning's copy left (it removed the old link first)
            source = locate(filepath, fallback_dirs=fallbacks_of(trainer))
            copy = functools.partial(copy_from, source)
            io.last_result = atomic_write(linkpath, copy, options=io.options)
            trainer.strategy.barrier()

    def file_exists(self, filepath: Any, trainer: Trainer) -> bool:
        if trainer.is_global_zero and is_local(filepath):
            filepath = locate(filepath, fallback_dirs=fallbacks_of(trainer))
        return super().file_exists(filepath, trainer)


def hpc_checkpoints(trainer: Trainer, directory: Folder) -> list[str] | None:
    """The HPC checkpoints of `directory` at the target and redirected, lowest number first;
    None when `trainer` saves without fsprobe or `directory` is remote (Lightning's own then)."""
    if not redirects(trainer) or not is_local(directory):
        return None
    return numbered_checkpoints(directory, HPC_CHECKPOINT, fallbacks_of(trainer))


def number(path: str) -> int:
    """The number of the HPC checkpoint `path`."""
    found = HPC_CHECKPOINT.fullmatch(os.path.basename(path))
    assert found is not None, path
    return int(found[1])


def hpc_resume_path(
    connector: _CheckpointConnector, lightnings: Callable[[_CheckpointConnector], str | None]
) -> str | None:
    """`_CheckpointConnector._hpc_resume_path`: the highest-numbered HPC checkpoint of the
    trainer's root directory, at the target or redirected. Its path as saved: the plugin loads
    its newest copy (Lightning asks for this path two or three times, a copy's check reads it
    whole)."""
    trainer = connector.trainer
    found = hpc_checkpoints(trainer, trainer.default_root_dir)
    if found is None:
        return lightnings(connector)
    return found[-1] if found else None


def hpc_save_path(trainer: Trainer, lightnings: Callable[[Folder], str], folder: Folder) -> str:
    """`_CheckpointConnector.hpc_save_path`: Lightning's next number, or one above every HPC
    checkpoint redirected (never a number a newer redirected copy has)."""
    path = lightnings(folder)
    found = hpc_checkpoints(trainer, folder)
    if found and number(found[-1]) >= number(path):
        path = os.path.join(folder, f"hpc_ckpt_{number(found[-1]) + 1}.ckpt")
    return path


class HpcSavePath:
    """In place of the static `_CheckpointConnector.hpc_save_path`: Lightning's on the class,
    `hpc_save_path` with the connector's trainer on an instance (what the SLURM handler calls)."""

    def __init__(self, lightnings: Callable[[Folder], str]) -> None:
        self.lightnings = lightnings

    def __get__(
        self, connector: _CheckpointConnector | None, owner: type
    ) -> Callable[[Folder], str]:
        if connector is None:
            return self.lightnings
        return functools.partial(hpc_save_path, connector.trainer, self.lightnings)


def extend_hpc_lookups() -> bool:
    """Put `hpc_resume_path` and `hpc_save_path` in Lightning's checkpoint connector (the
    only Lightning class fsprobe changes in place); False, with a warning, when the connector
    is not as Lightning 2.x has it. A trainer without `FsprobeCheckpointIO` is not affected."""
    resume = inspect.getattr_static(_CheckpointConnector, "_hpc_resume_path", None)
    save = inspect.getattr_static(_CheckpointConnector, "hpc_save_path", None)
    if isinstance(save, HpcSavePath):
        return True  # extended already
    if (
        not isinstance(resume, property)
        or resume.fget is None
        or not isinstance(save, staticmethod)
    ):
        warnings.warn(
            f"fsprobe does not know Lightning {lightning.__version__}'s checkpoint connector: "
            'fit(ckpt_path="hpc") and SLURM\'s requeue resume will not find redirected HPC '
            "checkpoints (pass fsprobe.locate's path as ckpt_path)",
            stacklevel=2,
        )
        return False
    extended = property(functools.partial(hpc_resume_path, lightnings=resume.fget))
    # setattr: mypy refuses assigning another type to a class's property or method.
    setattr(_CheckpointConnector, "_hpc_resume_path", extended)  # noqa: B010
    setattr(_CheckpointConnector, "hpc_save_path", HpcSavePath(save.__func__))  # noqa: B010
    return True


extend_hpc_lookups()
