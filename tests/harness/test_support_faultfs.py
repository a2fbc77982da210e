"""The fault filesystem does what the rest of the suite relies on: every fault really happens.

Each injected fault is observed the way an application would see it (the errno of a real
`open`/`write`/`fsync`/`rename`), not by asking the filesystem what it meant to do.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.capability import fuse_problem, require
from tests.support.faultctl import FaultControlError
from tests.support.faultmount import REPO_ROOT, FaultFS
from tests.support.faults import Faults
from tests.support.mountinfo import is_mounted
from tests.support.quota import Quota, scan_usage


def outcome(action: Callable[[], Any]) -> str:
    """``"ok"`` or the errno name an action failed with."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode[exc.errno]
    return "ok"


class Background:
    """A call run in a daemon thread, to be watched while it hangs on the filesystem."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.result = call()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finished(self, within: float) -> bool:
        self.thread.join(within)
        return not self.thread.is_alive()


# -- passthrough -------------------------------------------------------------------------------


def test_passthrough_keeps_content_modes_owners_and_times(faultfs):
    mnt, backing = faultfs.mountpoint, faultfs.backing
    (mnt / "d").mkdir(mode=0o750)
    with open(mnt / "d" / "f", "wb") as f:
        f.write(b"data")
        f.flush()
        os.fsync(f.fileno())
    directory = os.open(mnt / "d", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    os.replace(mnt / "d" / "f", mnt / "d" / "g")
    os.chmod(mnt / "d" / "g", 0o640)
    os.chown(mnt / "d" / "g", 1234, 5678)
    os.utime(mnt / "d" / "g", ns=(1_000_000_000, 2_000_000_123))

    st = os.stat(backing / "d" / "g")
    assert (backing / "d" / "g").read_bytes() == b"data"
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 1234, 5678)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_123)
    assert stat.S_IMODE(os.stat(backing / "d").st_mode) == 0o750
    assert os.listdir(mnt / "d") == ["g"]
    assert os.stat(mnt / "d" / "g").st_ino == st.st_ino
    counts = faultfs.ctl.counts()
    assert (counts["fsync"], counts["fsyncdir"], counts["rename"]) == (1, 1, 1)


def test_touch_keeps_an_omitted_time_and_sets_now(faultfs):
    path = faultfs.mountpoint / "f"
    path.write_bytes(b"x")
    os.utime(path, ns=(1_000_000_000, 2_000_000_000))
    subprocess.run(["touch", "-m", "-d", "@3", str(path)], check=True)  # atime: UTIME_OMIT
    st = os.stat(faultfs.backing / "f")
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 3_000_000_000)
    os.utime(path)  # both UTIME_NOW
    assert os.stat(faultfs.backing / "f").st_mtime > time.time() - 3600


def test_renameat2_keeps_noreplace_and_refuses_exchange(faultfs):
    mnt = faultfs.mountpoint
    (mnt / "a").write_bytes(b"a")
    (mnt / "b").write_bytes(b"b")
    libc = ctypes.CDLL(None, use_errno=True)

    def renameat2(old: str, new: str, flags: int) -> str:
        at_fdcwd = -100
        result = libc.renameat2(at_fdcwd, bytes(mnt / old), at_fdcwd, bytes(mnt / new), flags)
        return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]

    noreplace, exchange = 1, 2
    assert renameat2("a", "b", noreplace) == "EEXIST"
    assert renameat2("a", "b", exchange) == "EINVAL"
    assert renameat2("a", "c", noreplace) == "ok"
    assert sorted(os.listdir(faultfs.backing)) == ["b", "c"]
    assert (faultfs.backing / "b").read_bytes() == b"b"


def test_hundreds_of_mib_pass_through_intact(faultfs):
    chunk = os.urandom(8 << 20)
    count = 24  # 192 MiB
    with open(faultfs.mountpoint / "big", "wb") as f:
        for _ in range(count):
            f.write(chunk)
        os.fsync(f.fileno())
    assert (faultfs.backing / "big").stat().st_size == count * len(chunk)
    with open(faultfs.mountpoint / "big", "rb") as f:
        for _ in range(count):
            assert f.read(len(chunk)) == chunk
        assert f.read(1) == b""
    assert faultfs.ctl.quota()["bytes"]["used"] == count * len(chunk)


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's own temp tree is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="faultfs-public-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_entries_made_by_another_user_are_theirs_and_modes_are_enforced(
    public_dir, faultfs_factory
):
    backing, mnt = public_dir / "backing", public_dir / "mnt"
    backing.mkdir(mode=0o777)
    backing.chmod(0o777)
    mnt.mkdir()
    (backing / "root-only").mkdir(mode=0o755)
    faultfs_factory(backing=backing, mountpoint=mnt)
    nobody = {"user": 65534, "group": 65534, "extra_groups": []}

    subprocess.run(["touch", str(mnt / "mine")], check=True, **nobody)
    subprocess.run(["mkdir", str(mnt / "dir")], check=True, **nobody)
    refused = subprocess.run(
        ["touch", str(mnt / "root-only" / "x")], capture_output=True, text=True, **nobody
    )

    assert os.stat(backing / "mine").st_uid == 65534
    assert os.stat(backing / "dir").st_uid == 65534
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    assert not (backing / "root-only" / "x").exists()


# -- injected failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("after", "times", "expected"),
    [
        (2, 1, ["ok", "ok", "EIO", "ok", "ok"]),  # the 3rd write
        (0, 2, ["EIO", "EIO", "ok", "ok", "ok"]),  # the next two
        (1, None, ["ok", "EIO", "EIO", "EIO", "EIO"]),  # every write after the first
    ],
)
def test_fail_picks_exactly_the_writes_asked_for(faultfs, after, times, expected):
    rule = faultfs.ctl.fail("write", "EIO", after=after, times=times)
    with open(faultfs.mountpoint / "f", "wb", buffering=0) as f:
        seen = [outcome(lambda: f.write(b"0123456789")) for _ in expected]
    assert seen == expected
    assert faultfs.ctl.rule(rule)["hits"] == expected.count("EIO")
    assert (faultfs.backing / "f").stat().st_size == 10 * expected.count("ok")


def test_a_path_glob_confines_a_fault_to_matching_files(faultfs):
    faultfs.ctl.fail("write", errno.ENOSPC, path="*.tmp", times=None)
    tmp, final = faultfs.mountpoint / "ckpt" / ".model.pt.tmp", faultfs.mountpoint / "model.pt"
    tmp.parent.mkdir()
    assert [outcome(lambda: tmp.write_bytes(b"x")) for _ in range(3)] == ["ENOSPC"] * 3
    final.write_bytes(b"x")
    assert (faultfs.backing / "model.pt").read_bytes() == b"x"


def _make_old(mnt: Path) -> None:
    (mnt / "old").write_bytes(b"old")


def _fsync_dir(mnt: Path) -> None:
    fd = os.open(mnt, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(mnt: Path) -> None:
    _fsync_path(mnt / "old")


@pytest.mark.parametrize(
    ("op", "path", "name", "action"),
    [
        ("create", "/new", "EDQUOT", lambda mnt: open(mnt / "new", "xb").close()),
        ("open", "/old", "EACCES", lambda mnt: open(mnt / "old", "rb").close()),
        ("rename", "/old", "EIO", lambda mnt: os.replace(mnt / "old", mnt / "renamed")),
        ("unlink", "/old", "EBUSY", lambda mnt: os.unlink(mnt / "old")),
        ("fsync", "/old", "EIO", _fsync_file),
        ("fsyncdir", "/", "EIO", _fsync_dir),
        ("mkdir", "/dir", "ENOSPC", lambda mnt: os.mkdir(mnt / "dir")),
        ("getattr", "/old", "EIO", lambda mnt: os.stat(mnt / "old")),
        ("statfs", "/", "ETIMEDOUT", lambda mnt: os.statvfs(mnt)),
        ("truncate", "/old", "EPERM", lambda mnt: os.truncate(mnt / "old", 0)),
        ("read", "/old", "EIO", lambda mnt: (mnt / "old").read_bytes()),
        ("flush", "/old", "EIO", lambda mnt: open(mnt / "old", "rb").close()),
    ],
)
def test_any_operation_fails_with_any_errno(faultfs, op, path, name, action):
    _make_old(faultfs.mountpoint)
    # times=None: the kernel retries a failed getattr or read once by itself.
    rule = faultfs.ctl.fail(op, name, path=path, times=None)
    assert outcome(lambda: action(faultfs.mountpoint)) == name
    assert faultfs.ctl.rule(rule)["hits"] >= 1
    faultfs.ctl.remove(rule)
    assert outcome(lambda: action(faultfs.mountpoint)) == "ok"


def test_a_one_shot_estale_is_retried_by_the_kernel_so_tests_need_two(faultfs):
    _make_old(faultfs.mountpoint)
    once = faultfs.ctl.fail("open", "ESTALE", times=1)
    assert outcome(lambda: open(faultfs.mountpoint / "old", "rb").close()) == "ok"
    assert faultfs.ctl.rule(once)["hits"] == 1
    faultfs.ctl.fail("open", "ESTALE", times=2)
    assert outcome(lambda: open(faultfs.mountpoint / "old", "rb").close()) == "ESTALE"


def test_a_fault_inside_a_large_write_needs_sticky_to_reach_the_writer(faultfs):
    data = os.urandom(4 << 20)  # one write(2), four requests of 1 MiB
    faultfs.ctl.fail("write", "EIO", after=1)
    (faultfs.mountpoint / "plain").write_bytes(data)  # a short write, quietly retried
    assert (faultfs.backing / "plain").read_bytes() == data

    faultfs.ctl.fail("write", "EIO", after=1, sticky=True)
    with pytest.raises(OSError) as raised:
        (faultfs.mountpoint / "sticky").write_bytes(data)
    assert raised.value.errno == errno.EIO
    (faultfs.mountpoint / "next").write_bytes(data)  # a new handle is not broken
    assert (faultfs.backing / "next").read_bytes() == data


def test_readonly_refuses_every_change_with_erofs(faultfs):
    mnt = faultfs.mountpoint
    (mnt / "f").write_bytes(b"x")
    faultfs.ctl.set_readonly(True)
    changes = [
        lambda: (mnt / "g").touch(),
        lambda: open(mnt / "f", "ab").close(),
        lambda: os.unlink(mnt / "f"),
        lambda: os.rename(mnt / "f", mnt / "h"),
        lambda: os.mkdir(mnt / "d"),
        lambda: os.chmod(mnt / "f", 0o600),
    ]
    assert [outcome(change) for change in changes] == ["EROFS"] * len(changes)
    assert (mnt / "f").read_bytes() == b"x"
    faultfs.ctl.set_readonly(False)
    (mnt / "g").touch()


def test_a_read_only_remount_shows_in_statvfs_and_refuses_changes(faultfs):
    (faultfs.mountpoint / "f").write_bytes(b"x")
    faultfs.remount(readonly=True)
    assert os.statvfs(faultfs.mountpoint).f_flag & os.ST_RDONLY
    assert outcome(lambda: (faultfs.mountpoint / "g").touch()) == "EROFS"
    assert (faultfs.mountpoint / "f").read_bytes() == b"x"
    faultfs.remount(readonly=False)
    assert not os.statvfs(faultfs.mountpoint).f_flag & os.ST_RDONLY
    (faultfs.mountpoint / "g").touch()


def test_counts_show_which_operations_were_seen(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.reset_counts()
    with open(mnt / "f", "wb", buffering=0) as f:
        f.write(b"a")
        f.write(b"b")
        os.fsync(f.fileno())
    os.replace(mnt / "f", mnt / "g")
    os.statvfs(mnt)
    counts = faultfs.ctl.counts()
    seen = {op: counts.get(op) for op in ("create", "write", "fsync", "rename", "statfs")}
    assert seen == {"create": 1, "write": 2, "fsync": 1, "rename": 1, "statfs": 1}
    faultfs.ctl.reset_counts()
    assert "write" not in faultfs.ctl.counts()


def test_a_delay_holds_each_matching_write(faultfs):
    rule = faultfs.ctl.delay("write", 0.2, path="/slow")
    start = time.monotonic()
    (faultfs.mountpoint / "slow").write_bytes(b"x")
    assert time.monotonic() - start >= 0.2
    (faultfs.mountpoint / "fast").write_bytes(b"x")
    assert faultfs.ctl.rule(rule)["hits"] == 1


# -- hung calls --------------------------------------------------------------------------------


def test_a_blocked_statfs_hangs_until_released_while_the_rest_is_served(faultfs):
    mnt = faultfs.mountpoint
    rule = faultfs.ctl.block("statfs")
    call = Background(lambda: os.statvfs(mnt))
    faultfs.ctl.wait_blocked(rule)
    assert not call.finished(within=0.3)
    (mnt / "f").write_bytes(b"served meanwhile")
    assert (mnt / "f").read_bytes() == b"served meanwhile"

    faultfs.ctl.remove(rule)
    assert call.finished(within=10)
    assert call.error is None and call.result.f_blocks > 0
    assert faultfs.ctl.rules() == []


def _fsync_path(path: Path) -> None:
    with open(path, "r+b") as f:
        os.fsync(f.fileno())


@pytest.mark.parametrize(
    ("op", "action"),
    [
        ("getattr", os.stat),
        ("create", lambda p: p.write_bytes(b"x")),
        ("write", lambda p: p.write_bytes(b"x")),
        ("fsync", _fsync_path),
    ],
)
def test_any_operation_can_be_blocked_for_one_path(faultfs, op, action):
    mnt = faultfs.mountpoint
    target = mnt / "held" / "target"  # a held create holds its directory: keep it aside
    target.parent.mkdir()
    if op != "create":
        target.write_bytes(b"x")
    rule = faultfs.ctl.block(op, path="/held/target")
    call = Background(lambda: action(target))
    faultfs.ctl.wait_blocked(rule)
    (mnt / "other").write_bytes(b"x")  # another path is not held
    os.stat(mnt / "other")
    assert not call.finished(within=0.1)
    faultfs.ctl.remove(rule)
    assert call.finished(within=10) and call.error is None


def test_stopping_with_every_operation_blocked_releases_and_unmounts(faultfs_factory):
    fs = faultfs_factory()
    rule = fs.ctl.block("*")
    calls = [Background(lambda: os.statvfs(fs.mountpoint)) for _ in range(3)]
    fs.ctl.wait_blocked(rule, count=3)
    fs.stop()
    assert all(call.finished(within=10) for call in calls)
    assert not is_mounted(fs.mountpoint)


def test_stopping_a_frozen_filesystem_process_fails_its_pending_calls(faultfs_factory):
    fs = faultfs_factory()
    rule = fs.ctl.block("statfs")
    call = Background(lambda: os.statvfs(fs.mountpoint))
    fs.ctl.wait_blocked(rule)
    assert fs.proc is not None
    os.kill(fs.proc.pid, signal.SIGSTOP)  # not even the control socket answers now
    fs.stop(timeout=1)
    assert call.finished(within=10)
    assert isinstance(call.error, OSError)
    assert call.error.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    assert not is_mounted(fs.mountpoint)


def test_sigterm_releases_blocked_calls_and_unmounts(faultfs_factory):
    fs = faultfs_factory()
    rule = fs.ctl.block("statfs")
    call = Background(lambda: os.statvfs(fs.mountpoint))
    fs.ctl.wait_blocked(rule)
    assert fs.proc is not None
    fs.proc.send_signal(signal.SIGTERM)
    assert fs.proc.wait(10) == 0
    assert call.finished(within=10) and call.error is None
    assert not is_mounted(fs.mountpoint)


@pytest.mark.mount
def test_the_filesystem_unmounts_itself_when_its_parent_dies(tmp_path):
    require(fuse_problem())
    (tmp_path / "backing").mkdir()
    (tmp_path / "mnt").mkdir()
    parent = (
        "import os, sys\n"
        "from tests.support.faultmount import FaultFS\n"
        "fs = FaultFS(sys.argv[1], sys.argv[2]).start()\n"
        "print(fs.proc.pid, fs.socket_path.parent, flush=True)\n"
        "os._exit(0)\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", parent, str(tmp_path / "backing"), str(tmp_path / "mnt")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pid, rundir = started.stdout.split()

    def gone() -> bool:
        return not is_mounted(tmp_path / "mnt") and not os.path.exists(f"/proc/{pid}")

    try:
        deadline = time.monotonic() + 60
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone()
    finally:
        if not gone():  # leave nothing behind even when failing
            os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["umount", "-l", str(tmp_path / "mnt")], check=False)
        shutil.rmtree(rundir, ignore_errors=True)


@pytest.mark.mount
def test_a_forgotten_block_lets_go_after_max_block_and_says_so(tmp_path):
    require(fuse_problem())
    (tmp_path / "backing").mkdir()
    (tmp_path / "mnt").mkdir()
    with FaultFS(tmp_path / "backing", tmp_path / "mnt", max_block=0.5) as fs:
        rule = fs.ctl.block("statfs")
        call = Background(lambda: os.statvfs(fs.mountpoint))
        assert call.finished(within=10) and call.error is None
        assert fs.ctl.rule(rule)["hits"] == 1
    assert any("forget to remove" in line for line in fs.problems())


# -- quota -------------------------------------------------------------------------------------


def test_a_byte_hard_limit_may_be_reached_but_not_crossed(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.set_quota("bytes", hard=64 * 1024)
    with open(mnt / "f", "wb", buffering=0) as f:
        f.write(b"x" * (64 * 1024))
        assert outcome(lambda: f.write(b"x")) == "EDQUOT"
        f.seek(0)
        f.write(b"overwriting needs no new space")
    usage = faultfs.ctl.quota()["bytes"]
    assert (usage["used"], usage["state"]) == (64 * 1024, "hard_reached")
    (mnt / "empty").touch()  # a file of 0 bytes still fits
    os.truncate(mnt / "f", 1000)
    (mnt / "g").write_bytes(b"y" * (63 * 1024))
    assert faultfs.ctl.quota()["bytes"]["used"] == 1000 + 63 * 1024


def test_an_inode_hard_limit_counts_files_directories_and_symlinks(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.set_quota("inodes", hard=3)
    (mnt / "d").mkdir()
    (mnt / "d" / "a").touch()
    (mnt / "b").touch()
    refused = [
        outcome(lambda: (mnt / "c").touch()),
        outcome(lambda: (mnt / "e").mkdir()),
        outcome(lambda: os.symlink("b", mnt / "l")),
    ]
    assert refused == ["EDQUOT"] * 3
    os.link(mnt / "b", mnt / "b2")  # a hard link is no new inode
    assert faultfs.ctl.quota()["inodes"]["used"] == 3
    assert faultfs.ctl.quota()["inodes"]["state"] == "hard_reached"
    os.unlink(mnt / "b")  # its other name still holds the inode
    assert outcome(lambda: (mnt / "c").touch()) == "EDQUOT"
    os.unlink(mnt / "b2")
    (mnt / "c").touch()


def test_soft_limit_grace_runs_then_expires_then_resets(faultfs):
    mnt = faultfs.mountpoint
    # A grace long enough for the quota read and the write within it on a loaded machine
    faultfs.ctl.set_quota("bytes", soft=1000, grace=3)
    with open(mnt / "f", "wb", buffering=0) as f:
        f.write(b"x" * 1000)  # at the soft limit is not above it
        assert faultfs.ctl.quota()["bytes"]["grace_start"] is None
        f.write(b"x")
        usage = faultfs.ctl.quota()["bytes"]
        assert usage["state"] == "soft_exceeded"
        assert usage["grace_expires_at"] == usage["grace_start"] + 3
        f.write(b"x")  # within the grace, growth is allowed
        deadline = time.monotonic() + 60
        while faultfs.ctl.quota()["bytes"]["state"] != "grace_expired":
            assert time.monotonic() < deadline, "the grace never expired"
            time.sleep(0.05)
        assert outcome(lambda: f.write(b"x")) == "EDQUOT"
        f.seek(0)
        f.write(b"y" * 10)  # overwriting is no growth
    os.truncate(mnt / "f", 500)
    usage = faultfs.ctl.quota()["bytes"]
    assert (usage["state"], usage["grace_start"]) == ("ok", None)
    (mnt / "g").write_bytes(b"z" * 400)


def test_a_zero_grace_expires_as_soon_as_the_soft_limit_is_crossed(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.set_quota("inodes", soft=1, grace=0)
    (mnt / "a").touch()
    (mnt / "b").touch()  # the crossing itself is allowed
    assert faultfs.ctl.quota()["inodes"]["state"] == "grace_expired"
    assert outcome(lambda: (mnt / "c").touch()) == "EDQUOT"


def test_limits_change_and_lift_at_run_time(faultfs):
    mnt = faultfs.mountpoint
    faultfs.ctl.set_quota("bytes", hard=10)
    assert outcome(lambda: (mnt / "f").write_bytes(b"x" * 11)) == "EDQUOT"
    faultfs.ctl.set_quota("bytes", hard=None)
    (mnt / "f").write_bytes(b"x" * 11)
    usage = faultfs.ctl.set_quota("bytes", soft=5)["bytes"]  # below usage: the timer starts
    assert (usage["state"], usage["hard"]) == ("soft_exceeded", None)
    assert usage["grace_start"] is not None
    faultfs.ctl.lift_quota()
    usage = faultfs.ctl.quota()["bytes"]
    assert (usage["soft"], usage["hard"], usage["state"]) == (None, None, "ok")


def test_usage_is_tracked_through_every_kind_of_change_and_matches_a_rescan(faultfs):
    mnt, d = faultfs.mountpoint, faultfs.mountpoint / "d"
    d.mkdir()
    (d / "a").write_bytes(b"a" * 1000)
    (d / "b").write_bytes(b"b" * 500)
    os.replace(d / "b", d / "a")  # the replaced file is freed
    os.link(d / "a", d / "hard")
    os.unlink(d / "a")  # still linked: nothing freed
    os.truncate(d / "hard", 2000)
    (d / "hard").write_bytes(b"h" * 123)  # O_TRUNC, then 123 bytes
    os.symlink("hard", d / "s")
    (d / "e").mkdir()
    (d / "e").rmdir()
    with open(mnt / "appended", "ab") as f:
        f.write(b"1234")
    tracked = faultfs.ctl.quota()
    expected = {"bytes": 123 + 4, "inodes": 4}  # d, hard, s, appended
    assert {r: tracked[r]["used"] for r in ("bytes", "inodes")} == expected
    rescanned = faultfs.ctl.rescan()
    assert {r: rescanned[r]["used"] for r in ("bytes", "inodes")} == expected
    assert scan_usage(str(faultfs.backing)) == (127, 4)


def test_quota_reply_has_the_documented_shape(faultfs):
    reply = faultfs.ctl.quota()
    assert set(reply) == {"bytes", "inodes", "now"}
    keys = {"used", "soft", "hard", "grace", "grace_start", "grace_expires_at", "state"}
    assert set(reply["bytes"]) == keys and set(reply["inodes"]) == keys
    assert reply["bytes"]["grace"] == 7 * 24 * 3600
    assert abs(reply["now"] - time.time()) < 60


def test_quota_rules_on_a_fake_clock():
    now = [1000.0]
    quota = Quota(clock=lambda: now[0])
    quota.configure("bytes", soft=100, hard=200, grace=60)
    quota.charge(nbytes=150)
    assert quota.to_dict()["bytes"]["grace_start"] == 1000.0
    now[0] = 1059.0
    quota.check(nbytes=50)  # 59 s into a 60 s grace
    with pytest.raises(OSError) as raised:
        quota.check(nbytes=51)  # past the hard limit
    assert raised.value.errno == errno.EDQUOT
    now[0] = 1060.0
    assert quota.to_dict()["bytes"]["state"] == "grace_expired"
    with pytest.raises(OSError):
        quota.check(nbytes=1)
    quota.check(nbytes=-10)  # shrinking always passes
    quota.release(nbytes=60)
    usage = quota.to_dict()["bytes"]
    assert (usage["used"], usage["state"], usage["grace_start"]) == (90, "ok", None)
    with pytest.raises(ValueError):
        quota.configure("bytes", grace=None)


# -- statfs and the control channel ------------------------------------------------------------


def test_statfs_reports_the_numbers_set_and_passes_through_otherwise(faultfs):
    mnt = faultfs.mountpoint
    assert os.statvfs(mnt).f_blocks == os.statvfs(faultfs.backing).f_blocks
    faultfs.ctl.set_statfs(
        f_frsize=4096, f_blocks=1000, f_bfree=100, f_bavail=50, f_files=200, f_ffree=20
    )
    st = os.statvfs(mnt)
    numbers = (st.f_frsize, st.f_blocks, st.f_bfree, st.f_bavail, st.f_files, st.f_ffree)
    assert numbers == (4096, 1000, 100, 50, 200, 20)
    assert st.f_favail == 20
    assert faultfs.ctl.statfs()["f_bavail"] == 50
    faultfs.ctl.set_statfs()
    assert os.statvfs(mnt).f_blocks == os.statvfs(faultfs.backing).f_blocks
    assert faultfs.ctl.counts()["statfs"] == 3


def test_the_filesystem_runs_on_libfuse_3_even_where_libfuse_2_is_installed(faultfs):
    """mfusepy prefers libfuse.so.2 when both are installed, and every mount then fails; the
    launcher pins libfuse 3 and the filesystem refuses anything else (.ci/run installs
    libfuse2 beside libfuse3, so CI proves it)."""
    assert faultfs.ctl.ping()["libfuse"].startswith("3.")


def test_control_protocol_is_json_lines_over_a_unix_socket(faultfs):
    requests = [
        {"cmd": "quota"},
        {"cmd": "no-such-command"},
        {"cmd": "fail", "op": "wrte", "errno": "EIO"},
        {"cmd": "fail", "op": "write", "errno": "ENOTANERRNO"},
        {"cmd": "set_quota", "resource": "bytes", "hard": -1},
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(faultfs.socket_path))
        stream = sock.makefile("rwb")
        replies = []
        for request in [*requests, "not json"]:
            stream.write(json.dumps(request).encode() + b"\n")
            stream.flush()
            replies.append(json.loads(stream.readline()))
    assert replies[0]["ok"] is True and "bytes" in replies[0]["result"]
    assert [reply["ok"] for reply in replies[1:]] == [False] * 5
    assert "unknown command" in replies[1]["error"]
    assert "unknown operation" in replies[2]["error"]
    with pytest.raises(FaultControlError, match="no rule with id"):
        faultfs.ctl.remove(12345)


def test_rule_validation_catches_typos_before_they_silently_match_nothing():
    faults = Faults()
    for bad in [
        {"action": "fail", "op": "wirte", "errno": "EIO"},
        {"action": "fail", "op": "write"},
        {"action": "delay", "op": "write", "seconds": 0},
        {"action": "block", "op": "statfs", "times": 0},
        {"action": "block", "op": "statfs", "errno": "EIO"},
        {"action": "explode", "op": "write"},
    ]:
        with pytest.raises(ValueError):
            faults.add(**bad)
    assert faults.add("fail", "fsync*", errno=5).op == "fsync*"  # a glob is not checked


# -- real writers ------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_save_works_and_its_failure_looks_as_in_the_field(faultfs):
    import torch

    mnt = faultfs.mountpoint
    state = {"w": torch.randn(256, 1024), "step": 7}
    torch.save(state, mnt / "ok.pt")
    loaded = torch.load(mnt / "ok.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7

    faultfs.ctl.fail("write", "EIO", path="/bad*", times=None)
    with pytest.raises(RuntimeError, match=r"file write failed|unexpected pos"):
        torch.save(state, mnt / "bad.pt")  # std::ofstream: the errno is lost
    with pytest.raises(Exception) as raised, open(mnt / "bad2.pt", "wb") as f:
        torch.save(state, f)  # a Python file object: the OSError survives, maybe one level down
    chain = [raised.value, raised.value.__context__, raised.value.__cause__]
    assert any(isinstance(e, OSError) and e.errno == errno.EIO for e in chain)
