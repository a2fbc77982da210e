"""Which IDs a new file in the target is charged to: uid, gid (set-group-ID aware), project.

The project ID is read for real: on an XFS image mounted on a loop device (XFS keeps project
IDs in every inode, with or without quota enforcement, and implements FS_IOC_FSGETXATTR) and,
for the `lfs project -d` fallback, on the FUSE fault filesystem, whose ioctl fails with ENOTTY
as on filesystems without project IDs. ext4 cannot stand in here: its project feature needs a
kernel built with CONFIG_QUOTA.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.provider import LustreQuotaProvider
from fsprobe.probing.quota import probe_quota
from fsprobe.quota import ServerProbeSettings
from fsprobe.quota.ids import (
    FS_IOC_FSGETXATTR,
    FSXATTR,
    DirectoryProject,
    id_name,
    id_of,
    read_project,
    resolve_ids,
)
from fsprobe.quota.provider import Deadline
from tests.support.capability import require
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for
from tests.support.mountinfo import unmount

#: _IOW('X', 32, struct fsxattr): set the attributes, the project ID among them.
FS_IOC_FSSETXATTR = 0x401C5820
#: FS_XFLAG_PROJINHERIT: new files and directories inherit the directory's project ID.
PROJINHERIT = 0x200


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def set_project(directory: Path, project: int) -> None:
    """What `chattr -p PROJECT +P DIR` does, through the ioctl."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fields = list(FSXATTR.unpack(fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size))))
        fields[0] |= PROJINHERIT
        fields[3] = project
        fcntl.ioctl(fd, FS_IOC_FSSETXATTR, FSXATTR.pack(*fields))
    finally:
        os.close(fd)


def _xfs_problem() -> str | None:
    if os.geteuid() != 0:
        return "mounting an XFS image needs root"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs not found (apt-get install xfsprogs)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control)"
    return None


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """An empty XFS filesystem on a loop device (300 MiB sparse image, the mkfs minimum)."""
    require(_xfs_problem())
    image, mountpoint = tmp_path / "xfs.img", tmp_path / "xfs"
    mountpoint.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(300 * 2**20)
    made = subprocess.run(
        ["mkfs.xfs", "-q", str(image)], capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0:
        require(f"mkfs.xfs failed: {made.stderr.strip()}")
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mountpoint)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if mounted.returncode != 0:
        require(f"cannot mount an XFS image on a loop device: {mounted.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        unmount(mountpoint)


def test_user_is_the_effective_uid_and_group_the_effective_gid(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    ids = resolve_ids(str(tmp_path))
    assert (ids.user, ids.group) == (os.geteuid(), os.getegid())


def _another_group() -> int:
    """A group other than ours that we may give a directory: any for root, else one of our
    supplementary groups (a user may chgrp to the groups they are in)."""
    if os.geteuid() == 0:
        return 4242
    others = [gid for gid in os.getgroups() if gid != os.getegid()]
    require(None if others else "giving a directory another group needs root or a second group")
    return others[0]


def test_set_group_id_directory_gives_its_group(tmp_path: Path):
    group = _another_group()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, -1, group)
    os.chmod(shared, 0o2775)
    assert os.stat(shared).st_mode & stat.S_ISGID
    assert resolve_ids(str(shared)).group == group
    os.chmod(shared, 0o775)
    assert resolve_ids(str(shared)).group == os.getegid(), "without the bit: our own gid"


def test_overrides_replace_the_derived_ids(tmp_path: Path):
    def no_fallback(path: str) -> int:
        raise AssertionError("an explicit project must not be looked up")

    ids = resolve_ids(str(tmp_path), user=1, group=2, project=3, project_fallback=no_fallback)
    assert ids.queries() == (("user", 1), ("group", 2), ("project", 3))
    assert ids.errors == ()


@pytest.mark.mount
def test_project_id_is_read_with_the_ioctl(xfs: Path):
    plain = xfs / "plain"
    plain.mkdir()
    assert read_project(str(plain)).id == 0
    assert resolve_ids(str(plain)).project is None, "project 0 is no project"
    ckpt = xfs / "ckpt"
    ckpt.mkdir()
    set_project(ckpt, 4242)
    (ckpt / "run7").mkdir()  # created after: inherits the project, as a new checkpoint would

    def no_fallback(path: str) -> int:
        raise AssertionError("the ioctl works here: no fallback")

    for directory in (ckpt, ckpt / "run7"):
        ids = resolve_ids(str(directory), project_fallback=no_fallback)
        assert ids.project == 4242
        assert ids.queries()[-1] == ("project", 4242)


@pytest.mark.mount
def test_lfs_project_is_the_fallback_where_the_ioctl_is_not_supported(faultfs, fake_lfs: FakeLfs):
    directory = faultfs.mountpoint / "ckpt"
    directory.mkdir()
    with pytest.raises(OSError) as unsupported:
        read_project(str(directory))
    assert unsupported.value.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL)

    fake_lfs.configure(project=77)
    provider, settings = LustreQuotaProvider(LustreCaches()), ServerProbeSettings()

    def fallback(path: str) -> int:
        return provider.project(path, settings, Deadline.after(20))

    ids = resolve_ids(str(directory), project_fallback=fallback)
    assert (ids.project, ids.errors) == (77, ())
    assert [call["argv"] for call in fake_lfs.calls()] == [["project", "-d", str(directory)]]

    fake_lfs.configure(fail="project_unsupported")
    ids = resolve_ids(str(directory), project_fallback=fallback)
    assert ids.project is None
    assert len(ids.errors) == 1 and "ENOTTY" in ids.errors[0] and str(directory) in ids.errors[0]

    def too_slow(path: str) -> int:
        raise ProbeFailure("TIMEOUT", "lfs project -d took too long")

    ids = resolve_ids(str(directory), project_fallback=too_slow)
    assert ids.project is None and "TIMEOUT" in ids.errors[0]


def test_other_ioctl_errors_do_not_use_the_fallback(tmp_path: Path):
    calls: list[str] = []

    def fallback(path: str) -> int:
        calls.append(path)
        return 5

    missing = tmp_path / "gone"
    missing.mkdir()
    missing.rmdir()
    # resolve_ids needs the directory for its group; give the group so only the project reads
    ids = resolve_ids(str(missing), group=1, project_fallback=fallback)
    assert calls == [] and ids.project is None
    assert "ENOENT" in ids.errors[0]


def test_ioctl_numbers_encode_the_size_of_struct_fsxattr():
    assert FSXATTR.size == 28
    for number in (FS_IOC_FSGETXATTR, FS_IOC_FSSETXATTR):
        assert (number >> 16) & 0x3FFF == FSXATTR.size
        assert (number >> 8) & 0xFF == ord("X")


def test_names_and_ids_of_users_and_groups():
    root_group = grp.getgrgid(0).gr_name
    assert (id_of("user", "root"), id_of("group", root_group)) == (0, 0)
    assert (id_name("user", 0), id_name("group", 0)) == ("root", root_group)
    assert id_name("project", 0) is None
    for quota_type in ("user", "group", "project"):
        with pytest.raises(KeyError):
            id_of(quota_type, "no-such-name-harden")


def test_reading_the_project_id_leaves_no_descriptor_open(tmp_path: Path):
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        # On a filesystem without the ioctl it raises: the descriptor is closed all the same.
        with contextlib.suppress(OSError):
            read_project(str(tmp_path))
    assert len(os.listdir("/proc/self/fd")) == before


def xfs_io(*commands: str, path: Path) -> str:
    """Run xfs_io's commands on `path` (chproj, chattr +P, lsproj: the admin's own tools)."""
    argv = ["xfs_io"]
    for command in commands:
        argv += ["-c", command]
    done = subprocess.run([*argv, str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def project_of(path: Path) -> int:
    """The project ID a file or directory got, as `xfs_io -c lsproj` shows it."""
    (line,) = xfs_io("lsproj", path=path).splitlines()
    assert line.startswith("projid = "), line
    return int(line.removeprefix("projid = "))


@pytest.mark.mount
def test_a_project_without_its_inherit_flag_is_not_the_project_of_new_files(xfs: Path):
    plain, inheriting = xfs / "p42", xfs / "p43"
    plain.mkdir()
    inheriting.mkdir()
    xfs_io("chproj 42", path=plain)
    xfs_io("chproj 43", "chattr +P", path=inheriting)
    for directory in (plain, inheriting):
        (directory / "model.pt").write_bytes(b"x")
    # What the kernel does (the measurement): only the inherit flag passes it on.
    assert (project_of(plain / "model.pt"), project_of(inheriting / "model.pt")) == (0, 43)

    assert read_project(str(plain)) == DirectoryProject(42, inherit=False)
    assert read_project(str(inheriting)) == DirectoryProject(43, inherit=True)
    ids = resolve_ids(str(plain))
    assert ids.project is None and ids.queries()[-1][0] == "group"
    assert ids.notes == (
        f"{plain} has project 42 but not its inherit flag: new files get no project",
    )
    assert ids.errors == ()
    inherited = resolve_ids(str(inheriting))
    assert (inherited.project, inherited.notes) == (43, ())


@pytest.mark.mount
def test_the_quota_probe_asks_no_project_without_the_flag_and_says_why(
    xfs: Path, fake_lfs: FakeLfs
):
    plain, inheriting = xfs / "p42", xfs / "p43"
    plain.mkdir()
    inheriting.mkdir()
    xfs_io("chproj 42", path=plain)
    xfs_io("chproj 43", "chattr +P", path=inheriting)
    fake_lfs.configure(state={"mountpoint": str(xfs)})
    settings = ServerProbeSettings(provider="lfs", user=1000, cache_seconds=0)
    caches = LustreCaches()

    report = probe_quota(
        str(plain / "run7"), settings, caches=caches
    )  # run7 does not exist: p42 stands in
    assert report is not None
    assert [entry.type for entry in report.entries] == ["user", "group"]
    assert report.notes == (
        f"{plain} has project 42 but not its inherit flag: new files get no project",
    )
    assert report.errors == ()
    assert not [call for call in fake_lfs.quota_calls() if "-p" in call["argv"]]

    report = probe_quota(str(inheriting), settings, caches=caches)
    assert report is not None and report.notes == ()
    assert [(e.type, e.id) for e in report.entries][-1] == ("project", 43)


@pytest.mark.mount
def test_check_and_quota_say_in_one_line_why_no_project_is_asked(xfs: Path, fake_lfs: FakeLfs):
    plain = xfs / "p42"
    plain.mkdir()
    xfs_io("chproj 42", path=plain)
    fake_lfs.configure(state={"mountpoint": str(xfs)})
    line = f"{plain} has project 42 but not its inherit flag: new files get no project"
    base = [sys.executable, "-m", "fsprobe"]
    lfs = ["--quota-provider", "lfs", "--user", "1000"]
    quota = subprocess.run(
        [*base, "quota", str(plain), "--json", *lfs], capture_output=True, text=True, timeout=60
    )
    assert json.loads(quota.stdout)["notes"] == [line]
    human = subprocess.run(
        [*base, "quota", str(plain), *lfs], capture_output=True, text=True, timeout=60
    )
    assert f"Note: {line}." in human.stdout.splitlines()
    check = subprocess.run(
        [*base, "check", str(plain), "--json", "--no-write-probe", *lfs],
        capture_output=True,
        text=True,
        timeout=60,
    )
    document = json.loads(check.stdout)
    assert document["quota_notes"] == [line]
    notes = [r for r in document["reasons"] if r["code"] == "quota_note"]
    assert [(r["severity"], r["message"]) for r in notes] == [("notice", line)]
    assert check.returncode == 0, document["reasons"]  # a notice leaves the status as it is


@pytest.mark.mount
def test_lfs_project_fallback_reads_the_inherit_flag(faultfs, fake_lfs: FakeLfs):
    directory = faultfs.mountpoint / "ckpt"
    directory.mkdir()
    provider, settings = LustreQuotaProvider(LustreCaches()), ServerProbeSettings()

    def fallback(path: str) -> DirectoryProject:
        return provider.project(path, settings, Deadline.after(20))

    fake_lfs.configure(state={"project": 77, "project_inherit": False})
    ids = resolve_ids(str(directory), project_fallback=fallback)
    assert (ids.project, ids.errors) == (None, ())
    assert ids.notes == (
        f"{directory} has project 77 but not its inherit flag: new files get no project",
    )
    fake_lfs.configure(state={"project": 77, "project_inherit": True})
    assert resolve_ids(str(directory), project_fallback=fallback).project == 77
