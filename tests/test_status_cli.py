"""`fsprobe status`: the table, the exit codes, and every way the state can be missing or bad."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fsprobe.cli import main
from fsprobe.daemon.publish import Publisher
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.exporters.exposition import Exposition
from fsprobe.model import (
    FilesystemInfo,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    WriteProbeResult,
)
from fsprobe.policy import Thresholds
from fsprobe.state import STATE_FILE, write_state
from tests.daemon_process import clean_environment, run_fsprobe
from tests.support.cli import cli_runner


def status(state_dir: Path, *args: str) -> tuple[int, str, str]:
    """`fsprobe status` in this process; an exception (a crash) fails the test."""
    result = cli_runner().invoke(
        main, ["status", "--state-dir", str(state_dir), *args], catch_exceptions=False
    )
    return result.exit_code, result.stdout, result.stderr


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def once(tmp_path: Path, *targets: Path) -> Path:
    state_dir = tmp_path / "state"
    code, _out, err = run_fsprobe(
        "run", "--once", *map(str, targets), "--state-dir", str(state_dir),
        env=clean_environment(TMPDIR=str(tmp_path)),
    )  # fmt: skip
    assert code in (0, 1, 2), err
    return state_dir


def test_status_shows_a_table_of_every_target(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    state_dir = once(tmp_path, first, second)
    code, out, err = status(state_dir)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("fsprobe daemon pid ") and "state written" in lines[0]
    header = next(line for line in lines if line.startswith("STATUS"))
    for column in ("TARGET", "SPACE FREE", "INODES FREE", "QUOTA", "WRITE", "AGE"):
        assert column in header
    rows = [line for line in lines if line.startswith("ok ")]
    assert [row.split()[1] for row in rows] == [str(first), str(second)]
    for row in rows:
        assert " s" in row and "%" in row and "ms" in row  # age, headroom ratio, latency


def test_status_json_for_scripts(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state_dir = once(tmp_path, ckpt)
    code, out, _err = status(state_dir, "--json")
    report = json.loads(out)
    assert code == 0 and report["status"] == "ok" and report["stale"] is False
    assert report["state_file"] == str(state_dir / STATE_FILE)
    assert report["writer"]["host"] == socket.gethostname()
    assert report["writer"]["alive"] is False  # --once has exited
    assert report["targets"][str(ckpt)]["write_probe"]["ok"] is True
    assert report["age_seconds"] < report["stale_after_seconds"]


def test_status_exits_with_the_worst_status_and_shows_why(tmp_path, tmpfs):
    from tests.support.tmpfs import fill_bytes

    full = tmpfs(size="1M").path
    fill_bytes(full, leave_free=0)
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    state_dir = once(tmp_path, healthy, full)
    code, out, _err = status(state_dir)
    assert code == 2
    assert f"unhealthy  {full}" in out
    assert "ENOSPC at" in out  # the write column
    assert "space_headroom_low" in out and "write_failed" in out


def test_no_state_file_says_how_to_start_a_daemon(tmp_path):
    code, out, err = status(tmp_path / "none")
    assert code == 3 and out == ""
    assert f"no fsprobe daemon has written state in {tmp_path / 'none'}" in err
    assert "fsprobe run PATH" in err and "FSPROBE_STATE_DIR" in err
    code, out, _err = status(tmp_path / "none", "--json")
    assert code == 3 and json.loads(out)["status"] == "unknown"
    assert "no fsprobe daemon" in json.loads(out)["error"]


def test_the_state_dir_comes_from_the_environment(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    state_dir = once(tmp_path, ckpt)
    code, out, _err = run_fsprobe("status", env=clean_environment(FSPROBE_STATE_DIR=str(state_dir)))
    assert code == 0 and str(ckpt) in out


def stale_state(state_dir: Path, pid: int, age: float) -> None:
    write_state(
        str(state_dir),
        {
            "generated_at": time.time() - age,
            "host": socket.gethostname(),
            "pid": pid,
            "version": "0.1.0",
            "targets": {
                "/ckpt": {
                    "status": "ok",
                    "reasons": [],
                    "headroom": {},
                    "intervals": {"statvfs": 15.0},
                    "updated_at": time.time() - age,
                }
            },
        },
    )


def test_stale_state_of_a_dead_daemon_is_unknown_and_says_so(tmp_path):
    pid = dead_pid()
    stale_state(tmp_path, pid, age=600)
    code, out, err = status(tmp_path)
    assert code == 3
    assert "STALE" in err and "10 min ago" in err
    assert f"pid {pid} on {socket.gethostname()}, which is no longer running" in err
    assert "/ckpt" in out  # the old numbers are still shown, marked as old
    report = json.loads(status(tmp_path, "--json")[1])
    assert report["stale"] is True and report["status"] == "unknown"
    assert report["writer"] == {
        "host": socket.gethostname(),
        "pid": pid,
        "alive": False,
        "version": "0.1.0",
    }


def test_stale_state_of_a_live_daemon_suggests_it_hangs(tmp_path):
    stale_state(tmp_path, os.getpid(), age=120)
    code, _out, err = status(tmp_path)
    assert code == 3
    assert "still running but has stopped writing it" in err


def test_fresh_state_is_not_stale(tmp_path):
    stale_state(tmp_path, dead_pid(), age=5)
    code, out, err = status(tmp_path)
    assert code == 0 and "STALE" not in err and "/ckpt" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"schema": 1, "generated_at": 1', "not valid JSON"),
        (b'{"schema": 7}', "has schema 7"),
        (b'{"schema": 1, "generated_at": "x", "targets": {}}', "unexpected content"),
        (b'{"schema": 1, "generated_at": 1, "targets": {"/x": 5}}', "unexpected content"),
        (b'{"schema": 1, "generated_at": 1, "targets": {"/x": {"status": "ok"}}}', "STALE"),
    ],
)
def test_a_corrupt_state_file_is_reported_never_a_crash(tmp_path, content, message):
    write_state(str(tmp_path), {"targets": {}})
    (tmp_path / STATE_FILE).write_bytes(content)
    code, _out, err = status(tmp_path)
    assert code == 3
    assert message in err and "Traceback" not in err
    code, out, err = status(tmp_path, "--json")
    assert code == 3 and "Traceback" not in err
    assert json.loads(out)["status"] == "unknown"


def test_an_untrusted_state_file_is_reported_with_the_reason(tmp_path):
    stale_state(tmp_path, os.getpid(), age=1)
    os.chmod(tmp_path / STATE_FILE, 0o666)
    code, _out, err = status(tmp_path)
    assert code == 3
    assert "cannot use the state file" in err and "writable by group or others" in err


def test_the_quota_column_names_the_fullest_quota(tmp_path):
    path = "/lustre/ckpt"
    store = Store(clock=time.time)
    store.configure([TargetSpec(path, Thresholds(check_tmpdir=False), {"statvfs": 15.0})])
    now = time.time()
    fs = FilesystemInfo(path, "/lustre", "lustre", "mds@tcp:/x", 2**44, 2**43, 10**7, 9 * 10**6,
                        False, 1)  # fmt: skip
    quota = QuotaReport(
        "lfs",
        (
            QuotaEntry("user", 1000, "alice", QuotaUsage(2**30), QuotaUsage(10)),
            QuotaEntry(
                "project",
                4242,
                None,
                QuotaUsage(79 * 2**30, hard=100 * 2**30),
                QuotaUsage(93_000, soft=90_000, hard=100_000, grace_expires_at=now + 7 * 86400,
                           state=QuotaState.SOFT_EXCEEDED),
            ),
        ),
    )  # fmt: skip
    write = WriteProbeResult(True, 1 << 20, {"total": 0.0123})
    for probe, value in (("statvfs", fs), ("quota", quota), ("write", write)):
        store.record(path, ProbeResult(probe, now, 0.01, value=value))
    publisher = Publisher(
        store.views, Exposition(store.views, process_metrics=False), str(tmp_path)
    )
    publisher.publish(store.views())
    code, out, _err = status(tmp_path)
    assert code == 1
    row = next(line for line in out.splitlines() if line.startswith("degraded"))
    assert "project 4242: inodes 93 % soft exceeded" in row
    assert "7k (7.0 %, project quota)" in row  # inode headroom bound by the project quota
    assert "12.3 ms" in row
    assert "quota_soft_exceeded" in out
