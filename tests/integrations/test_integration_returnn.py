"""`fsprobe.integrations.returnn.protect`: real RETURNN trainings (PyTorch backend, CPU, the
generated Task12AXDataset, a small LSTM, adam, newbob with its learning-rate file beside the
models, as RETURNN's demo config keeps it) under real faults (the FUSE fault filesystem, a tmpfs
short of inodes): the original report's EIO, a quota that is full for two epochs, a full disk
for the optimizer state or the learning-rate file only, and a resume after each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("returnn")
need_module("tree")  # dm-tree: RETURNN's PyTorch engine needs it

import returnn  # noqa: E402

import fsprobe  # noqa: E402
from fsprobe.integrations import returnn as protection  # noqa: E402
from fsprobe.posix.atomic import parse_temp_name  # noqa: E402
from fsprobe.redirect import manifest  # noqa: E402

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]

#: A RETURNN config as a user writes one; {protect} is the line under test (or nothing).
CONFIG = """\
#!rnn.py
{protect}
import torch

backend = "torch"
task = "train"
device = "cpu"
train = {{"class": "Task12AXDataset", "num_seqs": 16}}
dev = {{"class": "Task12AXDataset", "num_seqs": 4, "fixed_random_seed": 1}}
extern_data = {{"data": {{"dim": 9}}, "classes": {{"dim": 2, "sparse": True}}}}
batch_size = 2000
max_seqs = 8
num_epochs = {epochs}
model = {model!r}
optimizer = {{"class": "adam", "epsilon": 1e-8}}
learning_rate = 0.01
learning_rate_control = "newbob"
learning_rate_file = {learning_rates!r}
log_verbosity = 4
torch_dataloader_opts = {{"num_workers": 0}}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(9, 8)
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.out(self.lstm(self.embed(x))[0])


def get_model(**_kwargs):
    return Model()


def train_step(*, model, extern_data, **_kwargs):
    import returnn.frontend as rf

    data, classes = extern_data["data"], extern_data["classes"]
    logits = model(data.raw_tensor.float())
    lengths = data.dims[1].dyn_size_ext.raw_tensor
    mask = torch.arange(logits.shape[1])[None, :] < lengths[:, None]
    targets = classes.raw_tensor.long()[mask]
    loss = torch.nn.functional.cross_entropy(logits[mask], targets, reduction="none")
    rf.get_run_ctx().mark_as_loss(name="ce", loss=loss)

{extra}
"""

#: The README's two lines, with a backoff that does not make the test wait.
PROTECT = """\
import fsprobe.integrations.returnn
from fsprobe.saving.options import Backoff

fsprobe.integrations.returnn.protect(
    fallback_dirs={fallbacks!r}, max_wait=0, save_timeout=120, backoff=Backoff(base=0.05, cap=0.2)
)
"""

LEARNING_RATES = "learning_rates"


def train(
    tmp_path: Path, model: Path, epochs: int, fallbacks: list[str] | None, extra: str = ""
) -> subprocess.CompletedProcess:
    """One RETURNN training run (``python -m returnn config``) in a process of its own;
    `extra` ends the config."""
    protect = "" if fallbacks is None else PROTECT.format(fallbacks=fallbacks)
    config = tmp_path / f"config-{epochs}.py"
    config.write_text(
        CONFIG.format(
            protect=protect,
            epochs=epochs,
            model=str(model),
            learning_rates=str(model.parent / LEARNING_RATES),
            extra=extra,
        )
    )
    return subprocess.run(
        [sys.executable, "-m", "returnn", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"},
    )


def sync(fallback: Path) -> None:
    """``fsprobe sync`` of `fallback`, as a user runs it; it must succeed."""
    synced = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync", "--fallback-dir", str(fallback), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert synced.returncode == 0, synced.stdout + synced.stderr
    json.loads(synced.stdout)


def loads(path: Path, epoch: int) -> None:
    """A model or optimizer file RETURNN can resume from: whole, of that epoch."""
    checkpoint = torch.load(path, map_location="cpu")
    assert checkpoint["epoch"] == epoch, path
    assert checkpoint.get("model") or checkpoint.get("optimizer"), path


def temps(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if parse_temp_name(n) or n.endswith(".tmp_write")]


@pytest.mark.parametrize("protected", [False, True], ids=["as-shipped", "protected"])
def test_an_eio_on_the_model_and_the_optimizer_write_is_survived(faultfs, tmp_path, protected):
    """As shipped, one EIO on a write of ``model.002.pt.tmp_write`` kills the run (the
    original report); protected, both files are retried and every checkpoint loads."""
    run = faultfs.mountpoint / "run"
    # One failing write in each file of epoch 2, wherever RETURNN or fsprobe writes it.
    rules = [
        faultfs.ctl.fail("write", "EIO", path=f"/run/*{name}*", sticky=True)
        for name in ("model.002.pt", "model.002.opt.pt")
    ]
    done = train(tmp_path, run / "model", 3, [] if protected else None)
    if not protected:
        assert done.returncode != 0
        assert "model.002.pt.tmp_write" in done.stdout + done.stderr
        assert not (run / "model.002.pt").exists()
        return
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert [faultfs.ctl.rule(rule)["hits"] for rule in rules] == [1, 1]
    assert "Finished training at epoch 3" in done.stdout
    for epoch in (1, 2, 3):
        loads(run / f"model.{epoch:03d}.pt", epoch)
    for epoch in (2, 3):  # RETURNN keeps the last two optimizer states
        loads(run / f"model.{epoch:03d}.opt.pt", epoch)
    assert not (run / "model.001.opt.pt").exists()
    assert temps(run) == []


def test_a_full_quota_for_two_epochs_redirects_them_and_the_resume_starts_at_epoch_3(
    faultfs, tmp_path
):
    run, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    quota = faultfs.ctl.fail("write", "EDQUOT", path="/run/*", times=None)
    first = train(tmp_path, run / "model", 2, [str(fallback)])
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert faultfs.ctl.rule(quota)["hits"] > 0
    assert not run.exists() or [n for n in os.listdir(run) if n.startswith("model.")] == []
    redirected = {
        name: fsprobe.locate(run / name, fallback_dirs=[fallback])
        for name in ("model.001.pt", "model.002.pt", "model.001.opt.pt", "model.002.opt.pt")
    }
    for name, where in redirected.items():
        assert where.startswith(str(fallback)), name
        loads(Path(where), int(name.split(".")[1]))

    faultfs.ctl.remove(quota)  # the quota was raised
    resumed = train(tmp_path, run / "model", 3, [str(fallback)])
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert f"Load model {redirected['model.002.pt']}" in resumed.stdout
    assert f"Load optimizer {redirected['model.002.opt.pt']}" in resumed.stdout
    assert "Starting training at epoch 3" in resumed.stdout
    assert "start epoch 1 " not in resumed.stdout and "start epoch 2 " not in resumed.stdout
    loads(run / "model.003.pt", 3)
    loads(run / "model.003.opt.pt", 3)

    sync(fallback)
    for name in ("model.001.pt", "model.002.pt", "model.002.opt.pt"):
        loads(run / name, int(name.split(".")[1]))
    assert temps(run) == []


#: RETURNN's own cleanup, keeping epoch 1 and the last epoch: after epoch 3 it deletes epoch 2
#: (model and optimizer state), and `_save_optimizer` the optimizer state of epoch 1.
CLEANUP = 'cleanup_old_models = {"keep": [1], "keep_last_n": 1, "keep_best_n": 0}'


def models_in(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("model."))


def test_what_returnn_cleans_up_in_a_redirected_run_is_gone_and_stays_gone(faultfs, tmp_path):
    """RETURNN's cleanup deletes redirected epochs wherever they landed: no manifest entry
    names a deleted file, and a sync brings home exactly what a run on a healthy disk keeps."""
    healthy = tmp_path / "healthy"
    plain = train(tmp_path, healthy / "model", 3, None, extra=CLEANUP)
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-4000:]
    kept = models_in(healthy)
    assert kept == ["model.001.pt", "model.003.opt.pt", "model.003.pt"]

    run, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    quota = faultfs.ctl.fail("write", "EDQUOT", path="/run/*", times=None)
    done = train(tmp_path, run / "model", 3, [str(fallback)], extra=CLEANUP)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "We will delete the models of epochs [2]." in done.stdout
    entries = manifest.pending([str(fallback)], mine=True)
    assert sorted(os.path.basename(entry.requested) for entry in entries) == [LEARNING_RATES, *kept]
    copies = {
        os.path.join(parent, name)
        for parent, _, names in os.walk(fallback)
        for name in names
        if name != manifest.MANIFEST
    }
    assert copies == {entry.actual for entry in entries}
    for name in ("model.002.pt", "model.002.opt.pt", "model.001.opt.pt"):
        assert fsprobe.locate(run / name, fallback_dirs=[fallback]) == str(run / name)

    faultfs.ctl.remove(quota)
    sync(fallback)
    assert models_in(run) == kept
    for name in kept:
        loads(run / name, int(name.split(".")[1]))
    assert "3: EpochData(" in (run / LEARNING_RATES).read_text()
    assert manifest.pending([str(fallback)], mine=True) == []


def test_an_unknown_returnn_is_refused_loudly(monkeypatch):
    monkeypatch.setattr(returnn, "__version__", "1.20990101.000000")
    with pytest.raises(
        protection.UnknownReturnn, match=r"knows RETURNN 1\.20261022\.211313, not 1\.2099"
    ):
        protection.protect(fallback_dirs=["/nowhere"])


def test_the_installed_returnn_is_the_one_the_patches_know():
    """The extra pins it; the check behind `protect` accepts it as it is installed."""
    assert returnn.__version__ in protection.RETURNN_VERSIONS
    protection._check_version()


def trained_epochs(stdout: str) -> list[int]:
    """The epochs a run trained, in order, from RETURNN's "start epoch N ..." lines."""
    return [int(line.split()[2]) for line in stdout.splitlines() if line.startswith("start epoch ")]


def same_weights(a: Path, b: Path) -> bool:
    first, second = (torch.load(p, map_location="cpu")["model"] for p in (a, b))
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_an_epoch_whose_optimizer_state_alone_was_redirected_is_resumed_not_trained_again(
    faultfs, tmp_path
):
    """ENOSPC on the optimizer files only: every model lands at the target, every optimizer
    state in the fallback. The run's models are those of a healthy run; the resume loads epoch
    3 (its model here, its optimizer state there) and trains epoch 4 only; after a sync the
    optimizer states RETURNN keeps are home and the ones it dropped are gone everywhere."""
    healthy = tmp_path / "healthy"
    plain = train(tmp_path, healthy / "model", 3, None)
    assert plain.returncode == 0, plain.stdout[-4000:] + plain.stderr[-4000:]

    run, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    full = faultfs.ctl.fail("write", "ENOSPC", path="/run/*.opt.pt*", times=None)
    first = train(tmp_path, run / "model", 3, [str(fallback)])
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert faultfs.ctl.rule(full)["hits"] >= 3
    assert models_in(run) == ["model.001.pt", "model.002.pt", "model.003.pt"]
    for epoch in (1, 2, 3):
        name = f"model.{epoch:03d}.pt"
        assert same_weights(run / name, healthy / name), name
    optimizer = fsprobe.locate(run / "model.003.opt.pt", fallback_dirs=[fallback])
    assert optimizer.startswith(str(fallback))
    loads(Path(optimizer), 3)

    resumed = train(tmp_path, run / "model", 4, [str(fallback)])
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert f"Load model {run / 'model.003.pt'}" in resumed.stdout
    assert f"Load optimizer {optimizer}" in resumed.stdout
    assert "Starting training at epoch 4" in resumed.stdout
    assert trained_epochs(resumed.stdout) == [4]

    faultfs.ctl.remove(full)
    sync(fallback)
    assert models_in(run) == [
        "model.001.pt",
        "model.002.pt",
        "model.003.opt.pt",
        "model.003.pt",
        "model.004.opt.pt",
        "model.004.pt",
    ]
    loads(run / "model.003.opt.pt", 3)
    loads(run / "model.004.opt.pt", 4)
    assert manifest.pending([str(fallback)], mine=True) == []
    assert temps(run) == []


@pytest.mark.parametrize("protected", [False, True], ids=["as-shipped", "protected"])
def test_a_full_disk_under_the_learning_rate_file_is_survived_and_resumed(
    faultfs, tmp_path, protected
):
    """As shipped, ENOSPC on ``learning_rates.new_tmp`` kills the run at the end of epoch 1;
    protected, the file goes to the fallback each epoch, the resume reads it from there (else
    RETURNN refuses: "Scores of epoch ... are missing") and a sync brings it home."""
    run, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    full = faultfs.ctl.fail("write", "ENOSPC", path=f"/run/*{LEARNING_RATES}*", times=None)
    first = train(tmp_path, run / "model", 2, [str(fallback)] if protected else None)
    if not protected:
        assert first.returncode != 0
        assert "[Errno 28] No space left on device" in first.stdout + first.stderr
        assert (run / f"{LEARNING_RATES}.new_tmp").exists()  # what it was writing
        assert not (run / "model.001.pt").exists()
        return
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert faultfs.ctl.rule(full)["hits"] > 0
    assert models_in(run) == [f"model.00{e}.{k}" for e in (1, 2) for k in ("opt.pt", "pt")]
    assert not (run / LEARNING_RATES).exists()
    scores = fsprobe.locate(run / LEARNING_RATES, fallback_dirs=[fallback])
    assert scores.startswith(str(fallback))
    assert "2: EpochData(" in Path(scores).read_text()

    resumed = train(tmp_path, run / "model", 3, [str(fallback)])
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert f"Learning-rate-control: loading file {scores}" in resumed.stdout
    assert trained_epochs(resumed.stdout) == [3]
    newest = Path(fsprobe.locate(run / LEARNING_RATES, fallback_dirs=[fallback])).read_text()
    assert "3: EpochData(" in newest

    faultfs.ctl.remove(full)
    sync(fallback)
    assert (run / LEARNING_RATES).read_text() == newest
    assert manifest.pending([str(fallback)], mine=True) == []
    assert temps(run) == []


def test_a_tmpfs_short_of_inodes_ends_every_epoch_saved_and_resumes_after_the_last(tmpfs, tmp_path):
    """The seed's situation, inodes: the files of two epochs fill the filesystem. As shipped,
    RETURNN dies of ENOSPC; protected, whatever does not fit goes to the fallback (deleting an
    old optimizer state frees one inode, so a model may fit and its optimizer state not), the
    resume trains the next epoch only, and once there is room a sync brings all home."""
    # The root, the run directory, the learning-rate file and two epochs' model and optimizer
    # state: one inode more than that for the temp file of the next save.
    fs = tmpfs(size="64M", nr_inodes=8)
    plain = train(tmp_path, fs.path / "plain" / "model", 4, None)
    assert plain.returncode != 0
    assert "No space left on device" in plain.stdout + plain.stderr
    shutil.rmtree(fs.path / "plain")

    run, fallback = fs.path / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    first = train(tmp_path, run / "model", 4, [str(fallback)])
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert trained_epochs(first.stdout) == [1, 2, 3, 4]
    redirected = manifest.pending([str(fallback)], mine=True)
    assert redirected, "nothing was redirected: the tmpfs was not short of inodes"
    for name in ("model.004.pt", "model.004.opt.pt", "model.003.opt.pt"):
        loads(Path(fsprobe.locate(run / name, fallback_dirs=[fallback])), int(name[6:9]))

    resumed = train(tmp_path, run / "model", 5, [str(fallback)])
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert trained_epochs(resumed.stdout) == [5]

    subprocess.run(["mount", "-o", "remount,nr_inodes=1000", str(fs.path)], check=True)
    sync(fallback)
    assert manifest.pending([str(fallback)], mine=True) == []
    for epoch in (1, 2, 3, 4, 5):
        loads(run / f"model.{epoch:03d}.pt", epoch)
    for epoch in (4, 5):
        loads(run / f"model.{epoch:03d}.opt.pt", epoch)
    assert "5: EpochData(" in (run / LEARNING_RATES).read_text()
    assert temps(run) == []


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"attempts": 0}, ValueError),
        ({"on_unhealthy": "ignore"}, ValueError),
        ({"save_timeout": -1}, ValueError),
        ({"attempt": 3}, TypeError),  # misspelt
        ({"backoff": 0.2}, TypeError),  # the report's: an AttributeError at the first retry
    ],
)
def test_a_wrong_option_fails_in_the_config_and_patches_nothing(options, error):
    engine = protection.returnn_engine.Engine
    saving = engine._save_model
    with pytest.raises(error):
        protection.protect(fallback_dirs=["/nowhere"], **options)
    assert engine._save_model is saving
    assert getattr(engine, "_fsprobe_protection", None) is None
