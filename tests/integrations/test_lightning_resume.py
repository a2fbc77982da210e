"""Lightning's own resume, ``fit(ckpt_path="last")``, after fsprobe redirected its checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("lightning")

from lightning import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fsprobe.integrations.lightning import FsprobeCheckpointIO  # noqa: E402
from fsprobe.integrations.lightning_callbacks import FsprobeModelCheckpoint  # noqa: E402
from fsprobe.redirect import manifest  # noqa: E402
from fsprobe.saving.commit import Backoff  # noqa: E402
from tests.support.tmpfs import fill_bytes  # noqa: E402

pytestmark = pytest.mark.slow  # a framework: the full run only

BATCHES = 4  # per epoch


class Counting(LightningModule):
    """A tiny model that records the epochs it trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.epochs: list[int] = []

    def on_train_epoch_start(self) -> None:
        self.epochs.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)
    data = TensorDataset(x, y)
    return DataLoader(data, batch_size=32 // BATCHES)


def fit(
    target: Path, root: Path, epochs: int, fallback: Path | None, ckpt_path: str | None = None
) -> tuple[Trainer, Counting]:
    """`epochs` epochs, the top 2 by loss and ``last.ckpt`` kept; fsprobe plugged in as
    docs/integrations.md says when there is a `fallback`, plain Lightning otherwise."""
    checkpoints: type[ModelCheckpoint] = ModelCheckpoint
    plugins = []
    if fallback is not None:
        checkpoints = FsprobeModelCheckpoint
        quick = Backoff(sleep=lambda seconds: None)
        plugins = [FsprobeCheckpointIO(fallback_dirs=[fallback], backoff=quick)]
    trainer = Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        plugins=plugins,
        callbacks=[checkpoints(dirpath=str(target), save_last=True, save_top_k=2, monitor="loss")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
    )
    model = Counting()
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    return trainer, model


def everywhere(target: Path, fallback: Path) -> list[str]:
    """The checkpoint names kept at the target or redirected to the fallback (a redirected
    copy that a later save at the target superseded is the same checkpoint)."""
    redirected = [Path(e.requested) for e in manifest.pending([str(fallback)], mine=True)]
    return sorted({*os.listdir(target), *(p.name for p in redirected if p.parent == target)})


def test_fit_last_resumes_from_the_redirected_last_checkpoint(tmpfs, tmp_path):
    """A target full from the first save: every checkpoint is redirected, and Lightning's own
    ``fit(ckpt_path="last")`` goes on from the epoch the first run ended, as a run that was
    never interrupted (no epoch lost or trained again, the same weights and checkpoints)."""
    mounted = tmpfs(size="256k").path
    target, fallback = mounted / "ckpt", tmp_path / "fallback"
    target.mkdir()
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)

    first, model = fit(target, tmp_path / "root", epochs=3, fallback=fallback)
    assert model.epochs == [0, 1, 2] and first.global_step == 3 * BATCHES
    assert os.listdir(target) == []  # nothing fitted at the target
    assert first.strategy.checkpoint_io.last_result.redirected

    resumed, model = fit(target, tmp_path / "root", epochs=5, fallback=fallback, ckpt_path="last")
    assert resumed.ckpt_path == manifest.newest_copy(str(target / "last.ckpt"), [str(fallback)])
    assert resumed.ckpt_path.startswith(str(fallback))
    assert model.epochs == [3, 4] and resumed.global_step == 5 * BATCHES

    _, unfaulted = fit(tmp_path / "plain", tmp_path / "root", epochs=5, fallback=None)
    for name, value in unfaulted.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert everywhere(target, fallback) == sorted(os.listdir(tmp_path / "plain"))
    ours = torch.load(resumed.ckpt_path, weights_only=False)["callbacks"]
    theirs = torch.load(tmp_path / "plain" / "last.ckpt", weights_only=False)["callbacks"]
    assert list(ours) == list(theirs)  # ModelCheckpoint's own key: either class resumes it


def test_fit_last_takes_the_newest_last_checkpoint_of_both_places(faultfs, tmp_path):
    """A run redirected while every write at the target failed with ENOSPC, then one that
    saved at the target again: "last" is the target's ``last.ckpt`` now, newer than its
    redirected copy, and the rotation went on over both places."""
    target, fallback = faultfs.mountpoint / "ckpt", tmp_path / "fallback"
    target.mkdir()
    fallback.mkdir(mode=0o700)
    full = faultfs.ctl.fail("write", "ENOSPC", times=None)
    fit(target, tmp_path / "root", epochs=2, fallback=fallback)
    assert os.listdir(target) == []
    faultfs.ctl.remove(full)  # room again: the resumed run saves at the target

    second, model = fit(target, tmp_path / "root", epochs=3, fallback=fallback, ckpt_path="last")
    assert second.ckpt_path.startswith(str(fallback))
    assert model.epochs == [2] and not second.strategy.checkpoint_io.last_result.redirected
    third, model = fit(target, tmp_path / "root", epochs=4, fallback=fallback, ckpt_path="last")
    assert third.ckpt_path == str(target / "last.ckpt")
    assert model.epochs == [3] and third.global_step == 4 * BATCHES
    fit(tmp_path / "plain", tmp_path / "root", epochs=4, fallback=None)
    assert everywhere(target, fallback) == sorted(os.listdir(tmp_path / "plain"))


def test_a_name_taken_by_a_redirected_copy_gets_lightnings_version_suffix(tmpfs, tmp_path):
    """A new run (not resumed) into a directory whose ``last.ckpt`` was redirected writes
    ``last-v1.ckpt``, as Lightning does when ``last.ckpt`` is at the target."""
    mounted = tmpfs(size="256k").path
    target, fallback = mounted / "ckpt", tmp_path / "fallback"
    target.mkdir()
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)
    fit(target, tmp_path / "root", epochs=1, fallback=fallback)
    fit(target, tmp_path / "root", epochs=1, fallback=fallback)
    plain = tmp_path / "plain"
    fit(plain, tmp_path / "root", epochs=1, fallback=None)
    fit(plain, tmp_path / "root", epochs=1, fallback=None)
    assert everywhere(target, fallback) == sorted(os.listdir(plain))
    assert "last-v1.ckpt" in os.listdir(plain)
