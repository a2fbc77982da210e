"""Lightning's own resume, ``fit(ckpt_path="last")``, ``"hpc"`` and SLURM's requeue, after
fsprobe redirected its checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from tests.support.capability import need_module

need_module("lightning")

from lightning import Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.trainer.connectors.checkpoint_connector import (  # noqa: E402
    _CheckpointConnector,
)

from fsprobe.integrations.lightning import FsprobeCheckpointIO  # noqa: E402
from fsprobe.integrations.lightning_callbacks import (  # noqa: E402
    FsprobeModelCheckpoint,
    HpcSavePath,
    extend_hpc_lookups,
)
from fsprobe.redirect import manifest  # noqa: E402
from fsprobe.saving.commit import Backoff  # noqa: E402
from tests.support.slurm_job import BATCHES, RESULT, Counting, loader  # noqa: E402
from tests.support.tmpfs import fill_bytes, fill_inodes  # noqa: E402

pytestmark = pytest.mark.slow  # a framework: the full run only


def fit(
    target: Path,
    root: Path,
    epochs: int,
    fallback: Path | None,
    ckpt_path: str | None = None,
    save_last: bool | Literal["link"] = True,
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
        callbacks=[
            checkpoints(dirpath=str(target), save_last=save_last, save_top_k=2, monitor="loss")
        ],
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


def resume_as_uninterrupted(
    target: Path, fallback: Path, tmp_path: Path, save_last: bool | Literal["link"] = True
) -> tuple[Trainer, Path]:
    """Epochs 3 and 4 after a first run of three, resumed with ``ckpt_path="last"``, held to
    the same five epochs run without fsprobe on a target with room: no epoch lost or trained
    again, the same weights, the same checkpoints kept (at the target and redirected). The
    resumed trainer, and the uninterrupted run's checkpoint directory."""
    resumed, model = fit(
        target, tmp_path / "root", 5, fallback, ckpt_path="last", save_last=save_last
    )
    assert model.epochs == [3, 4] and resumed.global_step == 5 * BATCHES
    plain = tmp_path / "plain"
    _, unfaulted = fit(plain, tmp_path / "root", 5, fallback=None, save_last=save_last)
    for name, value in unfaulted.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert everywhere(target, fallback) == sorted(os.listdir(plain))
    return resumed, plain


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

    resumed, plain = resume_as_uninterrupted(target, fallback, tmp_path)
    assert resumed.ckpt_path == manifest.newest_copy(str(target / "last.ckpt"), [str(fallback)])
    assert resumed.ckpt_path.startswith(str(fallback))
    ours = torch.load(resumed.ckpt_path, weights_only=False)["callbacks"]
    theirs = torch.load(plain / "last.ckpt", weights_only=False)["callbacks"]
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


def test_fit_last_follows_a_link_to_a_redirected_checkpoint(tmpfs, tmp_path):
    """``save_last="link"`` on a full target: ``last.ckpt`` is Lightning's symlink to a
    checkpoint that was redirected; "last" resumes from that checkpoint's copy, and the
    rotation keeps what an uninterrupted run keeps."""
    mounted = tmpfs(size="256k").path
    target, fallback = mounted / "ckpt", tmp_path / "fallback"
    target.mkdir()
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)
    fit(target, tmp_path / "root", epochs=3, fallback=fallback, save_last="link")
    assert os.path.islink(target / "last.ckpt") and not os.path.exists(target / "last.ckpt")

    linked = manifest.newest_copy(str(target / "epoch=2-step=12.ckpt"), [str(fallback)])
    assert linked.startswith(str(fallback))

    resumed, plain = resume_as_uninterrupted(target, fallback, tmp_path, save_last="link")
    assert resumed.ckpt_path == linked
    assert os.readlink(target / "last.ckpt") == os.readlink(plain / "last.ckpt")


def test_a_link_that_cannot_be_made_is_a_copy_saved_by_fsprobe(tmpfs, tmp_path):
    """``save_last="link"`` on a target out of inodes: neither Lightning's symlink nor its copy
    of the redirected file can be made there (plain Lightning dies: the file is not at the
    target); ``last.ckpt`` is then a copy saved by fsprobe, and "last" resumes from it."""
    mounted = tmpfs(size="1M", nr_inodes=16).path
    target, fallback = mounted / "ckpt", tmp_path / "fallback"
    target.mkdir()
    fallback.mkdir(mode=0o700)
    fill_inodes(mounted, 1.0)
    first, _ = fit(target, tmp_path / "root", epochs=3, fallback=fallback, save_last="link")
    assert os.listdir(target) == []
    last = manifest.newest_copy(str(target / "last.ckpt"), [str(fallback)])
    linked = manifest.newest_copy(str(target / "epoch=2-step=12.ckpt"), [str(fallback)])
    assert last.startswith(str(fallback)) and Path(last).read_bytes() == Path(linked).read_bytes()
    assert first.strategy.checkpoint_io.last_result.path == last

    resumed, _ = resume_as_uninterrupted(target, fallback, tmp_path, save_last="link")
    assert resumed.ckpt_path == last


def test_fit_hpc_resumes_from_the_redirected_hpc_checkpoint(tmpfs, tmp_path):
    """``fit(ckpt_path="hpc")`` after every HPC checkpoint was redirected: the newest one,
    from the fallback, where plain Lightning finds none at the root and raises."""
    mounted = tmpfs(size="256k").path
    root, fallback = mounted / "root", tmp_path / "fallback"
    root.mkdir()
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)
    first, _ = fit(root / "ckpt", root, epochs=2, fallback=fallback)
    for _ in range(2):  # what Lightning's SLURM handler does, twice
        first.save_checkpoint(first._checkpoint_connector.hpc_save_path(root))
    assert not any(name.startswith("hpc_ckpt_") for name in os.listdir(root))
    redirected = [e.requested for e in manifest.pending([str(fallback)], mine=True)]
    assert {str(root / "hpc_ckpt_1.ckpt"), str(root / "hpc_ckpt_2.ckpt")} <= set(redirected)

    resumed, model = fit(root / "ckpt", root, epochs=3, fallback=fallback, ckpt_path="hpc")
    assert resumed.ckpt_path == str(root / "hpc_ckpt_2.ckpt")  # as saved: only its copy exists
    assert model.epochs == [2] and resumed.global_step == 3 * BATCHES
    with pytest.raises(ValueError, match="no HPC checkpoint was found"):
        fit(tmp_path / "plain", root, epochs=3, fallback=None, ckpt_path="hpc")


def test_the_hpc_lookups_are_extended_and_lightnings_for_other_trainers(tmp_path):
    """The one private Lightning API changed: `extend_hpc_lookups` finds the connector as it
    expects (no warning), and a trainer without `FsprobeCheckpointIO` keeps Lightning's own
    answers. Fails when a Lightning release moves or changes them."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert extend_hpc_lookups()
    assert isinstance(_CheckpointConnector.__dict__["hpc_save_path"], HpcSavePath)
    assert _CheckpointConnector.hpc_save_path(tmp_path) == str(tmp_path / "hpc_ckpt_1.ckpt")
    (tmp_path / "hpc_ckpt_4.ckpt").touch()
    plain = Trainer(default_root_dir=str(tmp_path), logger=False, enable_checkpointing=False)
    assert plain._checkpoint_connector._hpc_resume_path == str(tmp_path / "hpc_ckpt_4.ckpt")
    assert plain._checkpoint_connector.hpc_save_path(tmp_path) == str(tmp_path / "hpc_ckpt_5.ckpt")


SLURM = {
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "train",
    "SLURM_NODELIST": "localhost",
}


def slurm_job(
    tmp_path: Path, root: Path, fallback: Path, epochs: int, signal_at: str | None = None
) -> tuple[int, dict[str, Any]]:
    """Run tests.support.slurm_job as SLURM would, with a fake ``scontrol`` that records the
    requeue and kills the job as SLURM does; its exit status and its report."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        scontrol = bin_dir / "scontrol"
        scontrol.write_text('#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\nkill -KILL $PPID\n')
        scontrol.chmod(0o755)
    arguments = [str(root), str(fallback), str(epochs)]
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.slurm_job",
            *arguments,
            *([str(signal_at)] if signal_at is not None else []),
        ],
        cwd=Path(__file__).parents[2],
        env={
            **os.environ,
            **SLURM,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
            "PYTHONPATH": str(Path(__file__).parents[2]),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = [line for line in job.stdout.splitlines() if line.startswith(RESULT)]
    assert said, job.stderr[-3000:]
    return job.returncode, json.loads(said[-1][len(RESULT) :])


def test_slurm_requeue_resumes_where_the_preempted_job_saved(tmpfs, tmp_path):
    """SLURM's requeue, for real but for the scheduler: SIGUSR1 at the end of an epoch,
    Lightning's own handler saves ``hpc_ckpt_N.ckpt`` and runs ``scontrol requeue`` (which kills
    the job), and the requeued job's ``fit()`` resumes from the newest HPC checkpoint. The first
    lands at the target, which is then full before each job: the second is redirected, the third
    lands at the target again in room the rotation freed, numbered after the redirected one
    (Lightning alone numbers by the target's files: it would resume the third job from the first
    checkpoint, and name the third 2 again).
    Four jobs train every epoch and step once, to the weights and checkpoints of one job."""
    mounted = tmpfs(size="256k").path
    root, fallback = mounted / "root", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)

    status, first = slurm_job(tmp_path, root, fallback, epochs=8, signal_at="epoch=1")
    assert status == -9 and first["resumed_from"] is None
    assert sorted(os.listdir(root)) == ["checkpoints", "hpc_ckpt_1.ckpt"]
    jobs, filler = [first], None
    for signal_at in ("epoch=3", "epoch=5", None):
        if filler is not None:
            filler.unlink()
        filler = fill_bytes(mounted)  # full, and full again of what the rotation freed
        status, said = slurm_job(tmp_path, root, fallback, epochs=8, signal_at=signal_at)
        assert status == (-9 if signal_at is not None else 0), said
        jobs.append(said)

    fallbacks = [str(fallback)]
    resumed = [job["resumed_from"] for job in jobs[1:]]
    numbers = (root / "hpc_ckpt_1.ckpt", root / "hpc_ckpt_2.ckpt", root / "hpc_ckpt_3.ckpt")
    assert resumed == [str(path) for path in numbers]  # as saved; the plugin loads the copy
    assert not numbers[1].exists()
    assert manifest.newest_copy(str(numbers[1]), fallbacks).startswith(str(fallback))
    assert [job["epochs"] for job in jobs] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [step for job in jobs for step in job["steps"]] == list(range(8 * BATCHES))
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n" * 3
    assert sorted(os.listdir(root)) == ["checkpoints", "hpc_ckpt_1.ckpt", "hpc_ckpt_3.ckpt"]

    plain = tmp_path / "plain"
    status, unfaulted = slurm_job(tmp_path, plain, tmp_path / "unused", epochs=8)
    assert status == 0 and unfaulted["epochs"] == list(range(8))
    assert jobs[-1]["weights"] == unfaulted["weights"]
    kept = everywhere(root / "checkpoints", fallback)
    assert kept == sorted(os.listdir(plain / "checkpoints"))


def test_slurm_requeue_mid_epoch_resumes_as_lightning_does_on_a_healthy_target(tmpfs, tmp_path):
    """The signal mid-epoch (as SLURM's warning mostly comes), on a target full from the
    start: the requeued job goes on from the redirected HPC checkpoint at the step it was
    saved, exactly as the same two jobs do on a target with room (Lightning's own mid-epoch
    resume: its plain DataLoader starts the epoch's data again, which Lightning warns about)."""
    mounted = tmpfs(size="256k").path
    root, fallback = mounted / "root", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)
    healthy = tmp_path / "healthy"
    runs = []
    for where in (root, healthy):
        first = slurm_job(tmp_path, where, fallback, epochs=3, signal_at="step=6")
        second = slurm_job(tmp_path, where, fallback, epochs=3)
        runs.append((first, second))
    assert [p for p in root.rglob("*") if not p.is_dir()] == []  # all in the fallback
    (status, first), (finished, second) = runs[0]
    assert status == -9 and finished == 0
    assert first["steps"] == list(range(6)) and second["steps"] == list(range(6, 12))
    assert second["resumed_from"] == str(root / "hpc_ckpt_1.ckpt")  # only its copy exists
    assert runs[1][1][1]["resumed_from"] == str(healthy / "hpc_ckpt_1.ckpt")
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n" * 2
    for (_, faulted), (_, plain) in zip(runs[0], runs[1]):
        assert {**faulted, "resumed_from": None} == {**plain, "resumed_from": None}
