"""The verdict belongs to the filesystem (issue 27): a second local user, as a real account
sending real datagrams to root's real daemon, and a user's own mistake in a real save, cannot
change what the monitor says about a target others use; hostile fields reach no reader raw."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

from fsprobe.events.emit import send
from fsprobe.events.event import SaveEvent
from tests.events.test_save_events import PROBING_DAEMON, start_daemon
from tests.support.capability import need_command
from tests.support.daemon_process import clean_environment, run_fsprobe
from tests.support.users import share

#: A forged event: a save into argv[2] that failed with argv[3] (``ok``: one that landed),
#: sent as the user running it; prints whether it was handed to the kernel.
FORGE = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested, errno = sys.argv[1], sys.argv[2], sys.argv[3]
if errno == "ok":
    event = SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), "h", 1)
else:
    event = SaveEvent(requested, None, 0, 0.1, 1, (Failure(errno, "write"),), time.time(), "h", 1)
sent = send(event.encode(), state_dir)
why = ""
if not sent:  # why not, for the assertion's message
    import os, socket
    for name in (f"events-{os.geteuid()}.sock", "events.sock"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        try:
            probe.sendto(event.encode(), f"{state_dir}/{name}")
            why += f" {name}: sent"
        except OSError as error:
            why += f" {name}: {error!r}"
print(sent, why)
"""


def _made(path: Path, owner, gid: int, mode: int) -> Path:
    path.mkdir()
    os.chown(path, owner.uid, gid)
    os.chmod(path, mode)
    return path


def _open_to_users(daemon) -> None:
    os.chmod(daemon.home, 0o755)
    os.chmod(daemon.state_dir, 0o755)


def _forge(user, daemon, requested: Path, errno: str) -> None:
    done = user.python(FORGE, str(daemon.state_dir), str(requested), errno)
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stdout + done.stderr


def test_a_team_member_whose_acl_entry_is_read_only_cannot_mark_the_team_target(
    tmp_path, local_users
):
    """Alice's team target is 2770 with an ACL: the team reads it (``g::r-x``), Alice
    writes it; the group bits show the ACL mask (rwx). Mallory, in the team, forged one
    EROFS event and the target was unhealthy for everyone: the mode bits said she could
    write there, the kernel says she cannot, and the kernel decides now."""
    share(tmp_path)
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    target = _made(tmp_path / "team-ckpt", alice, team, 0o2770)
    setfacl = need_command("setfacl", "acl")
    subprocess.run([setfacl, "-m", f"g::r-x,u:{alice.uid}:rwx", str(target)], check=True)
    assert target.stat().st_mode & 0o070 == 0o070  # the mask: it looks team-writable
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(target))
        _forge(mallory, daemon, target / "model.pt", "EROFS")
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="not_permitted")
        assert daemon.value("fsprobe_saves_total", path=str(target), outcome="failed") == 0.0
        assert daemon.value("fsprobe_health_status", path=str(target)) == 0.0
        _forge(alice, daemon, target / "model.pt", "EROFS")  # hers to say: it counts
        daemon.wait_for_value("fsprobe_health_status", 2.0, path=str(target))


def test_an_open_target_inside_a_private_directory_is_not_hers_to_report(tmp_path, local_users):
    """A 0777 target inside Alice's 0700 directory: Mallory cannot even reach it, yet one
    forged EDQUOT event marked it (the mode bits of the target alone were read)."""
    share(tmp_path)
    alice, mallory = local_users.user(), local_users.user()
    private = _made(tmp_path / "alice", alice, alice.gid, 0o700)
    target = _made(private / "ckpt", alice, alice.gid, 0o777)
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(target))
        _forge(mallory, daemon, target / "model.pt", "EDQUOT")
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="not_permitted")
        assert daemon.value("fsprobe_save_failed_attempts_total", path=str(target)) in (None, 0.0)
        assert daemon.value("fsprobe_health_status", path=str(target)) == 0.0


#: A real save as the user running it, into argv[2]; prints the errno of each failed attempt.
SAVE = """
import sys
import fsprobe
try:
    fsprobe.atomic_write(sys.argv[2], lambda f: f.write(b"x" * 4096), state_dir=sys.argv[1])
    print("landed")
except fsprobe.SaveError as error:
    print(" ".join(attempt.errno for attempt in error.attempts))
"""


def test_a_users_own_eacces_in_her_subdirectory_is_her_saves_outcome_only(tmp_path, local_users):
    """Mallory saves into a directory of hers inside the team's target that she made
    read-only: EACCES at create. It is her save's outcome (counted, failed), never the
    target's health: it made the target unhealthy (write_failed ... EPERM) for every
    user's preflight. A save that lands in the target itself still counts as one."""
    share(tmp_path)
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    target = _made(tmp_path / "team-ckpt", alice, team, 0o2770)
    hers = _made(target / "mallory-run", mallory, team, 0o2550)
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        path = str(target)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=path)
        done = mallory.python(SAVE, str(daemon.state_dir), str(hers / "step-1.pt"))
        assert (done.returncode, done.stdout.strip()) == (0, "EACCES"), done.stderr
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="failed")
        assert daemon.value("fsprobe_save_failed_attempts_total", path=path, errno="EACCES") == 1
        assert daemon.value("fsprobe_health_status", path=path) == 0.0
        state = json.loads(run_fsprobe("status", "--state-dir", str(daemon.state_dir), "--json")[1])
        assert state["targets"][path]["status"] == "ok", state["targets"][path]["reasons"]
        assert state["targets"][path]["last_save"]["failures"] == [
            {"errno": "EACCES", "step": "create"}
        ]


@contextlib.contextmanager
def _immutable(path: Path):
    subprocess.run([need_command("chattr", "e2fsprogs"), "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run([need_command("chattr", "e2fsprogs"), "-i", str(path)], check=True)


def test_saves_never_stand_for_a_write_probe_that_fails(tmp_path, local_users):
    """Alice's target is immutable: her write probe fails (EPERM), the target is unhealthy.
    Saves reported as landed there, one every 0.1 s for three probe intervals (from root,
    whom admission always believes), kept it reading ok and skipped the probe. A landed
    save stands for the probe only while the probe passes: it runs, and the target stays
    unhealthy."""
    share(tmp_path)
    alice = local_users.user()
    target = _made(tmp_path / "alice-ckpt", alice, alice.gid, 0o755)
    with _immutable(target), start_daemon(tmp_path, target, defaults=PROBING_DAEMON) as daemon:
        path = str(target)
        daemon.wait_for_value("fsprobe_health_status", 2.0, path=path)
        failed = daemon.value("fsprobe_probe_errors_total", path=path, probe="write", errno="EPERM")
        assert failed and failed >= 1
        landed = str(target / "step.pt")
        until = time.monotonic() + 6.0  # three write intervals of 2 s
        while time.monotonic() < until:
            event = SaveEvent(landed, landed, 4096, 0.1, 1, (), time.time(), "h", 1)
            assert send(event.encode(), str(daemon.state_dir))
            assert daemon.value("fsprobe_health_status", path=path) == 2.0
            time.sleep(0.1)
        assert daemon.value("fsprobe_saves_total", path=path, outcome="ok") >= 30
        assert daemon.value("fsprobe_probe_skipped_total", path=path, probe="write") in (None, 0)
        again = daemon.value("fsprobe_probe_errors_total", path=path, probe="write", errno="EPERM")
        assert again > failed  # the probe ran meanwhile, and still fails


HOSTILE = """
import json, socket, sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, target = sys.argv[1], sys.argv[2]
huge = SaveEvent(target + "/huge.pt", target + "/huge.pt", 1, 0.1, 1, (), time.time(), "h", 1)
document = json.loads(huge.encode())
document["bytes"] = int("9" * 4000)
raw = json.dumps(document).encode()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.sendto(raw, state_dir + "/events.sock")
requested = target + "/\\u202egp.exe\\u2028forged line.pt"
host = "node1\\r\\x1b[2Kforged ts=0 level=info event=ok\\x9b31m"
failed = (Failure("EIO", "write"),)
print(send(SaveEvent(requested, None, 0, 0.1, 1, failed, time.time(), host, 1).encode(), state_dir))
"""
RAW = ("\x1b", "\r", "\u202e", "\u2028", "\x9b")


def test_hostile_fields_reach_no_reader_raw(tmp_path, local_users):
    """Into her own target, Mallory sends `bytes` of 4,000 digits (fsprobe status exited 1
    with OverflowError for root and every user), then a save whose host rewrites the admin's
    terminal line (``\\r\\x1b[2K``) and whose path holds U+202E and U+2028: the first is
    malformed and dropped, the second is counted and every reader (the daemon's log, `status`
    text and JSON) shows it escaped."""
    share(tmp_path)
    mallory = local_users.user()
    target = _made(tmp_path / "mallory-ckpt", mallory, mallory.gid, 0o700)
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        done = mallory.python(HOSTILE, str(daemon.state_dir), str(target))
        assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="malformed")
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=str(target), outcome="failed")
        code, text, err = run_fsprobe(
            "status", "--state-dir", str(daemon.state_dir), env=clean_environment(NO_COLOR="1")
        )
        assert code == 1 and "Traceback" not in err, err  # degraded: the EIO, in the target
        log = daemon.log()
        for reader, said in (("status", text + err), ("log", log)):
            assert not [c for c in RAW if c in said], (reader, said)
        assert "\\u202egp.exe\\u2028forged line.pt" in text
        (line,) = [line for line in log.splitlines() if "event=save " in line]
        assert '"node1\\r\\x1b[2Kforged ts=0 level=info event=ok\\u009b31m"' in line


def test_a_hung_mount_holds_only_its_own_events_and_never_the_receiver(
    tmp_path, faultfs, local_users
):
    """Admission asks the kernel, and the kernel waits on a hung mount: the check of Alice's
    target on it hangs, her event there is refused as unverified after the check's deadline,
    while her saves into her other target are counted as they come; once the mount is back,
    the check answers and her saves there count again."""
    share(tmp_path)
    share(faultfs.mountpoint)
    alice = local_users.user()
    hung = _made(faultfs.mountpoint / "ckpt", alice, alice.gid, 0o755)
    fine = _made(tmp_path / "ckpt", alice, alice.gid, 0o755)
    with start_daemon(tmp_path, hung, fine) as daemon:
        _open_to_users(daemon)
        rule = faultfs.ctl.block("getattr", path="/ckpt")
        try:
            _forge(alice, daemon, hung / "model.pt", "ok")
            for n in range(1, 4):  # her other target's saves are counted meanwhile
                _forge(alice, daemon, fine / "model.pt", "ok")
                daemon.wait_for_value("fsprobe_saves_total", float(n), path=str(fine), outcome="ok")
            daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="unverified")
            assert daemon.value("fsprobe_saves_total", path=str(hung), outcome="ok") == 0.0
        finally:
            faultfs.ctl.remove(rule)
        deadline = time.monotonic() + 60
        while not daemon.value("fsprobe_saves_total", path=str(hung), outcome="ok"):
            _forge(alice, daemon, hung / "model.pt", "ok")  # refused while the check is out
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.5)


def test_a_target_not_made_yet_in_open_scratch_is_nobodys_to_report(tmp_path, local_users):
    """Alice's job will save into /scratch/alice-run, not made yet, in a sticky 1777 scratch
    that everyone may write: admission asked about its nearest existing parent, so Mallory's
    forged EROFS there made the target unhealthy before the job started, and its preflight
    refused to run. No save has landed in a directory that does not exist: refused."""
    share(tmp_path)
    mallory = local_users.user()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.chmod(scratch, 0o1777)
    target = scratch / "alice-run"
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        _forge(mallory, daemon, target / "model.pt", "EROFS")
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="not_permitted")
        assert daemon.value("fsprobe_saves_total", path=str(target), outcome="failed") == 0.0
        assert daemon.value("fsprobe_health_status", path=str(target)) != 2.0


BURST = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import SaveEvent
state_dir, requested, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sent, give_up = 0, time.monotonic() + 60
event = SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), "h", 1).encode()
while sent < count and time.monotonic() < give_up:  # as fast as the kernel's queue takes them
    if send(event, state_dir):
        sent += 1
    else:
        time.sleep(0.001)
print(sent)
"""


def test_a_first_burst_waits_for_its_check_and_loses_nothing(tmp_path, faultfs, local_users):
    """Alice's first saves come in a burst while her admission check is slow (the mount takes
    a second per lookup): the events wait for it, all of them (16 waited, the rest of a burst
    was refused as unverified)."""
    share(tmp_path)
    share(faultfs.mountpoint)
    alice = local_users.user()
    target = _made(faultfs.mountpoint / "ckpt", alice, alice.gid, 0o755)
    with start_daemon(tmp_path, target) as daemon:
        _open_to_users(daemon)
        rule = faultfs.ctl.delay("getattr", 1.0, path="/ckpt")
        try:
            done = alice.python(BURST, str(daemon.state_dir), str(target / "m.pt"), "40")
            assert (done.returncode, done.stdout.strip()) == (0, "40"), done.stderr
            daemon.wait_for_value("fsprobe_saves_total", 40.0, path=str(target), outcome="ok")
        finally:
            faultfs.ctl.remove(rule)
        assert daemon.value("fsprobe_save_events_dropped_total", reason="unverified") is None
