"""A hostile local user against root's node daemon's save-event intake (issue 21.1), as a real
account sending real datagrams to the real daemon's socket: whatever she sends, the daemon's
series stay bounded, and she can claim saves only where she could have written, as herself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time

from fsprobe.events.emit import SOCKET_NAME
from tests.events.test_save_events import start_daemon
from tests.support.users import REPO, share

#: Events each carrying `FAILURES` invented errno names: within the sender's burst, so that
#: every one is taken (the rate limit is not what bounds the series).
EVENTS = 40
FAILURES = 16

INVENT = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested = sys.argv[1], sys.argv[2]
events, failures = int(sys.argv[3]), int(sys.argv[4])
sent, give_up = 0, time.monotonic() + 120
for n in range(events):
    invented = tuple(Failure(f"EX{n:03d}{k:02d}", "write") for k in range(failures))
    event = SaveEvent(requested, requested, 1, 0.1, failures + 1, invented, time.time(), "h", 1)
    while time.monotonic() < give_up:  # the kernel queues max_dgram_qlen (10): wait for room
        if send(event.encode(), state_dir):
            sent += 1
            break
        time.sleep(0.01)
print(sent)
"""


def _errno_labels(metrics: dict, name: str, path: str) -> dict[str, float]:
    return {
        dict(labels)["errno"]: value
        for labels, value in metrics.get(name, {}).items()
        if dict(labels).get("path") == path
    }


def test_invented_errno_names_add_no_series(tmp_path, local_users):
    """An errno name is a label value of fsprobe_save_failed_attempts_total. Mallory, saving
    into her own target, made up a new name for each of her 16 failed attempts per event: on
    main every name became a series (80 a second within the rate limit, without end), growing
    the daemon's memory and every scrape. Names the daemon does not know are read as EUNKNOWN:
    counted, never a new series (nor one of fsprobe_probe_errors_total)."""
    share(tmp_path)
    mallory = local_users.user()
    target = tmp_path / "mallory-ckpt"
    target.mkdir(mode=0o700)
    os.chown(target, mallory.uid, mallory.gid)
    with start_daemon(tmp_path, target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        done = mallory.python(
            INVENT, str(daemon.state_dir), str(target / "m.pt"), str(EVENTS), str(FAILURES)
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == EVENTS
        daemon.wait_for_value(
            "fsprobe_saves_total", float(EVENTS), path=str(target), outcome="retried"
        )
        metrics = daemon.metrics()
        saves = _errno_labels(metrics, "fsprobe_save_failed_attempts_total", str(target))
        probes = _errno_labels(metrics, "fsprobe_probe_errors_total", str(target))
        assert saves == {"EUNKNOWN": float(EVENTS * FAILURES)}, sorted(saves)[:5]
        assert not [name for name in probes if name.startswith("EX")], sorted(probes)[:5]


CLAIM = """
import json, sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir = sys.argv[1]
sent = {}
for requested in sys.argv[2:]:
    failed = (Failure("EIO", "write"),)
    event = SaveEvent(requested, None, 0, 0.1, 1, failed, time.time(), "h", 1)
    sent[requested] = send(event.encode(), state_dir)
print(json.dumps(sent))
"""


def test_a_user_cannot_claim_saves_in_another_users_target_by_spelling_the_path(
    tmp_path, local_users
):
    """Bob owns a target beside Alice's. The target an event counts for is found by its
    requested path's text: Bob spells Alice's path through his own directory (``..``), with
    doubled slashes and a trailing ``/.``; every spelling counts for Alice's target, where he
    may not report, none for his own, and Alice's numbers stay untouched."""
    share(tmp_path)
    alice, bob = local_users.user(), local_users.user()
    root = tmp_path / "scratch"
    root.mkdir(mode=0o755)
    alice_target, bob_target = root / "alice", root / "bob"
    for directory, owner in ((alice_target, alice), (bob_target, bob)):
        directory.mkdir(mode=0o755)
        os.chown(directory, owner.uid, owner.gid)
    spellings = [
        f"{bob_target}/../alice/model.pt",
        f"{root}//alice//model.pt",
        f"{alice_target}/./model.pt",
        f"{bob_target}/../../scratch/alice/model.pt",
    ]
    with start_daemon(tmp_path, alice_target, bob_target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        done = bob.python(CLAIM, str(daemon.state_dir), *spellings)
        assert done.returncode == 0, done.stderr
        assert all(json.loads(done.stdout).values()), done.stdout
        daemon.wait_for_value(
            "fsprobe_save_events_dropped_total", float(len(spellings)), reason="not_permitted"
        )
        time.sleep(0.3)  # any event counted after all would show in the same scrape
        metrics = daemon.metrics()
        for target in (alice_target, bob_target):
            counted = {
                dict(labels)["outcome"]: value
                for labels, value in metrics.get("fsprobe_saves_total", {}).items()
                if dict(labels).get("path") == str(target)
            }
            assert not any(counted.values()), (target, counted)
        assert (daemon.state_dir / SOCKET_NAME).stat().st_uid == 0


AS_NAMESPACE_ROOT = """
import json, os, socket, struct, sys, time
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested = sys.argv[1], sys.argv[2]
event = SaveEvent(requested, None, 0, 0.1, 1, (Failure("EIO", "write"),), time.time(), "h", 1)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
creds = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", os.getpid(), 0, 0))]
sock.sendmsg([event.encode()], creds, 0, f"{state_dir}/{sys.argv[3]}")
print(json.dumps({"uid": os.getuid(), "sent": True}))
"""


def test_root_of_her_own_user_namespace_is_not_root_to_the_daemon(tmp_path, local_users):
    """Mallory makes a user namespace (``unshare -Ur``, allowed to any user here) in which she
    is uid 0, and claims uid 0 in the credentials of her datagram, which the kernel lets the
    namespace's root do. Root may report anywhere; the kernel hands the daemon her own uid,
    so her failed save in root's directory is refused and counted nowhere."""
    share(tmp_path)
    mallory = local_users.user()
    target = tmp_path / "roots"
    target.mkdir(mode=0o755)
    with start_daemon(tmp_path, target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        command = [
            "unshare",
            "--user",
            "--map-root-user",
            mallory.python_executable,
            "-c",
            AS_NAMESPACE_ROOT,
            str(daemon.state_dir),
            str(target / "model.pt"),
            SOCKET_NAME,
        ]
        done = subprocess.run(
            command,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            **mallory.subprocess_kwargs(),
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"uid": 0, "sent": True}  # root, in her namespace
        daemon.wait_for_value("fsprobe_save_events_dropped_total", 1.0, reason="not_permitted")
        assert not daemon.value("fsprobe_saves_total", path=str(target), outcome="failed")
        assert daemon.value("fsprobe_save_failed_attempts_total", path=str(target)) in (None, 0.0)


#: Mallory's flood: a connected, blocking sender keeps the shared socket's kernel queue full
#: (`net.unix.max_dgram_qlen` datagrams, shared by every sender) for `seconds`, at most
#: `FLOOD_MAX` datagrams; the daemon rate-limits her, but only after taking each from the queue.
FLOOD = """
import socket, sys, time
from fsprobe.events.event import SaveEvent
state_dir, requested, seconds, most = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
data = SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), "h", 1).encode()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.settimeout(0.1)
sock.connect(state_dir + "/events.sock")
sent, deadline = 0, time.monotonic() + seconds
while sent < most and time.monotonic() < deadline:
    try:
        sock.send(data)
        sent += 1
    except OSError:
        pass
print(sent)
"""
#: The flood lasts until the test ends it: these only bound it if the test cannot.
FLOOD_SECONDS = 600.0
FLOOD_MAX = 10**9

#: Alice's trainer: for each number read, that many saves a few tens of milliseconds apart,
#: each reporting once, as a real save does (one non-blocking send, never retried); it prints
#: how many were sent.
SAVES = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import SaveEvent
state_dir, requested = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    sent = 0
    for _ in range(int(line)):
        event = SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), "h", 1)
        sent += send(event.encode(), state_dir)
        time.sleep(0.03)
    print(sent, flush=True)
"""
ALICE_SAVES = 40
#: Saves Alice makes before she waits for the daemon to have counted them: fewer than the
#: kernel queues (max_dgram_qlen, 10), so her own saves never fill her queue, however slowly
#: a loaded machine lets the daemon read it; only someone else's datagrams could.
ALICE_BATCH = 5


def _owned_target(parent, name: str, user) -> str:
    directory = parent / name
    directory.mkdir(mode=0o700)
    os.chown(directory, user.uid, user.gid)
    return str(directory)


def test_a_flood_of_the_shared_socket_loses_none_of_another_users_events(tmp_path, local_users):
    """The kernel queues `net.unix.max_dgram_qlen` datagrams per socket, shared by every sender:
    Mallory keeping ``events.sock`` full (rate-limited by the daemon, but only after the queue)
    made Alice's sends find it full, and her saves went uncounted (16-34 of 40 on main). The
    daemon listens on a socket of her own, ``events-<uid>.sock`` (hers and root's only), which
    her trainer tries first: every one of her saves is counted while Mallory floods."""
    share(tmp_path)
    alice, mallory = local_users.user(), local_users.user()
    alice_target = _owned_target(tmp_path, "alice-ckpt", alice)
    mallory_target = _owned_target(tmp_path, "mallory-ckpt", mallory)
    with start_daemon(tmp_path, alice_target, mallory_target) as daemon:  # and their sockets
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        flood = subprocess.Popen(
            [mallory.python_executable, "-c", FLOOD, str(daemon.state_dir),
             f"{mallory_target}/x.pt", str(FLOOD_SECONDS), str(FLOOD_MAX)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            **mallory.subprocess_kwargs(),
        )  # fmt: skip
        trainer = subprocess.Popen(
            [alice.python_executable, "-c", SAVES, str(daemon.state_dir), f"{alice_target}/a.pt"],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, **alice.subprocess_kwargs(),
        )  # fmt: skip
        sent, counted = 0, None
        try:
            daemon.wait_for_present("fsprobe_save_events_dropped_total")  # past her burst
            for _ in range(ALICE_SAVES // ALICE_BATCH):
                assert trainer.stdin is not None and trainer.stdout is not None
                trainer.stdin.write(f"{ALICE_BATCH}\n")
                trainer.stdin.flush()
                sent += int(trainer.stdout.readline())
                deadline = time.monotonic() + 60
                counted = daemon.value("fsprobe_saves_total", path=alice_target, outcome="ok")
                while counted != sent and time.monotonic() < deadline:
                    time.sleep(0.05)
                    counted = daemon.value("fsprobe_saves_total", path=alice_target, outcome="ok")
            still_flooding = flood.poll() is None
        finally:
            flood.kill()
            out, err = flood.communicate(timeout=30)
            _, trainer_err = trainer.communicate(timeout=60)  # the end of her input: she stops
        assert trainer.returncode == 0, trainer_err
        assert still_flooding, f"the flood ended before Alice's saves: {out} {err}"
        limited = daemon.value("fsprobe_save_events_dropped_total", reason="rate_limited")
        assert limited and limited > 0
        assert (sent, counted) == (ALICE_SAVES, ALICE_SAVES), (
            f"of {ALICE_SAVES} saves {sent} sent, {counted} counted; "
            f"{limited} of Mallory's rate-limited"
        )


MALLORY_SENDS_TO = """
import json, socket, sys
target = sys.argv[1]
found = {}
for how in ("sendto", "connect"):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    try:
        if how == "sendto":
            sock.sendto(b"{}", target)
        else:
            sock.connect(target)
        found[how] = "sent"
    except OSError as error:
        found[how] = error.__class__.__name__
print(json.dumps(found))
"""


def test_another_user_cannot_send_to_a_users_own_socket(tmp_path, local_users):
    """Alice's socket is hers: mode 0600, owned by her, in root's state dir; Mallory's sendto
    and connect are refused by the kernel (EACCES), so she can neither fill its queue nor hold
    a connection to it."""
    share(tmp_path)
    alice, mallory = local_users.user(), local_users.user()
    alice_target = _owned_target(tmp_path, "alice-ckpt", alice)
    with start_daemon(tmp_path, alice_target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        own_socket = daemon.state_dir / f"events-{alice.uid}.sock"  # start_daemon saw it made
        info = own_socket.lstat()
        assert (stat.S_ISSOCK(info.st_mode), info.st_uid, stat.S_IMODE(info.st_mode)) == (
            True,
            alice.uid,
            0o600,
        )
        refused = {"sendto": "PermissionError", "connect": "PermissionError"}
        done = mallory.python(MALLORY_SENDS_TO, str(own_socket))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == refused
        done = alice.python(MALLORY_SENDS_TO, str(own_socket))
        assert json.loads(done.stdout) == {"sendto": "sent", "connect": "sent"}
