"""Filesystems that report odd statvfs numbers, to a real `fsprobe check` and a real daemon
(issue 17.1): zero blocks, a zero block size, zero inodes (autofs roots, /proc, FUSE mounts
without a real statfs), more free than the size, sizes far beyond any real filesystem.

Each gives a verdict: a capacity reported as zero is `capacity_unknown` for that resource,
never a division (on main: a ZeroDivisionError traceback and exit 1, "degraded", for a job
script's `fsprobe check "$CKPT" --need 120G || exit`; in the daemon, a dead scheduler).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.cli.test_check_faults import check_json
from tests.support.daemon_process import DaemonProcess, fast_config, run_fsprobe


def codes(report: dict) -> list[str]:
    return [reason["code"] for reason in report["reasons"]]


@pytest.mark.parametrize(
    ("fields", "unknown"),
    [
        ({"f_blocks": 0, "f_bavail": 0, "f_bfree": 0}, "space"),
        ({"f_frsize": 0, "f_bsize": 0}, "space"),  # FUSE takes f_bsize for a 0 f_frsize
        ({"f_files": 0, "f_ffree": 0}, "inodes"),
        ({"f_blocks": 0, "f_bavail": 0, "f_bfree": 0, "f_files": 0, "f_ffree": 0}, "both"),
    ],
    ids=["zero-blocks", "zero-frsize", "zero-inodes", "nothing"],
)
def test_check_of_a_capacity_reported_as_zero_says_unknown_and_never_divides(
    faultfs, fields, unknown
):
    faultfs.ctl.set_statfs(**fields)
    numbers = os.statvfs(faultfs.mountpoint)
    code, report = check_json(faultfs.mountpoint, "--need", "1M")
    assert code in (0, 3), report  # the test write works: not degraded, never a crash
    assert codes(report).count("capacity_unknown") == (2 if unknown == "both" else 1)
    headroom = report["headroom"]
    if unknown in ("space", "both"):
        assert numbers.f_blocks * numbers.f_frsize == 0  # what the kernel passed on
        assert headroom["bytes"] is None and headroom["bytes_ratio"] is None
        assert report["fits"] is None  # a size cannot be said to fit into an unknown
    if unknown in ("inodes", "both"):
        assert headroom["inodes"] is None and headroom["inodes_ratio"] is None
    if unknown == "inodes":
        assert code == 0 and headroom["bytes_ratio"] is not None


def test_check_of_free_above_size_and_huge_numbers_is_judged(faultfs):
    faultfs.ctl.set_statfs(
        f_frsize=1 << 20,
        f_bsize=1 << 20,
        f_blocks=1 << 40,
        f_bavail=1 << 41,
        f_bfree=1 << 41,
        f_files=2**63,
        f_ffree=2**64 - 1,
    )
    code, report = check_json(faultfs.mountpoint)
    assert code == 0, report
    assert report["headroom"]["bytes_ratio"] == 1.0
    assert report["headroom"]["inodes_ratio"] == 1.0
    assert report["filesystem"]["size_bytes"] == (1 << 40) * (1 << 20)


@pytest.mark.parametrize("path", ["/proc", "/sys"])
def test_check_of_a_pseudo_filesystem_is_no_crash_and_not_degraded(path):
    code, out, err = run_fsprobe("check", path)
    assert "Traceback" not in out + err
    assert code in (2, 3), out + err  # nothing writable there, or nothing measured
    assert "capacity_unknown" in out
    code, out, err = run_fsprobe("check", path, "--no-write-probe")
    assert (code, out.split()[0]) == (3, "UNKNOWN"), out + err


def test_a_daemon_watching_a_mount_without_capacity_keeps_probing_every_target(tmp_path, faultfs):
    odd, plain = faultfs.mountpoint / "ckpt", tmp_path / "plain"
    odd.mkdir()
    plain.mkdir()
    faultfs.ctl.set_statfs(f_frsize=0, f_bsize=0)
    config = fast_config(tmp_path / "fsprobe.toml", odd, plain)
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(plain))
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=str(odd))  # the write works
        assert daemon.value("fsprobe_headroom_ratio", path=str(odd), resource="bytes") is None
        assert daemon.value("fsprobe_headroom_ratio", path=str(odd), resource="inodes")
        stamp = "fsprobe_probe_last_success_timestamp_seconds"
        before = {p: daemon.value(stamp, path=str(p), probe="statvfs") for p in (odd, plain)}
        deadline = time.monotonic() + 60  # both still probed: the scheduler lives
        while not all(
            daemon.value(stamp, path=str(target), probe="statvfs") > before[target]
            for target in (odd, plain)
        ):
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
        code, out, _ = run_fsprobe("status", "--state-dir", str(daemon.state_dir))
        assert code == 0 and "capacity_unknown" in out, out
        assert "Traceback" not in daemon.log()
