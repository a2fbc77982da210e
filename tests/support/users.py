"""Real local users for the trust tests: a hostile neighbour is another uid, not a mock.

fsprobe runs as root in directories that other users can write (team fallback dirs, shared
scratch). The rules that keep those users from turning fsprobe against each other, or root
against them, are tested with real accounts and real permission checks::

    def test_x(local_users, tmp_path):
        share(tmp_path)                          # pytest's basetemp is private (0700)
        team = local_users.group()
        alice, bob = local_users.user(team), local_users.user(team)
        assert alice.run(os.geteuid) == alice.uid           # a forked child that is alice
        subprocess.run([...], **bob.subprocess_kwargs())    # a real process of bob's

Accounts are made with ``useradd --system`` under unique names (``fsp-t<pid>-<n>``, so that a
leftover of a killed run is recognisable) and removed after the test; creating them needs root,
so without root the `local_users` fixture skips, or fails with ``FSPROBE_REQUIRE_MOUNT_TESTS=1``.

Their processes run Python too (a save, ``fsprobe sync``, the probe worker), so they need an
interpreter they may execute: `SharedPython` provides one (see there).
"""

from __future__ import annotations

import contextlib
import grp
import itertools
import os
import pickle
import pwd
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: A prefix of every account and group these tests create (``getent passwd | grep fsp-t``).
PREFIX = "fsp-t"
_counter = itertools.count()


def users_problem() -> str | None:
    """Why this machine cannot give the tests local users, or None."""
    if os.geteuid() != 0:
        return "creating local test users needs root"
    for tool in ("useradd", "userdel", "groupadd", "groupdel"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin")):
            return f"{tool} not found (install the passwd package)"
    return None


class ChildFailed(AssertionError):
    """What the function run as another user raised, with the child's traceback."""


class SharedPython:
    """An interpreter with this checkout and its dependencies that every test user can run.

    Usually that is `sys.executable`. But a Python installed under root's home (a pyenv in
    ``/root``, mode 0700) cannot be executed by anyone else, nor can its ``libpython`` be
    loaded. Then another installation of the same Python version that everyone may run (the
    system's) gets a virtual environment that reaches this environment's site-packages (with
    the editable install of this checkout). Root's processes that start processes of a user
    (``fsprobe sync`` as root) must run on it too: they hand the user their `sys.executable`.
    """

    def __init__(self) -> None:
        self.executable = sys.executable
        self._home: Path | None = None
        if not self._runs_for_others(sys.executable):
            self.executable = self._share()

    @staticmethod
    def _runs_for_others(executable: str) -> bool:
        nobody = {"user": 65534, "group": 65534, "extra_groups": []}
        check = f"import sys, fsprobe; assert sys.version_info[:2] == {sys.version_info[:2]!r}"
        try:
            done = subprocess.run(
                [executable, "-I", "-c", check], capture_output=True, check=False, **nobody
            )
        except PermissionError:  # cannot even be executed
            return False
        return done.returncode == 0

    def _share(self) -> str:
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        self._home = Path(tempfile.mkdtemp(prefix="fsprobe-python-"))
        self._home.chmod(0o755)
        site_packages = self._home / "lib" / version / "site-packages"
        site_packages.mkdir(parents=True)
        reach = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
        (site_packages / "fsprobe-tests.pth").write_text(reach)
        (self._home / "bin").mkdir()
        for directory in ("/usr/bin", "/usr/local/bin"):
            base = Path(directory, version)
            if not base.exists():
                continue
            (self._home / "pyvenv.cfg").write_text(f"home = {directory}\n")
            executable = self._home / "bin" / "python"
            executable.unlink(missing_ok=True)
            executable.symlink_to(base)
            if self._runs_for_others(str(executable)):
                return str(executable)
        self.close()
        raise RuntimeError(
            f"{sys.executable} cannot be run by other users, and no {version} that they can "
            "run was found in /usr/bin or /usr/local/bin"
        )

    def close(self) -> None:
        if self._home is not None:
            shutil.rmtree(self._home)
            self._home = None


@dataclass(frozen=True)
class LocalUser:
    """A real account: its own uid, its own primary group, maybe a shared team group."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    python_executable: str = sys.executable

    def subprocess_kwargs(self) -> dict[str, Any]:
        """`subprocess` arguments that run a command as this user, in a session of its own."""
        return {
            "user": self.uid,
            "group": self.gid,
            "extra_groups": list(self.groups),
            "start_new_session": True,
        }

    def python(
        self, code: str, *args: str, timeout: float = 120.0, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -c CODE ARGS`` as this user, from the repository: a real process of theirs.

        Use it for anything that starts processes of its own (a save's probe worker): a forked
        child shares the test process's state, a fresh process shares nothing.
        """
        return subprocess.run(
            [self.python_executable, "-c", code, *args],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **self.subprocess_kwargs(),
        )

    def run(self, function: Callable[..., Any], *args: Any, timeout: float = 60.0) -> Any:
        """`function(*args)` in a forked child that dropped root for this user; its result.

        What the child raises is raised here as `ChildFailed` with the child's traceback. A
        child still running after `timeout` is killed and TimeoutError raised: a test about a
        hang must not hang the suite.
        """
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            os.close(read_end)
            try:
                os.setgroups(list(self.groups))
                os.setgid(self.gid)
                os.setuid(self.uid)
                payload = pickle.dumps(("ok", function(*args)))
            except BaseException:  # everything goes back to the parent
                payload = pickle.dumps(("error", traceback.format_exc()))
            with contextlib.suppress(OSError):
                view = memoryview(payload)
                while view:
                    view = view[os.write(write_end, view) :]
            os._exit(0)
        os.close(write_end)
        try:
            payload = _read_all(read_end, pid, timeout)
        finally:
            os.close(read_end)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        kind, value = pickle.loads(payload)
        if kind == "error":
            raise ChildFailed(f"as {self.name} (uid {self.uid}):\n{value}")
        return value


def _read_all(fd: int, pid: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            raise TimeoutError(f"the child {pid} did not finish within {timeout} s; killed")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _run_admin(*command: str) -> None:
    """Run useradd & co; they take a lock on /etc/passwd that a parallel run may hold."""
    for attempt in range(20):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr or attempt == 19:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
        time.sleep(0.1)


@dataclass
class LocalUsers:
    """Makes accounts and groups on demand; `remove` deletes every one of them."""

    python: str = sys.executable  # the interpreter their processes run (`SharedPython`)
    users: list[LocalUser] = field(default_factory=list)
    group_names: list[str] = field(default_factory=list)

    def _name(self) -> str:
        return f"{PREFIX}{os.getpid()}-{next(_counter)}"

    def group(self) -> int:
        """A new group (a team); returns its gid."""
        name = self._name()
        _run_admin("groupadd", "--system", name)
        self.group_names.append(name)
        return grp.getgrnam(name).gr_gid

    def user(self, *groups: int) -> LocalUser:
        """A new account with its own primary group, also a member of `groups`."""
        name = self._name()
        command = ["useradd", "--system", "--no-create-home", "--user-group"]
        command += ["--shell", "/usr/sbin/nologin", "--home-dir", "/nonexistent"]
        if groups:
            command += ["--groups", ",".join(str(g) for g in groups)]
        _run_admin(*command, name)
        entry = pwd.getpwnam(name)
        user = LocalUser(name, entry.pw_uid, entry.pw_gid, tuple(groups), self.python)
        self.users.append(user)
        return user

    def remove(self) -> list[str]:
        """Delete every account and group made here; returns what could not be deleted."""
        problems = []
        for user in reversed(self.users):
            try:
                _run_admin("userdel", user.name)
            except RuntimeError as error:
                problems.append(str(error))
        for name in reversed(self.group_names):
            try:
                _run_admin("groupdel", name)
            except RuntimeError as error:
                problems.append(str(error))
        self.users.clear()
        self.group_names.clear()
        return problems


def share(path: str | os.PathLike[str], stop: str | os.PathLike[str] = "/") -> None:
    """Let every user reach `path` (search permission on it and its parents up to `stop`).

    pytest makes its temporary directories private to the user running the suite; the
    directories a test then creates inside decide what the other users may do there.
    """
    current, stop = Path(path).resolve(), Path(stop).resolve()
    while True:
        mode = current.stat().st_mode
        if not mode & 0o001:
            current.chmod((mode & 0o7777) | 0o011)
        if current == stop or current == current.parent:
            return
        current = current.parent
