"""Every threshold at its exact boundary, with the shipped defaults (docs/design.md §5).

Each rule is tried exactly at its default value and one step to the side that flips it, so
that ``<`` turned into ``<=``, or a default moved by one unit (3 % to 4 %, 5 s to 6 s), fails a
test. A value "one step" away is the next float (``math.nextafter``) for seconds, one byte or
one inode for amounts. The defaults themselves are pinned to the README in
tests/package/test_defaults_documented.py.
"""

from __future__ import annotations

import math

import pytest

from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.grace import NO_TIMER, Grace
from fsprobe.lustre.provider import usage_from_cells
from fsprobe.lustre.quota_parser import Usage
from fsprobe.model import (
    FilesystemInfo,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Status,
    WriteProbeResult,
)
from tests.support.policy import NOW, filesystem_info, judge, probe

CAPACITY = 100_000  # bytes and inodes: 3 % is exactly 3000, 10 % exactly 10000
DAY = 86_400.0


def above(value: float) -> float:
    return math.nextafter(value, math.inf)


def below(value: float) -> float:
    return math.nextafter(value, -math.inf)


def filesystem(avail: int = CAPACITY // 2, files_free: int = CAPACITY // 2) -> FilesystemInfo:
    return filesystem_info(avail, CAPACITY, CAPACITY, files_free)


def write_took(seconds: float) -> ProbeResult:
    steps = {"create": 0.0, "write": 0.0, "fsync": seconds, "total": seconds}
    return probe("write", WriteProbeResult(True, 1 << 20, steps))


def severity_of(code: str, judged) -> Status | None:
    found = [reason.severity.status for reason in judged.reasons if reason.code == code]
    return max(found) if found else None


# -- headroom: unhealthy below 3 %, degraded below 10 % (space and inodes alike) -------------


@pytest.mark.parametrize(
    ("left", "expected"),
    [
        (2_999, Status.UNHEALTHY),
        (3_000, Status.DEGRADED),  # exactly 3 %: not below it
        (9_999, Status.DEGRADED),
        (10_000, None),  # exactly 10 %: ok
    ],
)
@pytest.mark.parametrize("resource", ["space", "inode"])
def test_headroom_at_3_and_10_percent(resource, left, expected):
    fs = filesystem(avail=left) if resource == "space" else filesystem(files_free=left)
    judged = judge(probe("statvfs", fs))
    assert severity_of(f"{resource}_headroom_low", judged) is expected
    assert judged.status is (expected or Status.OK)


@pytest.mark.parametrize(("need", "fits"), [(40_000, True), (40_001, False)])
@pytest.mark.parametrize("resource", ["bytes", "inodes"])
def test_a_checkpoint_exactly_as_big_as_the_headroom_fits(resource, need, fits):
    fs = filesystem(avail=40_000, files_free=40_000)
    judged = judge(probe("statvfs", fs), **{f"need_{resource}": need})
    assert judged.fits is fits
    assert (judged.status is Status.UNHEALTHY) is not fits


# -- write probe: degraded above 5 s, unhealthy above 30 s ------------------------------------


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (5.0, None),
        (above(5.0), Status.DEGRADED),
        (30.0, Status.DEGRADED),
        (above(30.0), Status.UNHEALTHY),
    ],
)
def test_write_slow_at_5_and_30_seconds(seconds, expected):
    judged = judge(probe("statvfs", filesystem()), write_took(seconds))
    assert severity_of("write_slow", judged) is expected


@pytest.mark.parametrize(("errors", "expected"), [(3, Status.DEGRADED), (4, None)])
def test_a_transient_write_error_counts_for_the_last_3_probes(errors, expected):
    """The window is the last 3 write probes; the error is `errors` probes ago."""
    recent = ["EIO"] + [None] * (errors - 1)
    judged = judge(probe("statvfs", filesystem()), write_took(0.01), recent=recent)
    assert severity_of("write_failed", judged) is expected


# -- Lustre targets: degraded under 5 % free ------------------------------------------------


@pytest.mark.parametrize(("avail", "expected"), [(4_999, Status.DEGRADED), (5_000, None)])
def test_one_lustre_target_under_5_percent_free(avail, expected):
    ost = LustreTarget("proj-OST0003", "OST", 3, CAPACITY, avail, 100, 50)
    judged = judge(probe("statvfs", filesystem()), probe("lfs_df", (ost,)))
    assert severity_of("lustre_target_full", judged) is expected


# -- staleness: a result older than 3 intervals --------------------------------------------


@pytest.mark.parametrize(
    ("finished_at", "stale"), [(NOW - 45, False), (below(NOW - 45), True)], ids=["45s", "older"]
)
def test_a_statvfs_result_is_stale_after_3_intervals_of_15_seconds(finished_at, stale):
    judged = judge(probe("statvfs", filesystem(), finished_at=finished_at))
    assert (severity_of("probe_stale", judged) is Status.DEGRADED) is stale
    assert (judged.status is Status.UNKNOWN) is stale


# -- quota: hard limit reached at used == hard; grace ending exactly now; within 24 h --------


def quota_verdict(usage: QuotaUsage):
    entry = QuotaEntry("project", 7, None, usage, QuotaUsage(0))
    report = QuotaReport("lfs", (entry,))
    return judge(probe("statvfs", filesystem()), probe("quota", report))


@pytest.mark.parametrize(
    ("used", "state"),
    [(19_999, QuotaState.SOFT_EXCEEDED), (20_000, QuotaState.HARD_REACHED)],
)
def test_lfs_usage_exactly_at_the_hard_limit_is_hard_reached(used, state):
    """At the hard limit with the soft grace still running: the hard limit is what binds
    (no marker shortcut: lfs shows a running timer, so only used >= hard decides)."""
    cells = Usage(Amount(used), True, Amount(10_000), Amount(20_000), Grace(remaining=3600))
    assert usage_from_cells(cells, NOW).state is state


@pytest.mark.parametrize(
    ("used", "state"), [(19_999, QuotaState.OK), (20_000, QuotaState.HARD_REACHED)]
)
def test_hard_limit_without_a_soft_limit_or_marker(used, state):
    cells = Usage(Amount(used), False, Amount(0), Amount(20_000), NO_TIMER)
    assert usage_from_cells(cells, NOW).state is state


@pytest.mark.parametrize(
    ("expires_at", "state"),
    [
        (above(NOW), QuotaState.SOFT_EXCEEDED),
        (NOW, QuotaState.GRACE_EXPIRED),  # ending exactly now: writes are refused now
    ],
)
def test_a_grace_period_ending_exactly_now_has_expired(expires_at, state):
    usage = QuotaUsage(15_000, 10_000, 20_000, expires_at, QuotaState.SOFT_EXCEEDED)
    assert usage.state_at(NOW) is state
    assert usage.remaining(NOW) == (0 if state is QuotaState.GRACE_EXPIRED else 5_000)
    judged = quota_verdict(usage)
    expected = "quota_grace_expired" if state is QuotaState.GRACE_EXPIRED else "quota_soft_exceeded"
    assert expected in {reason.code for reason in judged.reasons}


@pytest.mark.parametrize(
    ("expires_at", "expiring"),
    [(below(NOW + DAY), True), (NOW + DAY, False)],
    ids=["under-24h", "exactly-24h"],
)
def test_grace_expiring_within_24_hours(expires_at, expiring):
    usage = QuotaUsage(15_000, 10_000, 20_000, expires_at, QuotaState.SOFT_EXCEEDED)
    judged = quota_verdict(usage)
    assert (severity_of("quota_grace_expiring", judged) is Status.DEGRADED) is expiring


@pytest.mark.parametrize(("used", "hard_reached"), [(19_999, False), (20_000, True)])
def test_the_policy_reads_hard_reached_from_the_state(used, hard_reached):
    state = QuotaState.HARD_REACHED if hard_reached else QuotaState.OK
    judged = quota_verdict(QuotaUsage(used, None, 20_000, None, state))
    assert (severity_of("quota_hard_reached", judged) is Status.UNHEALTHY) is hard_reached
    assert judged.headroom.bytes == 20_000 - used


@pytest.mark.parametrize(("limit", "expected"), [(0, None), (1, 1)])
def test_a_zero_limit_is_no_limit_and_one_is_a_limit(limit, expected):
    """lfs prints 0 for "no limit"; the smallest real limit, 1 inode, must stay one."""
    cells = Usage(Amount(0), False, Amount(limit), Amount(limit), NO_TIMER)
    usage = usage_from_cells(cells, NOW)
    assert (usage.soft, usage.hard) == (expected, expected)
