"""One writer per state dir: a second daemon or `--once` run refuses, and `fsprobe status` tells a
live writer from one that is gone, by the writer's lock rather than by a pid."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fsprobe.state import LOCK_FILE, StateDirBusy, StateReader, WriterLock, writer_running
from tests.support.capability import require
from tests.support.daemon_process import DaemonProcess, clean_environment, fast_config, run_fsprobe

pytestmark = pytest.mark.slow  # daemons: the full run only

NOBODY = 65534


def start_daemon(tmp_path: Path, name: str = "ckpt") -> tuple[DaemonProcess, Path]:
    target = tmp_path / name
    target.mkdir()
    config = fast_config(tmp_path / f"{name}.toml", target)
    daemon = DaemonProcess(
        tmp_path, "--config", str(config), env=clean_environment(TMPDIR=str(tmp_path))
    ).start()
    daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(target))
    return daemon, target


def status(state_dir: Path, *args: str) -> tuple[int, str, str]:
    return run_fsprobe("status", "--state-dir", str(state_dir), *args)


def wait_for_rewrite(state_dir: Path, after: float, timeout: float = 5.0):
    reader = StateReader(str(state_dir))
    deadline = time.monotonic() + timeout
    while (state := reader.read()).generated_at <= after:
        assert time.monotonic() < deadline, "the state file is not rewritten"
        time.sleep(0.05)
    return state


@pytest.mark.parametrize("once", [False, True], ids=["daemon", "once"])
def test_a_second_writer_refuses_and_the_first_keeps_its_file(tmp_path, once):
    daemon, target = start_daemon(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    try:
        args = ["--once"] if once else ["--listen", "127.0.0.1:0"]
        code, _out, err = run_fsprobe(
            "run", str(other), "--state-dir", str(daemon.state_dir), *args,
            env=clean_environment(TMPDIR=str(tmp_path)),
        )  # fmt: skip
        assert code == 69, err
        assert f"{daemon.state_dir} is the state dir of another running fsprobe" in err
        assert f"(pid {daemon.pid})" in err and "--state-dir" in err
        before = time.time()
        state = wait_for_rewrite(daemon.state_dir, before)  # the first one still writes it
        assert state.writer.pid == daemon.pid and state.names == [str(target)]
        assert daemon.proc.poll() is None
    finally:
        daemon.stop()


def test_status_tells_a_live_daemon_from_one_stopped_by_sigterm(tmp_path):
    daemon, target = start_daemon(tmp_path)
    try:
        code, out, err = status(daemon.state_dir)
        assert (code, err) == (0, "")
        assert out.startswith(f"fsprobe run (pid {daemon.pid} on ")
        assert json.loads(status(daemon.state_dir, "--json")[1])["running"] is True
        daemon.send(signal.SIGTERM)
        assert daemon.wait(timeout=5) == 0
        stopped = time.time()
    finally:
        daemon.stop()
    code, out, err = status(daemon.state_dir)
    assert code == 3
    assert f"fsprobe run (pid {daemon.pid} on " in err
    assert "is not running since" in err and "it stopped cleanly" in err
    assert str(target) in out  # its last view, for what it is worth
    report = json.loads(status(daemon.state_dir, "--json")[1])
    assert report["status"] == "unknown" and report["running"] is False
    assert stopped - 5 < report["writer"]["stopped_at"] <= stopped


def test_status_after_sigkill_says_the_daemon_did_not_stop_cleanly(tmp_path):
    daemon, _target = start_daemon(tmp_path)
    try:
        daemon.send(signal.SIGKILL)
        daemon.wait(timeout=5)
    finally:
        daemon.stop()
    code, _out, err = status(daemon.state_dir)
    assert code == 3
    assert "is not running since" in err and "did not stop cleanly" in err
    assert writer_running(str(daemon.state_dir)) is False  # the kernel dropped its lock


def test_a_moment_of_a_reader_testing_the_lock_does_not_turn_a_writer_away(tmp_path):
    state_dir = tmp_path / "state"
    first = WriterLock(str(state_dir))
    first.acquire()  # creates the lock file
    first.release()
    fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what `fsprobe status` holds for microseconds
    threading.Timer(0.1, os.close, args=(fd,)).start()
    lock = WriterLock(str(state_dir))
    lock.acquire()
    assert writer_running(str(state_dir)) is True
    lock.release()
    assert writer_running(str(state_dir)) is False


def test_a_lock_held_by_another_process_is_refused_with_its_pid(tmp_path):
    state_dir = tmp_path / "state"
    holder = DaemonProcess(tmp_path, str(tmp_path), env=clean_environment(TMPDIR=str(tmp_path)))
    with holder:
        start = time.monotonic()
        with pytest.raises(StateDirBusy, match=f"pid {holder.pid}"):
            WriterLock(str(state_dir)).acquire()
        assert time.monotonic() - start < 5


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_a_lock_file_planted_by_someone_else_is_refused_without_blocking(tmp_path, planted):
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    if planted == "fifo":
        os.mkfifo(state_dir / LOCK_FILE)
    else:
        (state_dir / LOCK_FILE).symlink_to(tmp_path / "elsewhere")
    code, _out, err = run_fsprobe(
        "run", str(tmp_path), "--state-dir", str(state_dir), "--once", timeout=30
    )
    assert code == 69, err
    assert not (tmp_path / "elsewhere").exists()
    assert writer_running(str(state_dir)) is None  # nothing to prove either way


def test_another_user_cannot_hold_the_lock_to_keep_the_daemon_from_starting():
    require(None if os.getuid() == 0 else "running a child as another user needs root")
    require(None if shutil.which("flock") else "util-linux flock(1) not found on PATH")
    home = tempfile.mkdtemp(prefix="fsprobe-lock-")  # pytest's own are closed to others
    try:
        os.chmod(home, 0o755)
        state_dir = os.path.join(home, "state")
        lock = WriterLock(state_dir)
        lock.acquire()
        lock.release()
        assert os.stat(os.path.join(state_dir, LOCK_FILE)).st_mode & 0o777 == 0o600
        readable = os.path.join(state_dir, "readable")
        with open(readable, "w"):
            os.chmod(readable, 0o644)
        for path, refused in ((readable, False), (os.path.join(state_dir, LOCK_FILE), True)):
            # util-linux's flock(1) opens the file read-only and takes a shared lock on it.
            done = subprocess.run(
                ["flock", "--shared", "--nonblock", path, "true"], user=NOBODY, capture_output=True
            )
            assert (done.returncode != 0) is refused, done.stderr
            assert (b"Permission denied" in done.stderr) is refused, done.stderr
    finally:
        shutil.rmtree(home)


def test_a_reload_moves_the_lock_to_the_new_state_dir_or_keeps_the_old_one(tmp_path):
    (tmp_path / "other").mkdir()
    other, _ = start_daemon(tmp_path / "other")  # holds other/state
    target = tmp_path / "ckpt"
    target.mkdir()
    config = tmp_path / "fsprobe.toml"

    def configure(state_dir: Path) -> None:
        fast_config(config, target, top=f'state_dir = "{state_dir}"\n')

    first, taken, free = tmp_path / "first", other.state_dir, tmp_path / "free"
    configure(first)
    daemon = DaemonProcess(tmp_path, env=clean_environment(TMPDIR=str(tmp_path)))
    daemon.args = ["--listen", "127.0.0.1:0", "--config", str(config)]
    try:
        daemon.start()
        configure(taken)
        daemon.send(signal.SIGHUP)
        line = daemon.wait_for_log("event=reload_failed")
        assert f"pid {other.pid}" in line
        assert writer_running(str(first)) is True and other.proc.poll() is None
        configure(free)
        daemon.send(signal.SIGHUP)
        daemon.wait_for_log("event=reloaded")
        assert writer_running(str(free)) is True
        assert writer_running(str(first)) is False
    finally:
        daemon.stop()
        other.stop()
