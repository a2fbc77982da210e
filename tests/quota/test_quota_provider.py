"""From parsed `lfs quota` output to QuotaEntry (or a named failure), and the provider plumbing."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest

from fsprobe.errors import PARSE, ProbeFailure, errno_name
from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.grace import NO_TIMER, Grace
from fsprobe.lustre.provider import LustreQuotaProvider, outcome_from_output, usage_from_cells
from fsprobe.lustre.quota_parser import Usage, parse_quota
from fsprobe.model import Mount, ProbeResult, QuotaEntry, QuotaState, QuotaUsage, Snapshot, Status
from fsprobe.policy import Policy, evaluate
from fsprobe.probing.quota import select_provider
from fsprobe.quota import ServerProbeSettings
from fsprobe.quota.cache import SingleFlight
from fsprobe.quota.provider import IdOutcome, QuotaReading, assemble
from tests.support.fakes.fake_lfs import load_fixtures

FIXTURES = dict(load_fixtures("quota"))
NOW = 1_800_000_000.0
GIB = 2**30


def outcome(name: str, quota_type: str, quota_id: int) -> IdOutcome:
    case = FIXTURES[name]
    text = "".join(line + "\n" for line in case["stdout"])
    errors = "".join(line + "\n" for line in case["stderr"])
    output = parse_quota(text, errors, case["status"])
    return outcome_from_output(output, quota_type, quota_id, command=case["command"], now=NOW)


@pytest.mark.parametrize("version", ["2.12", "2.14", "2.15", "2.16"])
def test_over_soft_limit_with_grace_running(version: str):
    result = outcome(f"{version}/user_over_soft", "user", 1000)
    assert result.failure is None and result.notes == ()
    assert result.entry == QuotaEntry(
        type="user",
        id=1000,
        name=None,
        bytes=QuotaUsage(
            used=10737424 * 1024,
            soft=10 * GIB,
            hard=12 * GIB,
            grace_expires_at=NOW + 6 * 86400 + 23 * 3600 + 48 * 60 + 49,
            state=QuotaState.SOFT_EXCEEDED,
        ),
        inodes=QuotaUsage(used=930000, soft=1000000, hard=1000000),
    )


@pytest.mark.parametrize("version", ["2.12", "2.14", "2.15", "2.16"])
def test_hard_limit_reached_and_grace_expired(version: str):
    hard = outcome(f"{version}/project_hard_reached", "project", 4242).entry
    assert hard is not None
    assert (hard.inodes.state, hard.inodes.grace_expires_at) == (QuotaState.HARD_REACHED, None)
    assert hard.bytes.state is QuotaState.OK
    expired = outcome(f"{version}/group_grace_expired", "group", 2000).entry
    assert expired is not None
    assert expired.bytes.state is QuotaState.GRACE_EXPIRED
    assert expired.bytes.remaining(NOW) == 0


def test_root_has_no_limits():
    entry = outcome("2.16/root", "user", 0).entry
    assert entry is not None
    assert (entry.bytes.soft, entry.bytes.hard, entry.inodes.hard) == (None, None, None)


@pytest.mark.parametrize(("version", "status"), [("2.12", 0), ("2.14", 5), ("2.16", 5)])
def test_inaccurate_usage_is_kept_and_flagged(version: str, status: int):
    result = outcome(f"{version}/inaccurate", "user", 1000)
    assert result.entry is not None and result.failure is None
    assert result.entry.bytes.inaccurate and not result.entry.inodes.inaccurate
    assert result.entry.bytes.used == 4 * GIB
    exited = [note for note in result.notes if "exited with status" in note]
    assert len(exited) == (1 if status else 0)


@pytest.mark.parametrize(
    ("name", "quota_type", "quota_id", "error", "words"),
    [
        ("2.12/permission_denied", "user", 1001, "EPERM", "Permission denied"),
        ("2.16/permission_denied", "user", 1001, "EPERM", "their own uid"),
        ("2.14/quotas_not_enabled", "group", 2000, "ESRCH", "grp quotas are not enabled"),
        ("2.15/not_lustre", "user", 1000, "ENODEV", "not on a mounted Lustre"),
        ("2.15/not_lustre_early", "user", 1000, "ENODEV", "'/scratch/x'"),
        ("2.12/unexpected_error", "user", 1000, errno_name(95), "Operation not supported"),
        ("2.16/unexpected_error", "user", 1000, errno_name(95), "Operation not supported"),
        ("2.16/usage_invalid_id", "user", 1000, "EINVAL", "rejected the command line"),
        ("2.12/usage_invalid_id", "user", 1000, "EINVAL", "invalid id"),
        ("2.16/truncated", "user", 1000, PARSE, "stdout line 3"),
        ("2.12/broken_cell", "user", 1000, PARSE, "'soon!' is not a grace time"),
        ("2.16/user_over_soft", "group", 1000, PARSE, "no quota row for group 1000"),
    ],
)
def test_failures_are_named(name: str, quota_type: str, quota_id: int, error: str, words: str):
    result = outcome(name, quota_type, quota_id)
    assert result.entry is None
    assert result.failure is not None
    assert result.failure.error == error
    assert words in result.failure.message
    assert result.failure.message.startswith("lfs quota")


def test_unknown_lines_next_to_a_good_row_are_notes():
    result = outcome("2.15/unknown_lines", "user", 1000)
    assert result.entry is not None
    assert any("stdout line 4" in note and PARSE in note for note in result.notes)
    assert any("stderr line 1" in note for note in result.notes)


def test_a_title_of_a_new_form_above_a_readable_row_is_a_notice_and_never_degrades():
    text = (
        "Disk quotas for usr 1000 (uid 1000):\n"
        "     Filesystem    used   bsoft   bhard  bgrace   files   isoft   ihard  igrace\n"
        "    /mnt/lustre      40       0  104857       -       3       0     100       -\n"
    )
    command = "lfs quota -u 1000 /mnt/lustre"
    result = outcome_from_output(parse_quota(text), "user", 1000, command=command, now=NOW)
    assert result.entry is not None and result.notes == ()
    (notice,) = result.notices
    assert "column title fsprobe does not know" in notice and "bsoft" in notice
    report = assemble("lfs", QuotaReading((result, result)))
    assert report.errors == () and report.notes == (notice,)  # said once
    snapshot = Snapshot("/ckpt", {"quota": ProbeResult("quota", NOW - 1, 0.1, report)})
    verdict = evaluate(snapshot, Policy(), NOW)
    assert verdict.status is Status.OK
    assert [(r.code, r.severity.label) for r in verdict.reasons] == [("quota_note", "notice")]
    unreadable = text + "    /mnt/lustre      40       0  zero       -       3   0   0   -\n"
    broken = outcome_from_output(parse_quota(unreadable), "user", 1000, command=command, now=NOW)
    assert any(PARSE in note and "stdout line 4" in note for note in broken.notes)


def test_an_lfs_before_210_is_named_too_old_from_its_header():
    result = outcome("2.9/user_over_soft", "user", 1000)
    assert result.entry is None and result.failure is not None
    assert result.failure.error == "EOPNOTSUPP"
    assert "before 2.10" in result.failure.message


def test_eremoteio_row_is_kept_with_a_note():
    result = outcome("2.12/eremoteio", "user", 1000)
    assert result.entry is not None
    assert any("EREMOTEIO" in note for note in result.notes)


def _usage(used: int, soft: int, hard: int, grace: Grace, over: bool) -> Usage:
    return Usage(Amount(used), over, Amount(soft), Amount(hard), grace)


@pytest.mark.parametrize(
    ("cells", "state", "expires"),
    [
        (_usage(10, 0, 0, NO_TIMER, False), QuotaState.OK, None),
        (_usage(10, 5, 0, NO_TIMER, False), QuotaState.OK, None),  # over soft, no timer yet
        (_usage(10, 5, 20, Grace(remaining=60), True), QuotaState.SOFT_EXCEEDED, NOW + 60),
        (_usage(10, 5, 20, Grace(expired=True), True), QuotaState.GRACE_EXPIRED, None),
        (_usage(20, 5, 20, NO_TIMER, True), QuotaState.HARD_REACHED, None),
        # -h rounding can show used a hair below hard; the * with no timer says hard reached
        (_usage(19, 5, 20, NO_TIMER, True), QuotaState.HARD_REACHED, None),
    ],
)
def test_state_follows_the_server_marks(cells: Usage, state: QuotaState, expires):
    usage = usage_from_cells(cells, NOW)
    assert (usage.state, usage.grace_expires_at) == (state, expires)


def test_zero_limits_mean_no_limit():
    usage = usage_from_cells(_usage(10, 0, 0, NO_TIMER, False), NOW)
    assert (usage.soft, usage.hard, usage.remaining(NOW)) == (None, None, None)


def _entry(quota_type: str, inaccurate: bool = False) -> QuotaEntry:
    usage = QuotaUsage(used=1, inaccurate=inaccurate)
    return QuotaEntry(quota_type, 1, None, usage, QuotaUsage(used=1))


def test_assemble_keeps_a_partial_result():
    report = assemble(
        "lfs",
        QuotaReading(
            (
                IdOutcome("user", 1, entry=_entry("user", inaccurate=True)),
                IdOutcome("group", 2, failure=ProbeFailure("ESRCH", "grp quotas are not enabled.")),
                IdOutcome("project", 3, entry=_entry("project"), notes=("lfs: a note",)),
            ),
            ("pool quotas not read: EIO: broken",),
        ),
        ("cannot read the project ID of /x: EACCES",),
        ("/x has project 9 but not its inherit flag: new files get no project",),
    )
    assert [e.type for e in report.entries] == ["user", "project"]
    assert report.inaccurate
    assert report.errors == (
        "group 2: ESRCH: grp quotas are not enabled.",
        "project 3: lfs: a note",
        "pool quotas not read: EIO: broken",
        "cannot read the project ID of /x: EACCES",
    )
    assert report.notes == ("/x has project 9 but not its inherit flag: new files get no project",)


def test_assemble_raises_when_nothing_was_read():
    same = ProbeFailure("EPERM", "lfs quota: Permission denied.")
    with pytest.raises(ProbeFailure) as failure:
        assemble(
            "lfs",
            QuotaReading((IdOutcome("user", 1, failure=same), IdOutcome("group", 2, failure=same))),
        )
    assert (failure.value.error, failure.value.message) == ("EPERM", same.message)
    missing = ProbeFailure.of(FileNotFoundError(errno.ENOENT, "'lfs' is not on PATH"))
    with pytest.raises(ProbeFailure) as not_found:
        assemble("lfs", QuotaReading((IdOutcome("user", 1, failure=missing),)))
    assert (not_found.value.error, not_found.value.message) == ("ENOENT", "'lfs' is not on PATH")
    with pytest.raises(ProbeFailure) as mixed:
        assemble(
            "lfs",
            QuotaReading(
                (
                    IdOutcome("user", 1, failure=ProbeFailure("TIMEOUT", "too slow")),
                    IdOutcome("group", 2, failure=ProbeFailure("EIO", "broken")),
                )
            ),
        )
    assert mixed.value.error == "TIMEOUT"
    assert mixed.value.message == "user 1: too slow; group 2: broken"


def _mount(fstype: str) -> Mount:
    return Mount("/mnt/x", fstype, "src", "0:42", False)


def test_provider_selection():
    caches = LustreCaches()
    chosen = select_provider(ServerProbeSettings(), _mount("lustre"), caches)
    assert isinstance(chosen, LustreQuotaProvider) and chosen.cache is caches.quota
    assert select_provider(ServerProbeSettings(), _mount("ext4"), caches) is None
    assert select_provider(ServerProbeSettings(), None, caches) is None
    assert select_provider(ServerProbeSettings(provider="none"), _mount("lustre"), caches) is None
    forced = select_provider(ServerProbeSettings(provider="lfs"), _mount("fuse"), caches)
    assert isinstance(forced, LustreQuotaProvider) and forced.placements is caches.placements
    with pytest.raises(ValueError, match="unknown quota provider 'gpfs'"):
        select_provider(ServerProbeSettings(provider="gpfs"), _mount("gpfs"), caches)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_single_flight_computes_once_for_concurrent_callers():
    joined = threading.Semaphore(0)

    def clock() -> float:  # read once by every caller as it joins (or starts) the flight
        joined.release()
        return time.monotonic()

    flights: SingleFlight[int] = SingleFlight(clock)
    calls: list[int] = []
    gate = threading.Event()

    def compute() -> int:
        calls.append(1)
        gate.wait(5)
        return 42

    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(flights.get("k", compute, ttl=0, wait=10)))
        for _ in range(5)
    ]
    for thread in threads:
        thread.start()
    for _ in threads:  # all five are in before the computation ends (a sleep was not enough
        assert joined.acquire(timeout=60)  # on a loaded machine: a late one computed anew)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert results == [42] * 5
    assert len(calls) == 1


def test_single_flight_reuses_a_result_for_its_ttl_only():
    clock = Clock()
    flights: SingleFlight[int] = SingleFlight(clock)
    counter = iter(range(100))
    assert flights.get("k", lambda: next(counter), ttl=300, wait=1) == 0
    clock.now += 299
    assert flights.get("k", lambda: next(counter), ttl=300, wait=1) == 0
    assert flights.get("k", lambda: next(counter), ttl=10, wait=1) == 1, "too old for this one"
    clock.now += 301
    assert flights.get("k", lambda: next(counter), ttl=300, wait=1) == 2
    assert flights.get("other", lambda: next(counter), ttl=300, wait=1) == 3
    assert flights.get("k", lambda: next(counter), ttl=0, wait=1) == 4


def test_single_flight_waiter_gives_up_at_its_own_deadline():
    flights: SingleFlight[int] = SingleFlight()
    started, gate = threading.Event(), threading.Event()

    def compute() -> int:
        started.set()
        return int(gate.wait(60))

    owner = threading.Thread(target=lambda: flights.get("k", compute, ttl=0, wait=60))
    owner.start()
    assert started.wait(60)  # the owner's query runs (after a fixed sleep it might not yet)
    with pytest.raises(TimeoutError):
        flights.get("k", lambda: 2, ttl=0, wait=0.2)
    gate.set()
    owner.join(10)


def test_single_flight_does_not_keep_a_crash():
    flights: SingleFlight[int] = SingleFlight()

    def crash() -> int:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        flights.get("k", crash, ttl=300, wait=1)
    assert flights.get("k", lambda: 7, ttl=300, wait=1) == 7


def test_a_limit_of_one_is_a_limit_and_zero_is_none():
    usage = usage_from_cells(_usage(1, 1, 1, NO_TIMER, True), NOW)
    assert (usage.soft, usage.hard, usage.state) == (1, 1, QuotaState.HARD_REACHED)
    assert usage_from_cells(_usage(1, 0, 0, NO_TIMER, False), NOW).hard is None
