"""Lightning: a ``CheckpointIO`` plugin that saves checkpoints through `fsprobe.atomic_write`.

Loads and removals know redirected copies (docs/integrations.md); remote paths go to
Lightning's own implementation. Needs only ``lightning.fabric``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

from fsprobe import atomic_write
from fsprobe.extras import import_extra, is_missing, missing_extra
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate
from fsprobe.redirect.manifest import forget
from fsprobe.saving.commit import DEFAULT_ATTEMPTS, SaveResult

torch = import_extra("torch", "lightning", __name__)
if TYPE_CHECKING:  # the standalone package's class below is a copy of this one
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
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


def _is_local(path: str | os.PathLike[str]) -> bool:
    return "://" not in os.fspath(path)


class FsprobeCheckpointIO(TorchCheckpointIO):
    """Save, load and remove checkpoints the fsprobe way; `last_result` is the last save's.

    `attempts`, `fallback_dirs` and `max_wait` mean what they mean for `fsprobe.save`; further
    keyword arguments (``backoff``, ``state_dir``, ``timeout``, ``on_unhealthy``...) are passed
    to `fsprobe.atomic_write` as they are.
    """

    def __init__(
        self,
        attempts: int = DEFAULT_ATTEMPTS,
        fallback_dirs: Iterable[str | os.PathLike[str]] = (),
        max_wait: float = 0.0,
        **atomic_write_kwargs: Any,
    ) -> None:
        super().__init__()
        # A misspelt option must fail here, not at the first checkpoint hours into the run.
        inspect.signature(atomic_write).bind_partial(
            attempts=attempts, fallback_dirs=fallback_dirs, max_wait=max_wait, **atomic_write_kwargs
        )
        self.attempts = attempts
        self.fallback_dirs = tuple(os.fspath(d) for d in fallback_dirs)
        self.max_wait = max_wait
        self.atomic_write_kwargs = atomic_write_kwargs
        self.last_result: SaveResult | None = None

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        if storage_options is not None or not _is_local(path):
            # Lightning's own refusal of storage_options (its wording), or a remote path.
            super().save_checkpoint(checkpoint, os.fspath(path), storage_options=storage_options)
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.last_result = atomic_write(
            path, lambda stream: torch.save(checkpoint, stream), **self.save_options()
        )

    def save_options(self) -> dict[str, Any]:
        """The keyword arguments of every save made through this plugin."""
        return {
            "attempts": self.attempts,
            "fallback_dirs": self.fallback_dirs,
            "max_wait": self.max_wait,
            **self.atomic_write_kwargs,
        }

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Callable[..., Any] | Any | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load `path`, or its redirected copy when that one is newer (not yet synced back)."""
        if _is_local(path):
            path = locate(path, fallback_dirs=self.fallback_dirs)
        return super().load_checkpoint(
            os.fspath(path), map_location=map_location, weights_only=weights_only
        )

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Remove `path` and any redirected copy of it, with its manifest entry."""
        super().remove_checkpoint(os.fspath(path))
        if _is_local(path):
            forget(os.fspath(path), all_fallback_dirs(self.fallback_dirs))
