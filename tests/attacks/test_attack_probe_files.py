"""A member of a team against root's write probe of the team's root-owned directory.

A project directory owned by root, group-writable and without the sticky bit (``root:proj
2770``, as admins make them) gives ``probe_as = "owner"`` no user to probe as: its owner is
root. Any member may rename in it, so Mallory, watching it with inotify, moves each probe file
into a directory of hers the moment it is created. The probe can neither stop that nor find
the file again. So root does not write-probe such a directory as its owner at all (reason
``write_probe_refused``, the probe counted as skipped, a message naming ``probe_as``), and
writes there only when the admin chose to (``probe_as = "root"``, where a stolen file is left
empty: on main each stayed, 1 MiB of root's beyond every quota per probe; or a member's account,
whose file it then is).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsprobe.errors import NOT_AS_ROOT, ProbeFailure
from fsprobe.probing.write import probe_write
from tests.support.daemon_process import DaemonProcess, clean_environment, fast_config
from tests.support.users import REPO, share

PROBES = 6
SIZE = 1 << 20

#: Mallory's watcher: every probe file created in DIRECTORY is renamed into STASH at once.
STEAL = r"""
import ctypes, os, select, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
directory, stash, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
watch = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(watch, directory.encode(), 0x100 | 0x80) >= 0  # CREATE|MOVED_TO
source = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
into = os.open(stash, os.O_RDONLY | os.O_DIRECTORY)
print("watching", flush=True)
stolen = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    if not select.select([watch], [], [], 0.1)[0]:
        continue
    events = os.read(watch, 65536)
    at = 0
    while at < len(events):
        _, _, _, length = struct.unpack_from("iIII", events, at)
        name = events[at + 16 : at + 16 + length].rstrip(b"\0").decode()
        at += 16 + length
        if "write-probe" in name:
            try:
                os.rename(name, f"{stolen}{name}", src_dir_fd=source, dst_dir_fd=into)
                stolen += 1
            except OSError:
                pass
print(stolen, flush=True)
"""


def test_a_probe_file_a_team_member_steals_from_roots_directory_is_left_empty(
    tmp_path, local_users
):
    """The admin chose root (`probe_as = "root"`): what Mallory steals is empty."""
    share(tmp_path)
    team = local_users.group()
    mallory = local_users.user(team)
    project = tmp_path / "project"
    project.mkdir()
    os.chown(project, 0, team)
    os.chmod(project, 0o2770)
    stash = project / "mallory"
    stash.mkdir()
    os.chown(stash, mallory.uid, mallory.gid)
    watcher = subprocess.Popen(
        [mallory.python_executable, "-c", STEAL, str(project), str(stash), "60"],
        **mallory.subprocess_kwargs(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().strip() == "watching"
        outcomes = []
        for _ in range(PROBES):
            try:
                outcomes.append(probe_write(str(project), SIZE, probe_as="root").ok)
            except ProbeFailure as failure:
                outcomes.append(failure.message)
            time.sleep(0.1)
    finally:
        watcher.kill()
        watcher.wait()
    kept = {p.name: (p.stat().st_uid, p.stat().st_size) for p in stash.iterdir()}
    assert kept, f"Mallory stole nothing (the attack did not happen): {outcomes}"
    assert set(kept.values()) == {(0, 0)}, kept  # root's, and empty
    assert sorted(p.name for p in project.iterdir()) == ["mallory"]


def team_directory(tmp_path: Path, team: int, mode: int) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    os.chown(project, 0, team)
    os.chmod(project, mode)
    return project


_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80


@contextlib.contextmanager
def creations(directory: Path) -> Iterator[list[str]]:
    """The names created in (or moved into) `directory` while the block runs, as inotify saw
    them: the kernel queues each event before the call that made it returns."""
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert watch >= 0, os.strerror(ctypes.get_errno())
    names: list[str] = []
    try:
        assert libc.inotify_add_watch(watch, bytes(directory), _IN_CREATE | _IN_MOVED_TO) >= 0
        yield names
        while select.select([watch], [], [], 0)[0]:
            events = os.read(watch, 65536)
            at = 0
            while at < len(events):
                length = struct.unpack_from("iIII", events, at)[3]
                names.append(events[at + 16 : at + 16 + length].rstrip(b"\0").decode())
                at += 16 + length
    finally:
        os.close(watch)


def grant_write_by_acl(directory: Path, uid: int) -> None:
    """``setfacl -m u:UID:rwx DIR`` on a 0755 directory, written as the kernel's xattr."""
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 7, uid), (0x04, 5, 0xFFFFFFFF)]
    entries += [(0x10, 7, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)]  # mask rwx, other r-x
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
    try:
        os.setxattr(directory, "system.posix_acl_access", value)
    except OSError as error:
        pytest.fail(f"{directory}'s filesystem takes no ACL: {error}")


@pytest.mark.parametrize(
    "mode, grant, who",
    [
        (0o2770, None, "the members of group"),
        (0o0777, None, "every user"),
        (0o0775, None, "the members of group"),
        (0o0755, "acl", "the members of group"),  # the mask: whoever the ACL names
    ],
    ids=["2770", "0777", "0775", "0755+acl"],
)
def test_root_does_not_write_probe_its_own_directory_that_others_may_rename_in(
    tmp_path, local_users, mode, grant, who
):
    """On main root probed there as root (its owner), and Mallory could take its file."""
    share(tmp_path)
    team = local_users.group()
    mallory = local_users.user(team)
    project = team_directory(tmp_path, team, mode)
    if grant == "acl":
        grant_write_by_acl(project, mallory.uid)
        assert os.stat(project).st_mode & 0o070 == 0o070  # the ACL mask shows in the group bits
    with creations(project) as created, pytest.raises(ProbeFailure) as refused:
        probe_write(str(project), SIZE)
    assert created == [], "root wrote in a directory others may rename in"
    assert refused.value.error == NOT_AS_ROOT
    assert "probe_as" in refused.value.message and str(project) in refused.value.message
    assert who in refused.value.message
    assert mallory.run(os.listdir, str(project)) == []


@pytest.mark.parametrize("mode", [0o3770, 0o1777, 0o2750, 0o0755], ids=oct)
def test_root_write_probes_its_own_directory_that_only_it_may_rename_in(
    tmp_path, local_users, mode
):
    """The sticky bit keeps each file its owner's to rename: root's probe file is root's."""
    team = local_users.group()
    project = team_directory(tmp_path, team, mode)
    with creations(project) as created:
        assert probe_write(str(project), SIZE).ok
    assert created and all("write-probe" in name for name in created)
    assert os.listdir(project) == []


def test_probe_as_a_member_write_probes_the_team_directory_as_her(tmp_path, local_users):
    share(tmp_path)
    team = local_users.group()
    mallory = local_users.user(team)
    project = team_directory(tmp_path, team, 0o2770)
    assert probe_write(str(project), SIZE, probe_as=mallory.name).ok
    assert probe_write(str(project), SIZE, probe_as="root").ok  # the admin's choice
    assert os.listdir(project) == []


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=clean_environment(),
    )


def test_root_check_of_such_a_directory_says_why_it_did_not_write_probe(tmp_path, local_users):
    """Exit 1 (degraded) with the reason, not a green 0 for a write nobody tested; a member's
    account to probe as makes it ok."""
    share(tmp_path)
    team = local_users.group()
    mallory = local_users.user(team)
    project = team_directory(tmp_path, team, 0o2770)
    refused = _check(str(project), "--quota-provider", "none")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    report = json.loads(refused.stdout)
    reasons = {r["code"]: r for r in report["reasons"] if r["severity"] != "notice"}
    assert set(reasons) == {"write_probe_refused"}, reasons
    assert reasons["write_probe_refused"]["severity"] == "degraded"
    assert "--probe-as" in reasons["write_probe_refused"]["message"]
    as_member = _check(str(project), "--quota-provider", "none", "--probe-as", mallory.name)
    assert as_member.returncode == 0, as_member.stdout + as_member.stderr


def test_the_root_daemon_counts_the_refused_write_probe_as_skipped(tmp_path, local_users):
    """No write-probe failure (its alert is critical) and no success: skipped, degraded."""
    team = local_users.group()
    project = team_directory(tmp_path, team, 0o2770)
    home = tmp_path / "daemon"
    home.mkdir()
    config = fast_config(tmp_path / "fsprobe.toml", project)
    with DaemonProcess(home, "--config", str(config), env=clean_environment()) as daemon:
        deadline = time.monotonic() + 60
        while (daemon.value("fsprobe_probe_skipped_total", probe="write") or 0) < 2:
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
        daemon.wait_for_value("fsprobe_health_status", 1.0, timeout=30)
        assert daemon.value("fsprobe_probe_success", probe="write") is None
        errors = daemon.metrics().get("fsprobe_probe_errors_total", {})
        assert not any(("probe", "write") in labels for labels in errors), errors
        assert daemon.value("fsprobe_probe_success", probe="statvfs") == 1.0
    assert os.listdir(project) == []
