"""`fsprobe status`: the table, the exit codes, and every way the state can be missing or bad."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

import fsprobe
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
from fsprobe.policy import Policy
from fsprobe.state import STATE_FILE
from tests.support.cli import cli_runner
from tests.support.daemon_process import clean_environment, run_fsprobe
from tests.support.state import daemon_view, publish


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
    assert lines[0].startswith("fsprobe run --once (pid ") and "state written" in lines[0]
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
    assert report["writer"]["once"] is True
    assert report["writer"]["alive"] is False and report["running"] is False  # --once exited
    assert report["targets"][str(ckpt)]["write_probe"]["ok"] is True
    assert report["age_seconds"] < 5 and report["fresh_until"] > time.time() + 30


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


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    path = tmp_path / "ckpt"
    path.mkdir()
    return str(path)


def state_of(state_dir: Path, ckpt: str, pid: int, age: float, **writer) -> None:
    """A state file without a writer lock, `age` seconds old, written by `pid` on this host."""
    publish(
        str(state_dir),
        {ckpt: daemon_view(ckpt, age=age)},
        host=socket.gethostname(),
        pid=pid,
        generated_at=time.time() - age,
        **writer,
    )


def test_without_a_lock_a_dead_writer_is_guessed_from_its_pid(tmp_path, ckpt):
    pid = dead_pid()
    state_of(tmp_path / "state", ckpt, pid, age=600)
    code, out, err = status(tmp_path / "state")
    assert code == 3
    assert f"fsprobe run (pid {pid} on {socket.gethostname()}) is not running since" in err
    assert "(10 min ago) at the latest" in err and "did not stop cleanly" in err
    assert ckpt in out  # the old numbers are still shown, marked as old
    report = json.loads(status(tmp_path / "state", "--json")[1])
    assert report["status"] == "unknown" and report["running"] is False
    assert report["stale"] is True
    assert report["writer"] == {
        "host": socket.gethostname(),
        "pid": pid,
        "version": fsprobe.__version__,
        "once": False,
        "stopped_at": None,
        "failure": None,
        "alive": False,
    }


def test_stale_state_of_a_live_daemon_suggests_it_hangs(tmp_path, ckpt):
    state_of(tmp_path / "state", ckpt, os.getpid(), age=120)
    code, _out, err = status(tmp_path / "state")
    assert code == 3
    assert "STALE" in err and "still running but has stopped writing it" in err


def test_fresh_state_of_a_live_writer_is_not_stale(tmp_path, ckpt):
    state_of(tmp_path / "state", ckpt, os.getpid(), age=5)
    code, out, err = status(tmp_path / "state")
    assert code == 0 and err == "" and ckpt in out


def test_the_state_of_a_one_off_run_holds_until_its_policy_says_it_is_stale(tmp_path, ckpt):
    state_of(tmp_path / "state", ckpt, dead_pid(), age=30, once=True)  # 3 x 15 s: fresh
    code, out, err = status(tmp_path / "state")
    assert code == 0 and err == "" and "fsprobe run --once" in out
    state_of(tmp_path / "state", ckpt, dead_pid(), age=50, once=True)
    code, _out, err = status(tmp_path / "state")
    assert code == 3 and "STALE" in err and "which has exited (a one-off run)" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"schema": 1, "generated_at": 1', "not valid JSON"),
        (b'{"schema": 7}', "has schema 7"),
        (
            b'{"schema": 1, "generated_at": "x", "targets": {}}',
            "generated_at: expected a number, not a string",
        ),
        (b'{"schema": 1, "generated_at": 1, "targets": {"/x": 5}}', "expected an object"),
        (
            b'{"schema": 1, "generated_at": 1, "targets": {"/x": {"status": "ok"}}}',
            "targets['/x'].path: missing",
        ),
    ],
)
def test_a_corrupt_state_file_is_reported_never_a_crash(tmp_path, content, message):
    publish(str(tmp_path), {})
    (tmp_path / STATE_FILE).write_bytes(content)
    code, _out, err = status(tmp_path)
    assert code == 3
    assert message in err and "Traceback" not in err
    code, out, err = status(tmp_path, "--json")
    assert code == 3 and "Traceback" not in err
    assert json.loads(out)["status"] == "unknown"


def test_an_untrusted_state_file_is_reported_with_the_reason(tmp_path, ckpt):
    state_of(tmp_path / "state", ckpt, os.getpid(), age=1)
    tmp_path = tmp_path / "state"
    os.chmod(tmp_path / STATE_FILE, 0o666)
    code, _out, err = status(tmp_path)
    assert code == 3
    assert "cannot use the state file" in err and "writable by group or others" in err


def test_the_quota_column_names_the_fullest_quota(tmp_path):
    path = "/lustre/ckpt"
    store = Store(clock=time.time)
    store.configure([TargetSpec(path, Policy(check_tmpdir=False), {"statvfs": 15.0})])
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
