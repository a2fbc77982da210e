"""`fsprobe check` on a forced-Lustre target: the fake `lfs` reads the fault filesystem's quota.

The fault filesystem enforces the quota (EDQUOT) and the fake `lfs` prints that same quota in
the format of a real Lustre version, so what fsprobe parses, what the write probe meets and what
the filesystem holds must agree.
"""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from tests.support.cli import check_json
from tests.support.fakes.fake_lfs import fake_lfs_for, is_fake_process

VERSIONS = ["2.12", "2.14", "2.15", "2.16", "2.17"]
# Tests run as root, and lfs shows root's limits as 0 ("no limit"): ask as an ordinary user.
AS_USER = ["--user", "1000", "--group", "1000"]


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def entry(report, kind):
    (found,) = [q for q in report["quota"] if q["type"] == kind]
    return found


def create_files(directory, count):
    for index in range(count):
        (directory / f"shard-{index:04d}.bin").write_bytes(b"x" * 1000)


@pytest.mark.parametrize("version", VERSIONS)
def test_quota_shows_what_the_filesystem_really_holds(faultfs, fake_lfs, version):
    fake_lfs.configure(version=version, control=faultfs.ctl.socket_path, project=4242)
    faultfs.ctl.set_quota("bytes", hard=64 * 1024 * 1024)
    faultfs.ctl.set_quota("inodes", hard=10_000)
    create_files(faultfs.mountpoint, 25)
    (faultfs.mountpoint / "model.pt").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    code, report = check_json(
        faultfs.mountpoint, "--quota-provider", "lfs", "--no-write-probe", *AS_USER
    )
    held = faultfs.ctl.quota()
    assert code == 0, report["reasons"]
    assert {q["type"] for q in report["quota"]} == {"user", "group", "project"}
    project = entry(report, "project")
    assert project["id"] == 4242
    # lfs prints KiB rounded up; inodes exactly.
    assert project["bytes"]["used"] == math.ceil(held["bytes"]["used"] / 1024) * 1024
    assert project["inodes"]["used"] == held["inodes"]["used"]
    assert project["bytes"]["hard"] == 64 * 1024 * 1024
    assert project["inodes"]["hard"] == 10_000
    assert report["probes"]["quota"]["ok"] is True
    assert report["lustre_targets"], "lfs df found no MDT/OST"


@pytest.mark.parametrize("version", ["2.12", "2.16"])
def test_project_inode_quota_past_93_percent_degrades_then_edquot_is_unhealthy(
    faultfs, fake_lfs, version
):
    """The field case of docs/design.md §1, on a forced-Lustre target, then the write that fails."""
    fake_lfs.configure(
        version=version, control=faultfs.ctl.socket_path, project=4242, limited_types="project"
    )
    faultfs.ctl.set_quota("inodes", hard=100)
    create_files(faultfs.mountpoint, 94 - faultfs.ctl.quota()["inodes"]["used"])
    assert faultfs.ctl.quota()["inodes"]["used"] == 94

    code, report = check_json(faultfs.mountpoint, "--quota-provider", "lfs", *AS_USER)
    assert code == 1, report["reasons"]
    assert report["status"] == "degraded"
    assert report["headroom"]["inodes_limited_by"] == "quota:project"
    assert report["headroom"]["inodes"] == 6
    (reason,) = report["reasons"]
    assert reason["code"] == "inode_headroom_low"
    assert reason["message"] == "inodes: 94 % used under the project quota, only 6 (6.0 %) left"
    assert report["write_probe"]["ok"] is True

    create_files(faultfs.mountpoint, 100)  # fills to the hard limit; the rest get EDQUOT
    code, report = check_json(faultfs.mountpoint, "--quota-provider", "lfs", *AS_USER)
    assert code == 2
    assert report["write_probe"]["errno"] == "EDQUOT"
    codes = {(r["code"], r["severity"]) for r in report["reasons"]}
    assert ("write_failed", "unhealthy") in codes
    assert ("quota_hard_reached", "unhealthy") in codes
    assert report["headroom"]["inodes"] == 0


def test_a_hung_lfs_is_killed_at_the_timeout_with_its_children(faultfs, fake_lfs):
    """A hung lfs costs the deadline, not more: measured against the same command with a
    healthy lfs just before and after (interpreter start-up on a loaded machine cancels out;
    a deadline waited twice still fails)."""
    deadline, slack = 3.0, 1.5
    command = (faultfs.mountpoint, "--quota-provider", "lfs", "--timeout", str(deadline))

    def timed() -> tuple[float, int, dict]:
        start = time.monotonic()
        code, report = check_json(*command)
        return time.monotonic() - start, code, report

    fake_lfs.configure(control=faultfs.ctl.socket_path)
    before, _, _ = timed()
    fake_lfs.configure(control=faultfs.ctl.socket_path, fail="hang")
    elapsed, code, report = timed()
    pids = fake_lfs.pids()
    fake_lfs.configure(control=faultfs.ctl.socket_path)
    after, _, _ = timed()
    healthy = max(before, after)
    assert elapsed < healthy + deadline + slack, (
        f"check took {elapsed:.1f} s with a hung lfs, {healthy:.1f} s with a healthy one"
    )
    assert report["probes"]["quota"]["error"] == "TIMEOUT"
    assert ("quota_unavailable", "degraded") in {
        (r["code"], r["severity"]) for r in report["reasons"]
    }
    assert code == 1
    assert pids, "the fake lfs never started"
    deadline = time.monotonic() + 60
    while any(is_fake_process(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_fake_process(pid) for pid in pids), "lfs or its child survived"


def test_lfs_missing_is_a_clear_degraded_answer(faultfs, tmp_path):
    code, report = check_json(
        faultfs.mountpoint, "--quota-provider", "lfs", "--lfs", str(tmp_path / "no-lfs")
    )
    assert code == 1
    quota = report["probes"]["quota"]
    assert quota["error"] == "ENOENT"
    assert "FSPROBE_LFS" in quota["message"]


def test_an_lfs_before_210_is_called_too_old_naming_both_versions(faultfs, fake_lfs):
    fake_lfs.configure(version="2.9", control=faultfs.ctl.socket_path)
    code, report = check_json(
        faultfs.mountpoint, "--quota-provider", "lfs", "--no-write-probe", *AS_USER
    )
    assert code == 1
    quota = report["probes"]["quota"]
    assert quota["error"] == "EOPNOTSUPP"
    assert "lfs 2.9.0 is older than fsprobe supports" in quota["message"]
    assert "lfs 2.10 and later" in quota["message"]
    assert "fewer than 8 cells" not in json.dumps(report)
