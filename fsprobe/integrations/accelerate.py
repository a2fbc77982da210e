"""Accelerate: every `Accelerator.save_state` saved whole (`protect`), `load_state` finding it.

`save_state` is wrapped, never rewritten: docs/design.md §12; usage in docs/integrations.md.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fsprobe.extras import extra_imports

with extra_imports("accelerate", __name__, "torch", "accelerate"):
    import torch.distributed as dist
    from accelerate import Accelerator

from fsprobe import SaveOptions, save_dir
from fsprobe import distributed as collective
from fsprobe.posix.tree import remove_checkpoint
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate, newest_directory, numbered_checkpoints
from fsprobe.redirect.manifest import forget
from fsprobe.saving.commit import OPTION_NAMES, SaveContext, SaveResult, save_options

log = logging.getLogger("fsprobe.accelerate")

#: Accelerate's automatically named checkpoints: ``<project_dir>/checkpoints/checkpoint_<n>``.
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)$")
_SAVE_DIR_PARAMETERS = OPTION_NAMES | {"options", "context"}
_COLLECTIVE_PARAMETERS = _SAVE_DIR_PARAMETERS | {"process_group"}
_NOT_OPTIONS = ("path", "write")  # what protect() gives save_dir itself
#: The attribute of a protected accelerator that holds its protection: the accelerator owns it.
_PROTECTION = "_fsprobe_protected_state"


def protect(accelerator: Accelerator, **save_dir_kwargs: Any) -> Accelerator:
    """Make every `accelerator.save_state` a directory save; returns `accelerator`.

    `save_dir_kwargs` are the options of `fsprobe.save_dir` (``fallback_dirs``, ``attempts``,
    ``max_wait``, ``backoff``, ``state_dir``..., or one ``options=SaveOptions(...)``), made
    now: a wrong one fails here rather than at the first checkpoint. `load_state` then loads
    the newest copy of the checkpoint named, or with automatic naming and no argument the
    newest checkpoint wherever it landed.
    """
    unknown = [k for k in save_dir_kwargs if k not in _SAVE_DIR_PARAMETERS or k in _NOT_OPTIONS]
    if unknown:
        raise TypeError(f"protect() got unexpected keyword arguments: {', '.join(unknown)}")
    if accelerator.num_processes > 1:
        if accelerator.project_configuration.save_on_each_node:
            raise ValueError(
                "save_on_each_node: every node writes its own checkpoint to its own disk, "
                "which one collective save cannot commit; fsprobe protects shared storage"
            )
        alone = [k for k in save_dir_kwargs if k not in _COLLECTIVE_PARAMETERS]
        if alone:
            raise TypeError(f"a save by many processes takes no {', '.join(alone)}")
    given = dict(save_dir_kwargs)
    context = given.pop("context", None)
    options = save_options(given.pop("options", None), given)
    if _PROTECTION in vars(accelerator):
        raise ValueError("this accelerator's checkpoints are protected already")
    setattr(accelerator, _PROTECTION, _ProtectedState(accelerator, options, context))
    return accelerator


def protected_results(accelerator: Accelerator) -> list[SaveResult]:
    """The `SaveResult` of every checkpoint `accelerator` saved since `protect(accelerator)`."""
    protection: _ProtectedState | None = vars(accelerator).get(_PROTECTION)
    if protection is None:
        raise ValueError("this accelerator's checkpoints are not protected: call protect()")
    return list(protection.results)


def last_checkpoint(
    checkpoints_dir: str | os.PathLike[str], fallback_dirs: Iterable[str | os.PathLike[str]] = ()
) -> str | None:
    """The newest ``checkpoint_<n>`` of `checkpoints_dir` (``<project_dir>/checkpoints``)
    wherever it landed, at its newest copy (`fsprobe.locate`); None when there is none."""
    fallbacks = all_fallback_dirs(fallback_dirs)
    return newest_directory(_checkpoints_in(checkpoints_dir, fallbacks), fallbacks)


def _checkpoints_in(directory: str | os.PathLike[str], fallbacks: tuple[str, ...]) -> list[str]:
    """The ``checkpoint_<n>`` paths of `directory` (absolute, oldest first, by n) that exist
    there or redirected to `fallbacks` (not synced back yet)."""
    return numbered_checkpoints(directory, _CHECKPOINT_NAME, fallbacks)


def _files_in(directory: str) -> set[str]:
    """Every file below `directory` (our own staging directory), relative to it."""
    return {
        os.path.relpath(os.path.join(parent, name), directory)
        for parent, _, names in os.walk(directory)
        for name in names
    }


class _ProtectedState:
    """What `protect` installs on one accelerator: `save_state` staged and committed whole,
    `load_state` from where the checkpoint landed."""

    def __init__(
        self, accelerator: Accelerator, options: SaveOptions, context: SaveContext | None
    ) -> None:
        self.accelerator = weakref.proxy(accelerator)  # the accelerator holds this
        self.options, self.context = options, context
        self.fallbacks = all_fallback_dirs(options.fallback_dirs)
        self.results: list[SaveResult] = []
        save, load = accelerator.save_state, accelerator.load_state
        replacements = {
            "save_state": functools.wraps(save)(functools.partial(self.save_state, save)),
            "load_state": functools.wraps(load)(functools.partial(self.load_state, load)),
        }
        for name, replacement in replacements.items():
            setattr(accelerator, name, replacement)  # this accelerator's own, not its class's

    def save_state(
        self,
        original: Callable[..., Any],
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        **save_model_func_kwargs: Any,
    ) -> Path:
        """`Accelerator.save_state`, its files written into a staging directory by Accelerate's
        own code, once per attempt, and published whole."""
        accelerator, config = self.accelerator, self.accelerator.project_configuration
        automatic = config.automatic_checkpoint_naming
        if automatic:
            run_dir = os.path.join(accelerator.project_dir, "checkpoints")
            checkpoint = os.path.join(run_dir, f"checkpoint_{accelerator.save_iteration}")
            if os.path.exists(locate(checkpoint, fallback_dirs=self.fallbacks)):
                raise ValueError(  # Accelerate's own refusal, wherever the checkpoint landed
                    f"Checkpoint directory {checkpoint} ({accelerator.save_iteration}) already "
                    "exists. Please manually override `self.save_iteration` with what "
                    "iteration to start with."
                )
            if accelerator.is_main_process:  # Accelerate makes room before it saves ...
                self._rotate(run_dir, config.total_limit, incoming=1)
            accelerator.wait_for_everyone()
        elif output_dir is None:  # Accelerate's own error
            return Path(original(output_dir, safe_serialization, **save_model_func_kwargs))
        else:
            checkpoint = os.path.expanduser(os.fspath(output_dir))
        os.makedirs(os.path.dirname(os.path.abspath(checkpoint)), exist_ok=True)
        iteration = config.iteration

        def write(staging: str) -> None:
            config.iteration = iteration  # Accelerate counts each call: one save is one
            config.automatic_checkpoint_naming = False  # so that it writes into `staging`
            try:
                original(staging, safe_serialization, **save_model_func_kwargs)
            finally:
                config.automatic_checkpoint_naming = automatic

        result = self._save(checkpoint, write)
        config.iteration = iteration + 1
        self.results.append(result)
        if result.redirected:
            log.warning(
                "fsprobe: checkpoint %s was redirected to %s; `fsprobe sync` brings it back, "
                "load_state() finds it",
                result.requested_path,
                result.path,
            )
        if automatic and accelerator.is_main_process:  # ... and only this one is whole
            self._rotate(run_dir, config.total_limit, incoming=0)
        return Path(result.path)

    def _save(self, checkpoint: str, write: Callable[[str], None]) -> SaveResult:
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:

            def write_mine(staging: str) -> list[str]:
                before = _files_in(staging)
                write(staging)
                return sorted(_files_in(staging) - before)  # this process fsyncs its own

            return collective.save_dir(
                checkpoint, write_mine, options=self.options, context=self.context
            )
        return save_dir(checkpoint, write, options=self.options, context=self.context)

    def _rotate(self, run_dir: str, limit: int | None, incoming: int) -> None:
        """Accelerate's ``total_limit``, over the target and the fallbacks together: the
        oldest checkpoints go (from both, with their manifest entries) until `incoming` more
        fit, but never the newest, the last good one, before the next is whole."""
        if limit is None:
            return
        checkpoints = _checkpoints_in(run_dir, self.fallbacks)
        excess = max(0, min(len(checkpoints) + incoming - limit, len(checkpoints) - 1))
        for checkpoint in checkpoints[:excess]:
            log.info("fsprobe: deleting %s (total_limit=%d)", checkpoint, limit)
            remove_checkpoint(checkpoint)  # only this user's: not what others put there
            forget(checkpoint, self.fallbacks)

    def load_state(
        self,
        original: Callable[..., Any],
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> Any:
        """`Accelerator.load_state` from the newest copy of `input_dir`, or with automatic
        naming and no `input_dir`, from the newest checkpoint wherever it landed."""
        accelerator = self.accelerator
        if input_dir is not None:
            given = os.path.expanduser(os.fspath(input_dir))
            where = locate(given, fallback_dirs=self.fallbacks)
            if where != os.path.abspath(given):
                input_dir = where
        elif accelerator.project_configuration.automatic_checkpoint_naming:
            run_dir = os.path.join(accelerator.project_dir, "checkpoints")
            input_dir = last_checkpoint(run_dir, self.fallbacks)  # None: Accelerate's error
        return original(input_dir, load_kwargs, **load_model_func_kwargs)
