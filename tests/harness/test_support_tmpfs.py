"""The tmpfs helper gives real ENOSPC and real inode exhaustion; the mount fixtures skip or fail
as the machine allows."""

from __future__ import annotations

import errno
import os

import pytest

from tests.support.capability import REQUIRE_ENV, require, tmpfs_problem
from tests.support.mountinfo import is_mounted
from tests.support.tmpfs import Tmpfs, fill_bytes, fill_inodes, free_bytes, inode_fraction_used


def test_writing_past_size_is_a_real_enospc(tmpfs):
    fs = tmpfs(size="256k")
    with open(fs.path / "f", "wb") as f:
        f.write(b"x" * (128 * 1024))
        f.flush()
        with pytest.raises(OSError) as raised:
            f.write(b"x" * (256 * 1024))
            f.flush()
    assert raised.value.errno == errno.ENOSPC


def test_nr_inodes_counts_the_root_and_then_runs_out(tmpfs):
    fs = tmpfs(nr_inodes=16)
    st = os.statvfs(fs.path)
    assert (st.f_files, st.f_ffree) == (16, 15)
    for i in range(15):
        (fs.path / f"f{i}").touch()
    with pytest.raises(OSError) as raised:
        (fs.path / "one-too-many").touch()
    assert raised.value.errno == errno.ENOSPC
    assert os.statvfs(fs.path).f_ffree == 0


def test_fill_inodes_reaches_the_fraction_and_returns_what_it_made(tmpfs):
    fs = tmpfs(nr_inodes=100)
    created = fill_inodes(fs.path, 0.93)
    assert 0.93 <= inode_fraction_used(fs.path) < 0.94
    assert len(created) == 92  # 93 in use, the root being one of them
    assert sorted(os.listdir(fs.path)) == sorted(p.name for p in created)
    for path in created:
        path.unlink()
    assert os.statvfs(fs.path).f_ffree == 99


def test_fill_inodes_to_the_full_leaves_no_inode(tmpfs):
    fs = tmpfs(nr_inodes=20)
    created = fill_inodes(fs.path, 1.0)
    assert len(created) == 19
    with pytest.raises(OSError) as raised:
        (fs.path / "x").touch()
    assert raised.value.errno == errno.ENOSPC


def test_fill_bytes_leaves_exactly_what_was_asked(tmpfs):
    fs = tmpfs(size="1M")
    filler = fill_bytes(fs.path, leave_free=64 * 1024)
    assert free_bytes(fs.path) == 64 * 1024
    (fs.path / "fits").write_bytes(b"x" * (32 * 1024))
    with pytest.raises(OSError) as raised:
        (fs.path / "does-not").write_bytes(b"x" * (128 * 1024))
    assert raised.value.errno == errno.ENOSPC
    filler.unlink()
    assert free_bytes(fs.path) > 900 * 1024


def test_fill_bytes_to_zero_fills_the_filesystem(tmpfs):
    fs = tmpfs(size="512k")
    fill_bytes(fs.path)
    assert free_bytes(fs.path) == 0


@pytest.mark.mount
def test_unmount_is_lazy_when_the_mount_is_busy():
    require(tmpfs_problem())
    fs = Tmpfs(size="64k")
    path = fs.mount()
    try:
        (path / "f").write_bytes(b"still readable")
        busy = open(path / "f", "rb")  # noqa: SIM115 - held open across the unmount on purpose
    except BaseException:
        fs.unmount()
        raise
    with busy:
        fs.unmount()
        assert not is_mounted(path)
        assert not path.exists()
        assert busy.read() == b"still readable"


def test_mount_fixtures_mark_their_tests(tmpfs, request):
    assert request.node.get_closest_marker("mount") is not None


def test_require_skips_by_default_and_fails_when_mount_tests_are_required(monkeypatch):
    require(None)  # no problem: nothing happens
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no /dev/fuse"):
        require("no /dev/fuse")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="no /dev/fuse"):
        require("no /dev/fuse")
