"""The owner of a directory against the root thread that probes it as her (issue 18.1, 18.3).

Root's write probe of Alice's directory runs in a thread of root's probe worker whose file
system IDs are hers, and nothing else: its real, effective and saved IDs stay root's. Alice, a
real account, catches that thread in the middle of the probe (its fsync held by the fault
filesystem) and tries what she may do to a process of her own: ptrace it, signal it, read its
memory. Each is refused, and the probe, released, leaves nothing in her directory.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import threading
from pathlib import Path

import psutil

import fsprobe
from fsprobe.quota.settings import ServerProbeSettings
from tests.support.users import LocalUser

PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SEIZE = 16, 17, 0x4206


def _fs_uid(tid: int) -> int | None:
    """The file system uid of thread `tid` (the Uid line's fourth field), None if gone."""
    try:
        with open(f"/proc/{tid}/status") as status:
            for line in status:
                if line.startswith("Uid:"):
                    return int(line.split()[4])
    except OSError:
        return None
    return None


def _attack(pid: int, tids: list[int]) -> dict[str, str]:
    """What Alice gets for each attempt on the worker `pid` and its threads `tids`."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    outcomes: dict[str, str] = {}

    def outcome(result: int) -> str:
        return "done" if result == 0 else errno.errorcode[ctypes.get_errno()]

    for tid in tids:
        for name, request in (("attach", PTRACE_ATTACH), ("seize", PTRACE_SEIZE)):
            got = outcome(libc.ptrace(request, tid, None, None))
            if got == "done":
                libc.ptrace(PTRACE_DETACH, tid, None, None)
            outcomes[f"{name} {tid}"] = got
        try:
            os.kill(tid, signal.SIGSTOP)
            outcomes[f"SIGSTOP {tid}"] = "done"
            os.kill(tid, signal.SIGCONT)
        except OSError as error:
            outcomes[f"SIGSTOP {tid}"] = errno.errorcode[error.errno]
        for part in ("mem", "environ"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{part}", "rb") as opened:
                    opened.read(1)
                outcomes[f"{part} {tid}"] = "done"
            except OSError as error:
                outcomes[f"{part} {tid}"] = errno.errorcode[error.errno]
    return outcomes


def test_the_thread_that_probes_as_her_can_be_neither_traced_nor_signalled_by_her(
    local_users, faultfs
):
    alice: LocalUser = local_users.user()
    home = faultfs.mountpoint / "alice"
    home.mkdir(mode=0o700)
    os.chown(home, alice.uid, alice.gid)
    held = faultfs.ctl.block("fsync")
    check = threading.Thread(
        target=fsprobe.check,
        args=(str(home), fsprobe.ProbeSettings(server_probes=ServerProbeSettings(provider="none"))),
    )
    check.start()
    try:
        faultfs.ctl.wait_blocked(held)
        workers = [p for p in psutil.Process().children(recursive=True) if p.uids().real == 0]
        as_alice = {
            worker.pid: [t.id for t in worker.threads() if _fs_uid(t.id) == alice.uid]
            for worker in workers
        }
        as_alice = {pid: tids for pid, tids in as_alice.items() if tids}
        assert len(as_alice) == 1, f"no root worker thread acting as alice: {as_alice}"
        ((pid, tids),) = as_alice.items()
        every = [t.id for t in psutil.Process(pid).threads()]
        outcomes = alice.run(_attack, pid, every)
    finally:
        faultfs.ctl.remove(held)
        check.join(timeout=60)
    allowed = {k: v for k, v in outcomes.items() if v not in ("EPERM", "EACCES")}
    assert not allowed, allowed
    assert {outcomes[f"attach {tid}"] for tid in tids} == {"EPERM"}
    assert not check.is_alive()
    assert os.listdir(home) == [], "the probe left a file in her directory"
    assert [p.name for p in Path(home).parent.iterdir() if p.name.startswith(".fsprobe")] == []
