"""Real saves seen by a real daemon (issue 21): every save reports one event, the daemon counts
it for the target that holds it, and neither a missing daemon nor a neighbour can get in the
way of a save or of another user's numbers."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.events.admission import (
    NOT_PERMITTED,
    PARKED,
    TTL,
    Admission,
    Sender,
    may_write,
)
from fsprobe.events.emit import SOCKET_NAME, own_socket_name, send
from fsprobe.events.event import (
    MAX_EVENT_BYTES,
    OUTCOMES,
    Cause,
    Failure,
    Goodbye,
    MalformedEvent,
    SaveEvent,
    decode,
)
from fsprobe.exporters.metrics import target_samples
from fsprobe.model import PROBE_KINDS, QUOTA_TYPES, REASON_CODES, ProbeResult, WriteProbeResult
from fsprobe.policy import Policy
from fsprobe.saving.options import Backoff
from tests.support.capability import need_command
from tests.support.daemon_process import REPO_ROOT, DaemonProcess, clean_environment, run_fsprobe
from tests.support.oncall import SCALE, scaled_rules
from tests.support.ranks import run_ranks
from tests.support.state import daemon_view, publish
from tests.support.users import share

pytestmark = pytest.mark.slow  # trainers and a daemon: the full run only

HERE = "tests.events.test_save_events"
RULES = REPO_ROOT / "deploy" / "prometheus" / "fsprobe.rules.yml"
NO_WAIT = Backoff(sleep=lambda seconds: None)
CHUNK = b"x" * 65536

#: A daemon that looks at the target's directory often and never writes into it itself: the
#: faults below are meant for the saves.
QUIET_DAEMON = """
[defaults]
statvfs_interval = 0.2
tmpdir_interval = 0.5
write_probe = false
quota_probe = "never"
"""


def daemon_config(path: Path, *targets: Path, defaults: str = QUIET_DAEMON) -> Path:
    path.write_text(defaults + "".join(f'\n[[targets]]\npath = "{t}"\n' for t in targets))
    return path


def start_daemon(tmp_path: Path, *targets: Path, defaults: str = QUIET_DAEMON) -> DaemonProcess:
    """A real `fsprobe run` watching `targets`; its sockets and a statvfs of each are ready.

    As root, the daemon binds a socket of each target owner's own a moment after statvfs saw
    the owner, and a sender uses it from then on: waiting for it here means that every event
    of a test goes through one socket, in the order it was sent (see `settled`)."""
    home = tmp_path / "daemon"
    home.mkdir()
    config = daemon_config(tmp_path / "fsprobe.toml", *targets, defaults=defaults)
    daemon = DaemonProcess(home, "--config", str(config)).start()
    try:
        for target in targets:
            deadline = time.monotonic() + 60
            while daemon.value("fsprobe_filesystem_avail_bytes", path=str(target)) is None:
                assert time.monotonic() < deadline, daemon.log()
                time.sleep(0.05)
        assert (daemon.state_dir / SOCKET_NAME).is_socket()
        if os.geteuid() == 0:
            for owner in {os.stat(t).st_uid for t in targets if os.path.exists(t)}:
                own = daemon.state_dir / own_socket_name(owner)
                deadline = time.monotonic() + 60
                while not _socket_of(own, owner):  # bound, then given to her
                    assert time.monotonic() < deadline, daemon.log()
                    time.sleep(0.05)
    except BaseException:
        daemon.stop()
        raise
    return daemon


def _socket_of(path: Path, owner: int) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISSOCK(info.st_mode) and info.st_uid == owner


def settled(daemon: DaemonProcess, marker: Path) -> None:
    """Return once the daemon has taken and published every event that this process (and the
    children it started, as the same user) sent so far. A datagram socket's queue is first in,
    first out, and the daemon publishes the saves it took in that order: when a marker save
    into `marker` (a watched target of its own) is counted, all before it are too."""
    name, labels = "fsprobe_saves_total", {"path": str(marker), "outcome": "ok"}
    before = daemon.value(name, **labels) or 0.0
    landed = str(marker / "m.pt")
    event = SaveEvent(landed, landed, 1, 0.1, 1, (), time.time(), "h", 1)
    assert send(event.encode(), str(daemon.state_dir))
    daemon.wait_for_value(name, before + 1.0, timeout=60, **labels)


def status_json(state_dir: Path) -> dict:
    return json.loads(run_fsprobe("status", "--state-dir", str(state_dir), "--json")[1])


def status_text(state_dir: Path) -> str:
    plain = clean_environment(NO_COLOR="1")
    return run_fsprobe("status", "--state-dir", str(state_dir), env=plain)[1]


@pytest.fixture
def target(faultfs) -> Path:
    """A checkpoint directory on the fault filesystem."""
    directory = faultfs.mountpoint / "ckpt"
    directory.mkdir()
    return directory


@pytest.fixture
def fallback(tmp_path) -> Path:
    directory = tmp_path / "fallback"
    directory.mkdir(mode=0o700)
    return directory


def test_saves_that_are_ok_retried_redirected_and_failed_reach_metrics_and_status(
    tmp_path, faultfs, target, fallback, monkeypatch
):
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        fsprobe.atomic_write(target / "a.pt", lambda f: f.write(CHUNK))
        faultfs.ctl.fail("write", "EIO", path="*.tmp", sticky=True)  # once
        retried = fsprobe.atomic_write(target / "b.pt", lambda f: f.write(CHUNK), backoff=NO_WAIT)
        faultfs.ctl.fail("write", "EDQUOT", path="*.tmp", sticky=True)  # once: quota full
        redirected = fsprobe.atomic_write(
            target / "c.pt", lambda f: f.write(CHUNK), fallback_dirs=[fallback], backoff=NO_WAIT
        )
        faultfs.ctl.fail("write", "EROFS", path="*.tmp", sticky=True)  # permanent
        with pytest.raises(fsprobe.SaveError):
            fsprobe.atomic_write(target / "d.pt", lambda f: f.write(CHUNK), backoff=NO_WAIT)
        assert retried.errors == ("EIO",) and redirected.redirected

        path = str(target)
        for outcome in OUTCOMES:
            daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome=outcome)
        metrics = daemon.metrics()
        failed = {
            dict(labels)["errno"]: value
            for labels, value in metrics["fsprobe_save_failed_attempts_total"].items()
        }
        assert failed == {"EIO": 1.0, "EDQUOT": 1.0, "EROFS": 1.0}
        assert daemon.value("fsprobe_save_bytes_total", path=path) == 3 * len(CHUNK)
        assert daemon.value("fsprobe_save_duration_seconds_count", path=path) == 4
        last = daemon.value("fsprobe_last_save_timestamp_seconds", path=path)
        landed = daemon.value("fsprobe_last_successful_save_timestamp_seconds", path=path)
        assert landed <= last <= time.time()

        state = status_json(daemon.state_dir)["targets"][path]["last_save"]
        assert state["outcome"] == "failed" and state["landed"] is None
        assert state["requested"] == str(target / "d.pt")
        assert state["failures"] == [{"errno": "EROFS", "step": "write"}]
        assert (state["uid"], state["pid"], state["host"]) == (
            os.getuid(),
            os.getpid(),
            socket.gethostname(),
        )
        text = status_text(daemon.state_dir)
        assert "LAST SAVE" in text and "failed " in text
        assert "last save failed at " in text and "after EROFS at write" in text
        assert "event=save " in daemon.log() and "outcome=redirected" in daemon.log()


def test_the_status_says_where_a_redirected_save_landed(
    tmp_path, faultfs, target, fallback, monkeypatch
):
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        faultfs.ctl.fail("write", "EDQUOT", path="*.tmp", sticky=True)
        result = fsprobe.atomic_write(
            target / "c.pt", lambda f: f.write(CHUNK), fallback_dirs=[fallback], backoff=NO_WAIT
        )
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=str(target), outcome="redirected")
        state = status_json(daemon.state_dir)["targets"][str(target)]["last_save"]
        assert (state["outcome"], state["landed"]) == ("redirected", result.path)
        assert state["failures"] == [{"errno": "EDQUOT", "step": "write"}]
        assert f"{target / 'c.pt'} -> {result.path}" in status_text(daemon.state_dir)


def collective_save(rank: int, world_size: int, target: str) -> dict:
    """Every rank writes its shard of one directory checkpoint."""

    def write(staging: str) -> list[str]:
        name = f"shard-{rank}.bin"
        with open(os.path.join(staging, name), "wb") as shard:
            shard.write(CHUNK)
        return [name]

    return dataclasses.asdict(fsprobe.distributed.save_dir(target, write))


def test_a_collective_save_is_one_event_with_its_rank_count(tmp_path, monkeypatch):
    target, marker = tmp_path / "ckpt", tmp_path / "marker"
    target.mkdir()
    marker.mkdir()
    with start_daemon(tmp_path, target, marker) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        run_ranks(f"{HERE}:collective_save", 2, tmp_path, target=str(target / "step-1"))
        settled(daemon, marker)  # a second event, from the other rank, would be counted now
        assert daemon.value("fsprobe_saves_total", path=str(target), outcome="ok") == 1.0
        assert daemon.value("fsprobe_save_bytes_total", path=str(target)) == 2 * len(CHUNK)
        state = status_json(daemon.state_dir)["targets"][str(target)]["last_save"]
        assert state["ranks"] == 2 and state["requested"] == str(target / "step-1")


def test_saves_outside_every_watched_target_are_dropped_and_counted(tmp_path, monkeypatch):
    target, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        for step in range(3):
            fsprobe.atomic_write(elsewhere / f"{step}.pt", lambda f: f.write(b"x"))
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 3.0, reason="unwatched")
        exported = daemon.metrics()["fsprobe_saves_total"]
        assert not any(str(elsewhere) in str(labels) for labels in exported)


def test_with_no_daemon_a_save_neither_waits_nor_fails(tmp_path):
    """No state dir, a state dir without a socket, a socket nobody reads: nothing happens."""
    target = tmp_path / "ckpt"
    target.mkdir()
    state_dir = tmp_path / "state"
    result = fsprobe.atomic_write(
        target / "a.pt", lambda f: f.write(b"x"), state_dir=str(state_dir)
    )
    assert result.path == str(target / "a.pt")
    state_dir.mkdir(mode=0o700)
    event = SaveEvent(str(target / "a.pt"), str(target / "a.pt"), 1, 0.1, 1, (), 0.0, "h", 1)
    assert send(event.encode(), str(state_dir)) is False
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(state_dir / SOCKET_NAME))
    dead.close()  # the socket file of a daemon that died
    assert send(event.encode(), str(state_dir)) is False
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    (state_dir / SOCKET_NAME).unlink()
    reader.bind(str(state_dir / SOCKET_NAME))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with reader:  # a daemon that hangs: its queue fills, the sends after that are dropped
        sent = [send(event.encode(), str(state_dir)) for _ in range(200)]
        assert sent[0] and not all(sent)
        fsprobe.atomic_write(target / "b.pt", lambda f: f.write(b"x"), state_dir=str(state_dir))


def test_an_event_is_not_sent_to_a_socket_someone_else_planted(tmp_path, local_users):
    share(tmp_path)
    mallory = local_users.user()
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o777)  # a state dir others may write: not trusted
    event = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 0.1, 1, (), 0.0, "h", 1)
    mallory.run(_listen, str(state_dir / SOCKET_NAME))
    assert send(event.encode(), str(state_dir)) is False
    os.chmod(state_dir, 0o755)  # trusted now, but the socket in it is mallory's
    assert (state_dir / SOCKET_NAME).stat().st_uid == mallory.uid
    assert send(event.encode(), str(state_dir)) is False


def _listen(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.detach()  # the socket file stays, as a planted one would


FORGE = """
import json, socket, sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested, claimed_uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
event = SaveEvent(requested, requested, 1, 0.5, 2, (Failure("EIO", "write"),), time.time(), "h", 1)
sent = send(event.encode(), state_dir)
why = None
if not sent:  # say why, for the assertion's message
    try:
        info = os.stat(state_dir)
        sock_info = os.stat(state_dir + "/events.sock")
        why = f"dir {oct(info.st_mode)} uid {info.st_uid}, socket {oct(sock_info.st_mode)}"
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        probe.sendto(event.encode(), socket.MSG_DONTWAIT, state_dir + "/events.sock")
        why += ": a plain sendto works"
    except OSError as error:
        why = f"{why}: {error!r}"
# Claiming another uid in the credentials is the kernel's to refuse.
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
creds = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", 0, claimed_uid, 0))]
try:
    sock.sendmsg([event.encode()], creds, 0, f"{state_dir}/events.sock")
    forged = "sent"
except PermissionError:
    forged = "EPERM"
print(json.dumps({"sent": sent, "forged": forged, "why": why}))
""".replace("import json,", "import json, os, struct,")


def test_a_second_user_cannot_report_saves_into_another_users_target(tmp_path, local_users):
    """Root's node daemon hears every user; Bob's events for Alice's private target count
    nowhere (whatever uid Bob claims, the kernel says who he is), Alice's own do."""
    share(tmp_path)
    alice, bob = local_users.user(), local_users.user()
    target = tmp_path / "alice-ckpt"
    target.mkdir(mode=0o700)
    os.chown(target, alice.uid, alice.gid)
    with start_daemon(tmp_path, target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        assert (daemon.state_dir / SOCKET_NAME).stat().st_mode & 0o777 == 0o666
        requested = str(target / "model.pt")
        done = bob.python(FORGE, str(daemon.state_dir), requested, str(alice.uid))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"sent": True, "forged": "EPERM", "why": None}
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="not_permitted")
        assert daemon.value("fsprobe_saves_total", path=str(target), outcome="retried") == 0.0

        done = alice.python(FORGE, str(daemon.state_dir), requested, str(bob.uid))
        assert done.returncode == 0, done.stderr
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=str(target), outcome="retried")
        state = status_json(daemon.state_dir)["targets"][str(target)]["last_save"]
        assert state["uid"] == alice.uid
        assert daemon.value("fsprobe_save_events_dropped_total", reason="not_permitted") == 1.0


def test_a_flood_from_one_user_is_rate_limited(tmp_path, local_users):
    share(tmp_path)
    mallory = local_users.user()
    target = tmp_path / "shared"
    target.mkdir(mode=0o777)
    os.chmod(target, 0o1777)  # anyone may save here: so may Mallory, but not without bound
    with start_daemon(tmp_path, target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        flood = (
            "import sys, time\n"
            "from fsprobe.events.emit import send\n"
            "from fsprobe.events.event import SaveEvent\n"
            "e = SaveEvent(sys.argv[2], sys.argv[2], 1, 0.1, 1, (), time.time(), 'h', 1)\n"
            "sent, give_up = 0, time.monotonic() + 120\n"
            "while sent < 400 and time.monotonic() < give_up:\n"  # as fast as the kernel's
            "    if send(e.encode(), sys.argv[1]):\n"  # queue (max_dgram_qlen datagrams) takes them
            "        sent += 1\n"
            "    else:\n"
            "        time.sleep(0.001)\n"
            "print(sent)\n"
            "import os, socket\n"
            "for path in (sys.argv[1], sys.argv[1] + '/events.sock') if not sent else ():\n"
            "    info = os.stat(path)\n"  # why none was sent, for the message below
            "    print(path, oct(info.st_mode), info.st_uid, os.getuid())\n"
            "sys.stdout.flush()\n"
            "os._exit(0)\n"  # no goodbye at exit: exactly the 400 events are counted below
        )
        done = mallory.python(flood, str(daemon.state_dir), str(target / "x.pt"))
        assert done.returncode == 0, done.stderr
        assert int(done.stdout.split()[0]) == 400, f"not every event was sent: {done.stdout}"
        deadline = time.monotonic() + 60
        while True:  # every event sent is taken: counted, or dropped for her rate
            counted = daemon.value("fsprobe_saves_total", path=str(target), outcome="ok") or 0
            limited = daemon.value("fsprobe_save_events_dropped_total", reason="rate_limited")
            if counted + (limited or 0) >= 400 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert 100 <= counted < 400 and limited and limited > 0, (counted, limited)
        assert counted + limited == 400


def test_the_kernel_decides_where_a_user_may_report(tmp_path, local_users):
    """The admission rule is the kernel's answer for the sender (`may_write`), case by case:
    hers, her team's, a group-writable directory her ACL entry makes read-only (its group
    bits show the ACL mask, rwx), an open directory inside a 0700 one of someone else's, a
    read-only bind mount, and a target not made yet (no save landed there, whoever may make
    it)."""
    share(tmp_path)
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    root = tmp_path / "scratch"
    root.mkdir(mode=0o755)

    def made(path: Path, owner, gid: int, mode: int) -> Path:
        path.mkdir()
        os.chown(path, owner.uid, gid)
        os.chmod(path, mode)
        return path

    own = made(root / "mallory", mallory, mallory.gid, 0o700)
    teams = made(root / "team", alice, team, 0o2770)
    acl = made(root / "acl", alice, team, 0o2770)
    # The team reads it, Alice writes it: the mask (the union, rwx) is what the group bits show.
    setfacl = need_command("setfacl", "acl")
    subprocess.run([setfacl, "-m", f"g::r-x,u:{alice.uid}:rwx", str(acl)], check=True)
    assert stat.S_IMODE(acl.stat().st_mode) & 0o070 == 0o070  # the mask: looks team-writable
    private = made(root / "alice", alice, alice.gid, 0o700)
    inside = made(private / "open", alice, alice.gid, 0o777)
    readonly = made(root / "ro", mallory, mallory.gid, 0o700)
    subprocess.run(["mount", "--bind", str(readonly), str(readonly)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(readonly)], check=True)
        her = Sender(mallory.uid, mallory.gid, 1, frozenset({mallory.gid, team})).identity()
        decided = {
            name: may_write(her, str(path))
            for name, path in {
                "own": own,
                "own, not made yet": own / "run-1" / "step-1",
                "team": teams,
                "acl r-x": acl,
                "0777 in a 0700": inside,
                "read-only mount": readonly,
                "alice's private": private,
            }.items()
        }
    finally:
        subprocess.run(["umount", str(readonly)], check=True)
    assert decided == {
        "own": True,
        "own, not made yet": False,
        "team": True,
        "acl r-x": False,
        "0777 in a 0700": False,
        "read-only mount": False,
        "alice's private": False,
    }
    alone = Sender(mallory.uid, mallory.gid, 1, frozenset({mallory.gid})).identity()
    assert may_write(alone, str(teams)) is False  # her groups are what the kernel checks


def overdue_alerts(prometheus, path: str) -> list[dict]:
    return [
        alert
        for alert in prometheus.alerts()
        if alert["labels"]["alertname"] == "FsprobeCheckpointOverdue"
        and alert["labels"].get("path") == path
    ]


@pytest.mark.prometheus
def test_prometheus_fires_checkpoint_overdue_when_a_saving_loop_stops(
    tmp_path, prometheus_for, monkeypatch
):
    """A trainer saving every 1.5 s is one saving every 90 s at the on-call scenarios' compressed
    time: the shipped rule, its `for:` as compressed (`tests.support.oncall`), pages it once
    its checkpoints stop, not before."""
    target = tmp_path / "ckpt"
    target.mkdir()
    rules = scaled_rules(RULES, tmp_path)
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        prometheus = prometheus_for(daemon.url.split("//")[1].split("/")[0], [rules])
        prometheus.wait_for('up{job="fsprobe"}', 1.0)
        path = str(target)
        started = time.monotonic()
        for step in range(8):  # a trainer that checkpoints every 1.5 s, by the clock: the
            fsprobe.atomic_write(target / f"step-{step}.pt", lambda f: f.write(CHUNK))
            if step >= 3:  # save and this query, slow on a loaded machine, are within it
                assert overdue_alerts(prometheus, path) == []
            time.sleep(max(0.0, started + 1.5 * (step + 1) - time.monotonic()))
        interval = prometheus.value(f'fsprobe_save_interval_seconds{{path="{path}"}}')
        assert interval == pytest.approx(1.5, abs=0.5)
        assert overdue_alerts(prometheus, path) == []
        stopped = time.monotonic()  # the loop stops: the job hangs, fsprobe stays up
        deadline = stopped + 30
        while not [a for a in overdue_alerts(prometheus, path) if a["state"] == "firing"]:
            assert time.monotonic() < deadline, prometheus.alerts()
            time.sleep(0.2)
        assert time.monotonic() - stopped >= 2 * interval + 120 / SCALE  # overdue, then `for:`
        (alert,) = overdue_alerts(prometheus, path)
        assert alert["labels"]["severity"] == "critical"
        assert "it is saved about every 1" in alert["annotations"]["description"]


#: A daemon whose write probe runs every 2 s (and its statvfs every 0.3 s, with a 1 s deadline).
PROBING_DAEMON = """
[defaults]
statvfs_interval = 0.3
write_interval = 2.0
tmpdir_interval = 0.5
deadline = 1
write_bytes = "4K"
quota_probe = "never"
"""


def test_real_saves_stand_for_the_write_probe_while_they_flow(
    tmp_path, faultfs, target, monkeypatch
):
    """A save that landed within the write probe's interval stands for it: the probe's test
    file is not written, the skip is counted, and the probe's series come from the saves."""
    probe_files = faultfs.ctl.delay("create", 0.001, path="*~write-probe.tmp")  # counts them
    with start_daemon(tmp_path, target, defaults=PROBING_DAEMON) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        path = str(target)
        daemon.wait_for_value("fsprobe_probe_success", 1.0, path=path, probe="write")
        fsprobe.atomic_write(target / "step.pt", lambda f: f.write(CHUNK))
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="ok")
        before = faultfs.ctl.rule(probe_files)["hits"]
        stop = threading.Event()

        def trainer() -> None:  # a save every 0.2 s
            while not stop.wait(0.2):
                fsprobe.atomic_write(target / "step.pt", lambda f: f.write(CHUNK))

        saving = threading.Thread(target=trainer)
        saving.start()
        try:
            time.sleep(4.0)  # two write intervals
            state = status_json(daemon.state_dir)["targets"][path]
            text = status_text(daemon.state_dir)
            time.sleep(4.0)
        finally:
            stop.set()
            saving.join()
        assert faultfs.ctl.rule(probe_files)["hits"] == before
        assert daemon.value("fsprobe_probe_skipped_total", path=path, probe="write") >= 3
        assert daemon.value("fsprobe_probe_success", path=path, probe="write") == 1.0
        assert state["status"] == "ok" and state["write_probe"]["message"] == "a real save"
        assert "by save" in text, text

        deadline = time.monotonic() + 60  # the saves stop: the active probe is back
        while faultfs.ctl.rule(probe_files)["hits"] == before:
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)


@pytest.mark.parametrize(
    ("fault", "status", "severity"),
    [("EIO", 1.0, "degraded"), ("EROFS", 2.0, "unhealthy")],
    ids=["retried-transient", "failed-permanent"],
)
def test_a_real_saves_failed_attempts_feed_the_verdict_like_a_failed_probe(
    tmp_path, faultfs, target, monkeypatch, fault, status, severity
):
    """With the write probe off, only the saves say how writing goes: a transient error that
    the retry rode out leaves the target degraded, a permanent one that failed the save makes
    it unhealthy, with the save's errno, as a failed probe would; the policy judges both."""
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        path = str(target)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=path)
        faultfs.ctl.fail("write", fault, path="*.tmp", sticky=True)  # once
        try:
            fsprobe.atomic_write(target / "step.pt", lambda f: f.write(CHUNK), backoff=NO_WAIT)
        except fsprobe.SaveError as error:
            assert fault == "EROFS" and error.attempts[0].errno == "EROFS"
        daemon.wait_for_value("fsprobe_health_status", status, path=path)
        reasons = status_json(daemon.state_dir)["targets"][path]["reasons"]
        (reason,) = [r for r in reasons if r["code"] == "write_failed"]
        assert reason["severity"] == severity
        if fault == "EROFS":
            assert reason["errno"] == "EROFS" and "a real save of" in reason["message"]


def test_a_redirected_saves_attempts_in_the_fallback_are_no_evidence_for_the_target(
    tmp_path, faultfs, faultfs_factory, target, monkeypatch
):
    """The target was full (EDQUOT), then the fallback failed once (EIO) before the save
    landed there: the target's failure counts for the target, the fallback's does not."""
    fallback_fs = faultfs_factory()
    fallback = fallback_fs.mountpoint / "fallback"
    fallback.mkdir(mode=0o700)
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        path = str(target)
        faultfs.ctl.fail("write", "EDQUOT", path="*.tmp", sticky=True)  # once
        fallback_fs.ctl.fail("write", "EIO", path="*.tmp", sticky=True)  # once
        result = fsprobe.atomic_write(
            target / "step.pt",
            lambda f: f.write(CHUNK),
            fallback_dirs=[fallback],
            backoff=NO_WAIT,
        )
        assert result.redirected and result.errors == ("EDQUOT", "EIO")
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="redirected")
        assert daemon.value("fsprobe_save_failed_attempts_total", path=path, errno="EIO") == 1
        write = status_json(daemon.state_dir)["targets"][path]["write_probe"]
        assert (write["ok"], write["errno"], write["message"]) == (False, "EDQUOT", "a real save")
        assert "fsprobe_probe_errors_total" not in daemon.metrics()  # the saves count them


def test_a_hung_mount_is_still_marked_stuck_while_saves_stood_for_the_write_probe(
    tmp_path, faultfs, target, monkeypatch
):
    with start_daemon(tmp_path, target, defaults=PROBING_DAEMON) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        path = str(target)
        for _ in range(5):
            fsprobe.atomic_write(target / "step.pt", lambda f: f.write(CHUNK))
            time.sleep(0.2)
        daemon.wait_for_present("fsprobe_probe_skipped_total")
        rule = faultfs.ctl.block("statfs")  # the mount hangs
        try:
            daemon.wait_for_value("fsprobe_mount_stuck", 1.0, path=path, timeout=15)
            daemon.wait_for_value("fsprobe_health_status", 2.0, path=path)
        finally:
            faultfs.ctl.remove(rule)
        daemon.wait_for_value("fsprobe_mount_stuck", 0.0, path=path, timeout=15)


def test_a_save_every_few_minutes_stands_for_a_write_probe_every_minute_until_it_is_late():
    """Saves every 5 minutes, a write probe every minute: once the save interval is known (the
    third save), a landed save stands for the probe for 1.5 save intervals, and the policy
    does not call the saves' write results stale meanwhile; a late save lets the probe run.
    (The target's own write probe passed when it last ran, as saves stand in only then.)"""
    now = [1000.0]
    store = Store(clock=lambda: now[0])
    intervals = {"statvfs": 15.0, "write": 60.0}
    store.configure([TargetSpec("/ckpt", Policy(intervals=intervals), intervals)])
    store.record("/ckpt", passed_write_probe(now[0]))

    def save_and_wait(seconds: float) -> None:
        event = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 1.0, 1, (), now[0], "h", 1)
        assert store.record_save(Sender(0, 0, 1), event)[0] is None
        now[0] += seconds

    save_and_wait(100.0)
    assert store.skip_write_probe("/ckpt") is None  # one save: it stands for 60 s only
    now[0] += 200.0
    save_and_wait(300.0)
    store.record("/ckpt", passed_write_probe(now[0]))  # the last run the saves did not skip
    save_and_wait(400.0)  # the third save, 300 s after the second: 450 s of evidence
    assert store.view("/ckpt").saves.interval == 300.0
    assert store.skip_write_probe("/ckpt") is not None
    codes = {reason.code for reason in store.view("/ckpt").verdict.reasons}
    assert "probe_stale" not in codes
    now[0] += 60.0  # 460 s after the last save: late
    assert store.skip_write_probe("/ckpt") is None


def passed_write_probe(at: float) -> ProbeResult:
    return ProbeResult("write", at, 0.01, value=WriteProbeResult(True, 4096, {"total": 0.01}))


def test_a_dcp_save_and_a_background_save_each_report_one_event(tmp_path, monkeypatch):
    """DCP through FsprobeWriter on two gloo ranks: one event from the coordinator with both
    ranks; `save_async`: its event when the background write lands."""
    target = tmp_path / "ckpt"
    target.mkdir()
    with start_daemon(tmp_path, target) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        path = str(target)
        run_ranks(
            "tests.integrations.test_integration_dcp:save_state",
            2,
            tmp_path,
            target=str(target / "dcp-1"),
        )
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="ok")
        state = status_json(daemon.state_dir)["targets"][path]["last_save"]
        assert (state["requested"], state["ranks"]) == (str(target / "dcp-1"), 2)

        future = fsprobe.save_async({"step": 1}, target / "async.pt")
        assert future.result(timeout=60).path == str(target / "async.pt")
        daemon.wait_for_value("fsprobe_saves_total", 2.0, path=path, outcome="ok")
        state = status_json(daemon.state_dir)["targets"][path]["last_save"]
        assert (state["requested"], state["ranks"]) == (str(target / "async.pt"), 1)


def test_a_sender_cannot_make_up_errno_labels():
    """Errno names label a metric: names that are no errno count as EUNKNOWN, and an event
    lists at most 16 failed attempts, so no sender can grow the series without bound."""
    made_up = [Failure(f"EBOGUS{n}", "write") for n in range(16)]
    event = SaveEvent("/c/a.pt", None, 0, 1.0, 16, tuple(made_up), 0.0, "h", 1)
    assert {f.errno for f in decode(event.encode()).failures} == {"EUNKNOWN"}
    real = SaveEvent("/c/a.pt", None, 0, 1.0, 2, (Failure("EIO", "write"),), 0.0, "h", 1)
    assert decode(real.encode()).failures == (Failure("EIO", "write"),)
    document = json.loads(event.encode())
    document["failures"] *= 2  # 32: more than a sender would send
    with pytest.raises(MalformedEvent):
        decode(json.dumps(document).encode())


def _saved(store: Store, pid: int, uid: int = 0, at: float = 0.0) -> None:
    """One save into /ckpt by process `pid` (the kernel's pid, as the receiver passes it)."""
    landed = "/ckpt/step.pt"
    save = SaveEvent(landed, landed, 1, 0.1, 1, (), at, "node1", pid)
    refused, _view = store.record_save(Sender(uid, uid, pid), save)
    assert refused is None


def test_a_saver_is_expected_until_its_goodbye_and_only_its_own_uid_may_say_it():
    starts = {4242: 100}
    store = Store(started=starts.get)
    store.configure([TargetSpec("/ckpt")])
    for at in range(4):
        _saved(store, 4242, at=at)  # as root, who may report anywhere
    view = store.view("/ckpt")
    assert view is not None and view.saves.savers == 1
    assert view.saves.interval is not None
    assert store.goodbye(Sender(1001, 1001, 4242), Goodbye("node1", 4242)) == []  # not hers
    assert store.goodbye(Sender(0, 0, 999), Goodbye("node1", 999)) == []  # not a saver
    (after,) = store.goodbye(Sender(0, 0, 4242), Goodbye("node1", 4242))
    assert after.saves.savers == 0
    assert after.saves.interval is None  # the job ended: nothing is overdue


def test_a_saver_is_forgotten_when_its_pid_is_gone_or_reused_and_kept_while_it_lives():
    starts = {1: 100, 2: 200, 3: 300}
    store = Store(started=starts.get)
    store.configure([TargetSpec("/ckpt")])
    for pid in (1, 2, 3):
        _saved(store, pid)
    assert store.forget_gone_savers() == []  # all alive (a stopped process lives too)
    del starts[1]  # exited without a goodbye (killed)
    starts[2] = 201  # its pid now holds another process
    (view,) = store.forget_gone_savers()
    assert view.saves.savers == 1
    _saved(store, 5)  # gone before its event was read: never expected
    assert store.view("/ckpt").saves.savers == 1


def test_a_saver_outside_our_pid_namespace_is_expected_until_its_goodbye():
    store = Store(started=lambda pid: None)
    store.configure([TargetSpec("/ckpt")])
    save = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 0.1, 1, (), 0.0, "pod", 7)
    store.record_save(Sender(0, 0, 0), save)  # the kernel gave no pid: its claim stays
    assert store.forget_gone_savers() == []
    assert store.view("/ckpt").saves.savers == 1
    (view,) = store.goodbye(Sender(0, 0, 0), Goodbye("pod", 7))
    assert view.saves.savers == 0


def test_a_goodbye_is_a_datagram_of_its_own():
    assert decode(Goodbye("node1", 42).encode()) == Goodbye("node1", 42)


TRAINER = """
import os, signal, sys, time
import fsprobe
target, count, ending = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for step in range(count):
    fsprobe.atomic_write(os.path.join(target, f"step-{step}.pt"), lambda f: f.write(b"x" * 4096))
    time.sleep(0.2)
print("saved", flush=True)
if ending == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
elif ending == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def run_trainer(target: Path, state_dir: Path, ending: str, count: int = 4):
    """A trainer process saving `count` checkpoints into `target`, then ending as told: exit
    (cleanly: it says goodbye), kill (SIGKILL: no goodbye) or stop (SIGSTOP: alive, silent)."""
    env = clean_environment(FSPROBE_STATE_DIR=str(state_dir))
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(target), str(count), ending],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("ending", ["exit", "kill"])
def test_a_trainer_that_ended_is_no_longer_expected_to_save(tmp_path, ending):
    """A clean exit says goodbye; a killed trainer says nothing, and its pid is gone: either
    way the daemon expects no more saves (fsprobe_savers 0, no save interval to be late by)."""
    target = tmp_path / "ckpt"
    target.mkdir()
    with start_daemon(tmp_path, target) as daemon:
        trainer = run_trainer(target, daemon.state_dir, ending)
        assert trainer.wait(60) == (0 if ending == "exit" else -9)
        daemon.wait_for_value("fsprobe_saves_total", 4.0, path=str(target), outcome="ok")
        daemon.wait_for_value("fsprobe_savers", 0.0, timeout=60, path=str(target))
        assert daemon.value("fsprobe_save_interval_seconds", path=str(target)) is None
        assert ("saver_left" in daemon.log()) == (ending == "exit")


def test_a_stopped_trainer_is_still_expected_to_save(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()
    with start_daemon(tmp_path, target) as daemon:
        trainer = run_trainer(target, daemon.state_dir, "stop")
        try:
            assert trainer.stdout.readline() == "saved\n"
            daemon.wait_for_value("fsprobe_saves_total", 4.0, path=str(target), outcome="ok")
            daemon.wait_for_value("fsprobe_savers", 1.0, path=str(target))
            # A second trainer saves and is killed: the look that finds it gone (savers back
            # to 1) looked at the stopped one too, and found it alive.
            killed = run_trainer(target, daemon.state_dir, "kill")
            assert killed.wait(60) == -9
            daemon.wait_for_value("fsprobe_saves_total", 8.0, path=str(target), outcome="ok")
            daemon.wait_for_value("fsprobe_savers", 1.0, timeout=60, path=str(target))
            assert daemon.value("fsprobe_save_interval_seconds", path=str(target)) is not None
        finally:
            trainer.kill()
            trainer.wait()


def test_admission_decisions_are_kept_for_their_ttl_and_at_most_so_many():
    """Each (sender, target) is asked of the kernel once per TTL (30 s), and at most
    `max_decisions` answers are kept, the oldest forgotten first."""
    now, asked, back = [0.0], [], threading.Event()

    def check(identity, target: str) -> bool:
        asked.append((identity.uid, target))
        return target != "/denied"

    admission: Admission[str] = Admission(
        back.set, daemon_uid=1, check=check, clock=lambda: now[0], max_decisions=2
    )

    def ask(uid: int, target: str) -> str | None:
        said = admission.ask(Sender(uid, uid, 9, frozenset({uid})), target, "event")
        if said != PARKED:
            return said
        deadline = time.monotonic() + 60
        while not (decided := admission.decided()):
            assert back.wait(max(0.0, deadline - time.monotonic())), "no check came back"
            back.clear()
        ((item, said),) = decided
        assert item == "event"
        return said

    assert ask(1000, "/ckpt") is None and ask(1000, "/denied") == NOT_PERMITTED
    assert ask(1000, "/ckpt") is None and len(asked) == 2  # from the cache
    assert ask(0, "/denied") is None and ask(1, "/denied") is None  # root, the daemon's user
    now[0] += TTL
    assert ask(1000, "/ckpt") is None and len(asked) == 3  # asked again after its TTL
    for uid in (1001, 1002, 1003):
        ask(uid, "/ckpt")
    assert ask(1000, "/ckpt") is None and asked[-1] == (1000, "/ckpt")  # forgotten: asked again


def test_a_save_the_preflight_redirects_carries_the_verdicts_reason_to_the_daemon(tmp_path):
    """issue 35.7: the event of a save the preflight redirected (the daemon said read-only)
    names the reason and its errno, not "EUNKNOWN at unknown"; the daemon's problem, its
    metric labels and its log line carry them."""
    target, fallback, state_dir = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "state"
    for directory in (target, fallback):
        directory.mkdir()
    publish(
        str(state_dir),
        {
            str(target): daemon_view(str(target), readonly=True),
            str(fallback): daemon_view(str(fallback)),
        },
    )
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(str(state_dir / SOCKET_NAME))
    with reader:
        reader.settimeout(10)
        result = fsprobe.atomic_write(
            target / "m.pt", lambda f: f.write(b"x"), fallback_dirs=[str(fallback)],
            state_dir=str(state_dir), context=fsprobe.SaveContext(),
        )  # fmt: skip
        save = decode(reader.recv(MAX_EVENT_BYTES))
    assert result.redirected and result.errors == ()
    assert isinstance(save, SaveEvent) and save.cause == Cause("readonly", "EROFS")
    store = Store()
    store.configure([TargetSpec(str(target))])
    refused, view = store.record_save(Sender(os.getuid(), os.getgid(), os.getpid()), save)
    assert refused is None and view is not None
    problem = view.saves.problems["redirected"]
    assert (problem.reason, problem.errno, problem.step) == ("readonly", "EROFS", "preflight")
    (sample,) = target_samples(view)["fsprobe_last_save_problem_timestamp_seconds"]
    assert (sample.labels["reason"], sample.labels["errno"], sample.labels["step"]) == (
        "readonly", "EROFS", "preflight",
    )  # fmt: skip


def test_a_sender_cannot_make_up_reasons():
    """The reason labels a metric like the errno: a code the policy does not have counts as
    unknown, an errno as EUNKNOWN, and anything but [short name, short name or null] is
    refused."""
    made_up = SaveEvent(
        "/c/a.pt", "/f/a.pt", 1, 1.0, 1, (), 0.0, "h", 1, cause=Cause("<!here>", "EBOGUS")
    )
    assert decode(made_up.encode()).cause == Cause("unknown", "EUNKNOWN")
    real = dataclasses.replace(made_up, cause=Cause("space_headroom_low", None))
    assert decode(real.encode()).cause == Cause("space_headroom_low", None)
    assert decode(dataclasses.replace(made_up, cause=None).encode()).cause is None
    for bad in (["x" * 33, None], ["readonly"], "readonly", [1, None], ["readonly", "EROFS", "x"]):
        document = {**json.loads(made_up.encode()), "cause": bad}
        with pytest.raises(MalformedEvent):
            decode(json.dumps(document).encode())


def test_every_reason_the_policy_writes_is_one_an_event_may_carry():
    """REASON_CODES is the policy's vocabulary: each code it writes (the first argument of a
    `Reason`, or the first item of a table row of them) is in it, and nothing else is."""
    written = set()
    for module in ("policy.py", "model.py"):
        tree = ast.parse((Path(fsprobe.__file__).parent / module).read_text())
        for node in ast.walk(tree):
            first = None
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Reason":
                first = node.args[0] if node.args else None
            elif isinstance(node, ast.Tuple) and len(node.elts) >= 3:
                first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                written.add(first.value)
    others = set(PROBE_KINDS) | set(QUOTA_TYPES)  # table rows of probes and quota types
    assert written - others == REASON_CODES


def test_the_daemon_logs_and_exports_the_reason_of_a_preflight_redirect(
    tmp_path, tmpfs, monkeypatch
):
    """issue 35.7, end to end: a checkpoint that the daemon's answer says does not fit (a
    1 MiB tmpfs, a need of 4 MiB) is redirected by the preflight; the daemon's
    `event=save outcome=redirected` line and the problem's labels carry the reason and its
    errno, not "EUNKNOWN at unknown"."""
    target, fallback = tmpfs(size="1M").path, tmp_path / "fallback"
    fallback.mkdir()
    with start_daemon(tmp_path, target, fallback) as daemon:
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        result = fsprobe.atomic_write(
            target / "c.pt", lambda f: f.write(CHUNK), fallback_dirs=[str(fallback)],
            need_bytes=4 << 20, backoff=NO_WAIT,
        )  # fmt: skip
        assert result.redirected and result.errors == ()
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=str(target), outcome="redirected")
        problem = daemon.value(
            "fsprobe_last_save_problem_timestamp_seconds", path=str(target), outcome="redirected",
            reason="space_headroom_low", errno="ENOSPC", step="preflight",
        )  # fmt: skip
        assert problem is not None, daemon.get()[1].decode()[-3000:]
        line = daemon.wait_for_log("outcome=redirected")
        assert "reason=space_headroom_low" in line and "EUNKNOWN" not in line
