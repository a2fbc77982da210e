"""The Hugging Face callback in a real two-step `Trainer` run of a tiny GPT-2 built from a config
(no downloads)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest

from tests.support.capability import need_module

transformers = need_module("transformers")
need_module("accelerate")

from transformers import Trainer, TrainerCallback  # noqa: E402

from fsprobe import SaveOptions  # noqa: E402
from fsprobe.integrations.transformers import FsprobeCallback  # noqa: E402
from fsprobe.model import QuotaState  # noqa: E402
from tests.support.state import daemon_view, publish, quota_entry  # noqa: E402
from tests.support.trainer_job import comparable, tiny_trainer  # noqa: E402

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")


class Logs(TrainerCallback):
    """Registered after FsprobeCallback: sees the logs as reporters after it would."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(dict(logs or {}))


def run(output_dir, callback: FsprobeCallback) -> tuple[Trainer, Logs]:
    logs = Logs()
    trainer = tiny_trainer(output_dir, max_steps=2, callbacks=[callback, logs])
    trainer.train()
    return trainer, logs


def test_callback_runs_the_preflight_before_each_save_and_reports_it(tmp_path, caplog):
    callback = FsprobeCallback()
    with caplog.at_level(logging.INFO, logger="fsprobe.transformers"):
        _, logs = run(tmp_path / "out", callback)
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-1", "checkpoint-2"]
    assert [d.action for d in callback.decisions] == ["proceed", "proceed"]
    first, second = callback.decisions
    assert first.need_bytes is None  # nothing saved yet to size the checkpoint by
    size = sum(f.stat().st_size for f in (tmp_path / "out" / "checkpoint-1").rglob("*"))
    assert second.need_bytes >= size * 1.1 - 1  # the previous checkpoint, plus the margin
    assert os.path.dirname(second.requested_path) == str(tmp_path / "out")

    assert [e["fsprobe_action"] for e in logs.seen if "fsprobe_action" in e] == ["proceed"] * 2
    assert "before the save at step 1" in caplog.text and "before the save at step 2" in caplog.text


def test_an_unfit_target_is_reported_and_training_goes_on(tmp_path, caplog):
    out, state = tmp_path / "out", tmp_path / "state"
    out.mkdir()
    state.mkdir(mode=0o700)
    hard = quota_entry(QuotaState.HARD_REACHED, kind="project", ident=1234)
    publish(str(state), {str(out): daemon_view(str(out), quota=(hard,))})
    callback = FsprobeCallback(SaveOptions(state_dir=str(state)))
    with caplog.at_level(logging.WARNING, logger="fsprobe.transformers"):
        trainer, _ = run(out, callback)
    assert trainer.state.global_step == 2
    assert [d.action for d in callback.decisions] == ["fail", "fail"]
    assert all(d.source == "state" for d in callback.decisions)
    assert "quota_hard_reached" in caplog.text and "step 2" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "error"), [({"max_wiat": 30}, TypeError), ({"timeout": 0}, ValueError)]
)
def test_a_wrong_option_fails_when_the_callback_is_made(overrides, error):
    with pytest.raises(error, match=next(iter(overrides))):
        FsprobeCallback(**overrides)


def test_the_callback_keeps_nothing_in_the_state_the_trainer_saves_and_restores(tmp_path):
    """trainer_state.json (and so a resumed run's log history) is what it is without the
    callback: its decisions are in `decisions`, the log and the printed logs only."""
    plain = tiny_trainer(tmp_path / "plain", max_steps=2)
    plain.train()
    watched, _ = run(tmp_path / "watched", FsprobeCallback())
    assert comparable(dataclasses.asdict(watched.state)) == comparable(
        dataclasses.asdict(plain.state)
    )
    saved = json.loads((tmp_path / "watched" / "checkpoint-2" / "trainer_state.json").read_text())
    assert not [e for e in saved["log_history"] if any(k.startswith("fsprobe") for k in e)]
