"""A Hugging Face `Trainer` job for `torchrun`: a tiny GPT-2 (from a config, no downloads)
trained on CPU by every rank (gloo), its checkpoints protected by fsprobe.

    torchrun --standalone --nproc-per-node 2 -m tests.support.trainer_job OUTPUT_DIR STEPS

Each rank prints, as its last line, ``TRAINER-JOB {json}``: its rank, the global step reached
and the `SaveResult` of every checkpoint (`protected_results`). The backoff does not sleep.
`tiny_trainer` is the Trainer that every Hugging Face test trains, in a job or in-process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from fsprobe.integrations.transformers import protect, protected_results
from fsprobe.saving.options import Backoff

RESULT = "TRAINER-JOB "


def tiny_trainer(
    output_dir: str | os.PathLike[str],
    max_steps: int = 3,
    samples: int = 8,
    callbacks: list[TrainerCallback] | None = None,
    **arguments: Any,
) -> Trainer:
    """A Trainer of a tiny GPT-2 on `samples` random sequences, on CPU, with a checkpoint
    every step unless `arguments` (for `TrainingArguments`) say otherwise; an eval strategy
    gets an eval set."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    data = [
        {"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (samples, 16)).unbind()
    ]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        **{
            "save_steps": 1,
            "logging_steps": 1,
            "per_device_train_batch_size": 2,
            "report_to": [],
            "use_cpu": True,
            "disable_tqdm": True,
            **arguments,
        },
    )
    evaluating = arguments.get("eval_strategy", "no") != "no"
    return Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=data,
        eval_dataset=data[:2] if evaluating else None,
        callbacks=callbacks,
    )


#: What differs between two runs of the same training (their speed), as transformers' own
#: `check_trainer_state_are_the_same` skips it (and the evaluation's speed).
TIMINGS = (
    "train_runtime",
    "train_samples_per_second",
    "train_steps_per_second",
    "train_loss",
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
)


def comparable(state: dict) -> dict:
    """A Trainer's state (`dataclasses.asdict` or trainer_state.json) without its timings."""
    history = [{k: v for k, v in e.items() if k not in TIMINGS} for e in state["log_history"]]
    return {**state, "log_history": history}


def main(output_dir: str, steps: int) -> None:
    trainer = tiny_trainer(output_dir, steps, samples=16, ddp_backend="gloo")
    args = trainer.args
    protect(trainer, backoff=Backoff(sleep=lambda seconds: None))
    trainer.train()
    report = {
        "rank": args.process_index,
        "world_size": args.world_size,
        "global_step": trainer.state.global_step,
        "results": [dataclasses.asdict(result) for result in protected_results(trainer)],
    }
    print(RESULT + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
