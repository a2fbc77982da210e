"""Accelerate's `save_state`/`load_state` under `protect`: real faults, resumes held to a run
that had none."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import ProjectConfiguration, set_seed  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from fsprobe.integrations.accelerate import (  # noqa: E402
    last_checkpoint,
    protect,
    protected_results,
)
from fsprobe.redirect import manifest  # noqa: E402
from fsprobe.saving.commit import Backoff, SaveError  # noqa: E402
from tests.support.accelerate_job import RESULT  # noqa: E402
from tests.support.tmpfs import fill_bytes  # noqa: E402
from tests.support.torchrun import torchrun_job  # noqa: E402

pytestmark = pytest.mark.slow  # a framework: the full run only


class Epochs:
    """The epochs done, saved with the checkpoint (`register_for_checkpointing`)."""

    def __init__(self) -> None:
        self.done = 0

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.done = state["done"]


def quick() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def train(
    project: Path,
    epochs: int,
    fallbacks: list[Path] | None = None,
    resume: bool = False,
    total_limit: int | None = 2,
) -> tuple[Accelerator, torch.nn.Module, Epochs]:
    """`epochs` epochs of a tiny model, `save_state()` after each with automatic naming;
    protected with `fallbacks` (a list, maybe empty), plain Accelerate without; `resume` goes
    on from `load_state()` (no argument: the newest checkpoint) as an Accelerate user does."""
    set_seed(0)
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=total_limit
    )
    accelerator = Accelerator(cpu=True, project_config=config)
    if fallbacks is not None:
        protect(accelerator, fallback_dirs=fallbacks, backoff=quick())
    model, optimizer, data = accelerator.prepare(
        model, optimizer, DataLoader(TensorDataset(x, y), batch_size=8)
    )
    done = Epochs()
    accelerator.register_for_checkpointing(done)
    if resume:
        accelerator.load_state()
        config.iteration = done.done  # Accelerate leaves the next checkpoint's number to us
    while done.done < epochs:
        for inputs, targets in data:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        done.done += 1
        accelerator.save_state()
    return accelerator, model, done


def everywhere(checkpoints: Path, fallback: Path) -> list[str]:
    """The checkpoint names at the target and redirected to the fallback, together."""
    redirected = [Path(e.requested) for e in manifest.pending([str(fallback)], mine=True)]
    names = {*os.listdir(checkpoints), *(p.name for p in redirected if p.parent == checkpoints)}
    return sorted(name for name in names if not name.startswith("."))


def same_weights(one: torch.nn.Module, other: torch.nn.Module) -> bool:
    theirs = other.state_dict()
    return all(torch.equal(value, theirs[name]) for name, value in one.state_dict().items())


def test_a_target_full_from_the_first_save_redirects_whole_and_load_state_resumes(tmpfs, tmp_path):
    """Every checkpoint redirected whole; ``load_state()`` finds the newest in the fallback;
    the resumed run ends with the weights and the checkpoints of a run never interrupted."""
    mounted = tmpfs(size="256k").path
    project, fallback = mounted / "run", tmp_path / "fallback"
    (project / "checkpoints").mkdir(parents=True)
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)

    accelerator, _, _ = train(project, epochs=3, fallbacks=[fallback])
    results = protected_results(accelerator)
    assert [r.redirected for r in results] == [True, True, True]
    assert os.listdir(project / "checkpoints") == []
    assert everywhere(project / "checkpoints", fallback) == ["checkpoint_1", "checkpoint_2"]
    newest = last_checkpoint(project / "checkpoints", [fallback])
    assert newest == results[-1].path and newest.startswith(str(fallback))
    assert {"model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl"} <= set(
        os.listdir(newest)
    )

    _, resumed, done = train(project, epochs=5, fallbacks=[fallback], resume=True)
    _, unfaulted, _ = train(tmp_path / "plain", epochs=5)
    assert done.done == 5 and same_weights(resumed, unfaulted)
    plain = sorted(os.listdir(tmp_path / "plain" / "checkpoints"))
    assert (
        everywhere(project / "checkpoints", fallback) == plain == ["checkpoint_3", "checkpoint_4"]
    )


def test_total_limit_counts_the_target_and_the_fallback_as_one_place(faultfs, tmp_path):
    """Checkpoints 0-1 at the target, 2-3 redirected while it was full, 4 at the target again:
    the newest two are kept, one in each place, the rest deleted from both."""
    project, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    train(project, epochs=2, fallbacks=[fallback])
    full = faultfs.ctl.fail("write", "ENOSPC", times=None)
    accelerator, _, _ = train(project, epochs=4, fallbacks=[fallback], resume=True)
    assert [r.redirected for r in protected_results(accelerator)] == [True, True]
    faultfs.ctl.remove(full)
    train(project, epochs=5, fallbacks=[fallback], resume=True)
    assert everywhere(project / "checkpoints", fallback) == ["checkpoint_3", "checkpoint_4"]
    assert [n for n in os.listdir(project / "checkpoints") if n[0] != "."] == ["checkpoint_4"]
    [copy] = manifest.pending([str(fallback)], mine=True)
    assert copy.requested == str(project / "checkpoints" / "checkpoint_3")


def test_a_transient_error_is_retried_and_the_checkpoint_loads_as_saved(faultfs, tmp_path, caplog):
    """An EIO writing the safetensors weights (its errno only in safetensors' message): the
    whole checkpoint is written again, at its place, and loads as an unfaulted one."""
    project = faultfs.mountpoint / "run"
    # safetensors writes a temporary file and renames it to model.safetensors
    rule = faultfs.ctl.fail("write", "EIO", path="*checkpoint_0*/.tmp*", sticky=True)
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        accelerator, model, _ = train(project, epochs=2, fallbacks=[])
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert "failed at write with EIO (transient)" in caplog.text
    [first, second] = protected_results(accelerator)
    assert (first.attempts, second.attempts, first.redirected) == (2, 1, False)
    assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_0", "checkpoint_1"]
    _, resumed, done = train(project, epochs=2, fallbacks=[], resume=True)
    assert done.done == 2 and same_weights(resumed, model)


def test_a_failed_save_never_costs_the_last_good_checkpoint(faultfs, tmp_path):
    """``total_limit=1``: Accelerate alone deletes the only checkpoint before it writes the
    next; protected, a save that fails on every attempt (and has nowhere to go) leaves it."""
    plain, project = faultfs.mountpoint / "plain", faultfs.mountpoint / "run"
    train(plain, epochs=1, total_limit=1)
    train(project, epochs=1, fallbacks=[], total_limit=1)  # checkpoint_0 in both
    full = faultfs.ctl.fail("write", "ENOSPC", times=None)
    with pytest.raises(Exception, match="No space left on device"):
        train(plain, epochs=2, resume=True, total_limit=1)
    with pytest.raises(SaveError):
        train(project, epochs=2, fallbacks=[], resume=True, total_limit=1)
    assert "checkpoint_0" not in os.listdir(plain / "checkpoints")  # Accelerate's loss
    assert [n for n in os.listdir(project / "checkpoints") if n[0] != "."] == ["checkpoint_0"]
    faultfs.ctl.remove(full)
    _, _, done = train(project, epochs=2, fallbacks=[], resume=True, total_limit=1)
    assert done.done == 2 and os.listdir(project / "checkpoints") == ["checkpoint_1"]


def test_an_explicit_directory_is_redirected_whole_and_loaded_by_its_name(tmpfs, tmp_path):
    mounted = tmpfs(size="256k").path
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)
    model = torch.nn.Linear(8, 1)
    accelerator = protect(Accelerator(cpu=True), fallback_dirs=[fallback], backoff=quick())
    model = accelerator.prepare(model)
    saved = accelerator.save_state(mounted / "step-10")
    assert str(saved).startswith(str(fallback)) and not (mounted / "step-10").exists()
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(str(mounted / "step-10"))
    assert not torch.equal(model.weight, torch.zeros_like(model.weight))


def test_a_wrong_option_fails_when_protecting():
    with pytest.raises(TypeError, match="max_wiat"):
        protect(Accelerator(cpu=True), max_wiat=30)


def test_two_processes_commit_one_checkpoint_and_resume_from_the_fallback(tmpfs, tmp_path):
    """Under torchrun every process writes its part (its RNG state) into one staging
    directory, committed once, redirected together; ``load_state()`` on both resumes."""
    mounted = tmpfs(size="256k").path
    project, fallback = mounted / "run", tmp_path / "fallback"
    (project / "checkpoints").mkdir(parents=True)
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)

    first = job(project, 2, "fresh", fallback)
    assert first[0]["landed"] == first[1]["landed"]  # one save of both processes
    assert all(path.startswith(str(fallback)) for path in first[0]["landed"])
    newest = last_checkpoint(project / "checkpoints", [fallback])
    assert newest == first[0]["landed"][-1]
    assert {"random_states_0.pkl", "random_states_1.pkl", "model.safetensors"} <= set(
        os.listdir(newest)
    )
    resumed = job(project, 3, "resume", fallback)
    unfaulted = job(tmp_path / "plain", 3, "fresh")
    assert [r["done"] for r in resumed] == [3, 3]
    assert resumed[0]["weights"] == resumed[1]["weights"] == unfaulted[0]["weights"]
    assert everywhere(project / "checkpoints", fallback) == ["checkpoint_1", "checkpoint_2"]


def job(project: Path, epochs: int, resume: str, fallback: Path | None = None) -> list[dict]:
    args = [str(project), str(epochs), resume, *([str(fallback)] if fallback else [])]
    return torchrun_job("tests.support.accelerate_job", RESULT, *args)
