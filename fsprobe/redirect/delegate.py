"""Root acting for a user: run ``fsprobe`` as that user, never act on her files as root.

Why each bound of the run: docs/security.md, "`fsprobe sync` and the daemon's sync-back".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fsprobe.posix import children
from fsprobe.posix.limits import login_limits, lower_to

#: More than any report of a real run; a run that says more is killed and disbelieved.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024
#: The environment a run as a user gets from root's: where tools are, the language, fsprobe's.
_PASSED = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_NOT_PASSED = ("FSPROBE_STATE_DIR", "FSPROBE_FALLBACK_DIRS")
#: How long a killed run is waited for (one stuck in the kernel cannot die yet).
_REAP_SECONDS = 5.0
#: How often a run is checked for having been stopped while root waits for its report.
_STOP_CHECK_SECONDS = 0.5
#: From <linux/prctl.h>.
_PR_SET_DUMPABLE = 4
#: What the run executes: as root, it imports fsprobe from root's own installation and becomes
#: the user (`become`); only then does it run ``fsprobe ARGUMENTS``, as ``python -m`` would.
_BOOTSTRAP = (
    "import sys; from fsprobe.redirect.delegate import become, refuse_if_unusable; "
    "from fsprobe.probing.threads import probe_in_threads; probe_in_threads(); "
    "become(int(sys.argv[1]), int(sys.argv[2]), [int(g) for g in sys.argv[3].split(',') if g]); "
    "refuse_if_unusable(int(sys.argv[1])); "
    "import runpy; sys.argv[:4] = ['fsprobe']; runpy.run_module('fsprobe', run_name='__main__')"
)
#: The key of the one object a run prints when its user cannot run root's installation.
_CANNOT_RUN = "cannot_run"
_ADVICE = "install fsprobe where its users can run it"


class DelegationFailed(Exception):
    """The run as the user could not be made, did not finish in time, or said nonsense."""


class DelegationTimedOut(DelegationFailed):
    """The run as the user overran its deadline (it was killed with its process group)."""


def _environment(environ: Mapping[str, str]) -> dict[str, str]:
    kept = {
        name: value
        for name, value in environ.items()
        if name in _PASSED or (name.startswith("FSPROBE_") and name not in _NOT_PASSED)
    }
    kept.setdefault("PATH", os.defpath)
    return kept


def _stopped(process: subprocess.Popen) -> bool:
    """Whether the run is stopped by a signal (its state is left to be reported again)."""
    try:
        flags = os.WSTOPPED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, process.pid, flags) is not None
    except ChildProcessError:
        return False


def _read_report(process: subprocess.Popen, deadline: float, cap: int) -> bytes:
    """What the run prints until it closes its stdout; `DelegationFailed` if it overruns the
    deadline, prints more than `cap` bytes or is found stopped meanwhile."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    output = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DelegationTimedOut("did not finish in time")
        if _stopped(process):
            raise DelegationFailed("was stopped by a signal (not by fsprobe); not waiting for it")
        if not select.select([fd], [], [], min(left, _STOP_CHECK_SECONDS))[0]:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return bytes(output)
        output += chunk
        if len(output) > cap:
            raise DelegationFailed(f"printed more than {cap} bytes")


def become(uid: int, gid: int, groups: Sequence[int]) -> None:
    """Give up root for good and become `uid` (run in the started process, see the module).

    Every ID is set, real, effective and saved alike, and checked, so that nothing can ever
    switch back; the process is then marked not dumpable once more (the kernel did so when
    the IDs changed, unless ``fs.suid_dumpable`` says otherwise).
    """
    lower_to(login_limits(pwd.getpwuid(uid).pw_name, [gid, *groups]))
    os.setgroups(list(groups))
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise PermissionError(f"could not become uid {uid} and gid {gid} for good")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_DUMPABLE): {os.strerror(code)}")


def unusable_for_user(uid: int) -> str | None:
    """Why uid `uid`, which this process has become, cannot run root's fsprobe (None: it can).

    Root's interpreter started as root, but everything imported from now on is read as the
    user: an installation under a private home (a venv or pyenv in ``/root``, mode 0700)
    failed at its next import, printed nothing root could read, and root's sync reported
    "nothing to sync" and exited 0. Asked with `os.access`, so as the kernel will answer the
    user (ACLs included), before anything else is imported or done.
    """
    if not os.access(sys.executable, os.X_OK):
        return f"the interpreter {sys.executable} is not executable by uid {uid}: {_ADVICE}"
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for directory in (os.path.dirname(os.path.abspath(os.__file__)), package):
        if not os.access(directory, os.R_OK | os.X_OK):
            return f"{directory} (of {sys.executable}) is not readable by uid {uid}: {_ADVICE}"
    return None


def refuse_if_unusable(uid: int) -> None:
    """In the run, right after `become`: say why the user cannot run fsprobe, and exit."""
    problem = unusable_for_user(uid)
    if problem is not None:
        sys.stdout.write(json.dumps({_CANNOT_RUN: problem}))  # json was imported as root
        sys.stdout.flush()
        os._exit(0)


def _start(uid: int, gid: int, groups: list[int], arguments: Sequence[str]) -> subprocess.Popen:
    # Started as a known child: the probe worker, where the daemon's sync task runs, kills
    # every child it did not start itself whenever an `lfs` run ends (what lfs left behind).
    identity = [str(uid), str(gid), ",".join(map(str, groups))]
    return children.start(
        [sys.executable, "-I", "-c", _BOOTSTRAP, *identity, *arguments],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env=_environment(os.environ),
        umask=0o022,
        start_new_session=True,
        close_fds=True,
    )


def run_as(uid: int, arguments: Sequence[str], timeout: float) -> dict[str, Any]:
    """``fsprobe ARGUMENTS`` as user `uid`; the JSON object it prints on stdout.

    Raises `DelegationFailed` if `uid` has no account (its groups cannot be known), the run
    overran `timeout` or was stopped by a signal (it is killed, with whatever it started in
    its session), printed more than `MAX_OUTPUT_BYTES`, or printed something that is not one
    JSON object.
    """
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        raise DelegationFailed(f"uid {uid} has no account here; not acting for it") from None
    groups = os.getgrouplist(account.pw_name, account.pw_gid)
    try:
        process = _start(uid, account.pw_gid, groups, arguments)
    except OSError as error:
        raise DelegationFailed(f"cannot start fsprobe as uid {uid}: {error}") from None
    try:
        with process.stdout:  # type: ignore[union-attr]
            output = _read_report(process, time.monotonic() + timeout, MAX_OUTPUT_BYTES)
    except DelegationFailed as failure:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # its own session's group, nobody else's
        raise type(failure)(f"fsprobe as uid {uid} {failure}") from None
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_REAP_SECONDS)  # a run stuck in the kernel is left to the reaper
        children.finish(process)
    try:
        document = json.loads(output)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
        raise DelegationFailed(f"fsprobe as uid {uid} did not print JSON: {error}") from None
    if not isinstance(document, dict):
        raise DelegationFailed(f"fsprobe as uid {uid} printed JSON that is not an object")
    if isinstance(document.get(_CANNOT_RUN), str):
        raise DelegationFailed(document[_CANNOT_RUN])
    return document
