"""The Lightning `CheckpointIO` plugin in a real `Trainer.fit`, with a write failure injected."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("lightning")

from lightning import LightningModule, Trainer  # noqa: E402
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fsprobe.integrations.lightning import FsprobeCheckpointIO  # noqa: E402
from fsprobe.posix.atomic import parse_temp_name  # noqa: E402
from fsprobe.saving.options import Backoff, SaveOptions  # noqa: E402
from tests.support.state import daemon_view, publish  # noqa: E402

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    torch.manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)


def trainer(plugin: FsprobeCheckpointIO, dirpath, root) -> Trainer:
    return Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        plugins=[plugin],
        callbacks=[ModelCheckpoint(dirpath=str(dirpath), save_top_k=1, monitor=None)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
    )


def test_fit_survives_a_failed_checkpoint_write(faultfs, tmp_path, caplog):
    ckpt_dir = faultfs.mountpoint / "ckpt"
    sleeps = []
    plugin = FsprobeCheckpointIO(attempts=3, backoff=Backoff(sleep=sleeps.append))
    rule = faultfs.ctl.fail("write", "EIO", path="*.tmp", times=1, sticky=True)
    model = Tiny()
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        fit = trainer(plugin, ckpt_dir, tmp_path)
        fit.fit(model, loader())
    assert fit.state.finished and fit.current_epoch == 3
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert "failed at write with EIO (transient)" in caplog.text and len(sleeps) == 1
    [name] = os.listdir(ckpt_dir)  # top-1: older checkpoints were removed, no temp files
    assert not parse_temp_name(name)
    checkpoint = torch.load(ckpt_dir / name, weights_only=False)
    assert checkpoint["epoch"] == 2
    for key, value in model.state_dict().items():
        assert torch.equal(checkpoint["state_dict"][key], value)
    assert plugin.last_result.path == str(ckpt_dir / name)


def test_redirected_checkpoint_is_loaded_and_removed_through_the_plugin(tmp_path):
    target, fallback, state = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "state"
    target.mkdir()
    fallback.mkdir()
    state.mkdir(mode=0o700)
    publish(str(state), {str(target): daemon_view(str(target), readonly=True)})
    plugin = FsprobeCheckpointIO(SaveOptions(fallback_dirs=[fallback]), state_dir=str(state))
    path = str(target / "epoch=0.ckpt")
    plugin.save_checkpoint({"epoch": 0, "state_dict": {"w": torch.ones(3)}}, path)
    assert plugin.last_result.redirected and not os.path.exists(path)

    loaded = plugin.load_checkpoint(path)
    assert loaded["epoch"] == 0 and torch.equal(loaded["state_dict"]["w"], torch.ones(3))

    plugin.remove_checkpoint(path)  # top-k pruning: the redirected copy goes too
    assert os.listdir(fallback) == []
    with pytest.raises(FileNotFoundError):
        plugin.load_checkpoint(path)


def test_storage_options_are_refused_as_lightning_refuses_them(tmp_path):
    plugin = FsprobeCheckpointIO()
    with pytest.raises(TypeError) as lightnings:
        TorchCheckpointIO.save_checkpoint(plugin, {}, str(tmp_path / "x.ckpt"), storage_options={})
    with pytest.raises(TypeError) as ours:
        plugin.save_checkpoint({}, str(tmp_path / "x.ckpt"), storage_options={})
    assert str(ours.value) == str(lightnings.value)
    assert "is not supported for `FsprobeCheckpointIO`" in str(ours.value)
    assert os.listdir(tmp_path) == []


#: A fit whose every checkpoint save the daemon's state file answers (one process, no probe).
ANSWERED_FROM_THE_STATE = """
import json, sys, threading
import psutil
from tests.integrations.test_integration_lightning import FsprobeCheckpointIO, loader, trainer, Tiny
checkpoints, root, state = sys.argv[1:4]
print("imported", flush=True)
sys.stdin.readline()  # the state file is published now
plugin = FsprobeCheckpointIO(state_dir=state)
trainer(plugin, checkpoints, root).fit(Tiny(), loader())
print(json.dumps({
    "source": plugin.last_result is not None and sorted(os.listdir(checkpoints)),
    "children": [p.cmdline() for p in psutil.Process().children(recursive=True)],
    "fsprobe_threads": [t.name for t in threading.enumerate() if t.name.startswith("fsprobe")],
}))
""".replace("import json,", "import os, json,")


def test_a_fit_whose_saves_the_state_file_answers_starts_no_probe_worker(tmp_path):
    """Lightning's own tests fail on a thread left behind: a probe worker (and its reader
    thread) starts only when a save needs a probe."""
    checkpoints, state = tmp_path / "checkpoints", tmp_path / "state"
    checkpoints.mkdir()
    state.mkdir(mode=0o700)
    fit = subprocess.Popen(
        [sys.executable, "-c", ANSWERED_FROM_THE_STATE, checkpoints, tmp_path / "root", state],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert fit.stdout.readline() == "imported\n"
        # Probed and published now (in the test's process): fresh however slow the imports.
        publish(str(state), {str(checkpoints): daemon_view(str(checkpoints))})
        output, errors = fit.communicate("go\n", timeout=240)
    finally:
        fit.kill()
    assert fit.returncode == 0, errors[-3000:]
    answer = json.loads(output.splitlines()[-1])
    assert answer["source"] == ["epoch=2-step=12.ckpt"]
    assert answer["children"] == []
    assert answer["fsprobe_threads"] == []


def test_a_misspelt_option_fails_when_the_plugin_is_made():
    with pytest.raises(TypeError, match="max_wiat"):
        FsprobeCheckpointIO(max_wiat=30)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"attempts": 0}, ValueError),
        ({"on_unhealthy": "ignore"}, ValueError),
        ({"save_timeout": 0}, ValueError),
        ({"backoff": 0.2}, TypeError),  # the report's: an AttributeError at the first retry
    ],
)
def test_a_wrong_option_fails_when_the_plugin_is_made(options, error):
    with pytest.raises(error):
        FsprobeCheckpointIO(**options)


def test_lightning_gets_the_path_the_caller_gave_and_names_it_so(tmp_path, monkeypatch):
    """Lightning's tests hand a `Path` and a relative name, and expect them back: a `Path`
    stays a `Path`, "not existing" stays relative in the message (no redirected copy)."""
    given: list[object] = []

    class Recording(TorchCheckpointIO):
        """What the plugin hands Lightning's own implementation."""

        def load_checkpoint(self, path, *args, **kwargs):
            given.append(path)
            return super().load_checkpoint(path, *args, **kwargs)

        def remove_checkpoint(self, path):
            given.append(path)
            return super().remove_checkpoint(path)

    class RecordingFsprobe(FsprobeCheckpointIO, Recording):
        pass

    monkeypatch.chdir(tmp_path)
    plugin = RecordingFsprobe()
    path = tmp_path / "epoch=0.ckpt"
    plugin.save_checkpoint({"epoch": 0}, path)
    assert plugin.load_checkpoint(path)["epoch"] == 0
    plugin.remove_checkpoint(path)
    assert given == [path, path]
    assert all(type(p) is type(path) for p in given)
    with pytest.raises(FileNotFoundError, match=r"^Checkpoint file not found: not existing$"):
        plugin.load_checkpoint("not existing")
