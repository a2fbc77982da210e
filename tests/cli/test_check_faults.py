"""`fsprobe check` on filesystems that fail for real: a FUSE fault filesystem and tiny tmpfs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import fsprobe
from tests.support.tmpfs import fill_bytes, fill_inodes


def check_json(path, *args, env=None, timeout=60):
    """Run the real CLI in a child process, as a job script would."""
    completed = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(path), "--json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(path), **(env or {})},
        timeout=timeout,
    )
    assert completed.stdout, completed.stderr
    return completed.returncode, json.loads(completed.stdout)


def reason_codes(report):
    return {(r["code"], r["severity"]) for r in report["reasons"]}


# -- FUSE: a hung mount, failing writes, an enforced quota -----------------------------------


def timed_check(path, *args) -> tuple[float, int, dict]:
    start = time.monotonic()
    code, report = check_json(path, *args)
    return time.monotonic() - start, code, report


def test_blocked_statfs_answers_within_the_timeout_with_mount_stuck(faultfs):
    """A hung mount costs the deadline, not more: the check answers within --timeout of what
    the same command takes on the healthy mount, measured just before and just after (that
    absorbs interpreter start-up on a loaded machine; a deadline waited twice still fails)."""
    deadline, slack = 2.0, 1.0
    before, _, _ = timed_check(faultfs.mountpoint, "--timeout", str(deadline))
    rule = faultfs.ctl.block("statfs")
    elapsed, code, report = timed_check(faultfs.mountpoint, "--timeout", str(deadline))
    assert faultfs.ctl.rule(rule)["waiting"] >= 1  # the statfs really is being held
    faultfs.ctl.remove(rule)
    after, _, _ = timed_check(faultfs.mountpoint, "--timeout", str(deadline))
    healthy = max(before, after)
    assert elapsed < healthy + deadline + slack, (
        f"check took {elapsed:.1f} s on a hung mount, {healthy:.1f} s on a healthy one"
    )
    assert code == 2
    assert report["status"] == "unhealthy"
    assert ("mount_stuck", "unhealthy") in reason_codes(report)
    assert report["probes"]["statvfs"]["stuck"] is True
    assert report["filesystem"] is None


@pytest.mark.parametrize("name", ["EIO", "ESTALE", "ENOSPC"])
def test_failed_writes_are_write_failed_with_the_errno_name(faultfs, name):
    faultfs.ctl.fail("write", name, times=None)
    code, report = check_json(faultfs.mountpoint)
    probe = report["write_probe"]
    assert probe["ok"] is False
    assert (probe["step"], probe["errno"]) == ("write", name)
    severity = "unhealthy" if name == "ENOSPC" else "degraded"
    assert ("write_failed", severity) in reason_codes(report)
    assert code == (2 if name == "ENOSPC" else 1)
    assert os.listdir(faultfs.mountpoint) == []  # the probe file was removed


def test_failure_at_fsync_names_the_step(faultfs):
    faultfs.ctl.fail("fsync", "EIO")
    _, report = check_json(faultfs.mountpoint)
    assert (report["write_probe"]["step"], report["write_probe"]["errno"]) == ("fsync", "EIO")
    assert os.listdir(faultfs.mountpoint) == []


def test_enforced_quota_shows_up_as_edquot(faultfs):
    faultfs.ctl.set_quota("bytes", hard=512 * 1024)
    code, report = check_json(faultfs.mountpoint)
    assert code == 2
    assert report["write_probe"]["errno"] == "EDQUOT"
    assert report["write_probe"]["step"] == "write"
    assert ("write_failed", "unhealthy") in reason_codes(report)
    assert "Disk quota exceeded" in report["write_probe"]["message"]
    assert faultfs.ctl.quota()["bytes"]["used"] == 0  # nothing left behind counts against it


def test_the_probe_never_touches_files_it_did_not_create(faultfs):
    keep = faultfs.mountpoint / "checkpoint.pt"
    keep.write_bytes(b"weights")
    faultfs.ctl.fail("rename", "EIO")
    _, report = check_json(faultfs.mountpoint)
    assert report["write_probe"]["step"] == "rename"
    assert sorted(os.listdir(faultfs.mountpoint)) == ["checkpoint.pt"]
    assert keep.read_bytes() == b"weights"


# -- tmpfs: real ENOSPC, real inode exhaustion -----------------------------------------------


def test_headroom_equals_what_statvfs_says(tmpfs):
    fs = tmpfs(size="4M", nr_inodes=200)
    (fs.path / "a").write_bytes(b"x" * 100_000)
    code, report = check_json(fs.path, "--no-write-probe")
    st = os.statvfs(fs.path)
    assert report["headroom"]["bytes"] == st.f_bavail * st.f_frsize
    assert report["headroom"]["inodes"] == st.f_favail
    assert report["filesystem"]["files_free"] == st.f_favail
    assert report["filesystem"]["size_bytes"] == st.f_blocks * st.f_frsize
    assert report["filesystem"]["fstype"] == "tmpfs"
    assert report["filesystem"]["mountpoint"] == str(fs.path)
    assert report["headroom"]["inodes_ratio"] == pytest.approx(st.f_favail / st.f_files)
    assert code == 0


@pytest.mark.parametrize(("fraction", "status"), [(0.95, "degraded"), (0.98, "unhealthy")])
def test_inode_exhaustion_degrades_then_turns_unhealthy(tmpfs, fraction, status):
    fs = tmpfs(size="4M", nr_inodes=1000)
    fill_inodes(fs.path, fraction)
    code, report = check_json(fs.path)
    assert report["status"] == status
    assert code == {"degraded": 1, "unhealthy": 2}[status]
    assert ("inode_headroom_low", status) in reason_codes(report)
    assert report["write_probe"]["ok"] is True  # still writable, just nearly out of inodes


def test_full_tmpfs_fails_the_write_probe_with_enospc(tmpfs):
    fs = tmpfs(size="2M", nr_inodes=1000)
    fill_bytes(fs.path)
    code, report = check_json(fs.path)
    assert code == 2
    assert report["write_probe"]["errno"] == "ENOSPC"
    assert ("write_failed", "unhealthy") in reason_codes(report)
    assert ("space_headroom_low", "unhealthy") in reason_codes(report)
    assert sorted(os.listdir(fs.path)) == [".fill-bytes"]


def test_the_field_case_93_percent_of_the_inode_quota_is_degraded(tmpfs):
    """docs/design.md §1: a project at 79 % of its space quota and 93 % of its inode quota.

    Reproduced with a tmpfs whose inode count plays the quota: 1000 inodes, 930 in use.
    """
    fs = tmpfs(size="10M", nr_inodes=1000)
    fill_inodes(fs.path, 0.93)
    filler = fs.path / "data"
    filler.write_bytes(os.urandom(int(0.79 * 10 * 1024 * 1024) - 4096 * 940))
    code, report = check_json(fs.path, "--need", "64K")
    st = os.statvfs(fs.path)
    assert code == 1
    assert report["status"] == "degraded"
    (reason,) = report["reasons"]
    assert reason["code"] == "inode_headroom_low"
    assert reason["severity"] == "degraded"
    left = st.f_favail
    assert reason["message"] == (
        f"inodes: {round(100 * (1 - left / st.f_files))} % used on the filesystem, "
        f"only {left} ({100 * left / st.f_files:.1f} %) left"
    )
    assert report["fits"] is True


def test_a_target_that_does_not_exist_yet_is_judged_by_its_parent(tmpfs):
    fs = tmpfs(size="4M", nr_inodes=100)
    code, report = check_json(fs.path / "run-7" / "ckpt", env={"TMPDIR": str(fs.path)})
    assert code == 0, report["reasons"]
    assert report["filesystem"]["probed_path"] == str(fs.path)
    assert report["write_probe"]["ok"] is True
    assert os.listdir(fs.path) == []


def test_python_api_matches_the_cli(tmpfs, monkeypatch):
    fs = tmpfs(size="4M", nr_inodes=100)
    monkeypatch.setenv("TMPDIR", str(fs.path))
    report = fsprobe.check(
        str(fs.path), fsprobe.ProbeSettings(write_probe=False), need_bytes=8 * 1024 * 1024
    )
    assert report.fits is False
    assert report.status.label == "unhealthy"
    assert report.to_dict()["reasons"][0]["code"] == "space_headroom_low"
