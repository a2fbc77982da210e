"""The daemon's memory of the saves survives its restart (issue 35): a real daemon, stopped by
SIGTERM or killed by SIGKILL, started again on the same state dir, and real trainer processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsprobe.daemon.memory import (
    MAX_MEMORY_BYTES,
    MEMORY_FILE,
    SCHEMA,
    Remembered,
    write_memory,
)
from fsprobe.daemon.savers import MAX_SAVERS, Saver
from fsprobe.events.event import MAX_HOST, SaveEvent, decode
from fsprobe.exporters.view import SaveProblem
from fsprobe.model import LastSave
from tests.events.test_save_events import QUIET_DAEMON, daemon_config
from tests.support.daemon_process import DaemonProcess, clean_environment

pytestmark = pytest.mark.slow  # daemons and trainers: the full run only

#: Saves argv[2] checkpoints into argv[1] a fifth of a second apart, says so, then hangs
#: (SIGSTOP: alive, silent), as a trainer stuck in a collective or a hung read does.
HUNG_TRAINER = """
import os, signal, sys, time
import fsprobe
target, count = sys.argv[1], int(sys.argv[2])
for step in range(count):
    fsprobe.atomic_write(os.path.join(target, f"step-{step}.pt"), lambda f: f.write(b"x" * 4096))
    time.sleep(0.2)
print("saved", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


def _daemon(home: Path, target: Path) -> DaemonProcess:
    config = daemon_config(home.parent / "fsprobe.toml", target, defaults=QUIET_DAEMON)
    return DaemonProcess(home, "--config", str(config))


def _hung_trainer(target: Path, state_dir: Path) -> subprocess.Popen:
    trainer = subprocess.Popen(
        [sys.executable, "-c", HUNG_TRAINER, str(target), "4"],
        env=clean_environment(FSPROBE_STATE_DIR=str(state_dir)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert trainer.stdout is not None and trainer.stdout.readline() == "saved\n"
    return trainer


def _expectation(daemon: DaemonProcess, path: str) -> tuple:
    """What FsprobeCheckpointOverdue reads: savers, the interval, the last successful save."""
    return (
        daemon.value("fsprobe_savers", path=path),
        daemon.value("fsprobe_save_interval_seconds", path=path),
        daemon.value("fsprobe_last_successful_save_timestamp_seconds", path=path),
    )


def _remembered(state_dir: Path) -> dict:
    """The targets in the memory file (root's test reads the writer's own file), if any."""
    try:
        return json.loads((state_dir / MEMORY_FILE).read_text())["targets"]
    except FileNotFoundError:
        return {}


def _first_scrape(daemon: DaemonProcess, path: str) -> tuple:
    """The expectation as the first scrape that shows the target at all sees it."""
    deadline = time.monotonic() + 60
    while daemon.value("fsprobe_health_status", path=path) is None:
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.02)
    return _expectation(daemon, path)


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL])
def test_a_hung_trainer_is_expected_again_at_once_after_a_restart(tmp_path, ending):
    """A trainer saved four times and hangs: the daemon expects its next save (the overdue
    alert's savers, interval and last save). Stopped (SIGTERM) or killed (SIGKILL, as the OOM
    killer does) and started again, the daemon expected nothing until three saves again, and
    a hung trainer never saves again: its page resolved, and never came back. The memory
    file gives the new daemon the expectation from its first scrape on."""
    target = tmp_path / "ckpt"
    target.mkdir()
    home = tmp_path / "daemon"
    home.mkdir()
    path = str(target)
    daemon = _daemon(home, target).start()
    trainer = None
    try:
        trainer = _hung_trainer(target, daemon.state_dir)
        daemon.wait_for_value("fsprobe_saves_total", 4.0, path=path, outcome="ok")
        daemon.wait_for_value("fsprobe_savers", 1.0, path=path)
        before = _expectation(daemon, path)
        assert before[1] is not None and before[2] is not None
        deadline = time.monotonic() + 60
        while len(_remembered(daemon.state_dir).get(path, {}).get("save_times", ())) < 4:
            assert time.monotonic() < deadline, daemon.log()  # written as it publishes
            time.sleep(0.05)
        daemon.send(ending)
        daemon.wait(60)
        daemon = _daemon(home, target).start()
        assert _first_scrape(daemon, path) == before
        assert "event=memory_recalled" in daemon.log()
    finally:
        daemon.stop()
        if trainer is not None:
            trainer.kill()
            trainer.wait()


def test_a_trainer_that_died_while_the_daemon_was_down_is_forgotten(tmp_path):
    """The trainer hangs, the daemon stops, the trainer is killed (no goodbye: the daemon is
    not there to hear one anyway): the new daemon finds its pid gone (or holding another
    process, by its start time) and expects nothing, as if it had watched it die."""
    target = tmp_path / "ckpt"
    target.mkdir()
    home = tmp_path / "daemon"
    home.mkdir()
    path = str(target)
    with _daemon(home, target).start() as daemon:
        trainer = _hung_trainer(target, daemon.state_dir)
        try:
            daemon.wait_for_value("fsprobe_savers", 1.0, path=path)
            daemon.wait_for_value("fsprobe_saves_total", 4.0, path=path, outcome="ok")
        finally:
            daemon.send(signal.SIGKILL)
            daemon.wait(60)
            trainer.kill()
            trainer.wait()
    with _daemon(home, target).start() as daemon:
        savers, interval, last = _first_scrape(daemon, path)
        assert (savers, interval) == (0.0, None)  # a job that ended is never overdue
        assert last is not None  # its last save is still known
        assert "gone=1" in daemon.wait_for_log("event=memory_recalled")


HOSTILE = {
    "not JSON": b'{"schema": 1, "boot_id": ',
    "NaN": b'{"schema":1,"boot_id":"x","targets":{"/t":{"savers":[],"save_times":[NaN],'
    b'"last":null,"last_success_at":null,"problems":{}}}}',
    "a string for a pid": None,  # made below from a valid document
    "too many savers": None,
    "a made-up step label": None,
    "a made-up reason label": None,
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
}


def _valid(target: Path) -> dict:
    # Outside the daemon's pid namespace (no start time), heard of a moment ago: kept until
    # its goodbye or a day of silence (no interval is known from 2 saves).
    saver = {"uid": 0, "host": "h", "pid": os.getpid(), "started": None, "heard_at": time.time()}
    problem = {
        "at": 2.0,
        "file": f"{target}/a.pt",
        "uid": 0,
        "errno": "EIO",
        "step": "write",
        "fallback": "none",
        "landed": None,
    }
    last = {
        "at": 2.0,
        "outcome": "failed",
        "seconds": 0.5,
        "bytes": 0,
        "requested": f"{target}/a.pt",
        "landed": None,
        "uid": 0,
        "pid": 7,
        "host": "h",
        "ranks": 1,
        "failures": [{"errno": "EIO", "step": "write"}],
    }
    return {
        "schema": SCHEMA,
        "boot_id": "x",
        "targets": {
            str(target): {
                "savers": [saver],
                "save_times": [1.0, 2.0],
                "last": last,
                "last_success_at": 2.0,
                "problems": {"failed": problem},
            }
        },
    }


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_memory_file_that_does_not_read_is_logged_and_forgotten(tmp_path, kind):
    """Truncated, edited or planted: one clear log line, an empty memory, a daemon that runs."""
    target = tmp_path / "ckpt"
    target.mkdir()
    home = tmp_path / "daemon"
    (home / "state").mkdir(parents=True, mode=0o755)
    data = HOSTILE[kind]
    if data is None:
        document = _valid(target)
        remembered = document["targets"][str(target)]
        if kind == "a string for a pid":
            remembered["savers"][0]["pid"] = "1"
        elif kind == "too many savers":
            remembered["savers"] *= 257
        elif kind == "a made-up reason label":
            remembered["problems"]["failed"]["reason"] = "<!here> disk_full"
        else:
            remembered["problems"]["failed"]["step"] = "<!channel> call me"
        data = json.dumps(document).encode()
    (home / "state" / MEMORY_FILE).write_bytes(data)
    os.chmod(home / "state" / MEMORY_FILE, 0o600)
    with _daemon(home, target).start() as daemon:
        assert "event=memory_unreadable" in daemon.wait_for_log("memory_unreadable")
        assert _first_scrape(daemon, str(target)) == (None, None, None)
        assert daemon.proc is not None and daemon.proc.poll() is None


def test_a_valid_memory_file_is_taken_and_one_others_may_write_is_not(tmp_path):
    """The same document is recalled when it is the writer's own, refused when group-writable
    (someone else could have written it): the state dir's rule for every file in it."""
    target = tmp_path / "ckpt"
    target.mkdir()
    home = tmp_path / "daemon"
    (home / "state").mkdir(parents=True, mode=0o755)
    memory = home / "state" / MEMORY_FILE
    memory.write_text(json.dumps(_valid(target)))
    os.chmod(memory, 0o600)
    with _daemon(home, target).start() as daemon:
        daemon.wait_for_log("event=memory_recalled")
        assert _first_scrape(daemon, str(target)) == (1.0, None, 2.0)
        assert daemon.value("fsprobe_last_save_problem_timestamp_seconds", path=str(target)) == 2
    memory.write_text(json.dumps(_valid(target)))
    os.chmod(memory, 0o620)
    with _daemon(home, target).start() as daemon:
        assert "writable by group" in daemon.wait_for_log("memory_unreadable")
        assert _first_scrape(daemon, str(target)) == (None, None, None)


def test_what_senders_may_make_the_memory_hold_is_recalled_whole(tmp_path):
    """Eleven targets, each with the 256 savers their senders may make (outside the daemon's
    pid namespace a claimed pid is one: no process needed) under hosts of 255 characters
    beyond the BMP, which an event may carry and JSON writes in 12 bytes each: the file the
    daemon writes for them is past 8 MiB, and was forgotten whole at the next start (every
    hung trainer's expectation with it). The reader takes what the writer may write."""
    host, name = "\U0001f600" * MAX_HOST, "\U0001f600" * 800
    sent = SaveEvent(f"/{name}", f"/{name}", 1, 0.1, 1, (), time.time(), host, 1)
    datagram = json.dumps(json.loads(sent.encode()), ensure_ascii=False).encode()  # raw UTF-8
    assert decode(datagram) == sent
    targets = [tmp_path / f"ckpt{n}" for n in range(11)]
    for target in targets:
        target.mkdir()
    home = tmp_path / "daemon"
    (home / "state").mkdir(parents=True, mode=0o755)
    now = time.time()
    savers = tuple(Saver(4242, host, pid, None, now) for pid in range(1, MAX_SAVERS + 1))
    failed = SaveProblem(now, f"/t/{name}", 4242, "EIO", "write", "none", f"/f/{name}")
    problems = {"failed": failed, "retried": failed}
    memory = {
        str(t): Remembered(
            savers,
            (),
            LastSave(now, "ok", 0.1, 1, f"{t}/{name}", f"{t}/{name}", 4242, 1, host, 1, ()),
            now,
            problems,
        )
        for t in targets
    }
    write_memory(str(home / "state"), memory, "x")
    assert (home / "state" / MEMORY_FILE).stat().st_size > MAX_MEMORY_BYTES
    config = daemon_config(home.parent / "fsprobe.toml", *targets, defaults=QUIET_DAEMON)
    with DaemonProcess(home, "--config", str(config)).start() as daemon:
        daemon.wait_for_log("event=memory_recalled")
        for target in targets:
            assert _first_scrape(daemon, str(target))[0] == MAX_SAVERS
        assert "memory_unreadable" not in daemon.log()
