"""A Lightning job as SLURM runs it: a tiny model on CPU, fsprobe plugged in as
docs/integrations.md says, ``fit()`` with no ``ckpt_path`` (Lightning resumes a requeued job
from its HPC checkpoint).

    python -m tests.support.slurm_job ROOT FALLBACK EPOCHS [epoch=N | step=N]

ROOT is the trainer's ``default_root_dir`` (its ``checkpoints`` the `FsprobeModelCheckpoint`'s:
the top 2 by loss and ``last.ckpt``). With ``epoch=N`` (``step=N``), the job sends itself SIGUSR1
(SLURM's warning before the time limit) at the end of epoch N (when the global step reaches N,
mid-epoch), and Lightning's own handler saves the HPC checkpoint and runs ``scontrol requeue``
(the test's fake one). Before it ends, or at that signal, the job prints ``SLURM-JOB {json}``:
the epochs and steps this process trained, the checkpoint it resumed from and the layer's
weights.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch
from lightning import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from fsprobe.integrations.lightning import FsprobeCheckpointIO
from fsprobe.integrations.lightning_callbacks import FsprobeModelCheckpoint
from fsprobe.saving.options import Backoff

RESULT = "SLURM-JOB "
BATCHES = 4  # per epoch


class Counting(LightningModule):
    """A tiny model that records the epochs and steps this process trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.epochs: list[int] = []
        self.steps: list[int] = []

    def on_train_epoch_start(self) -> None:
        self.epochs.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        self.steps.append(self.global_step)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def report(trainer: Trainer, model: Counting) -> None:
    said = {
        "epochs": model.epochs,
        "steps": model.steps,
        "resumed_from": trainer.ckpt_path,
        "weights": [float(w) for w in model.layer.weight.flatten()],
    }
    print(RESULT + json.dumps(said), flush=True)


class Preempted(Callback):
    """SLURM's signal before the time limit: at the end of epoch N (before the
    `ModelCheckpoint`'s save of that epoch: checkpoint callbacks run last), or after the batch
    that brings the global step to N."""

    def __init__(self, when: str) -> None:
        kind, number = when.split("=")
        self.epoch = int(number) if kind == "epoch" else None
        self.step = int(number) if kind == "step" else None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            self.signal(trainer, pl_module)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *_: Any) -> None:
        if trainer.global_step == self.step:
            self.signal(trainer, pl_module)

    def signal(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert isinstance(pl_module, Counting)
        report(trainer, pl_module)  # the fake scontrol kills this process
        os.kill(os.getpid(), signal.SIGUSR1)


def loader() -> DataLoader:
    """The same 32 samples in `BATCHES` batches, in every process."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=32 // BATCHES)


def main(root: str, fallback: str, epochs: int, signal_at: str | None) -> None:
    data = loader()
    quick = Backoff(sleep=lambda seconds: None)
    trainer = Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        plugins=[FsprobeCheckpointIO(fallback_dirs=[fallback], backoff=quick)],
        callbacks=[
            FsprobeModelCheckpoint(
                dirpath=os.path.join(root, "checkpoints"),
                save_last=True,
                save_top_k=2,
                monitor="loss",
            ),
            *([Preempted(signal_at)] if signal_at is not None else []),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
    )
    model = Counting()
    trainer.fit(model, data)
    report(trainer, model)


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        sys.argv[4] if len(sys.argv) > 4 else None,
    )
