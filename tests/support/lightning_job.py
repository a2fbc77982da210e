"""A Lightning job for `torchrun`: a tiny model sharded with FSDP2 under
`FsprobeModelParallelStrategy` on CPU (gloo), its distributed checkpoints saved by fsprobe.

    torchrun --standalone --nproc-per-node 2 -m tests.support.lightning_job OUTPUT EPOCHS [RESUME]

Each rank prints, as its last line, ``LIGHTNING-JOB {json}``: its rank, the epoch and step it
reached, the layer's weight (gathered, as a list) and the `SaveResult` of the last directory
checkpoint. With RESUME, training goes on from that checkpoint (``fit(ckpt_path=...)``).
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from fsprobe.integrations.lightning import FsprobeCheckpointIO
from fsprobe.integrations.lightning_strategies import FsprobeModelParallelStrategy
from fsprobe.saving.options import Backoff

RESULT = "LIGHTNING-JOB "


class Sharded(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(64, 64)

    def configure_model(self) -> None:
        fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def main(output: str, epochs: int, resume: str | None) -> None:
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 64), torch.randn(32, 64)), batch_size=8)
    strategy = FsprobeModelParallelStrategy(process_group_backend="gloo")
    trainer = Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        plugins=[FsprobeCheckpointIO(backoff=Backoff(sleep=lambda seconds: None))],
        callbacks=[ModelCheckpoint(dirpath=output, save_top_k=1, monitor=None)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=output,
    )
    model = Sharded()
    trainer.fit(model, data, ckpt_path=resume)
    weight = model.layer.weight.full_tensor()  # every rank's shard, gathered
    result = strategy.last_result
    report = {
        "rank": trainer.global_rank,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "weight_sum": float(weight.sum()),
        "last_result": dataclasses.asdict(result) if result is not None else None,
    }
    print(RESULT + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
