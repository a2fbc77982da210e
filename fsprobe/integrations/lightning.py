"""Lightning: a ``CheckpointIO`` plugin that saves checkpoints through `fsprobe.atomic_write`.

Loads and removals know redirected copies (docs/integrations.md); remote paths go to
Lightning's own implementation. Needs only ``lightning.fabric``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fsprobe import SaveOptions, atomic_write
from fsprobe.extras import import_extra, is_missing, missing_extra
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate
from fsprobe.redirect.manifest import forget
from fsprobe.saving.commit import SaveResult, save_options

torch = import_extra("torch", "lightning", __name__)
if TYPE_CHECKING:  # the standalone package's class below is a copy of this one
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from typing_extensions import Unpack

    from fsprobe.saving.commit import SaveOverrides
else:
    try:
        from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    except ImportError:  # only the standalone pytorch_lightning / lightning_fabric packages
        try:
            from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
        except ModuleNotFoundError as error:
            if not is_missing(error, "lightning_fabric"):
                raise
            raise missing_extra("lightning", "lightning", __name__) from None


def is_local(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a local path (no ``scheme://``), the only kind fsprobe saves."""
    return "://" not in os.fspath(path)


class FsprobeCheckpointIO(TorchCheckpointIO):
    """Save, load and remove checkpoints the fsprobe way; `last_result` is the last save's.

    `options` and keyword overrides are a save's (`fsprobe.SaveOptions`), made here: a wrong
    one is a TypeError or ValueError now, not at the first checkpoint hours into the run.
    Lightning gets the paths it gave (a `Path` stays a `Path`), but for a redirected copy.
    """

    def __init__(
        self, options: SaveOptions | None = None, **overrides: Unpack[SaveOverrides]
    ) -> None:
        super().__init__()
        self.options = save_options(options, overrides)
        self.last_result: SaveResult | None = None

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | Path,
        storage_options: Any | None = None,
    ) -> None:
        if storage_options is not None or not is_local(path):
            # Lightning's own refusal of storage_options (its wording), or a remote path.
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.last_result = atomic_write(
            path, lambda stream: torch.save(checkpoint, stream), options=self.options
        )

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable[..., Any] | Any | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load `path`, or its redirected copy when that one is newer (not yet synced back)."""
        if is_local(path):
            where = locate(path, fallback_dirs=self.options.fallback_dirs)
            if where != os.path.abspath(path):
                path = where
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Remove `path` and any redirected copy of it, with its manifest entry."""
        super().remove_checkpoint(path)
        if is_local(path):
            forget(os.fspath(path), all_fallback_dirs(self.options.fallback_dirs))
