"""The policy where one rule meets another: several reasons at once, headroom bound by different
limits for bytes and inodes, ties, filesystems without an inode count, and the details a
message promises (which step was slow, which storage target is full, what quota said).

Each test is there because a small change to the policy (found by tests/support/mutation) left every
other test green.
"""

from __future__ import annotations

import math

import pytest

from fsprobe.model import (
    FilesystemInfo,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Severity,
    Status,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.policy import Policy
from tests.support.policy import NOW, filesystem_info, judge, probe


def filesystem(avail=500, size=1000, files=1000, files_free=900) -> FilesystemInfo:
    return filesystem_info(avail, size, files, files_free)


def project(bytes_=None, inodes=None) -> QuotaReport:
    entry = QuotaEntry("project", 7, None, bytes_ or QuotaUsage(0), inodes or QuotaUsage(0))
    return QuotaReport("lfs", (entry,))


def message(verdict, code: str) -> str:
    (reason,) = [r for r in verdict.reasons if r.code == code]
    return reason.message


# -- several reasons: the worst decides ------------------------------------------------------


def test_the_worst_reason_decides_the_status_whatever_else_is_found():
    slow_write = WriteProbeResult(True, 1 << 20, {"fsync": 6.0, "total": 6.0})
    verdict = judge(
        probe("statvfs", filesystem(avail=20)),  # 2 %: unhealthy
        probe("write", slow_write),  # 6 s: degraded
        probe("tmpdir", TmpdirInfo("/tmp", False)),  # a notice
    )
    severities = {r.severity for r in verdict.reasons}
    assert severities == {Severity.UNHEALTHY, Severity.DEGRADED, Severity.NOTICE}
    assert verdict.status is Status.UNHEALTHY
    assert verdict.reasons[0].severity is Severity.UNHEALTHY  # worst first


def test_a_notice_beside_a_degraded_reason_leaves_it_degraded():
    verdict = judge(
        probe("statvfs", filesystem(avail=50)), probe("tmpdir", TmpdirInfo("/tmp", False))
    )
    assert verdict.status is Status.DEGRADED


# -- which limit binds -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fs", "quota", "limited_by"),
    [
        # inodes scarcer (5 % of the project's inodes) than bytes (50 % of the filesystem)
        (filesystem(), project(inodes=QuotaUsage(95, hard=100)), "quota:project"),
        # bytes scarcer (5 % of the project's bytes) than inodes (90 % of the filesystem)
        (filesystem(), project(bytes_=QuotaUsage(95, hard=100)), "quota:project"),
        # equal ratios (50 % of the filesystem's bytes, 50 % of the project's inodes): bytes
        (filesystem(avail=500), project(inodes=QuotaUsage(50, hard=100)), "filesystem"),
    ],
    ids=["inodes-scarcer", "bytes-scarcer", "tie"],
)
def test_limited_by_names_the_limit_of_the_scarcer_resource(fs, quota, limited_by):
    headroom = judge(probe("statvfs", fs), probe("quota", quota)).headroom
    assert headroom.limited_by == limited_by


def test_limited_by_follows_inodes_when_bytes_are_plenty_on_another_limit():
    quota = project(inodes=QuotaUsage(95, hard=100))
    headroom = judge(probe("statvfs", filesystem()), probe("quota", quota)).headroom
    assert (headroom.bytes_limited_by, headroom.inodes_limited_by) == (
        "filesystem",
        "quota:project",
    )
    assert headroom.limited_by == "quota:project"


def test_limited_by_with_only_one_resource_known():
    no_inode_count = judge(probe("statvfs", filesystem(files=0, files_free=0))).headroom
    assert no_inode_count.inodes_ratio is None and no_inode_count.limited_by == "filesystem"
    only_inodes = judge(probe("quota", project(inodes=QuotaUsage(50, hard=100)))).headroom
    assert only_inodes.bytes_ratio is None and only_inodes.limited_by == "quota:project"


def test_a_tie_between_filesystem_and_quota_names_the_filesystem():
    # 500 bytes and 900 inodes left under the quota, exactly as on the filesystem
    quota = project(bytes_=QuotaUsage(500, hard=1000), inodes=QuotaUsage(100, hard=1000))
    headroom = judge(probe("statvfs", filesystem(avail=500)), probe("quota", quota)).headroom
    assert (headroom.bytes, headroom.inodes) == (500, 900)
    assert (headroom.bytes_limited_by, headroom.inodes_limited_by) == ("filesystem", "filesystem")


@pytest.mark.parametrize(("files", "files_free", "inodes"), [(0, 0, None), (1, 0, 0), (1, 1, 1)])
def test_a_filesystem_without_an_inode_count_has_no_inode_headroom(files, files_free, inodes):
    """FUSE and vfat report 0 inodes in all: no limit, not 0 % left; 1 inode is a count."""
    verdict = judge(probe("statvfs", filesystem(files=files, files_free=files_free)))
    assert verdict.headroom.inodes == inodes
    low = any(r.code == "inode_headroom_low" for r in verdict.reasons)
    assert low is (inodes == 0)


# -- what the messages promise ---------------------------------------------------------------


def test_write_slow_names_the_slowest_step():
    latency = {"create": 0.1, "write": 0.2, "fsync": 6.0, "rename": 0.3, "total": 6.6}
    verdict = judge(
        probe("statvfs", filesystem()), probe("write", WriteProbeResult(True, 1 << 20, latency))
    )
    assert "(fsync: 6" in message(verdict, "write_slow")


def lustre(name: str, avail: int) -> LustreTarget:
    return LustreTarget(name, "OST", int(name[-4:], 16), 1000, avail, 100, 50)


def test_one_full_lustre_target_is_named_alone_and_more_are_counted():
    one = judge(probe("statvfs", filesystem()), probe("lfs_df", (lustre("p-OST0001", 10),)))
    assert "p-OST0001" in message(one, "lustre_target_full")
    assert "more" not in message(one, "lustre_target_full")
    several = (lustre("p-OST0001", 30), lustre("p-OST0002", 10), lustre("p-OST0003", 900))
    three = judge(probe("statvfs", filesystem()), probe("lfs_df", several))
    text = message(three, "lustre_target_full")
    assert text.startswith("p-OST0002") and "(and 1 more)" in text


def test_quota_read_in_part_says_what_failed_or_that_targets_did_not_answer():
    failed = QuotaReport("lfs", project().entries, False, ("quotactl ost3 failed.",))
    said = judge(probe("statvfs", filesystem()), probe("quota", failed))
    assert "quotactl ost3 failed." in message(said, "quota_unavailable")
    silent = QuotaReport("lfs", project().entries, True, ())
    unsaid = judge(probe("statvfs", filesystem()), probe("quota", silent))
    assert "did not answer" in message(unsaid, "quota_unavailable")


# -- freshness -------------------------------------------------------------------------------


def test_a_verdict_is_fresh_up_to_and_including_its_fresh_until():
    verdict = judge(probe("statvfs", filesystem(), finished_at=NOW - 1))
    until = verdict.fresh_until
    assert until == NOW - 1 + Policy().stale_after("statvfs")
    assert verdict.is_fresh(until) and not verdict.is_fresh(math.nextafter(until, math.inf))


# -- who and what a message names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "words"),
    [
        (
            QuotaUsage(500, 400, 500, None, QuotaState.HARD_REACHED),
            "500 inodes used, hard limit 500",
        ),
        (
            QuotaUsage(450, 400, 500, NOW + 7 * 86400.0, QuotaState.SOFT_EXCEEDED),
            "450 inodes used, soft limit 400",
        ),
    ],
    ids=["hard", "soft"],
)
def test_a_quota_message_names_the_owner_and_the_limit_that_was_crossed(usage, words):
    def quota_message(entry: QuotaEntry) -> str:
        verdict = judge(
            probe("statvfs", filesystem()), probe("quota", QuotaReport("lfs", (entry,)))
        )
        (reason,) = [r for r in verdict.reasons if r.code.startswith("quota_")]
        return reason.message

    named = quota_message(QuotaEntry("user", 1000, "alice", QuotaUsage(0), usage))
    assert named.startswith(f"user quota of alice: {words}")
    unnamed = quota_message(QuotaEntry("project", 4242, None, QuotaUsage(0), usage))
    assert unnamed.startswith(f"project quota of 4242: {words}")


def test_a_failed_probe_without_a_message_is_described_by_its_errno():
    failed = probe("write", error="EIO")
    said = ProbeResult("write", NOW - 1, 0.0, None, "EIO", "test write failed at fsync", False)
    assert message(judge(probe("statvfs", filesystem()), failed), "write_failed") == (
        "test write failed with EIO"
    )
    assert message(judge(probe("statvfs", filesystem()), said), "write_failed") == (
        "test write failed at fsync"
    )
    quiet_statvfs = probe("statvfs", error="EACCES")
    assert message(judge(quiet_statvfs), "probe_failed") == (
        "the statvfs probe failed: EACCES (EACCES)"
    )
