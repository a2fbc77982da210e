"""Root probes a user's directory as that user, through one descriptor (issue 18, items 1-2).

A node daemon runs as root and probes directories that its users control. Tried as a second
local user would, with real accounts: a symlink ``~/ckpt -> /root-only-dir`` and real
``renameat2(RENAME_EXCHANGE)`` swaps must never make root write into the root-only directory
(the fault filesystem's journal sees every create there); and the fault filesystem, exempting
root from its quota as Lustre does, must refuse root's probe of a user's full directory with
EDQUOT, as it refuses the user's own save, with the probe's file the user's.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.daemon.config import ConfigError, load_target
from fsprobe.lustre.caches import LustreCaches
from fsprobe.probing.quota import lookup_quota, probe_quota
from fsprobe.probing.write import probe_write
from fsprobe.quota import ServerProbeSettings
from tests.deploy.test_deploy_systemd import UNIT, _directives
from tests.support.capability import need_command, need_module
from tests.support.fakes.fake_lfs import fake_lfs_for
from tests.support.users import REPO, LocalUser, share

#: A check without quota: these tests are about who writes.
NO_QUOTA = fsprobe.ProbeSettings(server_probes=ServerProbeSettings(provider="none"))
DAEMONSET = REPO / "deploy" / "kubernetes" / "daemonset.yaml"

#: renameat2's flag that swaps two names atomically, from <linux/fs.h>.
RENAME_EXCHANGE = 2
#: What the neighbour runs: swap `ckpt` (her directory) and `flip` (her symlink to the root-only
#: directory) back and forth until killed.
SWAPPER = f"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
first, second = (os.fsencode(name) for name in sys.argv[1:3])
print("swapping", flush=True)
while True:
    if libc.renameat2(-100, first, -100, second, {RENAME_EXCHANGE}) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
"""


def home_of(user: LocalUser, parent: Path) -> Path:
    """A directory of `user`'s own in `parent` (made if needed, and which every user may reach)."""
    parent.mkdir(exist_ok=True)
    share(parent)
    home = parent / user.name
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    home.chmod(0o755)
    return home


def root_only(faultfs) -> Path:
    """A root-only directory on the fault filesystem, whose journal records every create."""
    secret = faultfs.mountpoint / "root-only"
    secret.mkdir()
    secret.chmod(0o700)
    faultfs.ctl.clear_journal()
    return secret


def creates_in(faultfs, directory: Path) -> list:
    inside = "/" + directory.relative_to(faultfs.mountpoint).as_posix() + "/"
    return [
        entry
        for entry in faultfs.ctl.journal()["entries"]
        if any(path and path.startswith(inside) for path in entry[1])
        and entry[0] in ("create", "mknod", "mkdir", "rename", "link", "symlink")
    ]


def codes(report) -> dict[str, dict]:
    return {reason["code"]: reason for reason in report.to_dict()["reasons"]}


def test_a_users_symlink_to_a_root_only_directory_is_refused_never_followed(
    local_users, faultfs, tmp_path
):
    alice = local_users.user()
    secret = root_only(faultfs)
    home = home_of(alice, tmp_path / "homes")
    alice.run(os.symlink, str(secret), str(home / "ckpt"))

    report = fsprobe.check(str(home / "ckpt"), NO_QUOTA)

    assert creates_in(faultfs, secret) == []
    untrusted = codes(report)["target_untrusted"]
    assert untrusted["severity"] == "unhealthy" and untrusted["errno"] == "EACCES"
    assert str(home / "ckpt") in untrusted["message"] and f"uid {alice.uid}" in untrusted["message"]
    assert report.to_dict()["status"] == "unhealthy"


def test_the_owners_own_symlink_to_her_own_directory_is_followed(local_users, tmp_path):
    alice = local_users.user()
    home = home_of(alice, tmp_path / "homes")
    real = home / "real"
    alice.run(os.mkdir, str(real))
    alice.run(os.symlink, str(real), str(home / "ckpt"))

    report = fsprobe.check(str(home / "ckpt"), NO_QUOTA)

    assert "target_untrusted" not in codes(report)
    assert report.to_dict()["write_probe"]["ok"] is True
    assert report.to_dict()["filesystem"]["probed_path"] == str(real)


def test_swapping_the_target_for_a_symlink_while_root_probes_never_writes_through_it(
    local_users, faultfs, tmp_path
):
    alice = local_users.user()
    secret = root_only(faultfs)
    home = home_of(alice, tmp_path / "homes")
    alice.run(os.mkdir, str(home / "ckpt"))
    alice.run(os.symlink, str(secret), str(home / "flip"))
    swapper = subprocess.Popen(
        [alice.python_executable, "-c", SWAPPER, str(home / "ckpt"), str(home / "flip")],
        stdout=subprocess.PIPE,
        text=True,
        **alice.subprocess_kwargs(),
    )
    try:
        assert swapper.stdout.readline() == "swapping\n"
        outcomes = set()
        for _ in range(25):
            report = fsprobe.check(str(home / "ckpt"), NO_QUOTA)
            write = report.to_dict()["write_probe"]
            refused = "target_untrusted" in codes(report)
            outcomes.add("untrusted" if refused else (write["ok"], write["message"]))
    finally:
        swapper.kill()
        swapper.wait()

    assert creates_in(faultfs, secret) == []
    assert outcomes <= {(True, ""), "untrusted"}, outcomes  # written in her directory, or refused


def test_two_owners_probed_at_once_each_write_as_themselves(local_users, faultfs):
    """Two probes in the one worker, each thread with another owner's IDs at the same moment:
    credentials are the thread's, never the process's (glibc's setgroups would be)."""
    alice, bob = local_users.user(), local_users.user()
    homes = {user: home_of(user, faultfs.mountpoint) for user in (alice, bob)}
    held = faultfs.ctl.block("fsync")
    checks = [
        threading.Thread(target=fsprobe.check, args=(str(home),), kwargs={"settings": NO_QUOTA})
        for home in homes.values()
    ]
    for check in checks:
        check.start()
    try:
        faultfs.ctl.wait_blocked(held, count=2)
        owners = {
            user: {os.stat(home / name).st_uid for name in os.listdir(home)}
            for user, home in homes.items()
        }
    finally:
        faultfs.ctl.remove(held)
        for check in checks:
            check.join()
    assert owners == {alice: {alice.uid}, bob: {bob.uid}}


def full_home_of(user: LocalUser, faultfs) -> Path:
    """`user`'s directory on the fault filesystem, whose quota (root exempt, as on Lustre) has
    room for 64 KiB more: a 1 MiB test write does not fit."""
    faultfs.ctl.exempt_root()
    target = home_of(user, faultfs.mountpoint)
    used = faultfs.ctl.quota()["bytes"]["used"]
    faultfs.ctl.set_quota("bytes", hard=used + 64 * 1024)
    return target


def test_roots_probe_of_a_users_full_directory_meets_her_quota(local_users, faultfs):
    target = full_home_of(local_users.user(), faultfs)

    report = fsprobe.check(str(target), NO_QUOTA)

    write = report.to_dict()["write_probe"]
    assert (write["ok"], write["step"], write["errno"]) == (False, "write", "EDQUOT")
    assert codes(report)["write_failed"]["errno"] == "EDQUOT"
    assert report.to_dict()["status"] == "unhealthy"
    assert os.listdir(target) == []  # the failed probe's file is gone


def test_the_probe_file_in_a_users_directory_is_hers_and_root_keeps_its_own_ids(
    local_users, faultfs
):
    team = local_users.group()
    alice = local_users.user(team)
    target = home_of(alice, faultfs.mountpoint)
    held = faultfs.ctl.block("fsync")
    seen = {}

    def look() -> None:
        try:
            faultfs.ctl.wait_blocked(held)
            for name in os.listdir(target):
                info = os.stat(target / name)
                seen[name] = (info.st_uid, info.st_gid)
        finally:
            faultfs.ctl.remove(held)

    looker = threading.Thread(target=look)
    looker.start()
    result = probe_write(str(target), 4096)  # in this very thread: its IDs must come back
    looker.join()

    assert result.ok
    assert list(seen.values()) == [(alice.uid, alice.gid)], seen
    assert (os.geteuid(), os.getegid()) == (0, 0)
    libc = ctypes.CDLL(None)
    assert (libc.setfsuid(-1), libc.setfsgid(-1)) == (0, 0)
    mine = faultfs.mountpoint / "roots"
    mine.write_text("root's")  # the thread is root again: its file is root's
    assert mine.stat().st_uid == 0


def test_probe_as_root_writes_as_root(local_users, faultfs):
    target = full_home_of(local_users.user(), faultfs)

    report = fsprobe.check(str(target), dataclasses.replace(NO_QUOTA, probe_as="root"))

    assert report.to_dict()["write_probe"]["ok"] is True  # root writes past her quota


@pytest.fixture
def shared_fake_lfs(monkeypatch, tmp_path):
    """The fake lfs, with a log and a pid file that the users it runs as may write."""
    share(tmp_path)
    for fake in fake_lfs_for(monkeypatch, tmp_path):
        for written in (fake.log, fake.pidfile):
            written.touch()
            written.chmod(0o666)
        yield fake


def lustre_directory_of(user: LocalUser, fake, tmp_path: Path) -> Path:
    """A directory of `user` on what the fake lfs takes for a Lustre mount."""
    lustre = tmp_path / "lustre"
    target = home_of(user, lustre)
    fake.configure(state={"mountpoint": str(lustre)})
    (tmp_path / "fake-lfs-state.json").chmod(0o644)
    return target


def test_lfs_quota_is_asked_as_the_owner_for_her_own_ids(local_users, shared_fake_lfs, tmp_path):
    team = local_users.group()
    alice = local_users.user(team)
    target = lustre_directory_of(alice, shared_fake_lfs, tmp_path)

    report = probe_quota(str(target), ServerProbeSettings(provider="lfs"), caches=LustreCaches())

    assert report.errors == (), report.errors
    assert [(entry.type, entry.id) for entry in report.entries] == [
        ("user", alice.uid),
        ("group", alice.gid),
    ]
    calls = [call for call in shared_fake_lfs.calls() if call["argv"][0] == "quota"]
    assert {call["ids"]["euid"] for call in calls} == {alice.uid}
    assert all(set(call["groups"]) == {alice.gid, team} for call in calls)
    assert {call["dumpable"] for call in calls} == {0}  # she cannot trace what root started


def test_a_user_cannot_trace_the_lfs_root_runs_as_her(local_users, shared_fake_lfs, tmp_path):
    """The exec'd `lfs` is hers (her uid) yet not dumpable: ptrace(ATTACH) as her is refused."""
    alice = local_users.user()
    target = lustre_directory_of(alice, shared_fake_lfs, tmp_path)
    # The test ends the hanging lfs itself; a deadline of the product's own that ran out
    # first (a loaded machine, a slow attach below) would start the group's lfs, hanging too.
    settings = ServerProbeSettings(provider="lfs", timeout=120, cache_seconds=0)
    caches = LustreCaches()
    lookup_quota(
        str(target), settings, caches=caches
    )  # root's `lfs --version` and `getstripe`, cached now
    os.environ["FAKE_LFS_FAIL"] = "hang"  # the monkeypatch of the fixture undoes it
    outcome = []
    prober = threading.Thread(
        target=lambda: outcome.append(lookup_quota(str(target), settings, caches=caches).report)
    )
    prober.start()
    try:
        pid = _wait_for_pid(shared_fake_lfs.pidfile)
        status = Path(f"/proc/{pid}/status").read_text()
        (uids,) = [line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")]
        assert uids == [str(alice.uid)] * 4  # hers: real, effective, saved and fs uid
        traced = alice.python(ATTACH, str(pid), env={"PATH": os.defpath})
        assert traced.stdout.strip() == "EPERM", traced.stderr
    finally:
        del os.environ["FAKE_LFS_FAIL"]  # the next lfs answers at once
        for pid in shared_fake_lfs.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        prober.join()
    assert [error.split(":")[0] for error in outcome[0].errors] == [f"user {alice.uid}"]


ATTACH = """
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
ok = libc.ptrace(16, int(sys.argv[1]), None, None) == 0  # PTRACE_ATTACH
print("attached" if ok else errno.errorcode[ctypes.get_errno()])
"""


def _wait_for_pid(pidfile: Path) -> int:
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        text = pidfile.read_text().split()
        if text:
            return int(text[0])
        time.sleep(0.05)
    raise TimeoutError("the fake lfs never started")


LFS_LIMITS = """
import resource, sys
from fsprobe.lustre.runner import run_lfs
from fsprobe.posix.identity import Identity
resource.setrlimit(resource.RLIMIT_NOFILE, (4321, 4321))  # a service's LimitNOFILE
run = run_lfs(["-c", "ulimit -Sn; ulimit -Hn; id -u"], binary="/bin/sh", timeout=30,
              identity=Identity.of_account(int(sys.argv[1])))
print(run.stdout, end="")
"""


def test_the_lfs_root_runs_as_her_has_her_login_limits_not_roots(local_users):
    """On main it had root's raised limits (4321 open files): hers to use through it."""
    alice = local_users.user()
    done = subprocess.run(
        [sys.executable, "-c", LFS_LIMITS, str(alice.uid)],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1024", "4321", str(alice.uid)]  # a login's soft, root's hard


def test_probe_as_names_an_account_or_is_refused(tmp_path):
    config = tmp_path / "fsprobe.toml"
    config.write_text(f'[[targets]]\npath = "{tmp_path}"\nprobe_as = "no-such-user-here"\n')
    with pytest.raises(ConfigError, match="probe_as"):
        load_target(str(config), str(tmp_path))
    config.write_text(f'[[targets]]\npath = "{tmp_path}"\nprobe_as = "root"\n')
    assert load_target(str(config), str(tmp_path)).settings.probe_as == "root"


def test_check_takes_probe_as_on_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(tmp_path), "--probe-as", "nobody-xyz"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 64 and "probe_as" in done.stderr


def _unit_capabilities() -> list[str]:
    return " ".join(_directives(UNIT.read_text())["Service"]["CapabilityBoundingSet"]).split()


def _daemonset_capabilities() -> list[str]:
    yaml = need_module("yaml")
    for document in yaml.safe_load_all(DAEMONSET.read_text()):
        if document and document.get("kind") == "DaemonSet":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            return [f"CAP_{name}" for name in container["securityContext"]["capabilities"]["add"]]
    raise AssertionError(f"no DaemonSet in {DAEMONSET}")


@pytest.mark.parametrize("shipped", [_unit_capabilities, _daemonset_capabilities])
def test_the_shipped_capabilities_let_root_probe_as_the_owner(
    shipped, local_users, faultfs, shared_fake_lfs, tmp_path
):
    """Root with only the capabilities the systemd unit and the DaemonSet keep: its probe of a
    user's full directory meets her EDQUOT, and it reads her quota from a Lustre that refuses
    anyone without CAP_SYS_ADMIN someone else's (the fake lfs checks its own CapEff)."""
    setpriv = need_command("setpriv", "util-linux")
    bounding = ",".join(["-all", *(f"+{name.lower()[4:]}" for name in shipped())])
    alice = local_users.user()
    full = full_home_of(alice, faultfs)
    lustre = lustre_directory_of(alice, shared_fake_lfs, tmp_path)

    def fsprobe_json(*arguments: str) -> dict:
        python = [local_users.python, "-m", "fsprobe", *arguments, "--json"]
        done = subprocess.run(
            [setpriv, "--bounding-set", bounding, "--no-new-privs", *python],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.stdout, done.stderr
        return json.loads(done.stdout)

    write = fsprobe_json("check", str(full), "--quota-provider", "none")["write_probe"]
    assert (write["ok"], write["errno"]) == (False, "EDQUOT"), write
    quota = fsprobe_json("quota", str(lustre), "--quota-provider", "lfs")
    assert quota["errors"] == [], quota
    assert [(entry["type"], entry["id"]) for entry in quota["quota"]] == [
        ("user", alice.uid),
        ("group", alice.gid),
    ]
