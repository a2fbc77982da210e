"""A daemon in a pid namespace of its own, as under the DaemonSet without hostPID (issue 35):
the kernel gives it pid 0 for every sender (SCM_CREDENTIALS names a pid only where the
receiver can see it), and /proc shows none of their processes. Real accounts on the host send;
the daemon runs in ``unshare --pid --fork --mount-proc``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.events.test_save_events import QUIET_DAEMON, daemon_config
from tests.support.capability import need_command
from tests.support.daemon_process import REPO_ROOT, DaemonProcess
from tests.support.users import share

pytestmark = pytest.mark.slow  # a daemon and real accounts: the full run only

#: As its user: argv[3] saves into argv[2] a fifth of a second apart (claiming host argv[4]
#: and pid argv[5], its own if "-"), then "sent", then (argv[6]) hang, or a goodbye and exit.
SENDER = """
import os, signal, socket, sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Goodbye, SaveEvent
state_dir, requested, count, host, pid, then = sys.argv[1:7]
pid = os.getpid() if pid == "-" else int(pid)
host = socket.gethostname() if host == "-" else host
for _ in range(int(count)):
    assert send(SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), host, pid).encode(),
                state_dir)
    time.sleep(0.2)
print("sent", socket.gethostname(), os.getpid(), flush=True)
if then == "hang":
    os.kill(os.getpid(), signal.SIGSTOP)
else:
    assert send(Goodbye(host, pid).encode(), state_dir)
"""


def _in_own_pid_namespace(home: Path, target: Path) -> DaemonProcess:
    """Root's daemon watching `target` from a pid namespace of its own (its /proc too)."""
    need_command("unshare", "util-linux")
    config = daemon_config(home.parent / "fsprobe.toml", target, defaults=QUIET_DAEMON)
    return DaemonProcess(
        home,
        "--config",
        str(config),
        python="unshare",
        program=(
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGTERM",
            sys.executable,
            "-m",
            "fsprobe",
        ),
    )


def _send(user, state_dir: Path, requested: Path, *claim: str) -> tuple[subprocess.Popen, str, str]:
    """`SENDER` as `user`, a real process of hers on the host, once it has sent: the process,
    its host name and its pid (as the host sees it)."""
    process = subprocess.Popen(
        [user.python_executable, "-c", SENDER, str(state_dir), str(requested), *claim],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **user.subprocess_kwargs(),
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    assert line.startswith("sent "), process.stderr.read()
    _, host, pid = line.split()
    return process, host, pid


def test_a_sender_the_daemon_cannot_see_keeps_its_promises(tmp_path, local_users):
    """Alice writes the team's target through her team group only (Olga owns it, 2770), from
    the host; the daemon sees pid 0 and no /proc of hers:

    - her events are admitted: her groups come from her account (/proc/0/status has none; they
      were all refused as not_permitted);
    - Mallory, in the team, claims Alice's host and pid with a save and a goodbye: Alice's hung
      trainer is still expected (one goodbye ended it, and her overdue alert with it);
    - Alice's trainer is killed: after 10 of its save intervals of silence it is no longer
      expected (it stayed a live saver until the daemon restarted)."""
    share(tmp_path)
    team = local_users.group()
    olga, alice, mallory = local_users.user(), local_users.user(team), local_users.user(team)
    target = tmp_path / "team-ckpt"
    target.mkdir()
    os.chown(target, olga.uid, team)
    os.chmod(target, 0o2770)
    home = tmp_path / "daemon"
    home.mkdir(mode=0o755)
    path = str(target)
    with _in_own_pid_namespace(home, target).start() as daemon:
        os.chmod(daemon.state_dir, 0o755)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=path)
        hung, host, pid = _send(alice, daemon.state_dir, target / "a.pt", "4", "-", "-", "hang")
        try:
            daemon.wait_for_value("fsprobe_saves_total", 4.0, path=path, outcome="ok")
            daemon.wait_for_value("fsprobe_savers", 1.0, path=path)
            interval = daemon.value("fsprobe_save_interval_seconds", path=path)
            assert interval is not None and interval < 1.0
            assert daemon.value("fsprobe_save_events_dropped_total", reason="not_permitted") in (
                None,
                0.0,
            )
            claim, _, _ = _send(mallory, daemon.state_dir, target / "m.pt", "1", host, pid, "bye")
            assert claim.wait(60) == 0
            daemon.wait_for_value("fsprobe_saves_total", 5.0, path=path, outcome="ok")
            deadline = time.monotonic() + 60  # her claim came and went: Alice's stays
            while "saver_left" not in daemon.log():
                assert time.monotonic() < deadline, daemon.log()
                time.sleep(0.05)
            assert daemon.value("fsprobe_savers", path=path) == 1.0
            assert daemon.value("fsprobe_save_interval_seconds", path=path) is not None
        finally:
            hung.send_signal(signal.SIGKILL)
            hung.wait()
        daemon.wait_for_value("fsprobe_savers", 0.0, path=path, timeout=60)
        assert daemon.value("fsprobe_save_interval_seconds", path=path) is None
