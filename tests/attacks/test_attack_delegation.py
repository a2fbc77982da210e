"""Root acting for users (`fsprobe.redirect.delegate`), attacked and as bad luck would have it.

Root's sync (`fsprobe sync` as root, the root daemon's sync task) acts on a user's fallback area
only through ``fsprobe sync`` run as that user. These tests attack that run from both sides:
from the daemon it lives in (its probe worker kills the children it does not know), and from
the user it runs as (a process of theirs that they may signal, trace and inspect), with real
accounts, a real daemon and real processes.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import resource
import subprocess
import sysconfig
import time
from pathlib import Path

import psutil
import pytest

from fsprobe.posix import limits
from tests.deploy.test_deploy_systemd import UNIT, _directives
from tests.redirect.test_trust_fallback import make_dir, save_as, syncing_daemon
from tests.support.capability import need_command
from tests.support.users import REPO, share


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A directory every test user can reach; what is made inside decides what they may do."""
    share(tmp_path)
    return tmp_path


def test_a_users_sync_back_is_not_killed_by_the_lfs_runs_beside_it(local_users, place):
    """The probe worker reaps what an `lfs` leaves behind: every child it did not start as an
    lfs run. The sync task's run as the user is a child of the worker too, and was killed at
    the end of every quota probe of any target (the checkpoint never went back)."""
    alice = local_users.user()
    fallback = make_dir(place / "fallback", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Alice's save is refused and redirected
    result = save_as(alice, target / "model.pt", "alice's weights", fallback)
    assert result["redirected"], result
    os.chown(target, alice.uid, -1)  # now it can take the checkpoint back
    lfs_runs = place / "lfs-runs"
    lfs_runs.touch(mode=0o666)  # `lfs quota` of Alice's directory runs as Alice
    lfs_runs.chmod(0o666)
    lfs = place / "lfs"
    # Each `lfs` waits (up to 10 s) for Alice's sync run and ends while it runs: "during".
    lfs.write_text(
        f"#!/bin/sh\nfor i in $(seq 100); do\n"
        f"  if pgrep -u {alice.uid} -f 'sync.*--json' >/dev/null; then\n"
        f"    echo during >> {lfs_runs}; exit 0\n  fi\n  sleep 0.1\ndone\n"
        f"echo run >> {lfs_runs}\n"
    )
    lfs.chmod(0o755)
    daemon = syncing_daemon(
        place, target, fallback, local_users.python,
        defaults=f'quota_probe = "always"\nquota_provider = "lfs"\nlfs = "{lfs}"\n'
        "quota_interval = 0.1\n",
        more=f"user = {alice.uid}\n",
    )  # fmt: skip
    with daemon:
        deadline = time.monotonic() + 60
        while not (target / "model.pt").exists():
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        line = daemon.wait_for_log("event=sync ")
    # The fake lfs runs that still wait for a sync end by themselves (10 s at most).
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-u", str(alice.uid)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a fake lfs of Alice's outlived its 10 s"
        time.sleep(0.1)
    assert "action=synced" in line, daemon.log()
    assert (target / "model.pt").read_text() == "alice's weights"
    assert "during" in lfs_runs.read_text().split()  # an lfs ended while the sync ran
    assert "could not sync" not in daemon.log()


#: Mallory, waiting for root's run of `fsprobe sync` as her: she finds it in /proc (its
#: command line is public), then does what argv[1] says to it and prints what came of it.
MEDDLE = r"""
import ctypes, json, os, signal, sys, time
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000
action = sys.argv[1]
deadline = time.monotonic() + 90
found = None
while found is None and time.monotonic() < deadline:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
            owner = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        mine = owner == os.getuid() and int(pid) != os.getpid()
        if mine and b"sync" in argv and b"--json" in argv:
            found = int(pid)
            break
result = {"found": found is not None}
if found is not None and action == "trace":
    # Her own process: if it lets her trace it, she can make it write anything to the pipe
    # root reads as its report, and run anything of hers inside root's service.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long] * 4
    if libc.ptrace(PTRACE_ATTACH, found, 0, 0) == 0:
        os.waitpid(found, WALL)
        libc.ptrace(PTRACE_DETACH, found, 0, 0)
        result["traced"] = True
    else:
        result["traced"] = False
        result["error"] = os.strerror(ctypes.get_errno())
    try:
        with open(f"/proc/{found}/environ", "rb") as environ:
            result["environ"] = environ.read().decode(errors="replace")
    except OSError as error:
        result["environ_error"] = error.strerror
elif found is not None and action == "stop":
    os.kill(found, signal.SIGSTOP)  # and never continue it
    result["stopped"] = True
print(json.dumps(result))
"""


def _two_pending_users(local_users, place) -> tuple:
    """Mallory and Bob, each with a checkpoint redirected to one scratch fallback, and their
    targets ready to take them back. Mallory's uid is the lower: root syncs her first."""
    mallory, bob = sorted((local_users.user(), local_users.user()), key=lambda user: user.uid)
    scratch = make_dir(place / "scratch", 0o1777)
    targets = {}
    for user in (mallory, bob):
        targets[user] = make_dir(place / f"{user.name}-ckpt", 0o755)
        assert save_as(user, targets[user] / "model.pt", f"{user.name}'s", scratch)["redirected"]
        os.chown(targets[user], user.uid, -1)
    return mallory, bob, scratch, targets


def _meddle_beside_roots_sync(local_users, mallory, scratch: Path, action: str):
    """Root's `fsprobe sync` of the scratch fallback while Mallory meddles with her run."""
    meddler = subprocess.Popen(
        [local_users.python, "-c", MEDDLE, action],
        stdout=subprocess.PIPE,
        text=True,
        **mallory.subprocess_kwargs(),
    )
    try:
        time.sleep(0.5)  # she is watching /proc
        started = time.monotonic()
        done = subprocess.run(
            [local_users.python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(scratch)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,  # the run as Mallory may take an hour: killed at its deadline (3600 s)
            check=False,
        )
        took = time.monotonic() - started
        meddled = json.loads(meddler.communicate(timeout=120)[0])
    finally:
        meddler.kill()
        meddler.wait()
        for process in psutil.process_iter(["uids"]):  # a run she stopped, left behind
            if process.info["uids"] and process.info["uids"].real == mallory.uid:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
    return done, took, meddled


def test_a_user_can_neither_trace_her_run_nor_read_what_root_gave_it(
    local_users, place, monkeypatch
):
    """The run as Mallory was Mallory's own process (it became her before exec): she could
    trace it (and so write whatever she liked into the pipe root reads its report from, and
    run code of hers inside root's service), and read the environment root gave it."""
    mallory, bob, scratch, targets = _two_pending_users(local_users, place)
    monkeypatch.setenv("FSPROBE_SECRET_OF_ROOTS", "root-only")  # passed on to the runs
    done, _took, meddled = _meddle_beside_roots_sync(local_users, mallory, scratch, "trace")

    assert meddled["found"], meddled
    assert meddled["traced"] is False, meddled
    assert "environ" not in meddled, meddled
    assert done.returncode in (0, 2), done.stderr  # Mallory's run may have failed, nothing else
    report = json.loads(done.stdout)
    assert [(e["owner"], e["action"]) for e in report["entries"] if e["owner"] == bob.uid] == [
        (bob.uid, "synced")
    ]
    assert (targets[bob] / "model.pt").read_text() == f"{bob.name}'s"


def test_a_run_its_user_stops_is_not_waited_for(local_users, place):
    """A run that Mallory stopped (SIGSTOP, never continued) held root's sync, and with it
    every other user's, until the run's deadline: an hour. Her checkpoint not synced is an
    error of root's sync (exit 2, one line naming her), Bob's went back all the same."""
    mallory, bob, scratch, targets = _two_pending_users(local_users, place)
    done, took, meddled = _meddle_beside_roots_sync(local_users, mallory, scratch, "stop")

    assert meddled == {"found": True, "stopped": True}
    assert took < 60, took
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert [(e["owner"], e["action"]) for e in report["entries"]] == [(bob.uid, "synced")]
    assert (targets[bob] / "model.pt").read_text() == f"{bob.name}'s"
    assert not (targets[mallory] / "model.pt").exists()
    assert "was stopped" in done.stderr
    [failure] = json.loads(done.stdout)["failures"]
    assert failure["uid"] == mallory.uid and failure["fallback"] == str(scratch)
    assert "was stopped" in failure["cause"]


#: Mallory holding the lock of her own manifest (argv[1]), as a save of hers may: her run of
#: root's sync then waits for it at the rewrite, up to the lock's timeout (30 s).
HOLD_LOCK = r"""
import fcntl, sys, time
with open(sys.argv[1], "rb") as manifest:
    fcntl.flock(manifest, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(600)
"""


def _processes_of(uid: int) -> set[int]:
    return {
        process.pid
        for process in psutil.process_iter(["uids"])
        if process.info["uids"] and process.info["uids"].real == uid
    }


def test_a_slow_users_run_costs_at_most_her_share_of_the_round(local_users, place):
    """Each run as a user had an hour (DELEGATE_TIMEOUT) whatever the others needed: a run
    that Mallory makes slow without stopping it (here she holds the lock of her own manifest,
    which her run then waits 30 s for; a directory copy of many files, a slow disk of hers
    would do too) held root's sync, and every user after her, for up to that hour. Now the
    runs share the round (--round-timeout): hers is killed at her share, with its process
    group, and reported as a failure of hers (exit 2); Bob, after her, is synced in the same
    round."""
    mallory, bob, scratch, targets = _two_pending_users(local_users, place)
    manifest = scratch / f"uid-{mallory.uid}" / ".fsprobe-redirects.jsonl"
    holder = subprocess.Popen(
        [local_users.python, "-c", HOLD_LOCK, str(manifest)],
        stdout=subprocess.PIPE,
        text=True,
        **mallory.subprocess_kwargs(),
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        before = _processes_of(mallory.uid)  # hers already (a save's worker still exiting)
        done = subprocess.run(
            [local_users.python, "-m", "fsprobe", "sync", "--json", "--fallback-dir",
             str(scratch), "--round-timeout", "24"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert holder.poll() is None  # she still holds it: her run did not get past it
        left = sorted(_processes_of(mallory.uid) - before)
        assert left == []  # her run and its group are gone
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr
    report = json.loads(done.stdout)
    assert [(e["owner"], e["action"]) for e in report["entries"]] == [(bob.uid, "synced")]
    assert (targets[bob] / "model.pt").read_text() == f"{bob.name}'s"
    [failure] = report["failures"]
    assert failure["uid"] == mallory.uid and failure["fallback"] == str(scratch)
    assert "did not finish in time" in failure["cause"], failure
    assert "12 s, its share of the sync round" in failure["cause"], failure
    assert f"uid {mallory.uid}" in done.stderr


def test_root_acts_for_no_account_because_someone_named_an_area_after_it(local_users, place):
    """Root's sync ran ``fsprobe sync`` as every uid an area's *name* gave: Mallory made
    root start processes as any account she liked (here, three of her neighbours; nobody's
    too, before), one after the other, at every sync of the daemon."""
    mallory = local_users.user()
    neighbours = [local_users.user() for _ in range(3)]
    scratch = make_dir(place / "scratch", 0o1777)
    named = [user.uid for user in neighbours]  # (not nobody's: other tests run as nobody)
    mallory.run(lambda: [(scratch / f"uid-{uid}").mkdir() for uid in named])

    seen: set[int] = set()
    sync = subprocess.Popen(
        [local_users.python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(scratch)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while sync.poll() is None:  # what root's sync starts, and as whom
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(sync.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        seen.add(child.uids().real)
            time.sleep(0.005)
        stdout, stderr = sync.communicate(timeout=120)
    finally:
        sync.kill()
        sync.wait()
    done = subprocess.CompletedProcess(sync.args, sync.returncode, stdout, stderr)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entries"] == []
    assert seen & set(named) == set(), seen
    assert sorted(os.listdir(scratch)) == sorted(f"uid-{uid}" for uid in named)  # untouched


def test_the_shipped_unit_lets_root_sync_each_users_checkpoints_as_that_user(local_users, place):
    """The unit's capability bounding set had no CAP_SETUID, CAP_SETGID or CAP_KILL: the root
    daemon with sync_redirected could not become a user (EPERM), nor kill a run at its
    deadline; nobody's redirected checkpoint ever went back."""
    setpriv = need_command("setpriv", "util-linux")
    service = _directives(UNIT.read_text())["Service"]
    capabilities = " ".join(service["CapabilityBoundingSet"]).split()
    bounding = ",".join(["-all", *(f"+{name.lower()[4:]}" for name in capabilities)])
    alice = local_users.user()
    fallback = make_dir(place / "fallback", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Alice's save is refused and redirected
    assert save_as(alice, target / "model.pt", "alice's weights", fallback)["redirected"]
    os.chown(target, alice.uid, -1)

    sync = [local_users.python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(fallback)]
    done = subprocess.run(
        [setpriv, "--bounding-set", bounding, "--no-new-privs", *sync],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)["entries"]
    assert [(e["owner"], e["action"]) for e in entries] == [(alice.uid, "synced")], done.stderr
    assert (target / "model.pt").read_text() == "alice's weights"


def private_python(local_users, place: Path) -> str:
    """A venv of fsprobe's under a directory only root may enter (/root, as pyenv and
    `python -m venv` in a home make it): root can run it, its users cannot."""
    private = make_dir(place / "root-only", 0o700)
    subprocess.run(
        [local_users.python, "-m", "venv", "--without-pip", str(private / "venv")], check=True
    )
    [site] = (private / "venv" / "lib").glob("python3*/site-packages")
    reach = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    (site / "fsprobe-tests.pth").write_text(reach)
    return str(private / "venv" / "bin" / "python")


def test_root_whose_interpreter_its_users_cannot_run_fails_loudly(local_users, place):
    """Root's `fsprobe sync` from an installation under a private directory (a venv or pyenv
    in /root, mode 0700) printed "nothing to sync" and exited 0: the run as the user could
    not import fsprobe, printed nothing, and stderr said only "did not print JSON"; the
    user's checkpoint stayed in the fallback behind a green exit. Now: exit 2 and one line
    naming the uid and the cause, in a dry run too, before anything is done."""
    alice = local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "alice-ckpt", 0o755)
    assert save_as(alice, target / "model.pt", "alice's", scratch)["redirected"]
    os.chown(target, alice.uid, -1)
    python = private_python(local_users, place)
    for dry_run in (["--dry-run"], []):
        done = subprocess.run(
            [python, "-m", "fsprobe", "sync", *dry_run, "--fallback-dir", str(scratch)],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (done.stdout, done.stderr)
        [line] = [line for line in done.stderr.splitlines() if f"uid {alice.uid}" in line]
        assert f"the interpreter {python} is not executable by uid {alice.uid}" in line, line
        assert "install fsprobe where its users can run it" in line
        assert "nothing to sync" not in done.stdout
    assert not (target / "model.pt").exists()  # nothing was done for her
    assert (scratch / f"uid-{alice.uid}").exists()


def test_the_root_daemon_that_cannot_act_as_a_user_logs_an_error_and_counts_it(local_users, place):
    alice = local_users.user()
    fallback = make_dir(place / "fallback", 0o1777)
    target = make_dir(place / "ckpt", 0o755)
    assert save_as(alice, target / "model.pt", "alice's weights", fallback)["redirected"]
    os.chown(target, alice.uid, -1)
    daemon = syncing_daemon(place, target, fallback, private_python(local_users, place))
    with daemon:
        line = daemon.wait_for_log("event=sync_as_user_failed", timeout=60)
        labels = {"path": str(target), "problem": "sync_as_user_failed"}
        deadline = time.monotonic() + 30
        while (daemon.value("fsprobe_redirect_problems_total", **labels) or 0) < 1:
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
    assert "level=error" in line and f"uid={alice.uid}" in line, line
    assert "is not executable by uid" in line and "install fsprobe where its users" in line
    assert not (target / "model.pt").exists()


#: Mallory traces every process of hers that appears until `stop` exists (argv[1]), and
#: prints what each attempt gave: {pid: [argv, traced]}.
TRACE_EVERY = r"""
import ctypes, json, os, sys, time
PTRACE_ATTACH, PTRACE_DETACH, WALL = 16, 17, 0x40000000
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long] * 4
stop, tried = sys.argv[1], {}
deadline = time.monotonic() + 90
while not os.path.exists(stop) and time.monotonic() < deadline:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) in (os.getpid(), os.getppid()) or pid in tried:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        traced = libc.ptrace(PTRACE_ATTACH, int(pid), 0, 0) == 0
        if traced:
            os.waitpid(int(pid), WALL)
            libc.ptrace(PTRACE_DETACH, int(pid), 0, 0)
        tried[pid] = [argv, traced]
print(json.dumps(tried))
"""


def test_no_process_root_starts_as_a_user_can_be_traced_by_her(local_users, place):
    """The run as Mallory could not be traced, but the probe worker it started (with `exec`,
    so hers) could: attached with gdb it ran her code inside root's service, with root's
    limits. The run now starts no process of hers that lives: its probes run in its threads."""
    mallory, _bob, scratch, targets = _two_pending_users(local_users, place)
    stop = place / "stop"
    tracer = subprocess.Popen(
        [local_users.python, "-c", TRACE_EVERY, str(stop)],
        stdout=subprocess.PIPE, text=True, **mallory.subprocess_kwargs(),
    )  # fmt: skip
    try:
        time.sleep(0.5)
        done, started = _watch_roots_sync(local_users, scratch, mallory)
        stop.touch()
        tried = json.loads(tracer.communicate(timeout=120)[0])
    finally:
        tracer.kill()
        tracer.wait()
    assert any("sync" in argv for argv, _ in tried.values()), tried  # she saw her run
    assert [argv for argv, traced in tried.values() if traced] == [], tried
    assert started and all("fsprobe.redirect.delegate" in " ".join(argv) for argv in started), (
        started  # her run and nothing else: no probe worker of hers
    )
    assert done.returncode == 0, done.stderr
    assert (targets[mallory] / "model.pt").read_text() == f"{mallory.name}'s"


def open_files_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) of RLIMIT_NOFILE, as /proc says (prlimit needs CAP_SYS_RESOURCE)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open files limit for {pid}")


def test_roots_run_as_a_user_has_the_users_limits_not_roots(local_users, place):
    """The run as a user inherited root's limits (a service's LimitNOFILE=4321, not the 1024
    of the user's login), and so did everything it started."""
    mallory, _bob, scratch, _targets = _two_pending_users(local_users, place)
    done, limits_seen = _watch_roots_sync(local_users, scratch, mallory, open_files=4321)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["failures"] == []
    assert limits_seen, "no run as Mallory was seen"
    assert set(limits_seen) == {(1024, 4321)}, limits_seen  # a login's soft, under root's hard


def _watch_roots_sync(
    local_users, scratch: Path, user, open_files: int | None = None
) -> tuple[subprocess.CompletedProcess, list]:
    """Root's `fsprobe sync` of `scratch`, and what root sees of the processes it starts as
    `user`: their argv, or with `open_files` (root's own limit then), their open-files limits."""
    seen: dict[int, object] = {}

    def limit_root() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    sync = subprocess.Popen(
        [local_users.python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(scratch)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=limit_root,
    )  # fmt: skip
    try:
        while sync.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                for child in psutil.Process(sync.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError):
                        if child.uids().real == user.uid and child.pid not in seen:
                            seen[child.pid] = (
                                child.cmdline() if open_files is None
                                else open_files_limit(child.pid)
                            )  # fmt: skip
            time.sleep(0.005)
        stdout, stderr = sync.communicate(timeout=120)
    finally:
        sync.kill()
        sync.wait()
    return subprocess.CompletedProcess(sync.args, sync.returncode, stdout, stderr), list(
        seen.values()
    )


def test_login_limits_read_limits_conf_as_pam_limits_does(tmp_path, monkeypatch):
    conf = tmp_path / "limits.conf"
    conf.write_text(
        "# domain type item value\n"
        "*        soft  nofile  2048\n"
        "*        hard  nofile  8192\n"
        "@team    -     nofile  4096   # the team's line beats the wildcard\n"
        "alice    hard  as      1048576\n"
        "*        soft  core    unlimited\n"
        "broken line\n"
    )
    monkeypatch.setattr(limits, "LIMITS_FILES", (str(conf), str(tmp_path / "none" / "*.conf")))
    team = grp.getgrgid(os.getgid())
    monkeypatch.setattr(limits.grp, "getgrgid", lambda gid: team if gid == 7 else None)
    for_alice = limits.login_limits("alice", [])
    assert for_alice[resource.RLIMIT_NOFILE] == (2048, 8192)
    assert for_alice[resource.RLIMIT_AS] == (resource.RLIM_INFINITY, 1 << 30)
    assert for_alice[resource.RLIMIT_CORE] == (resource.RLIM_INFINITY, 0)
    conf.write_text(conf.read_text().replace("@team", f"@{team.gr_name}"))
    assert limits.login_limits("bob", [7])[resource.RLIMIT_NOFILE] == (4096, 4096)
    assert limits.login_limits("bob", [])[resource.RLIMIT_NOFILE] == (2048, 8192)
