"""Failures are contained and visible (issue 17.2).

A bug while probing, judging or publishing one target costs that target (unknown, reason
`internal_error`, counted in `fsprobe_internal_errors_total{path,stage}`, logged once with its
traceback) and nothing else. The scheduler itself is supervised: when its loop dies or stalls,
/metrics answers 503 and `fsprobe status` exits 3 saying why; a loop that died ends the daemon
with exit status 70 for its supervisor to restart it. On main a judging bug killed the
scheduler thread while /metrics served the frozen values with `up` 1 and SIGTERM exited 0.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from fsprobe.daemon import publish
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.exporters import exposition as exposition_module
from fsprobe.exporters.exposition import Exposition
from fsprobe.model import ProbeResult, Status
from fsprobe.report import TargetState
from fsprobe.state import StateReader
from tests.support.daemon_process import DaemonProcess, fast_config, run_fsprobe
from tests.support.policy import NOW, filesystem_info, probe

STAMP = "fsprobe_probe_last_success_timestamp_seconds"
BUGS = "fsprobe_internal_errors_total"


def sabotaged(tmp_path: Path, where: str, path: Path, *targets: Path) -> DaemonProcess:
    config = fast_config(tmp_path / "fsprobe.toml", *targets)
    return DaemonProcess(
        tmp_path,
        "--config",
        str(config),
        program=("-m", "tests.support.sabotage", where, str(path)),
    )


def targets(tmp_path: Path) -> tuple[Path, Path]:
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    return bad, good


def test_a_target_that_cannot_be_judged_is_unknown_and_the_others_go_on(tmp_path):
    bad, good = targets(tmp_path)
    with sabotaged(tmp_path, "judge", bad, bad, good) as daemon:
        daemon.wait_for_value("fsprobe_health_status", 3.0, path=str(bad))
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(good))
        before = daemon.value(STAMP, path=str(good), probe="statvfs")
        deadline = time.monotonic() + 60  # five statvfs rounds of both targets, however slow
        while not (
            daemon.value(STAMP, path=str(good), probe="statvfs") > before  # still probed
            and daemon.value(BUGS, path=str(bad), stage="judge") >= 5  # each round counted
        ):
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
        assert daemon.value(BUGS, path=str(good), stage="judge") == 0
        assert daemon.value(BUGS, path=str(bad), stage="probe") == 0

        code, out, err = run_fsprobe("status", "--state-dir", str(daemon.state_dir), "--json")
        assert code == 3, out + err
        report = json.loads(out)["targets"]
        assert report[str(good)]["status"] == "ok"
        assert report[str(bad)]["status"] == "unknown"
        (reason,) = report[str(bad)]["reasons"]
        assert reason["code"] == "internal_error" and "ZeroDivisionError" in reason["message"]

        log = daemon.log()
        bugs = [line for line in log.splitlines() if "event=internal_error" in line]
        assert len(bugs) == 1, log  # once, with its traceback, however often it recurs
        assert "level=error" in bugs[0] and "stage=judge" in bugs[0]
        assert "Traceback (most recent call last)" in bugs[0] and "planted" in bugs[0]
    assert daemon.proc is not None and daemon.proc.returncode == 0  # SIGTERM: a clean stop


def test_a_scheduler_loop_that_dies_stops_claiming_health_and_exits_70(tmp_path):
    bad, good = targets(tmp_path)
    daemon = sabotaged(tmp_path, "loop", bad, bad, good)
    with daemon:
        # The supervisor looks every second; the daemon goes within a few.
        assert daemon.wait(timeout=10.0) == 70, daemon.log()
    log = daemon.log()
    assert "event=scheduler_died" in log and "planted" in log and "traceback=" in log
    assert "event=not_probing" in log
    code, out, err = run_fsprobe("status", "--state-dir", str(daemon.state_dir))
    assert code == 3, out + err
    assert "stopped since" in err and "the scheduler loop died: RuntimeError: planted" in err
    state = StateReader(str(daemon.state_dir)).read()
    assert state.writer.failure.startswith("the scheduler loop died")


def test_a_stalled_scheduler_answers_503_and_status_says_why_until_it_turns_again(
    tmp_path, faultfs
):
    """The scheduler stalls for real: its textfile output sits on a hung mount."""
    target = tmp_path / "ckpt"
    target.mkdir()
    textfiles = faultfs.mountpoint / "textfile"
    textfiles.mkdir()
    config = fast_config(tmp_path / "fsprobe.toml", target)
    with DaemonProcess(tmp_path, "--config", str(config), "--textfile-dir", str(textfiles)) as d:
        d.wait_for_value("fsprobe_health_status", 0.0, path=str(target))
        rule = faultfs.ctl.block("create")
        try:
            faultfs.ctl.wait_blocked(rule, timeout=60)
            held = time.monotonic()
            status, body = d.get()
            while status == 200 and time.monotonic() < held + 15:
                time.sleep(0.2)
                status, body = d.get()
            # within the window: 3 x 0.2 s, but never under the loop's longest idle sleep (5 s)
            assert status == 503, body
            assert b"fsprobe is not probing: the scheduler loop has not turned for" in body
            d.wait_for_log("event=not_probing")  # the supervisor has written the state
            code, out, err = run_fsprobe("status", "--state-dir", str(d.state_dir))
            assert code == 3, out + err
            assert "is running but not probing" in err and "has not turned for" in err, d.log()
        finally:
            faultfs.ctl.remove(rule)
        deadline = time.monotonic() + 60
        while d.get()[0] != 200:
            assert time.monotonic() < deadline, d.log()
            time.sleep(0.1)
        d.wait_for_log("event=probing_again")
        assert d.log().count("event=not_probing") == 1, d.log()
        deadline = time.monotonic() + 60
        while run_fsprobe("status", "--state-dir", str(d.state_dir))[0] != 0:
            assert time.monotonic() < deadline, d.log()
            time.sleep(0.2)


# -- in the store and the outputs: one target's bug stays that target's ----------------------


def store_of(*paths: str) -> Store:
    store = Store(clock=lambda: NOW)
    store.configure(TargetSpec(path) for path in paths)
    for path in paths:
        store.record(path, probe("statvfs", filesystem_info(50, 100, 50, 100)))
    return store


def test_a_bug_in_rendering_one_target_costs_that_target_only(monkeypatch, caplog):
    store = store_of("/bad", "/good")
    samples = exposition_module.target_samples

    def broken(view):
        if view.path == "/bad":
            raise KeyError("planted")
        return samples(view)

    monkeypatch.setattr(exposition_module, "target_samples", broken)
    exposition = Exposition(store.views, process_metrics=False)
    with caplog.at_level(logging.ERROR):
        text = exposition.fsprobe_text().decode()
        store.record("/bad", probe("statvfs", filesystem_info(40, 100, 50, 100)))
        text = exposition.fsprobe_text().decode()
    assert 'fsprobe_health_status{path="/bad"} 3.0' in text
    assert 'fsprobe_health_status{path="/good"} 0.0' in text
    assert 'fsprobe_filesystem_size_bytes{device="mgs@tcp:/proj"' in text  # /good's
    assert 'fsprobe_internal_errors_total{path="/bad",stage="publish"} 2.0' in text
    assert 'fsprobe_internal_errors_total{path="/good",stage="publish"} 0.0' in text
    (logged,) = caplog.records  # once, though it failed twice
    assert "event=internal_error target=/bad stage=publish" in logged.getMessage()
    assert 'raise KeyError("planted")' in logged.getMessage()  # with its traceback


def test_a_target_whose_state_does_not_encode_is_written_unknown(monkeypatch, tmp_path):
    store = store_of("/bad", "/good")
    encode = publish.target_state

    def broken(view):
        if view.path == "/bad":
            raise ValueError("planted")
        return encode(view)

    monkeypatch.setattr(publish, "target_state", broken)
    exposition = Exposition(store.views, process_metrics=False)
    publisher = publish.Publisher(store.views, exposition, str(tmp_path))
    publisher.publish(store.views())
    state = StateReader(str(tmp_path)).read()
    assert TargetState.read(state, "/good").report.status is Status.OK
    bad = TargetState.read(state, "/bad").report
    assert bad.status is Status.UNKNOWN and bad.reasons[0].code == "internal_error"
    assert exposition.internal_errors.counts() == {("/bad", "publish"): 1}


@pytest.mark.parametrize("kind", ["statvfs", "write"])
def test_a_probe_that_raises_is_an_internal_error_not_a_filesystem_fact(kind):
    store = store_of("/ckpt")
    crashed = ProbeResult(
        kind, NOW - 1, 0.0, error="INTERNAL", message="TypeError: x", detail="Traceback ..."
    )
    view = store.record("/ckpt", crashed)
    assert view is not None and view.verdict.status is Status.UNKNOWN
    assert [r.code for r in view.verdict.reasons] == ["internal_error"]
    assert store.internal_errors.counts() == {("/ckpt", "probe"): 1}
