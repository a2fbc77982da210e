"""The health policy as a pure function: every rule of docs/design.md §5 with plain values."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from fsprobe.codec import Form, FormatError
from fsprobe.model import (
    TIMEOUT,
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
from fsprobe.policy import Policy, judge_need, save_answer
from tests.support.policy import NOW, filesystem_info, judge

GiB = 1024**3
TiB = 1024**4


def fs(avail=500 * GiB, size=1000 * GiB, files=1_000_000, files_free=900_000, readonly=False):
    return filesystem_info(avail, size, files, files_free, readonly=readonly, mountpoint="/lustre")


def result(probe, value=None, error=None, age=1.0, stuck=False, message=""):
    return ProbeResult(probe, NOW - age, 0.01, value, error, message, stuck)


def write_ok(total=0.01):
    return WriteProbeResult(
        True, 1 << 20, {"create": total / 2, "fsync": total / 2, "total": total}
    )


def write_failed(errno, step="write"):
    return WriteProbeResult(
        False, 1 << 20, {"create": 0.001, "total": 0.002}, step, errno, f"failed: {errno}"
    )


def quota(*entries, inaccurate=False, errors=()):
    return QuotaReport("lfs", tuple(entries), inaccurate, tuple(errors))


def entry(kind="project", bytes_=None, inodes=None, ident=1234):
    return QuotaEntry(kind, ident, None, bytes_ or QuotaUsage(0), inodes or QuotaUsage(0))


def codes(verdict):
    return {(reason.code, reason.severity.label) for reason in verdict.reasons}


def test_healthy_filesystem_is_ok_with_headroom_from_statvfs():
    verdict = judge(result("statvfs", fs()), result("write", write_ok()))
    assert verdict.status is Status.OK
    assert verdict.reasons == ()
    assert verdict.headroom.bytes == 500 * GiB
    assert verdict.headroom.inodes == 900_000
    assert verdict.headroom.bytes_ratio == pytest.approx(0.5)
    assert verdict.headroom.inodes_ratio == pytest.approx(0.9)
    assert verdict.headroom.limited_by == "filesystem"


def test_nothing_probed_is_unknown():
    assert judge().status is Status.UNKNOWN


def test_the_tmpdir_check_alone_says_nothing_about_health():
    assert judge(result("tmpdir", TmpdirInfo("/ckpt", True))).status is Status.UNKNOWN


def test_every_probe_failed_is_unknown_with_the_reason():
    verdict = judge(result("statvfs", error="EACCES", message="Permission denied"))
    assert verdict.status is Status.UNKNOWN
    assert ("probe_failed", "degraded") in codes(verdict)
    assert "EACCES" in verdict.reasons[0].message


@pytest.mark.parametrize(
    ("files_free", "expected"),
    [(110_000, Status.OK), (95_000, Status.DEGRADED), (29_000, Status.UNHEALTHY)],
)
def test_inode_headroom_thresholds(files_free, expected):
    verdict = judge(result("statvfs", fs(files_free=files_free)))
    assert verdict.status is expected
    if expected is not Status.OK:
        assert ("inode_headroom_low", expected.label) in codes(verdict)


@pytest.mark.parametrize(
    ("avail", "expected"),
    [(101 * GiB, Status.OK), (99 * GiB, Status.DEGRADED), (29 * GiB, Status.UNHEALTHY)],
)
def test_space_headroom_thresholds(avail, expected):
    verdict = judge(result("statvfs", fs(avail=avail)))
    assert verdict.status is expected


def test_project_inode_quota_at_93_percent_binds_and_degrades():
    """The field case of docs/design.md §1: 79 % of the space quota, 93 % of the inode quota."""
    project = entry(
        bytes_=QuotaUsage(used=79 * TiB // 100, hard=TiB),
        inodes=QuotaUsage(used=930_000, hard=1_000_000),
    )
    verdict = judge(
        result("statvfs", fs(avail=500 * TiB, size=1000 * TiB, files=10**9, files_free=9 * 10**8)),
        result("quota", quota(project)),
    )
    assert verdict.status is Status.DEGRADED
    assert verdict.headroom.inodes == 70_000
    assert verdict.headroom.inodes_limited_by == "quota:project"
    assert verdict.headroom.bytes_limited_by == "quota:project"
    assert verdict.headroom.limited_by == "quota:project"
    (reason,) = verdict.reasons
    assert reason.code == "inode_headroom_low"
    assert reason.message == "inodes: 93 % used under the project quota, only 70k (7.0 %) left"


def test_headroom_ratio_is_against_the_binding_capacity():
    # 5 GiB left of a 10 GiB user quota on a huge filesystem: 50 %, not 0.0005 %.
    user = entry("user", bytes_=QuotaUsage(used=5 * GiB, hard=10 * GiB))
    verdict = judge(
        result("statvfs", fs(avail=900 * TiB, size=1000 * TiB)), result("quota", quota(user))
    )
    assert verdict.headroom.bytes == 5 * GiB
    assert verdict.headroom.bytes_ratio == pytest.approx(0.5)
    assert verdict.headroom.bytes_limited_by == "quota:user"
    assert verdict.status is Status.OK


def test_soft_limit_without_hard_limit_does_not_bind_until_grace_expires():
    running = entry(
        bytes_=QuotaUsage(
            used=11 * GiB,
            soft=10 * GiB,
            state=QuotaState.SOFT_EXCEEDED,
            grace_expires_at=NOW + 5 * 86400,
        )
    )
    verdict = judge(result("statvfs", fs()), result("quota", quota(running)))
    assert verdict.headroom.bytes_limited_by == "filesystem"
    assert codes(verdict) == {("quota_soft_exceeded", "degraded")}
    assert "grace period ends in 5 days" in verdict.reasons[0].message


def test_grace_expiring_within_a_day_is_named():
    running = entry(
        inodes=QuotaUsage(
            used=1100,
            soft=1000,
            hard=2000,
            state=QuotaState.SOFT_EXCEEDED,
            grace_expires_at=NOW + 3 * 3600 + 60,
        )
    )
    verdict = judge(result("statvfs", fs()), result("quota", quota(running)))
    assert codes(verdict) == {
        ("quota_soft_exceeded", "degraded"),
        ("quota_grace_expiring", "degraded"),
    }
    assert any("3 hours 1 minute" in reason.message for reason in verdict.reasons)


def test_grace_that_ran_out_since_the_quota_was_read_counts_as_expired():
    stale_timer = entry(
        bytes_=QuotaUsage(
            used=11 * GiB,
            soft=10 * GiB,
            hard=20 * GiB,
            state=QuotaState.SOFT_EXCEEDED,
            grace_expires_at=NOW - 1,
        )
    )
    verdict = judge(result("statvfs", fs()), result("quota", quota(stale_timer)))
    assert verdict.status is Status.UNHEALTHY
    assert ("quota_grace_expired", "unhealthy") in codes(verdict)
    assert verdict.headroom.bytes == 0


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (QuotaState.HARD_REACHED, "quota_hard_reached"),
        (QuotaState.GRACE_EXPIRED, "quota_grace_expired"),
    ],
)
def test_quota_that_refuses_writes_is_unhealthy(state, code):
    full = entry(bytes_=QuotaUsage(used=20 * GiB, soft=10 * GiB, hard=20 * GiB, state=state))
    verdict = judge(result("statvfs", fs()), result("quota", quota(full)))
    assert verdict.status is Status.UNHEALTHY
    assert (code, "unhealthy") in codes(verdict)
    assert verdict.headroom.bytes == 0


def test_quota_that_could_not_be_read_degrades():
    verdict = judge(
        result("statvfs", fs()), result("quota", error=TIMEOUT, message="lfs killed after 30 s")
    )
    assert verdict.status is Status.DEGRADED
    assert codes(verdict) == {("quota_unavailable", "degraded")}
    assert "lfs killed after 30 s" in verdict.reasons[0].message


def test_inaccurate_quota_degrades():
    verdict = judge(result("statvfs", fs()), result("quota", quota(entry(), inaccurate=True)))
    assert codes(verdict) == {("quota_unavailable", "degraded")}


def test_one_full_ost_degrades_while_the_total_looks_fine():
    targets = (
        LustreTarget("proj-MDT0000", "MDT", 0, 100 * GiB, 90 * GiB, 10**6, 9 * 10**5),
        LustreTarget("proj-OST0000", "OST", 0, 100 * TiB, 50 * TiB, None, None),
        LustreTarget("proj-OST0001", "OST", 1, 100 * TiB, 2 * TiB, None, None),
        LustreTarget("proj-OST0002", "OST", 2, 100 * TiB, 0, None, None, active=False),
    )
    verdict = judge(result("statvfs", fs()), result("lfs_df", targets))
    assert codes(verdict) == {("lustre_target_full", "degraded")}
    assert "proj-OST0001" in verdict.reasons[0].message
    assert "2.0 %" in verdict.reasons[0].message


def _ost(index, free, pools=(), in_layout=True):
    return LustreTarget(
        f"proj-OST{index:04x}", "OST", index, 100 * TiB, free, None, None,
        pools=pools, in_layout=in_layout,
    )  # fmt: skip


def test_only_the_osts_the_layout_reaches_are_judged():
    mdt = LustreTarget("proj-MDT0000", "MDT", 0, 100 * GiB, 90 * GiB, 10**6, 9 * 10**5)
    outside = _ost(2, free=TiB, in_layout=False)  # 1 %: full, but no byte can land there
    flash = (_ost(0, 50 * TiB, ("flash",)), _ost(1, 40 * TiB, ("flash",)))
    assert codes(judge(result("statvfs", fs()), result("lfs_df", (mdt, *flash, outside)))) == set()
    full_mdt = LustreTarget("proj-MDT0000", "MDT", 0, 100 * GiB, GiB, 10**6, 9 * 10**5)
    verdict = judge(result("statvfs", fs()), result("lfs_df", (full_mdt, *flash, outside)))
    assert "proj-MDT0000 has only" in verdict.reasons[0].message, "an MDT always counts"
    inside = (_ost(0, 50 * TiB, ("flash",)), _ost(1, TiB, ("flash", "fast")))
    verdict = judge(result("statvfs", fs()), result("lfs_df", (mdt, *inside, outside)))
    (reason,) = verdict.reasons
    assert reason.message.startswith("proj-OST0001 (pool flash, fast) has only 1 TiB (1.0 %) free:")
    both = (_ost(0, TiB, ("flash",)), _ost(1, TiB, ("flash",)))
    verdict = judge(result("statvfs", fs()), result("lfs_df", (mdt, *both, outside)))
    assert "(and 1 more); every OST of pool flash is nearly full" in verdict.reasons[0].message


def test_a_pool_quota_binds_and_is_named_with_its_pool():
    user = entry("user", bytes_=QuotaUsage(used=GiB, hard=100 * GiB), ident=1000)
    flash = QuotaEntry(
        "user", 1000, "alice", QuotaUsage(used=19 * GiB // 2, hard=10 * GiB), QuotaUsage(5),
        pool="flash",
    )  # fmt: skip
    verdict = judge(result("statvfs", fs()), result("quota", quota(user, flash)))
    assert verdict.headroom.bytes == GiB // 2
    assert verdict.headroom.bytes_limited_by == "quota:user@flash"
    (reason,) = verdict.reasons
    assert reason.code == "space_headroom_low"
    assert "under the user quota of pool flash" in reason.message
    at_hard = QuotaEntry(
        "user", 1000, "alice", QuotaUsage(10 * GiB, hard=10 * GiB, state=QuotaState.HARD_REACHED),
        QuotaUsage(5), pool="flash",
    )  # fmt: skip
    verdict = judge(result("statvfs", fs()), result("quota", quota(user, at_hard)))
    reached = [r for r in verdict.reasons if r.code == "quota_hard_reached"]
    assert reached[0].message.startswith("user quota of alice in pool flash: 10 GiB bytes used")
    assert reached[0].errno == "EDQUOT"


def test_a_quota_note_is_a_notice_that_leaves_the_status_alone():
    note = "/lustre/p has project 42 but not its inherit flag: new files get no project"
    report = QuotaReport("lfs", (entry("user"),), notes=(note,))
    verdict = judge(result("statvfs", fs()), result("quota", report))
    assert verdict.status is Status.OK
    assert [(r.code, r.severity, r.message) for r in verdict.reasons] == [
        ("quota_note", Severity.NOTICE, note)
    ]


@pytest.mark.parametrize(
    ("errno", "expected"),
    [
        ("ENOSPC", Status.UNHEALTHY),
        ("EDQUOT", Status.UNHEALTHY),
        ("EROFS", Status.UNHEALTHY),
        ("EACCES", Status.UNHEALTHY),
        ("EIO", Status.DEGRADED),
        ("ESTALE", Status.DEGRADED),
    ],
)
def test_failed_write_probe_by_errno(errno, expected):
    verdict = judge(
        result("statvfs", fs()),
        result("write", write_failed(errno), error=errno, message=f"failed: {errno}"),
    )
    assert verdict.status is expected
    assert ("write_failed", expected.label) in codes(verdict)


def test_a_transient_error_in_the_last_three_writes_still_degrades():
    verdict = judge(
        result("statvfs", fs()), result("write", write_ok()), recent=("EIO", None, None)
    )
    assert codes(verdict) == {("write_failed", "degraded")}
    assert "1 of the last 3" in verdict.reasons[0].message
    older = judge(
        result("statvfs", fs()), result("write", write_ok()), recent=("EIO", None, None, None)
    )
    assert older.status is Status.OK


@pytest.mark.parametrize(
    ("seconds", "expected"), [(4.0, Status.OK), (6.0, Status.DEGRADED), (31.0, Status.UNHEALTHY)]
)
def test_slow_write_probe(seconds, expected):
    verdict = judge(result("statvfs", fs()), result("write", write_ok(seconds)))
    assert verdict.status is expected


def test_stuck_probe_is_unhealthy_mount_stuck():
    verdict = judge(
        result("statvfs", error=TIMEOUT, stuck=True, message="statvfs has not returned after 10 s")
    )
    assert verdict.status is Status.UNHEALTHY
    assert codes(verdict) == {("mount_stuck", "unhealthy")}
    assert "not returned after 10 s" in verdict.reasons[0].message


def test_readonly_mount_is_unhealthy():
    verdict = judge(result("statvfs", fs(readonly=True)))
    assert codes(verdict) == {("readonly", "unhealthy")}


def test_tmpdir_on_another_device_is_a_notice_that_leaves_the_status_alone():
    results = (result("statvfs", fs()), result("tmpdir", TmpdirInfo("/tmp", False)))
    verdict = judge(*results)
    assert verdict.status is Status.OK
    assert codes(verdict) == {("tmpdir_cross_device", "notice")}
    assert "fsprobe's own saves never stage there" in verdict.reasons[0].message
    assert verdict.concerns == () and verdict.can_take_save and verdict.acceptable_destination
    assert judge(*results, policy=Policy(check_tmpdir=False)).reasons == ()


def test_stale_results_are_not_used_and_say_so():
    stale = result("statvfs", fs(files_free=1000), age=46.0)
    verdict = judge(stale)
    assert verdict.status is Status.UNKNOWN
    assert codes(verdict) == {("probe_stale", "degraded")}
    assert verdict.headroom.inodes is None
    fresh_enough = judge(result("statvfs", fs(), age=44.0))
    assert fresh_enough.status is Status.OK


def test_need_that_does_not_fit_is_unhealthy_and_named():
    verdict = judge(result("statvfs", fs(avail=400 * GiB)), need_bytes=500 * GiB, need_inodes=1)
    assert verdict.fits is False
    assert verdict.status is Status.UNHEALTHY
    assert "needs 500 GiB but only 400 GiB is left on the filesystem" in verdict.reasons[0].message
    fits = judge(result("statvfs", fs(avail=400 * GiB)), need_bytes=300 * GiB)
    assert fits.fits is True and fits.status is Status.OK


def test_need_with_unknown_headroom_cannot_tell():
    verdict = judge(result("write", write_ok()), need_bytes=GiB)
    assert verdict.fits is None


def test_reasons_are_ordered_worst_first():
    verdict = judge(
        result("tmpdir", TmpdirInfo("/tmp", False)),
        result("statvfs", fs(readonly=True, avail=95 * GiB)),
    )
    assert [reason.severity for reason in verdict.reasons] == [
        Severity.UNHEALTHY,
        Severity.DEGRADED,
        Severity.NOTICE,
    ]


# -- what the save path asks the verdict -------------------------------------------------------

PASSING, REFUSING, WARNING = "passing", "refusing", "warning"


def _kind(reason):
    if reason.transient:
        return PASSING
    return REFUSING if reason.errno is not None else WARNING


@pytest.mark.parametrize(
    ("results", "recent", "need", "expected"),
    [
        ((result("statvfs", fs(readonly=True)),), (), {}, ("readonly", REFUSING, "EROFS")),
        (
            (result("statvfs", error=TIMEOUT, stuck=True, message="hung"),),
            (),
            {},
            ("mount_stuck", PASSING, "ETIMEDOUT"),
        ),
        (
            (result("statvfs", fs()), result("write", write_failed("EACCES"), error="EACCES")),
            (),
            {},
            ("write_failed", REFUSING, "EACCES"),
        ),
        (
            (result("statvfs", fs()), result("write", write_failed("EIO"), error="EIO")),
            (),
            {},
            ("write_failed", PASSING, "EIO"),
        ),
        (
            (result("statvfs", fs()), result("write", write_ok())),
            ("EIO", None),
            {},
            ("write_failed", WARNING, None),
        ),
        (
            (result("statvfs", fs()), result("write", write_ok(6.0))),
            (),
            {},
            ("write_slow", WARNING, None),
        ),
        (
            (result("statvfs", fs()), result("write", write_ok(31.0))),
            (),
            {},
            ("write_slow", PASSING, None),
        ),
        (
            (result("statvfs", fs()), result("write", write_ok(), age=200.0)),
            (),
            {},
            ("probe_stale", PASSING, None),
        ),
        (
            (result("statvfs", fs()), result("lfs_df", error="EIO", message="lfs df failed")),
            (),
            {},
            ("probe_failed", PASSING, None),
        ),
        (
            (result("statvfs", fs(avail=20 * GiB)),),
            (),
            {},
            ("space_headroom_low", WARNING, None),
        ),
        (
            (result("statvfs", fs(avail=20 * GiB)),),
            (),
            {"need_bytes": 30 * GiB},
            ("space_headroom_low", REFUSING, "ENOSPC"),
        ),
        (
            (
                result("statvfs", fs()),
                result("quota", quota(entry(inodes=QuotaUsage(used=99, hard=100)))),
            ),
            (),
            {"need_inodes": 5},
            ("inode_headroom_low", REFUSING, "EDQUOT"),
        ),
        (
            (
                result("statvfs", fs()),
                result(
                    "quota",
                    quota(entry(bytes_=QuotaUsage(20, hard=20, state=QuotaState.HARD_REACHED))),
                ),
            ),
            (),
            {},
            ("quota_hard_reached", REFUSING, "EDQUOT"),
        ),
        (
            (result("statvfs", fs()), result("quota", error=TIMEOUT, message="lfs hung")),
            (),
            {},
            ("quota_unavailable", WARNING, None),
        ),
    ],
)
def test_each_reason_says_whether_waiting_helps_and_what_a_write_would_get(
    results, recent, need, expected
):
    verdict = judge(*results, recent=recent, **need)
    _code, kind, _errno = expected
    assert expected in {(reason.code, _kind(reason), reason.errno) for reason in verdict.reasons}
    assert verdict.worth_waiting is (kind == PASSING)
    assert verdict.acceptable_destination is (kind == WARNING)


@pytest.mark.parametrize(
    ("results", "can_take_save"),
    [
        ((result("statvfs", fs(readonly=True)),), False),  # refused for good
        ((result("statvfs", error=TIMEOUT, stuck=True, message="hung"),), False),  # hangs
        ((result("statvfs", fs()), result("write", write_ok(31.0))), False),  # 31 s a save
        ((result("statvfs", fs()), result("write", write_failed("EIO"), error="EIO")), True),
        ((result("statvfs", fs(avail=20 * GiB)),), True),  # 2 % left, but no size asked
        ((result("statvfs", fs()), result("write", write_ok(6.0))), True),
    ],
)
def test_a_target_can_take_a_save_unless_something_refuses_it_or_passing_trouble_is_bad(
    results, can_take_save
):
    assert judge(*results).can_take_save is can_take_save


def test_a_target_nobody_probed_is_no_destination():
    verdict = judge(result("tmpdir", TmpdirInfo("/ckpt", True)))
    assert verdict.status is Status.UNKNOWN and not verdict.acceptable_destination


def test_the_errno_a_write_would_get_comes_from_the_worst_reason_that_names_one():
    verdict = judge(
        result("statvfs", fs(readonly=True)),
        result("write", write_failed("EIO"), error="EIO"),
    )
    assert verdict.errno == "EROFS"
    assert judge(result("statvfs", fs())).errno is None


def test_a_verdict_made_without_a_size_is_judged_for_one_by_the_same_rule():
    without = judge(result("statvfs", fs(avail=400 * GiB)))
    assert without.fits is None
    too_big = judge_need(without, 500 * GiB, 1)
    assert too_big == judge(
        result("statvfs", fs(avail=400 * GiB)), need_bytes=500 * GiB, need_inodes=1
    )
    assert judge_need(without, 300 * GiB, None).fits is True
    assert judge_need(without, None, None) is without


@pytest.mark.parametrize("readonly", [False, True])
@pytest.mark.parametrize(
    ("need_bytes", "need_inodes"),
    [(None, None), (300 * GiB, None), (500 * GiB, 1), (None, 10**12), (500 * GiB, 10**12)],
)
def test_the_saves_answer_fits_a_need_as_the_policy_judges_one(readonly, need_bytes, need_inodes):
    """What a save reads from the state file (`save_answer`, fitted by `SaveAnswer.fit`)
    answers every question as the verdict for that size does: one rule, two places."""
    without = judge(result("statvfs", fs(avail=400 * GiB, readonly=readonly)))
    answer = save_answer(without, True).fit(need_bytes, need_inodes)
    judged = judge_need(without, need_bytes, need_inodes)
    assert (answer.status, answer.reasons, answer.fits, answer.errno) == (
        judged.status,
        judged.reasons,
        judged.fits,
        judged.errno,
    )
    assert (answer.can_take_save, answer.worth_waiting, answer.acceptable_destination) == (
        judged.can_take_save,
        judged.worth_waiting,
        judged.acceptable_destination,
    )
    assert (answer.headroom_bytes, answer.bytes_limited_by) == (400 * GiB, "filesystem")


def test_a_verdict_holds_until_its_first_result_goes_stale():
    verdict = judge(result("statvfs", fs(), age=10.0), result("write", write_ok(), age=100.0))
    statvfs_due = NOW - 10.0 + 0.01 + 3 * 15.0
    write_due = NOW - 100.0 + 0.01 + 3 * 60.0
    assert verdict.fresh_until == pytest.approx(min(statvfs_due, write_due))
    assert verdict.is_fresh(NOW + 30) and not verdict.is_fresh(NOW + 40)
    slower = judge(result("statvfs", fs(), age=10.0), policy=Policy(stale_after_intervals=5))
    assert slower.fresh_until == pytest.approx(NOW - 10.0 + 0.01 + 5 * 15.0)
    assert judge().fresh_until is None and not judge().is_fresh(NOW)


def test_a_stuck_mark_ages_like_any_result():
    """A live daemon renews it while the mount hangs; a dead one's mark goes stale."""
    verdict = judge(result("statvfs", error=TIMEOUT, stuck=True, message="hung", age=5.0))
    assert verdict.fresh_until == pytest.approx(NOW - 5.0 + 0.01 + 45.0)


@dataclass(frozen=True)
class _Levels:
    status: Status
    severity: Severity


LEVELS = Form(_Levels, "status severity")


def test_labels_read_back_exactly():
    for status, severity in itertools.zip_longest(Status, Severity, fillvalue=Severity.NOTICE):
        document = {"status": status.label, "severity": severity.label}
        assert LEVELS.encode(_Levels(status, severity)) == document
        assert LEVELS.decode(document) == _Levels(status, severity)
    for bad in ("Degraded", "worse", "", "OK", None, 1):
        with pytest.raises(FormatError, match="status"):
            LEVELS.decode({"status": bad, "severity": "notice"})


def test_a_write_probe_root_refused_degrades_but_leaves_saves_alone():
    """Root would have probed as root where others may rename (fsprobe.probing.target): not a
    failed write, nothing in the way of a save, but the target is not fully judged."""
    refused = result("write", error="NOT_AS_ROOT", message="not write-probing /ckpt as root")
    verdict = judge(result("statvfs", fs()), refused, recent=["NOT_AS_ROOT"])
    assert verdict.status is Status.DEGRADED
    (reason,) = verdict.reasons
    assert (reason.code, reason.severity, reason.message) == (
        "write_probe_refused",
        Severity.DEGRADED,
        "not write-probing /ckpt as root",
    )
    assert reason.errno is None and not reason.transient
    assert verdict.can_take_save and verdict.acceptable_destination and not verdict.worth_waiting
    assert (
        judge(result("statvfs", fs()), result("write", error="NOT_AS_ROOT")).reasons[0].message
        == "NOT_AS_ROOT"
    )
