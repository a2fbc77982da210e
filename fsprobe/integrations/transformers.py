"""Hugging Face: a ``TrainerCallback`` that runs the preflight before each checkpoint save.

::

    from transformers import Trainer
    from fsprobe.integrations.transformers import FsprobeCallback

    trainer = Trainer(..., callbacks=[FsprobeCallback(max_wait=120)])

The `Trainer` writes its checkpoints itself (``checkpoint-<step>/`` under ``output_dir``), so the
callback cannot retry or redirect them; what it does is look before the Trainer leaps. When a
save step comes (``control.should_save`` at the end of a step or an epoch) it runs
`fsprobe.preflight` on ``output_dir`` with the size of the previous checkpoint as the need, waits
up to `max_wait` for a transiently unhealthy filesystem (a hung mount, failing test writes) to
recover, and reports the decision: a log line (a warning unless all is well), an entry in
``state.log_history`` (saved with every checkpoint in ``trainer_state.json``), and
``fsprobe_status`` / ``fsprobe_action`` in the next ``logs`` the Trainer prints. It never raises:
a monitoring problem must not be what stops a training run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback

from fsprobe.saving.preflight import NEED_MARGIN, Decision, preflight

log = logging.getLogger("fsprobe.transformers")

#: The Trainer's checkpoint directories are ``<output_dir>/checkpoint-<global_step>``.
CHECKPOINT_PREFIX = "checkpoint"


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


class FsprobeCallback(TrainerCallback):
    """Preflight before each save step; the decisions so far are in `decisions`.

    `need_bytes` (default: the previous checkpoint's size times 1.1, none before the first),
    `max_wait`, `state_dir` and `timeout` go to `fsprobe.preflight`. `fallback_dirs` only
    changes what is reported (the Trainer writes where it writes): a target that cannot take
    the checkpoint is reported as ``redirect`` when a fallback could, ``fail`` otherwise.
    """

    def __init__(
        self,
        need_bytes: int | None = None,
        max_wait: float = 0.0,
        fallback_dirs: Iterable[str | os.PathLike[str]] = (),
        state_dir: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.need_bytes = need_bytes
        self.max_wait = max_wait
        self.fallback_dirs = tuple(os.fspath(d) for d in fallback_dirs)
        self.state_dir = state_dir
        self.timeout = timeout
        self.decisions: list[Decision] = []
        self._measured: tuple[int, int] | None = None  # (bytes, inodes) of the last checkpoint
        self._unreported: Decision | None = None

    # -- Trainer events ------------------------------------------------------------------------

    def on_step_end(self, args, state, control, **kwargs: Any) -> None:
        if control.should_save:
            self._before_save(args, state)

    def on_epoch_end(self, args, state, control, **kwargs: Any) -> None:
        if control.should_save:
            self._before_save(args, state)

    def on_save(self, args, state, control, **kwargs: Any) -> None:
        """Measure the checkpoint just written: the need of the next one."""
        if not args.should_save:
            return
        directory = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")
        try:
            if os.path.isdir(directory):
                self._measured = _tree_size(directory)
        except Exception:  # never let measuring stop the training
            log.exception("fsprobe: could not measure %s", directory)

    def on_log(self, args, state, control, logs=None, **kwargs: Any) -> None:
        if logs is not None and self._unreported is not None:
            logs["fsprobe_status"] = int(self._unreported.status)
            logs["fsprobe_action"] = self._unreported.action
            self._unreported = None

    # -- the check -----------------------------------------------------------------------------

    def _need(self) -> tuple[int | None, int]:
        if self.need_bytes is not None:
            inodes = self._measured[1] if self._measured else 1
            return self.need_bytes, inodes
        if self._measured is None:
            return None, 1
        size, inodes = self._measured
        return math.ceil(size * NEED_MARGIN), inodes

    def _before_save(self, args, state) -> None:
        if not args.should_save:  # only the process that writes checkpoints asks
            return
        try:
            self._report(self._decide(args, state), state)
        except Exception:
            log.exception(
                "fsprobe: the preflight before the save at step %d failed", state.global_step
            )

    def _decide(self, args, state) -> Decision:
        need_bytes, need_inodes = self._need()
        checkpoint = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")
        return preflight(
            checkpoint,  # a path inside output_dir: output_dir is the target judged
            need_bytes=need_bytes,
            need_inodes=need_inodes,
            max_wait=self.max_wait,
            fallback_dirs=self.fallback_dirs,
            on_unhealthy="fail",
            state_dir=self.state_dir,
            timeout=self.timeout,
        )

    def _report(self, decision: Decision, state) -> None:
        self.decisions.append(decision)
        self._unreported = decision
        state.log_history.append(
            {
                "fsprobe_preflight": decision.to_dict(),
                "step": state.global_step,
            }
        )
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
