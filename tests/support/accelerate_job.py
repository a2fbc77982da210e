"""An Accelerate job for `torchrun`: a tiny model under DDP on CPU (gloo), `save_state()`
after each epoch with automatic naming, protected by fsprobe when given fallbacks.

    torchrun --standalone --nproc-per-node 2 -m tests.support.accelerate_job PROJECT EPOCHS \
        RESUME [FALLBACK]

RESUME is ``resume`` (go on from ``load_state()``) or ``fresh``; without FALLBACK, plain
Accelerate. Each rank prints, as its last line, ``ACCELERATE-JOB {json}``: its rank, the
epochs done, the weights (as lists) and the paths its protected saves landed at.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

from fsprobe.integrations.accelerate import protect, protected_results
from fsprobe.saving.commit import Backoff

RESULT = "ACCELERATE-JOB "


class Epochs:
    """The epochs done, saved with the checkpoint (`register_for_checkpointing`)."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.done = state["done"]


def main(project: str, epochs: int, resume: bool, fallback: str | None) -> None:
    set_seed(0)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=generator), torch.randn(64, 1, generator=generator)
    config = ProjectConfiguration(project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    if fallback is not None:
        protect(accelerator, fallback_dirs=[fallback], backoff=Backoff(sleep=lambda s: None))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, data = accelerator.prepare(
        model, optimizer, DataLoader(TensorDataset(x, y), batch_size=8)
    )
    done = Epochs()
    accelerator.register_for_checkpointing(done)
    if resume:
        accelerator.load_state()
        config.iteration = done.done
    while done.done < epochs:
        for inputs, targets in data:
            accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
        done.done += 1
        accelerator.save_state()
    weights = accelerator.unwrap_model(model).state_dict()
    report = {
        "rank": accelerator.process_index,
        "done": done.done,
        "weights": {name: value.tolist() for name, value in weights.items()},
        "landed": [r.path for r in protected_results(accelerator)] if fallback else [],
    }
    print(RESULT + json.dumps(report), flush=True)
    # DDP holds the process group: let it go before the group, or gloo may abort at exit.
    model, optimizer, data = accelerator.free_memory(model, optimizer, data)
    accelerator.end_training()


if __name__ == "__main__":
    main(
        sys.argv[1],
        int(sys.argv[2]),
        sys.argv[3] == "resume",
        sys.argv[4] if len(sys.argv) > 4 else None,
    )
    # Everything is saved and said: end without the interpreter's teardown, where gloo's
    # threads still abort a rank now and then ("terminate called without an active
    # exception", 1 full run in 3 even after end_training), which no checkpoint depends on.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
