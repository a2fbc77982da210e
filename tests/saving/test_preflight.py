"""`fsprobe.preflight` judged from the daemon's state file, or from its own inline probe."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.model import QuotaState, Status
from fsprobe.policy import Policy
from fsprobe.saving.context import SaveContext
from fsprobe.saving.preflight import expected_need
from fsprobe.state import ANSWER_KEY, Writer, write_state
from tests.support.state import INTERVALS, daemon_view, publish, quota_entry


@pytest.fixture
def dirs(tmp_path):
    """A target directory, a fallback directory and a private state directory."""
    target, fallback, state = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "state"
    target.mkdir()
    fallback.mkdir()
    state.mkdir(mode=0o700)
    return str(target), str(fallback), str(state)


def test_a_healthy_directory_proceeds_from_an_inline_probe(dirs):
    target, _, _ = dirs
    decision = fsprobe.preflight(os.path.join(target, "model.pt"))
    assert decision.action == "proceed" and decision.source == "probe"
    assert decision.path == decision.requested_path == os.path.join(target, "model.pt")
    assert decision.status is Status.OK and decision.wait_seconds == 0.0
    assert decision.fits is True  # one inode needed, and there are many


def test_a_fresh_trusted_state_file_answers(dirs):
    target, _, state = dirs
    publish(state, {target: daemon_view(target, write_seconds=6.0)})
    decision = fsprobe.preflight(os.path.join(target, "sub", "model.pt"), state_dir=state)
    assert decision.source == "state"
    assert decision.action == "proceed" and decision.status is Status.DEGRADED
    assert [r.code for r in decision.reasons] == ["write_slow"]


def test_an_untrusted_state_file_is_ignored_with_one_warning(dirs, caplog):
    target, _, state = dirs
    publish(state, {target: daemon_view(target, readonly=True)})
    os.chmod(state, 0o777)  # anyone could have written it
    with caplog.at_level(logging.WARNING, logger="fsprobe.preflight"):
        first = fsprobe.preflight(os.path.join(target, "a.pt"), state_dir=state)
        second = fsprobe.preflight(os.path.join(target, "b.pt"), state_dir=state)
    assert first.source == second.source == "probe"
    assert first.status is Status.OK  # the inline probe's view, not the file's "readonly"
    warnings = [r for r in caplog.records if "writable by group or others" in r.getMessage()]
    assert len(warnings) == 1


def test_a_stale_state_entry_is_not_trusted(dirs):
    target, _, state = dirs
    publish(state, {target: daemon_view(target, readonly=True, age=600)})
    decision = fsprobe.preflight(os.path.join(target, "model.pt"), state_dir=state)
    assert decision.source == "probe" and decision.action == "proceed"


def test_the_state_holds_for_as_long_as_the_daemons_policy_says(dirs):
    """Staleness is the policy's: `stale_after_intervals` of the daemon's probe intervals."""
    target, _, state = dirs
    requested = os.path.join(target, "model.pt")
    publish(state, {target: daemon_view(target, readonly=True, age=40)})  # 3 x 15 s: fresh
    assert fsprobe.preflight(requested, state_dir=state).source == "state"
    publish(state, {target: daemon_view(target, readonly=True, age=50)})
    assert fsprobe.preflight(requested, state_dir=state).source == "probe"
    patient = Policy(intervals=INTERVALS, stale_after_intervals=5)  # 75 s
    publish(state, {target: daemon_view(target, readonly=True, age=50, policy=patient)})
    assert fsprobe.preflight(requested, state_dir=state).source == "state"


def test_a_checkpoint_that_does_not_fit_is_redirected_to_a_fallback(dirs):
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, avail_bytes=1000)})
    requested = os.path.join(target, "model.pt")
    decision = fsprobe.preflight(
        requested, need_bytes=5000, fallback_dirs=[fallback], state_dir=state
    )
    assert decision.action == "redirect"
    area = os.path.join(fallback, f"uid-{os.geteuid()}")  # this user's area in the fallback
    assert decision.path == os.path.join(area, requested.lstrip("/"))  # mirrored
    assert decision.fits is False and decision.status is Status.UNHEALTHY
    assert any("needs 4.88 KiB" in r.message for r in decision.reasons)


def test_without_a_fallback_an_unhealthy_target_is_still_attempted_unless_told_not_to(dirs, caplog):
    target, _, state = dirs
    hard = quota_entry(QuotaState.HARD_REACHED)
    publish(state, {target: daemon_view(target, quota=(hard,))})
    requested = os.path.join(target, "model.pt")
    with caplog.at_level(logging.WARNING, logger="fsprobe.preflight"):
        attempted = fsprobe.preflight(requested, state_dir=state)
    assert attempted.action == "proceed" and attempted.path == requested
    assert "quota_hard_reached" in caplog.text
    refused = fsprobe.preflight(requested, state_dir=state, on_unhealthy="fail")
    assert refused.action == "fail"
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.atomic_write(
            requested, lambda f: f.write(b"x"), state_dir=state, on_unhealthy="fail"
        )
    assert (
        raised.value.attempts[0].step == "preflight" and raised.value.attempts[0].errno == "EDQUOT"
    )
    assert os.listdir(target) == []


def test_fallbacks_from_the_environment_are_used_but_never_from_the_state_file(dirs, monkeypatch):
    target, fallback, state = dirs
    planted = {**daemon_view(target, readonly=True).to_dict(), "fallback_dirs": [fallback]}
    write_state(state, time.time(), Writer("node1", 1, "0"), {target: json.dumps(planted)})
    requested = os.path.join(target, "model.pt")
    assert fsprobe.preflight(requested, state_dir=state).action == "proceed"
    monkeypatch.setenv("FSPROBE_FALLBACK_DIRS", f"/nonexistent-fallback:{fallback}")
    decision = fsprobe.preflight(requested, state_dir=state)
    assert decision.action == "redirect" and decision.path.startswith(fallback + "/")


def test_a_fallback_that_is_unhealthy_itself_is_not_taken(dirs, tmp_path):
    target, fallback, state = dirs
    other = str(tmp_path / "other")
    os.mkdir(other)
    expired = quota_entry(QuotaState.GRACE_EXPIRED)
    publish(
        state,
        {
            target: daemon_view(target, readonly=True),
            fallback: daemon_view(fallback, quota=(expired,)),
        },
    )
    decision = fsprobe.preflight(
        os.path.join(target, "m.pt"), fallback_dirs=[fallback, other], state_dir=state
    )
    assert decision.action == "redirect" and decision.path.startswith(other + "/")


def test_need_defaults_to_the_last_save_into_that_directory_plus_ten_percent(dirs):
    target, _, _ = dirs
    assert fsprobe.preflight(os.path.join(target, "first.pt")).need_bytes is None
    fsprobe.atomic_write(os.path.join(target, "model.pt"), lambda f: f.write(b"x" * 1000))
    assert fsprobe.preflight(os.path.join(target, "epoch-2.pt")).need_bytes == 1100
    fsprobe.atomic_write(os.path.join(target, "meta.json"), lambda f: f.write(b"{}"))
    assert fsprobe.preflight(os.path.join(target, "model.pt")).need_bytes == 1100  # same file
    assert fsprobe.preflight(os.path.join(target, "epoch-3.pt")).need_bytes == 3  # the directory


def test_delay_waits_for_a_hung_mount_to_recover(dirs):
    target, _, state = dirs
    publish(state, {target: daemon_view(target, stuck=True)})
    recovered = threading.Timer(1.2, lambda: publish(state, {target: daemon_view(target)}))
    recovered.start()
    try:
        decision = fsprobe.preflight(os.path.join(target, "m.pt"), max_wait=20, state_dir=state)
    finally:
        recovered.cancel()
    assert decision.action == "delay" and decision.status is Status.OK
    assert 1.0 <= decision.wait_seconds < 15


def test_still_stuck_when_the_wait_ends_means_redirect(dirs):
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, stuck=True)})
    start = time.monotonic()
    decision = fsprobe.preflight(
        os.path.join(target, "m.pt"), max_wait=1.5, fallback_dirs=[fallback], state_dir=state
    )
    assert decision.action == "redirect" and decision.wait_seconds >= 1.5
    assert time.monotonic() - start < 10
    assert [r.code for r in decision.reasons] == ["mount_stuck"]


def test_decision_summary_and_dict_say_what_happened(dirs):
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, readonly=True)})
    decision = fsprobe.preflight(
        os.path.join(target, "m.pt"), fallback_dirs=[fallback], state_dir=state
    )
    (readonly,) = [r for r in decision.reasons if r.code == "readonly"]
    assert decision.summary().startswith("redirect (target unhealthy) to ")
    assert f"readonly: {readonly.message}" in decision.summary()
    assert "is mounted read-only" in readonly.message
    as_dict = decision.to_dict()
    assert as_dict["action"] == "redirect" and as_dict["status"] == "unhealthy"
    assert {
        "code": "readonly",
        "severity": "unhealthy",
        "message": readonly.message,
        "transient": False,
        "errno": "EROFS",
    } in as_dict["reasons"]


def test_bad_on_unhealthy_is_refused(dirs):
    with pytest.raises(ValueError, match="on_unhealthy"):
        fsprobe.preflight(os.path.join(dirs[0], "m.pt"), on_unhealthy="maybe")


def test_remembered_sizes_stay_bounded_for_runs_that_save_into_new_directories():
    context = SaveContext(memory_entries=4)
    for epoch in range(10):
        context.remember_save(f"/ckpt/epoch-{epoch}/model.pt", 1000 + epoch)
    # 4 entries: the last two saves, each by file and by directory
    assert expected_need(context, "/ckpt/epoch-9/model.pt") == math.ceil(1009 * 1.1)
    assert expected_need(context, "/ckpt/epoch-8/other.pt") == math.ceil(1008 * 1.1)
    assert expected_need(context, "/ckpt/epoch-7/model.pt") is None  # forgotten
    assert expected_need(context, "/ckpt/epoch-0/model.pt") is None


def test_reads_the_state_file_that_fsprobe_run_writes(dirs):
    target, _, state = dirs
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "run", target, "--once", "--state-dir", state],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert os.path.exists(os.path.join(state, "state.json")), done.stderr
    decision = fsprobe.preflight(os.path.join(target, "model.pt"), state_dir=state)
    assert decision.source == "state" and decision.action == "proceed"


FAST_PATH = """
import json, sys, time
import psutil
import fsprobe
target, fallback, state = sys.argv[1:4]
start = time.monotonic()
decision = fsprobe.preflight(target + "/model.pt", need_bytes=1 << 20, fallback_dirs=[fallback],
                             state_dir=state, timeout=5)
print(json.dumps({
    "action": decision.action,
    "source": decision.source,
    "seconds": time.monotonic() - start,
    "children": [p.pid for p in psutil.Process().children(recursive=True)],
    "threads": psutil.Process().num_threads(),
}))
"""


def test_a_healthy_target_in_the_state_is_answered_without_a_process_or_a_fallback(dirs, faultfs):
    """The README's pattern (docs/design.md §7, issue 11.4): fallbacks judged only for a redirect.

    The fallback is a hung mount: judging it would cost the 5 s timeout and a probe worker.
    """
    target, _, state = dirs
    publish(state, {target: daemon_view(target)})
    rule = faultfs.ctl.block("statfs")
    try:
        done = subprocess.run(
            [sys.executable, "-c", FAST_PATH, target, str(faultfs.mountpoint), state],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert faultfs.ctl.rule(rule)["waiting"] == 0  # nobody asked the fallback anything
    finally:
        faultfs.ctl.remove(rule)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["action"], answer["source"]) == ("proceed", "state")
    assert answer["children"] == []  # no probe worker started
    assert answer["threads"] == 1
    assert answer["seconds"] < 2.5  # far below the 5 s a probe of the hung fallback would take


def test_a_redirect_decided_from_the_state_starts_no_process(dirs):
    """Issue 29.6: the daemon watches the target (read-only now) and the fallback (healthy,
    there): the state file answers where the save goes, and whether the fallback exists, so
    no probe worker is started to `isdir` it."""
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, readonly=True), fallback: daemon_view(fallback)})
    done = subprocess.run(
        [sys.executable, "-c", FAST_PATH, target, fallback, state],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["action"], answer["source"]) == ("redirect", "state")
    assert answer["children"] == []  # no probe worker started
    assert answer["threads"] == 1


def test_a_fallback_the_daemon_found_missing_is_refused_from_the_state(dirs, tmp_path):
    """The daemon watches a fallback that does not exist (a typo, scratch not mounted): its
    fresh state says so, and the save stays at the target (attempted anyway, as without any
    fallback) instead of going where nothing is."""
    target, _, state = dirs
    missing = str(tmp_path / "scratch-not-mounted")
    publish(state, {target: daemon_view(target, readonly=True), missing: daemon_view(missing)})
    decision = fsprobe.preflight(
        os.path.join(target, "m.pt"), fallback_dirs=[missing], state_dir=state
    )
    assert (decision.action, decision.source) == ("proceed", "state")
    assert not os.path.exists(missing)


@pytest.mark.parametrize("answer", ["absent", "corrupt"])
def test_a_state_file_without_a_readable_answer_is_probed_inline_and_said_once(
    dirs, caplog, answer
):
    """A state file of the version before the answer (none in the target's entry), or one
    whose answer does not read: never a crash, never believed; probed inline instead, and
    said once. The daemon says read-only: an inline probe finds the directory healthy."""
    target, _, state = dirs
    document = daemon_view(target, readonly=True).to_dict()
    if answer == "absent":
        del document[ANSWER_KEY]
    else:
        document[ANSWER_KEY]["can_take_save"] = "yes"
    write_state(state, time.time(), Writer("n", 1, "0.3"), {target: json.dumps(document)})
    with caplog.at_level(logging.INFO, logger="fsprobe.preflight"):
        decisions = [fsprobe.preflight(os.path.join(target, f"{n}.pt"), state_dir=state)
                     for n in range(2)]  # fmt: skip
    assert [(d.source, d.action, d.status) for d in decisions] == [
        ("probe", "proceed", Status.OK)
    ] * 2
    said = [r.getMessage() for r in caplog.records if "state" in r.getMessage()]
    assert len(said) == 1, said
    expected = "holds no answer" if answer == "absent" else "can_take_save: expected true or false"
    assert expected in said[0]
