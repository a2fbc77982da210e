"""The processes fsprobe starts (`lfs`, runs as a user), and the helpers they leave behind.

Every child is started through `start`; the worker, a child subreaper, kills and reaps every
other child after each run (docs/security.md, "`lfs`").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

#: From <linux/prctl.h>.
PR_SET_CHILD_SUBREAPER = 36

#: How long a killed orphan may take to die before a thread is left to reap it (a process in
#: uninterruptible sleep dies only when the kernel lets go of it).
ORPHAN_GRACE = 1.0
#: Rounds of "kill the orphans, then look again": killing one reparents its own children to us.
ORPHAN_ROUNDS = 8

_lock = threading.Lock()
_running: set[int] = set()
_adopting = False
_ending = False


def adopt_orphans() -> bool:
    """Make this process the reaper of its descendants' orphans; False where Linux refuses."""
    global _adopting
    libc = ctypes.CDLL(None, use_errno=True)
    _adopting = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _adopting


def start(argv: Sequence[str], **popen_arguments: object) -> subprocess.Popen[bytes]:
    """`subprocess.Popen`, with the child known as a run in progress until `finish`.

    OSError (ECANCELED) once `kill_runs` has begun: a run started then would outlive it."""
    with _lock:  # no orphan sweep may see the child before it is known
        if _ending:
            raise OSError(errno.ECANCELED, f"not starting {argv[0]}: the process is ending")
        process: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen_arguments)  # type: ignore[call-overload]
        _running.add(process.pid)
    return process


def finish(process: subprocess.Popen[bytes]) -> None:
    """The run is over and reaped: its pid may be reused from now on."""
    with _lock:
        _running.discard(process.pid)


def kill_runs() -> None:
    """Kill the process group of every run in progress (each is started in a session of its
    own), and wait up to `ORPHAN_GRACE` for each to die, so that what it started outside its
    group is re-parented to us for `reap_orphans`: what the worker does as it exits, so that no
    `lfs` outlives it. No run starts after it (`start`)."""
    global _ending
    with _lock:
        _ending = True
        running = sorted(_running)
    for pid in running:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    until = time.monotonic() + ORPHAN_GRACE
    for pid in running:
        while not _has_exited(pid) and time.monotonic() < until:
            time.sleep(0.01)


def _has_exited(pid: int) -> bool:
    """Whether our child `pid` has exited (its children are then ours), without reaping it:
    the thread that runs it reaps it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


def reap_orphans() -> list[int]:
    """Kill and reap every child that is not a run in progress; returns their pids."""
    if not _adopting:
        return []
    killed: list[int] = []
    for _ in range(ORPHAN_ROUNDS):
        with _lock:
            orphans = _children() - _running
        if not orphans:
            break
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in orphans:
            _reap(pid)
        killed.extend(sorted(orphans))
    return killed


def _children() -> set[int]:
    """The pids whose parent is this process, from /proc (any thread may be the parent)."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 1 and int(fields[1]) == me:
            found.add(int(entry))
    return found


def _reap(pid: int) -> None:
    """Wait for `pid` up to `ORPHAN_GRACE`, then leave the wait to a thread."""
    until = time.monotonic() + ORPHAN_GRACE
    while time.monotonic() < until:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # reaped by a concurrent sweep
        if done:
            return
        time.sleep(0.01)
    threading.Thread(target=_wait_quietly, args=(pid,), name=f"reap-{pid}", daemon=True).start()


def _wait_quietly(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
