"""`fsprobe run` as a process: start, SIGTERM/SIGINT, SIGHUP reloads, --once, refusals."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from fsprobe.model import Status
from fsprobe.report import TargetState
from fsprobe.state import StateReader
from tests.support.capability import ipv6_problem, require
from tests.support.daemon_process import DaemonProcess, clean_environment, fast_config, run_fsprobe

pytestmark = pytest.mark.slow  # daemons: the full run only


def target_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


def env_with_tmpdir(tmp_path: Path) -> dict[str, str]:
    """$TMPDIR on the targets' filesystem, so that only what the test does can degrade them."""
    return clean_environment(TMPDIR=str(tmp_path))


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_ends_the_daemon_with_a_valid_state_file(tmp_path, number):
    """Stopped while it writes state after every probe: its last word is a whole state file.
    (How fast it stops, within the second the design promises, is benchmarks/hung_mount.py's
    to measure.)"""
    ckpt = target_dir(tmp_path, "ckpt")
    config = fast_config(tmp_path / "fsprobe.toml", ckpt)
    daemon = DaemonProcess(tmp_path, "--config", str(config), env=env_with_tmpdir(tmp_path))
    with daemon:
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(ckpt))
        time.sleep(0.3)  # let the daemon be busy writing state after every probe
        daemon.send(number)
        code = daemon.wait(timeout=60)
    assert code == 0, daemon.log()
    assert "event=stopped" in daemon.log()
    state = StateReader(str(daemon.state_dir)).read()
    assert state is not None and state.writer.pid == daemon.pid
    assert state.writer.stopped_at is not None  # its last word: stopped cleanly
    assert TargetState.read(state, str(ckpt)).report.status is Status.OK
    assert sorted(p.name for p in daemon.state_dir.iterdir()) == ["state.json", "writer.lock"]


def test_state_file_is_rewritten_after_probes_with_the_documented_shape(tmp_path):
    ckpt = target_dir(tmp_path, "ckpt")
    config = fast_config(tmp_path / "fsprobe.toml", ckpt)
    with DaemonProcess(tmp_path, "--config", str(config), env=env_with_tmpdir(tmp_path)) as daemon:
        daemon.wait_for_value("fsprobe_probe_success", 1.0, path=str(ckpt), probe="write")
        reader = StateReader(str(daemon.state_dir))
        first = reader.read()
        deadline = time.monotonic() + 60
        while reader.read().generated_at == first.generated_at:
            assert time.monotonic() < deadline, "the state file is not rewritten"
            time.sleep(0.05)
        document = json.loads((daemon.state_dir / "state.json").read_bytes())
    assert document["schema"] == 1
    assert document["host"] == socket.gethostname() and document["version"]
    target = document["targets"][str(ckpt)]
    assert target["path"] == str(ckpt) and target["status"] == "ok"
    # The import states (Lustre only) are planned everywhere and find no Lustre here.
    assert target["intervals"] == {"statvfs": 0.2, "write": 0.5, "tmpdir": 0.5, "imports": 15.0}
    assert target["updated_at"] <= document["generated_at"]
    assert target["filesystem"]["files_free"] > 0
    assert target["write_probe"]["ok"] is True and target["write_probe"]["bytes"] == 4096
    assert {"statvfs", "write", "tmpdir"} <= set(target["probes"]) <= set(target["intervals"])
    assert reader.read().target_for(str(ckpt / "epoch-3")) == str(ckpt)


def test_sighup_with_a_good_config_adds_and_removes_targets(tmp_path):
    first, second = target_dir(tmp_path, "a"), target_dir(tmp_path, "b")
    config = fast_config(tmp_path / "fsprobe.toml", first)
    with DaemonProcess(tmp_path, "--config", str(config), env=env_with_tmpdir(tmp_path)) as daemon:
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(first))
        fast_config(tmp_path / "fsprobe.toml", second, top='log_level = "debug"\n')
        daemon.send(signal.SIGHUP)
        daemon.wait_for_log("event=reloaded")
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(second))
        assert daemon.value("fsprobe_health_status", path=str(first)) is None
        daemon.wait_for_log("event=probe target=" + str(second))  # the new log level holds
        state = StateReader(str(daemon.state_dir)).read()
        assert state.names == [str(second)]


def test_sighup_with_a_bad_config_logs_it_and_keeps_the_running_one(tmp_path):
    ckpt = target_dir(tmp_path, "ckpt")
    config = fast_config(tmp_path / "fsprobe.toml", ckpt)
    with DaemonProcess(tmp_path, "--config", str(config), env=env_with_tmpdir(tmp_path)) as daemon:
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(ckpt))
        assert daemon.value("fsprobe_config_last_reload_successful") == 1.0
        loaded = daemon.value("fsprobe_config_last_reload_success_timestamp_seconds")
        assert loaded is not None and loaded <= time.time()
        config.write_text(config.read_text() + "write_intervall = 3\n")
        daemon.send(signal.SIGHUP)
        line = daemon.wait_for_log("event=reload_failed")
        daemon.wait_for_value("fsprobe_config_last_reload_successful", 0.0)  # for the alert
        assert daemon.value("fsprobe_config_last_reload_success_timestamp_seconds") == loaded
        assert "level=error" in line
        assert f"{config}:" in line and "targets[0].write_intervall: unknown key" in line
        # Still serving, still probing the old target.
        before = daemon.value("fsprobe_probe_last_success_timestamp_seconds", probe="statvfs")
        deadline = time.monotonic() + 60
        while daemon.value("fsprobe_probe_last_success_timestamp_seconds", probe="statvfs") == (
            before
        ):
            assert time.monotonic() < deadline, "probing stopped after a failed reload"
            time.sleep(0.05)
        assert daemon.proc.poll() is None
        # And a fixed config is taken on the next SIGHUP.
        fast_config(tmp_path / "fsprobe.toml", ckpt)
        daemon.send(signal.SIGHUP)
        daemon.wait_for_log("event=reloaded")
        daemon.wait_for_value("fsprobe_config_last_reload_successful", 1.0)
        assert daemon.value("fsprobe_config_last_reload_success_timestamp_seconds") > loaded


def test_once_runs_every_probe_writes_the_outputs_and_prints_one_line_per_target(tmp_path):
    ckpt = target_dir(tmp_path, "ckpt")
    textfiles = target_dir(tmp_path, "textfile")
    state_dir = tmp_path / "state"
    code, out, err = run_fsprobe(
        "run",
        "--once",
        str(ckpt),
        "--state-dir",
        str(state_dir),
        "--textfile-dir",
        str(textfiles),
        env=env_with_tmpdir(tmp_path),
    )
    assert (code, out, err) == (0, f" OK  {ckpt}\n", "")  # issue 17.5: cron's mail says it
    state = StateReader(str(state_dir)).read()
    report = TargetState.read(state, str(ckpt)).report
    assert report.status is Status.OK and state.writer.once
    assert report.snapshot.value("write").ok is True
    assert {"statvfs", "write", "tmpdir"} <= set(report.snapshot.results)
    prom = (textfiles / "fsprobe.prom").read_text()
    assert f'fsprobe_health_status{{path="{ckpt}"}} 0.0' in prom
    assert "process_" not in prom  # the textfile holds fsprobe's metrics only
    assert [p.name for p in textfiles.iterdir()] == ["fsprobe.prom"]


def test_once_exits_with_the_worst_status(tmp_path, tmpfs):
    from tests.support.tmpfs import fill_bytes

    full = tmpfs(size="1M").path
    fill_bytes(full, leave_free=0)
    healthy = target_dir(tmp_path, "healthy")
    code, out, err = run_fsprobe(
        "run", "--once", str(healthy), str(full), "--state-dir", str(tmp_path / "state"),
        env=env_with_tmpdir(tmp_path),
    )  # fmt: skip
    assert code == 2, err
    lines = out.splitlines()  # one per target, in path order, as `check` says them
    assert len(lines) == 2, out
    by_path = {line.split()[1]: line for line in lines}
    assert by_path[str(healthy)].split() == ["OK", str(healthy)]
    unhealthy = by_path[str(full)]
    assert unhealthy.startswith(f" UNHEALTHY  {full}  space_headroom_low: space: 100 % used")
    assert "write_failed: " in unhealthy and "(ENOSPC)" in unhealthy
    # unhealthy from the start is a warning (it went from unknown to unhealthy: level=info)
    assert f"level=warning event=status_changed target={full} old=unknown new=unhealthy" in err
    state = StateReader(str(tmp_path / "state")).read()
    assert TargetState.read(state, str(healthy)).report.status is Status.OK
    assert TargetState.read(state, str(full)).report.status is Status.UNHEALTHY
    assert "event=probe_failed" in err and "errno=ENOSPC" in err and f"target={full}" in err


def test_no_path_and_no_config_is_a_usage_error(tmp_path):
    code, _out, err = run_fsprobe("run", "--state-dir", str(tmp_path))
    assert code == 64
    assert "no target to watch" in err and "fsprobe run /path/to/ckpt" in err


def test_a_bad_config_is_refused_at_start_with_file_line_and_reason(tmp_path):
    config = tmp_path / "fsprobe.toml"
    config.write_text('[defaults]\nwrite_bytes = "1 potato"\n[[targets]]\npath = "/x"\n')
    code, _out, err = run_fsprobe("run", "--config", str(config), "--state-dir", str(tmp_path))
    assert code == 64
    assert f"{config}:2: defaults.write_bytes: not a size" in err


def test_an_address_in_use_is_refused_at_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _out, err = run_fsprobe(
            "run", str(tmp_path), "--listen", f"127.0.0.1:{port}", "--state-dir",
            str(tmp_path / "state"),
        )  # fmt: skip
    assert code == 69
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_an_untrusted_state_dir_is_refused_at_start(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    code, _out, err = run_fsprobe("run", str(tmp_path), "--state-dir", str(shared), "--once")
    assert code == 69
    assert "writable by group or others" in err


def test_listens_on_ipv6_loopback(tmp_path):
    require(ipv6_problem())
    daemon = DaemonProcess(tmp_path, str(tmp_path), env=env_with_tmpdir(tmp_path))
    daemon.args[1] = "[::1]:0"
    with daemon:
        assert daemon.url.startswith("http://[::1]:")
        status, body = daemon.get()
    assert status == 200 and b"fsprobe_build_info" in body


def test_logs_are_one_event_per_line(tmp_path):
    ckpt = target_dir(tmp_path, "ckpt")
    config = fast_config(tmp_path / "fsprobe.toml", ckpt)
    with DaemonProcess(
        tmp_path, "--config", str(config), "-v", env=env_with_tmpdir(tmp_path)
    ) as daemon:
        daemon.wait_for_log("event=probe target=", count=5)
    lines = daemon.log().splitlines()
    assert lines, "nothing logged"
    for line in lines:
        assert line.startswith("ts=") and " level=" in line and " event=" in line, line
    probe_line = next(line for line in lines if "event=probe " in line)
    assert f"target={ckpt}" in probe_line and "probe=" in probe_line
    json.dumps(lines)  # plain text, nothing binary
