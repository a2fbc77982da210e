"""Hugging Face: the `Trainer`'s checkpoints saved whole (`protect`), and a preflight callback.

`_save_checkpoint` is wrapped, never rewritten: docs/design.md §12; usage in
docs/integrations.md. `FsprobeCallback` never raises.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from fsprobe.extras import extra_imports

with extra_imports("transformers", __name__, "torch", "transformers", "accelerate"):
    import torch.distributed as dist
    import transformers
    from transformers import (
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from fsprobe import SaveOptions, preflight, save_dir
from fsprobe import distributed as collective
from fsprobe.posix.tree import remove_checkpoint
from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.locate import locate, newest_directory, numbered_checkpoints
from fsprobe.redirect.manifest import forget
from fsprobe.saving.commit import (
    NEED_MARGIN,
    OPTION_NAMES,
    Decision,
    SaveContext,
    SaveResult,
    save_options,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.commit import SaveOverrides

log = logging.getLogger("fsprobe.transformers")

#: The Trainer's checkpoint directories are ``<output_dir>/checkpoint-<global_step>``.
CHECKPOINT_PREFIX = PREFIX_CHECKPOINT_DIR
#: The Trainer's methods that write a checkpoint's files, each given the directory first.
WRITERS = ("save_model", "_save_optimizer_and_scheduler", "_save_scaler", "_save_rng_state")
_SAVE_DIR_PARAMETERS = OPTION_NAMES | {"options", "context"}
_COLLECTIVE_PARAMETERS = _SAVE_DIR_PARAMETERS | {"process_group"}
_CHECKPOINT_NAME = re.compile(rf"^{re.escape(PREFIX_CHECKPOINT_DIR)}-(\d+)$")
_NOT_OPTIONS = ("path", "write")  # what protect() gives save_dir itself
#: The attribute of a protected trainer that holds its protection: the trainer owns it.
_PROTECTION = "_fsprobe_protected_checkpoints"


def _tree_size(directory: str) -> tuple[int, int]:
    """(bytes, entries) of a checkpoint directory, itself included among the entries."""
    total, count = 0, 1
    for parent, directories, files in os.walk(directory):
        count += len(directories) + len(files)
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total, count


def _checkpoint_at(args: TrainingArguments, state: TrainerState) -> str:
    """The ``checkpoint-N`` directory the Trainer saves at this step."""
    # Declared `str | None`, but TrainingArguments.__post_init__ always sets it.
    output_dir = cast(str, args.output_dir)
    return os.path.join(output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")


class FsprobeCallback(TrainerCallback):
    """Preflight before each save step; the decisions so far are in `decisions`.

    `options` and keyword overrides are a save's (`fsprobe.SaveOptions`), made here, for
    `fsprobe.preflight`: `need_bytes` defaults to the previous checkpoint's size times 1.1 (none
    before the first), and a target that cannot take the checkpoint is ``fail``, or
    ``redirect`` when a fallback could (only reported: the Trainer writes where it writes).
    """

    def __init__(
        self, options: SaveOptions | None = None, **overrides: Unpack[SaveOverrides]
    ) -> None:
        self.options = save_options(options, overrides)
        self.decisions: list[Decision] = []
        self._measured: tuple[int, int] | None = None  # (bytes, inodes) of the last checkpoint
        self._unreported: Decision | None = None

    # -- Trainer events ------------------------------------------------------------------------

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_save:
            self._before_save(args, state)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_save:
            self._before_save(args, state)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Measure the checkpoint just written: the need of the next one."""
        if not args.should_save:
            return
        directory = _checkpoint_at(args, state)
        try:
            if os.path.isdir(directory):
                self._measured = _tree_size(directory)
        except Exception:  # never let measuring stop the training
            log.exception("fsprobe: could not measure %s", directory)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs is not None and self._unreported is not None:
            logs["fsprobe_status"] = int(self._unreported.status)
            logs["fsprobe_action"] = self._unreported.action
            self._unreported = None

    # -- the check -----------------------------------------------------------------------------

    def _need(self) -> tuple[int | None, int | None]:
        if self._measured is None:
            return self.options.need_bytes, self.options.need_inodes
        size, inodes = self._measured
        if self.options.need_bytes is not None:
            return self.options.need_bytes, inodes
        return math.ceil(size * NEED_MARGIN), inodes

    def _before_save(self, args: TrainingArguments, state: TrainerState) -> None:
        if not args.should_save:  # only the process that writes checkpoints asks
            return
        try:
            self._report(self._decide(args, state), state)
        except Exception:
            log.exception(
                "fsprobe: the preflight before the save at step %d failed", state.global_step
            )

    def _decide(self, args: TrainingArguments, state: TrainerState) -> Decision:
        need_bytes, need_inodes = self._need()
        checkpoint = _checkpoint_at(args, state)
        return preflight(
            checkpoint,  # a path inside output_dir: output_dir is the target judged
            self.options,
            need_bytes=need_bytes,
            need_inodes=need_inodes,
            on_unhealthy="fail",
        )

    def _report(self, decision: Decision, state: TrainerState) -> None:
        self.decisions.append(decision)
        self._unreported = decision
        level = (
            logging.INFO
            if decision.action == "proceed" and not decision.concerns
            else logging.WARNING
        )
        log.log(
            level,
            "fsprobe: before the save at step %d: %s",
            state.global_step,
            decision.summary(),
        )


def protect(trainer: Trainer, **save_dir_kwargs: Any) -> Trainer:
    """Make every checkpoint `trainer` writes a directory save; returns `trainer`.

    `save_dir_kwargs` are the options of `fsprobe.save_dir` (``fallback_dirs``, ``attempts``,
    ``max_wait``, ``backoff``, ``state_dir``..., or one ``options=SaveOptions(...)``), made
    now: a wrong one fails here rather than at the first checkpoint. Works on an instance of
    `Trainer` or of any subclass (TRL's, a user's), before or after ``train()`` started; see
    the module docstring for what it changes.
    """
    unknown = [k for k in save_dir_kwargs if k not in _SAVE_DIR_PARAMETERS or k in _NOT_OPTIONS]
    if unknown:
        raise TypeError(f"protect() got unexpected keyword arguments: {', '.join(unknown)}")
    if trainer.args.world_size > 1:
        alone = [k for k in save_dir_kwargs if k not in _COLLECTIVE_PARAMETERS]
        if alone:
            raise TypeError(f"a save by many ranks takes no {', '.join(alone)}")
    given = dict(save_dir_kwargs)
    context = given.pop("context", None)
    options = save_options(given.pop("options", None), given)
    if _PROTECTION in vars(trainer):
        raise ValueError("this trainer's checkpoints are protected already")
    setattr(trainer, _PROTECTION, _ProtectedCheckpoints(trainer, options, context))
    return trainer


def last_checkpoint(
    output_dir: str | os.PathLike[str], fallback_dirs: Iterable[str | os.PathLike[str]] = ()
) -> str | None:
    """The checkpoint a resume should load: the newest ``checkpoint-N`` of `output_dir`,
    wherever it landed — in `output_dir`, or redirected to one of `fallback_dirs` (and
    ``FSPROBE_FALLBACK_DIRS``) and not synced back yet. None when there is none.

    What ``trainer.train(resume_from_checkpoint=True)`` does, except that it looks only in
    `output_dir`; pass this instead: ``resume_from_checkpoint=last_checkpoint(out, [fb])``.
    A redirected copy counts only if `fsprobe.locate` trusts it (this user's, checksum intact).
    """
    fallbacks = all_fallback_dirs(fallback_dirs)
    return newest_directory(_checkpoints_in(output_dir, fallbacks), fallbacks)


def _checkpoints_in(output_dir: str | os.PathLike[str], fallbacks: tuple[str, ...]) -> list[str]:
    """The ``checkpoint-N`` paths of `output_dir` (absolute, oldest step first) that exist
    there or redirected to `fallbacks` (not synced back yet)."""
    return numbered_checkpoints(output_dir, _CHECKPOINT_NAME, fallbacks)


def protected_results(trainer: Trainer) -> list[SaveResult]:
    """The `SaveResult` of every checkpoint `trainer` saved since `protect(trainer)`."""
    protection: _ProtectedCheckpoints | None = vars(trainer).get(_PROTECTION)
    if protection is None:
        raise ValueError("this trainer's checkpoints are not protected: call protect(trainer)")
    return list(protection.results)


def _fingerprint(path: str) -> tuple[int, int] | None:
    """What changes when something writes into the directory `path` (None: there is none)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_mtime_ns


def _files_in(directory: str) -> set[str]:
    """Every file below `directory` (our own staging directory), relative to it."""
    return {
        os.path.relpath(os.path.join(parent, name), directory)
        for parent, _, names in os.walk(directory)
        for name in names
    }


class _ProtectedCheckpoints:
    """What `protect` installs on one trainer: its checkpoints, staged and committed whole."""

    def __init__(self, trainer: Trainer, options: SaveOptions, context: SaveContext | None) -> None:
        self.trainer = weakref.proxy(trainer)  # the trainer holds this, not the other way
        self.options, self.context = options, context
        self.fallbacks = all_fallback_dirs(options.fallback_dirs)
        #: The best checkpoint that the state a resume loads names (the Trainer forgets it
        #: when it is not at its path: redirected).
        self.resumed_best: str | None = None
        #: (the checkpoint's absolute path, its staging directory) while the Trainer writes.
        self.staging: tuple[str, str] | None = None
        self.push: Callable[[str], object] | None = None  # the Hub push, deferred to the commit
        self.saving = False  # while the Trainer's _save_checkpoint runs
        self.results: list[SaveResult] = []
        self._install(trainer)

    def _install(self, trainer: Trainer) -> None:
        needed = (
            *("_save_checkpoint", "_get_output_dir", "_push_from_checkpoint", *WRITERS),
            *("_load_best_model", "_load_callback_state"),
        )
        missing = [name for name in needed if not callable(getattr(trainer, name, None))]
        if missing:
            raise TypeError(
                f"fsprobe cannot protect the checkpoints of this Trainer (transformers "
                f"{transformers.__version__}): it has no {', '.join(missing)}"
            )
        if trainer.args.save_on_each_node and trainer.args.world_size > 1:
            raise ValueError(
                "save_on_each_node: every node writes its own checkpoint to its own disk, "
                "which one collective save cannot commit; fsprobe protects shared storage"
            )
        replacements = {name: self._staged_writer(getattr(trainer, name)) for name in WRITERS}
        pushing = trainer._push_from_checkpoint
        replacements["_push_from_checkpoint"] = functools.wraps(pushing)(
            lambda folder, *args, **kwargs: self._defer_push(pushing, args, kwargs)
        )
        replacements["_save_checkpoint"] = functools.partial(
            self.save_checkpoint, trainer._save_checkpoint
        )
        replacements["_load_best_model"] = functools.partial(
            self.load_best_model, trainer._load_best_model
        )
        replacements["train"] = functools.wraps(trainer.train)(
            functools.partial(self.train, trainer.train)
        )
        replacements["_load_callback_state"] = functools.partial(
            self.load_callback_state, trainer._load_callback_state
        )
        replacements["_get_output_dir"] = functools.partial(
            self.output_dir, trainer._get_output_dir
        )
        for name, replacement in replacements.items():
            setattr(trainer, name, replacement)  # this trainer's own methods, not its class's

    # -- what the Trainer's own code calls --------------------------------------------------

    def staged(self, path: Any) -> Any:
        """`path`, moved into the staging directory if it is (in) the checkpoint being saved."""
        if self.staging is None or path is None:
            return path
        checkpoint, staging = self.staging
        full = os.path.abspath(os.fspath(path))
        if full == checkpoint:
            return staging
        if full.startswith(checkpoint + os.sep):
            return staging + full[len(checkpoint) :]
        return path

    def _staged_writer(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def write(output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            return method(self.staged(output_dir), *args, **kwargs)

        return write

    def _defer_push(
        self, push: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The Hub upload reads the files in the background: only from the published folder."""
        self.push = lambda folder: push(folder, *args, **kwargs)

    def save_checkpoint(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """The Trainer's `_save_checkpoint(model, trial)`, as one directory save."""
        trainer, state = self.trainer, self.trainer.state
        trial = kwargs.get("trial", args[1] if len(args) > 1 else None)
        run_dir = trainer._get_output_dir(trial=trial)
        given = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        checkpoint = os.path.abspath(given)
        best_before = state.best_model_checkpoint
        if state.best_global_step and state.best_global_step == state.global_step:
            # What the Trainer sets when it finds this checkpoint on disk, which it cannot
            # before the commit: its trainer_state.json must name itself as the best.
            state.best_model_checkpoint = given
        self.push = None
        self.saving = True
        try:
            result = self._save(checkpoint, lambda: original(*args, **kwargs))
        except BaseException:
            state.best_model_checkpoint = best_before
            self.push = None
            raise
        finally:
            self.saving = False
        self._after_commit(run_dir, result)

    def output_dir(self, original: Callable[..., str], trial: Any = None) -> str:
        """`Trainer._get_output_dir`. Asked outside a save once the training stopped, it is
        the end of training, where ``save_total_limit=1`` keeps the best checkpoint alone: done
        here over the target and the fallbacks, before the Trainer's own pass, which looks
        only at the target and stats the best there (FileNotFoundError when redirected)."""
        run_dir = original(trial)
        trainer = self.trainer
        if not self.saving and trainer.control.should_training_stop:
            best = trainer.state.best_model_checkpoint
            if trainer.args.should_save and best is not None and trainer.args.save_total_limit == 1:
                for checkpoint in _checkpoints_in(run_dir, self.fallbacks):
                    if checkpoint != os.path.abspath(best):
                        self._delete(checkpoint, "the best is kept alone")
        return run_dir

    # -- the save ---------------------------------------------------------------------------

    def _save(self, checkpoint: str, run_original: Callable[[], object]) -> SaveResult:
        collective_save = dist.is_available() and dist.is_initialized()
        collective_save = collective_save and dist.get_world_size() > 1

        def write(staging: str) -> list[str] | None:
            before = _files_in(staging) if collective_save else set()
            self._write_into(checkpoint, staging, run_original)
            # Each rank fsyncs the files that appeared while it wrote (its own among them).
            return sorted(_files_in(staging) - before) if collective_save else None

        if collective_save:
            return collective.save_dir(
                checkpoint, write, options=self.options, context=self.context
            )
        return save_dir(checkpoint, write, options=self.options, context=self.context)

    def _write_into(
        self, checkpoint: str, staging: str, run_original: Callable[[], object]
    ) -> None:
        """One attempt: the Trainer's code writes the checkpoint, into `staging`."""
        state = self.trainer.state
        untouched = _fingerprint(checkpoint)
        self.staging = (checkpoint, staging)
        state.save_to_json = lambda path: type(state).save_to_json(state, self.staged(path))
        try:
            run_original()
        finally:
            self.staging = None
            del state.save_to_json
        if _fingerprint(checkpoint) != untouched:
            raise RuntimeError(
                f"the Trainer of transformers {transformers.__version__} wrote into {checkpoint} "
                "by a way fsprobe does not know, around the staging directory: its "
                "checkpoints cannot be protected (fsprobe.integrations.transformers.WRITERS)"
            )

    def _after_commit(self, run_dir: str, result: SaveResult) -> None:
        state, args = self.trainer.state, self.trainer.args
        self.results.append(result)
        if result.redirected:
            log.warning(
                "fsprobe: checkpoint %s was redirected to %s; `fsprobe sync` brings it back, "
                "fsprobe.integrations.transformers.last_checkpoint() finds it for a resume",
                result.requested_path,
                result.path,
            )
        if args.should_save:  # the Trainer's rotation ran before this checkpoint existed
            self._rotate(run_dir, args.save_total_limit, state.best_model_checkpoint)
        if self.push is not None:
            push, self.push = self.push, None
            push(result.path)

    def _rotate(self, run_dir: str, limit: int | None, best: str | None) -> None:
        """The Trainer's rotation (``save_total_limit``: the newest and the best kept), over
        the checkpoints at the target and in the fallbacks together: what it deletes goes from
        both, with its manifest entries."""
        if limit is None or limit <= 0:
            return
        checkpoints = _checkpoints_in(run_dir, self.fallbacks)
        if len(checkpoints) <= limit:
            return
        kept = {checkpoints[-1], *([os.path.abspath(best)] if best else [])}
        remaining = len(checkpoints)
        for checkpoint in checkpoints:
            if remaining <= max(limit, len(kept)):
                break
            if checkpoint in kept:
                continue
            self._delete(checkpoint, f"save_total_limit={limit}")
            remaining -= 1

    def _delete(self, checkpoint: str, why: str) -> None:
        """Delete `checkpoint` at the target and its redirected copies with their entries."""
        log.info("fsprobe: deleting %s (%s)", checkpoint, why)
        remove_checkpoint(checkpoint)  # only this user's: not what others put there
        forget(checkpoint, self.fallbacks)

    # -- loading: what the Trainer looks for at a checkpoint's path, wherever it landed -------

    def train(
        self,
        original: Callable[..., Any],
        resume_from_checkpoint: str | bool | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """`Trainer.train`, resuming from the newest checkpoint wherever it landed
        (``resume_from_checkpoint=True``) or from the newest copy of the one named."""
        output_dir = cast(str, self.trainer.args.output_dir)
        if resume_from_checkpoint is True:
            found = last_checkpoint(output_dir, self.fallbacks)
            if found is None:
                raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
            resume_from_checkpoint = found
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
            where = locate(resume_from_checkpoint, fallback_dirs=self.fallbacks)
            if where != os.path.abspath(resume_from_checkpoint):
                resume_from_checkpoint = where
        self.resumed_best = None
        if isinstance(resume_from_checkpoint, (str, os.PathLike)):
            self.resumed_best = _best_named_in(resume_from_checkpoint)
        return original(resume_from_checkpoint, *args, **kwargs)

    def load_callback_state(self, original: Callable[[], None]) -> None:
        """Runs right after the Trainer loaded a resumed state and dropped a best checkpoint
        that is not at its path: kept when it was redirected."""
        state, best = self.trainer.state, self.resumed_best
        redirected = best is not None and os.path.isdir(locate(best, fallback_dirs=self.fallbacks))
        if state.best_model_checkpoint is None and redirected:
            state.best_model_checkpoint = best
            log.info("fsprobe: the best checkpoint %s is a redirected copy: kept", best)
        original()

    def load_best_model(self, original: Callable[[], None]) -> None:
        """`Trainer._load_best_model` from the newest copy of the best checkpoint."""
        state = self.trainer.state
        best = state.best_model_checkpoint
        if best is not None:
            state.best_model_checkpoint = locate(best, fallback_dirs=self.fallbacks)
        try:
            original()
        finally:
            state.best_model_checkpoint = best


def _best_named_in(checkpoint: str | os.PathLike[str]) -> str | None:
    """The best checkpoint that `checkpoint`'s saved trainer state names, if any."""
    try:
        state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    except (OSError, ValueError):
        return None
    best: str | None = state.best_model_checkpoint
    return best
