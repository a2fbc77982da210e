"""`fsprobe.integrations.transformers.protect`: a real Hugging Face `Trainer` (a tiny GPT-2 built
from a config, no downloads) whose ``checkpoint-N/`` directories are written through
`fsprobe.save_dir`, on the fault filesystem. Pinned against the installed transformers: the
checkpoints hold exactly what the unprotected Trainer writes, rotate and track the best model
as it does, and a resume loads them."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from tests.support.capability import need_module

need_module("transformers")
need_module("accelerate")

from transformers import GPT2LMHeadModel, Trainer, TrainerCallback  # noqa: E402

from fsprobe import SaveOptions  # noqa: E402
from fsprobe.integrations.transformers import (  # noqa: E402
    last_checkpoint,
    protect,
    protected_results,
)
from fsprobe.posix.atomic import parse_temp_name  # noqa: E402
from fsprobe.redirect import manifest  # noqa: E402
from fsprobe.saving.options import Backoff  # noqa: E402
from tests.support.durability import assert_directory_saved  # noqa: E402
from tests.support.torchrun import torchrun_job  # noqa: E402
from tests.support.trainer_job import RESULT, comparable, tiny_trainer  # noqa: E402

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

#: What the installed Trainer writes into every checkpoint of this model (no scaler on CPU).
CHECKPOINT_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "optimizer.pt",
    "rng_state.pth",
    "scheduler.pt",
    "trainer_state.json",
    "training_args.bin",
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")


def quick() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def checkpoints(output_dir: Path) -> list[str]:
    return sorted(name for name in os.listdir(output_dir) if name.startswith("checkpoint-"))


def relative(path: str | None, start: Path) -> str | None:
    return None if path is None else os.path.relpath(path, start)


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}


def leftovers(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(".fsprobe")]


def assert_complete_and_loads(checkpoint: Path, step: int) -> None:
    """Everything the Trainer writes is there, and each file loads as what it is."""
    assert sorted(os.listdir(checkpoint)) == CHECKPOINT_FILES
    model = GPT2LMHeadModel.from_pretrained(checkpoint)
    assert model.transformer.wte.weight.shape == (64, 16)
    optimizer = torch.load(checkpoint / "optimizer.pt")
    assert optimizer["state"] and optimizer["param_groups"]
    assert "last_epoch" in torch.load(checkpoint / "scheduler.pt")
    assert "cpu" in torch.load(checkpoint / "rng_state.pth", weights_only=False)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == step


@pytest.mark.parametrize(
    ("victim", "errno_name"),
    [
        # model.safetensors, written by safetensors (Rust) to a temp file renamed in place:
        # the errno survives only in the message, "... (os error 5)".
        (".tmp*", "EIO"),
        ("optimizer.pt", "EUNKNOWN"),  # torch.save to a path: "unexpected pos", no errno
    ],
)
def test_a_write_failing_inside_a_checkpoint_is_retried_and_every_checkpoint_is_whole(
    faultfs, caplog, victim, errno_name
):
    output = faultfs.mountpoint / "run"
    trainer = protect(tiny_trainer(output), backoff=quick())
    # The first write of this file in checkpoint-2's staging directory fails, handle broken.
    rule = faultfs.ctl.fail(
        "write", "EIO", path=f"/run/.fsprobe~*checkpoint-2.tmp/{victim}", sticky=True
    )
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        trainer.train()
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert trainer.state.global_step == 3
    results = protected_results(trainer)
    assert [(r.attempts, r.errors) for r in results] == [(1, ()), (2, (errno_name,)), (1, ())]
    assert all(not r.redirected for r in results)
    assert "attempt 1/5 failed" in caplog.text
    assert checkpoints(output) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for step in (1, 2, 3):
        assert_complete_and_loads(output / f"checkpoint-{step}", step)
    assert leftovers(output) == []
    # The attempt that counted was durable: files, then directories, then rename, then parent.
    assert_directory_saved(faultfs, output / "checkpoint-3")


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param(dict(max_steps=3, save_total_limit=2), id="rotation"),
        pytest.param(
            dict(
                max_steps=4,
                save_total_limit=1,
                eval_strategy="steps",
                eval_steps=1,
                load_best_model_at_end=True,
                metric_for_best_model="loss",
            ),
            id="best-model",
        ),
    ],
)
def test_the_checkpoints_are_what_the_unprotected_trainer_writes(tmp_path, arguments):
    """Same files, same rotation (save_total_limit), same best checkpoint, same state."""
    plain = tiny_trainer(tmp_path / "plain", **arguments)
    plain.train()
    protected = protect(tiny_trainer(tmp_path / "protected", **arguments))
    protected.train()

    assert checkpoints(tmp_path / "protected") == checkpoints(tmp_path / "plain")
    for name in checkpoints(tmp_path / "plain"):
        ours, theirs = tmp_path / "protected" / name, tmp_path / "plain" / name
        assert sorted(os.listdir(ours)) == sorted(os.listdir(theirs))
        state, reference = (
            json.loads((d / "trainer_state.json").read_text()) for d in (ours, theirs)
        )
        assert relative(state.pop("best_model_checkpoint"), ours.parent) == relative(
            reference.pop("best_model_checkpoint"), theirs.parent
        )
        # Everything else, the log history above all: what a resume from here restores.
        assert comparable(state) == comparable(reference)
    assert protected.state.best_global_step == plain.state.best_global_step
    assert relative(protected.state.best_model_checkpoint, tmp_path / "protected") == relative(
        plain.state.best_model_checkpoint, tmp_path / "plain"
    )
    assert leftovers(tmp_path / "protected") == []


def test_a_resume_loads_the_protected_checkpoint(tmp_path):
    first = protect(tiny_trainer(tmp_path / "run", max_steps=2))
    first.train()
    resumed = protect(tiny_trainer(tmp_path / "run", max_steps=3))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert checkpoints(tmp_path / "run") == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert_complete_and_loads(tmp_path / "run" / "checkpoint-3", 3)


@pytest.mark.parametrize("resume_at", [2, 4])
def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, resume_at):
    """transformers' test_resume_training, protected: resumed from a checkpoint, the run ends
    with the weights (dropout draws from the restored RNG), loss, log history and step of the
    run that was never interrupted."""
    arguments = dict(max_steps=6, save_steps=2, samples=12)
    whole = protect(tiny_trainer(tmp_path / "whole", **arguments))
    whole.train()
    state = dataclasses.asdict(whole.state)

    resumed = protect(tiny_trainer(tmp_path / "whole", **arguments))
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / f"checkpoint-{resume_at}"))
    assert resumed.state.global_step == 6
    assert weights(resumed).keys() == weights(whole).keys()
    for name, tensor in weights(resumed).items():
        assert torch.equal(tensor, weights(whole)[name]), name
    assert comparable(dataclasses.asdict(resumed.state)) == comparable(state)


def test_an_interrupted_run_resumes_where_its_last_checkpoint_left_it(tmp_path):
    """Killed after checkpoint-2 (an exception out of step 3), resumed with
    ``resume_from_checkpoint=True``: the same run as one never interrupted."""

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise KeyboardInterrupt("the job's time is up")

    arguments = dict(max_steps=4, save_steps=2)
    whole = protect(tiny_trainer(tmp_path / "whole", **arguments))
    whole.train()
    interrupted = protect(tiny_trainer(tmp_path / "run", callbacks=[Interrupt()], **arguments))
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert checkpoints(tmp_path / "run") == ["checkpoint-2"]
    assert leftovers(tmp_path / "run") == []
    resumed = protect(tiny_trainer(tmp_path / "run", **arguments))
    resumed.train(resume_from_checkpoint=True)
    assert checkpoints(tmp_path / "run") == checkpoints(tmp_path / "whole")
    for name, tensor in weights(resumed).items():
        assert torch.equal(tensor, weights(whole)[name]), name
    assert comparable(dataclasses.asdict(resumed.state)) == comparable(
        dataclasses.asdict(whole.state)
    )


def test_a_writer_fsprobe_does_not_know_is_refused_instead_of_left_unprotected(tmp_path):
    """A Trainer (a future version, a subclass) that writes into the checkpoint some other way
    than the known writers would leave those files outside the staging directory."""

    class Sidecar(Trainer):
        def _save_rng_state(self, output_dir):
            super()._save_rng_state(output_dir)
            checkpoint = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            os.makedirs(checkpoint, exist_ok=True)
            Path(checkpoint, "sidecar.json").write_text("{}")

    plain = tiny_trainer(tmp_path / "run", max_steps=1)
    trainer = protect(
        Sidecar(model=plain.model, args=plain.args, train_dataset=plain.train_dataset)
    )
    with pytest.raises(RuntimeError, match=r"wrote into .*checkpoint-1 by a way fsprobe does not"):
        trainer.train()
    assert leftovers(tmp_path / "run") == []


def test_protect_checks_its_arguments_and_protects_once(tmp_path):
    trainer = tiny_trainer(tmp_path / "run")
    with pytest.raises(TypeError, match="atempts"):
        protect(trainer, atempts=3)
    with pytest.raises(TypeError, match="write"):
        protect(trainer, write=print)
    protect(trainer)
    with pytest.raises(ValueError, match="protected already"):
        protect(trainer)
    with pytest.raises(ValueError, match="not protected"):
        protected_results(tiny_trainer(tmp_path / "other"))


def test_no_staging_directory_is_left_when_the_save_fails_for_good(faultfs):
    output = faultfs.mountpoint / "run"
    trainer = protect(tiny_trainer(output, max_steps=1), attempts=2, backoff=quick())
    faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*/optimizer.pt", times=None, sticky=True)
    with pytest.raises(OSError) as raised:
        trainer.train()
    assert [a.errno for a in raised.value.attempts] == ["EUNKNOWN", "EUNKNOWN"]
    assert os.listdir(output) == []
    assert not [name for name in os.listdir(output) if parse_temp_name(name)]


def test_torchrun_two_ranks_one_failing_write_on_rank_1_and_every_checkpoint_is_whole(faultfs):
    """`torchrun`, 2 processes, gloo: every rank writes its part of ``checkpoint-N/`` (its RNG
    state) into the one staging directory; rank 1's write fails once, both ranks retry."""
    output = faultfs.mountpoint / "run"
    rule = faultfs.ctl.fail(
        "write", "EIO", path="/run/.fsprobe~*checkpoint-2.tmp/rng_state_1.pth", sticky=True
    )
    reports = torchrun_job("tests.support.trainer_job", RESULT, str(output), "3")
    assert [(r["rank"], r["world_size"], r["global_step"]) for r in reports] == [
        (0, 2, 3),
        (1, 2, 3),
    ]
    for report in reports:  # one decision for all: the same result on every rank
        outcomes = [(s["attempts"], s["errors"]) for s in report["results"]]
        assert outcomes == [(1, []), (2, ["EUNKNOWN"]), (1, [])]
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert checkpoints(output) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for step in (1, 2, 3):
        checkpoint = output / f"checkpoint-{step}"
        assert sorted(os.listdir(checkpoint)) == sorted(
            [
                *(f for f in CHECKPOINT_FILES if f != "rng_state.pth"),
                "rng_state_0.pth",
                "rng_state_1.pth",
            ]
        )
        GPT2LMHeadModel.from_pretrained(checkpoint)
        for rank in (0, 1):
            assert "cpu" in torch.load(checkpoint / f"rng_state_{rank}.pth", weights_only=False)
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    assert leftovers(output) == []


def test_checkpoints_that_do_not_fit_are_redirected_whole_and_a_resume_finds_them(tmpfs, tmp_path):
    output = tmpfs(size="160k").path / "run"  # room for the first checkpoint only
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    trainer = protect(tiny_trainer(output), fallback_dirs=[fallback], backoff=quick())
    trainer.train()
    results = protected_results(trainer)
    assert [r.redirected for r in results] == [False, True, True]
    assert checkpoints(output) == ["checkpoint-1"]  # nothing of the others at the target
    for result in results[1:]:
        assert result.path.startswith(str(fallback))
        assert_complete_and_loads(Path(result.path), int(result.path.rsplit("-", 1)[1]))

    found = last_checkpoint(output, fallback_dirs=[fallback])
    assert found == results[-1].path  # checkpoint-3, in the fallback
    resumed = protect(tiny_trainer(output, max_steps=4), fallback_dirs=[fallback])
    resumed.train(resume_from_checkpoint=found)
    assert resumed.state.global_step == 4
    assert protected_results(resumed)[-1].redirected
    assert last_checkpoint(output, fallback_dirs=[fallback]).endswith("checkpoint-4")


@pytest.mark.parametrize("inodes", [15, 18])
def test_a_checkpoint_torch_cannot_open_for_want_of_inodes_is_redirected(
    tmpfs, tmp_path, caplog, inodes
):
    """With the second checkpoint's inodes running out at a file torch.save opens itself
    (training_args.bin, optimizer.pt...), torch raises RuntimeError("... open file failed with
    strerror: No space left on device"), no errno: the unprotected Trainer dies of it, the
    protected one redirects the checkpoint (it died of it too: not an I/O failure)."""
    with pytest.raises(RuntimeError, match="open file failed with strerror: No space left"):
        tiny_trainer(tmpfs(size="4M", nr_inodes=inodes).path / "run").train()

    output = tmpfs(size="4M", nr_inodes=inodes).path / "run"
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    trainer = protect(tiny_trainer(output), fallback_dirs=[fallback], backoff=quick())
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        trainer.train()
    results = protected_results(trainer)
    assert [r.redirected for r in results] == [False, True, True]
    assert results[1].errors == ("ENOSPC",)
    assert "ENOSPC (capacity): [enforce fail" in caplog.text
    assert "open file failed with strerror: No space left on device" in caplog.text
    for result in results[1:]:
        assert_complete_and_loads(Path(result.path), int(result.path.rsplit("-", 1)[1]))


def test_last_checkpoint_is_the_newest_at_the_output_dir_without_redirects(tmp_path):
    assert last_checkpoint(tmp_path / "nothing-yet") is None
    trainer = protect(tiny_trainer(tmp_path / "run", max_steps=2))
    trainer.train()
    (tmp_path / "run" / "checkpoint-x").mkdir()  # not a checkpoint name
    assert last_checkpoint(tmp_path / "run") == str(tmp_path / "run" / "checkpoint-2")


def redirect_checkpoint(faultfs, step: int) -> int:
    """Every write into the staging directory of ``run/checkpoint-<step>`` fails with EDQUOT:
    that checkpoint goes to the fallback, whole; the others stay at the target."""
    staging = f"/run/.fsprobe~*checkpoint-{step}.tmp/*"
    return faultfs.ctl.fail("write", "EDQUOT", path=staging, times=None)


def everywhere(output: Path, fallback: Path) -> list[str]:
    """The checkpoint names of `output`, at the target or redirected (not synced back)."""
    redirected = [
        os.path.basename(entry.requested)
        for entry in manifest.pending([str(fallback)], mine=True)
        if os.path.dirname(entry.requested) == str(output)
    ]
    return sorted(checkpoints(output) + redirected)


#: Evaluated every step; the best is the *worst* loss, an early checkpoint, so that the end
#: loads a checkpoint other than the last.
BEST_EARLY = dict(
    max_steps=5,
    eval_strategy="steps",
    eval_steps=1,
    save_total_limit=2,
    load_best_model_at_end=True,
    metric_for_best_model="loss",
    greater_is_better=True,
)


@pytest.mark.parametrize("limit", [2, 1])
@pytest.mark.parametrize("redirected", ["best", "others"])
def test_the_best_model_and_the_rotation_count_the_target_and_the_fallback_together(
    faultfs, tmp_path, redirected, limit
):
    """The run ends with the best model wherever it landed, keeps save_total_limit
    checkpoints in target and fallback together (the rest deleted from both), and its state
    is the unprotected run's. With ``save_total_limit=1`` the Trainer's end of training keeps
    the best checkpoint alone (it compared each checkpoint to the best with os.path.samefile,
    FileNotFoundError when the best was redirected)."""
    arguments = {**BEST_EARLY, "save_total_limit": limit}
    plain = tiny_trainer(tmp_path / "plain", **arguments)
    plain.train()
    best = plain.state.best_global_step
    assert best not in (None, 5)  # the end loads an earlier checkpoint
    steps = [best] if redirected == "best" else [s for s in range(1, 6) if s != best]

    output, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    for step in steps:
        redirect_checkpoint(faultfs, step)
    protected = protect(
        tiny_trainer(output, **arguments), fallback_dirs=[fallback], backoff=quick()
    )
    protected.train()
    results = protected_results(protected)
    assert [int(r.requested_path.rsplit("-", 1)[1]) for r in results if r.redirected] == steps

    for name, tensor in weights(protected).items():  # the best model, loaded at the end
        assert torch.equal(tensor, weights(plain)[name]), name
    assert everywhere(output, fallback) == checkpoints(tmp_path / "plain")
    assert protected.state.best_global_step == best
    assert relative(protected.state.best_model_checkpoint, output) == relative(
        plain.state.best_model_checkpoint, tmp_path / "plain"
    )
    newest = Path(last_checkpoint(output, fallback_dirs=[fallback]))
    state, reference = (
        json.loads((d / "trainer_state.json").read_text())
        for d in (newest, tmp_path / "plain" / newest.name)
    )
    assert relative(state.pop("best_model_checkpoint"), output) == relative(
        reference.pop("best_model_checkpoint"), tmp_path / "plain"
    )
    assert comparable(state) == comparable(reference)
    copies = {e.actual for e in manifest.pending([str(fallback)], mine=True)}
    assert {
        os.path.join(parent, name)
        for parent, names, _ in os.walk(fallback)
        for name in names
        if name.startswith("checkpoint-")
    } == copies  # what the rotation deleted is gone from the fallback too


def test_a_resume_finds_the_newest_checkpoint_in_the_fallback_and_keeps_a_redirected_best(
    faultfs, tmp_path
):
    """``resume_from_checkpoint=True`` resumes from a redirected newest checkpoint, and the
    best checkpoint it names stays the best though it is not at its path: the run ends as the
    one never interrupted, best model loaded."""

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 4:
                raise KeyboardInterrupt("the job's time is up")

    arguments = {**BEST_EARLY, "save_total_limit": None}
    whole = tiny_trainer(tmp_path / "whole", **arguments)
    whole.train()
    best = whole.state.best_global_step
    assert best not in (None, 3, 5)

    output, fallback = faultfs.mountpoint / "run", tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    for step in sorted({best, 3}):
        redirect_checkpoint(faultfs, step)
    interrupted = protect(
        tiny_trainer(output, callbacks=[Interrupt()], **arguments),
        fallback_dirs=[fallback],
        backoff=quick(),
    )
    with pytest.raises(KeyboardInterrupt):
        interrupted.train()
    assert "checkpoint-3" not in checkpoints(output)

    resumed = protect(tiny_trainer(output, **arguments), fallback_dirs=[fallback])
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 5
    for name, tensor in weights(resumed).items():
        assert torch.equal(tensor, weights(whole)[name]), name
    assert resumed.state.best_global_step == best
    assert relative(resumed.state.best_model_checkpoint, output) == relative(
        whole.state.best_model_checkpoint, tmp_path / "whole"
    )


def test_protect_makes_its_options_at_once(tmp_path):
    trainer = tiny_trainer(tmp_path / "run")
    with pytest.raises(ValueError, match="attempts"):
        protect(trainer, attempts=0)
    with pytest.raises(ValueError, match="attempts"):
        protect(trainer, options=SaveOptions(attempts=3), attempts=0)
    with pytest.raises(TypeError, match="backoff"):
        protect(trainer, backoff=0.2)
    protect(trainer, options=SaveOptions(attempts=2))
