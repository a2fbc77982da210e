"""The health policy: from what the probes saw to ok / degraded / unhealthy / unknown.

A pure function of a snapshot, the target's `Policy` and the time: the only judge
(docs/design.md §2, §5). Headroom's ratio is taken against whichever capacity binds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fsprobe.errors import NOT_AS_ROOT, UNTRUSTED, ErrorClass, classify
from fsprobe.model import (
    INTERNAL,
    RECOVERY_HARD_SECONDS,
    TIMEOUT,
    FilesystemInfo,
    LustreImport,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Reason,
    SaveAnswer,
    Severity,
    Snapshot,
    Status,
    TmpdirInfo,
    WriteProbeResult,
    binding_phrase,
    fit_need,
)
from fsprobe.units import (
    format_bytes,
    format_clock,
    format_count,
    format_duration,
    format_percent,
    format_seconds,
)

DEFAULT_INTERVALS: Mapping[str, float] = {
    "statvfs": 15.0,
    "write": 60.0,
    "quota": 300.0,
    "lfs_df": 3600.0,  # sooner while space is tight: fsprobe.daemon.pace
    "imports": 15.0,
    "tmpdir": 60.0,
}


@dataclass(frozen=True)
class Policy:
    """Everything a target is judged by; all configurable per target.

    The thresholds of docs/design.md §5; how often each probe runs, because a result is stale
    once it is older than `stale_after_intervals` of its probe's interval; and whether $TMPDIR on
    another filesystem is worth a notice.
    """

    headroom_degraded_ratio: float = 0.10
    headroom_unhealthy_ratio: float = 0.03
    grace_expiring_seconds: float = 24 * 3600.0
    lustre_target_min_free_ratio: float = 0.05
    write_slow_seconds: float = 5.0
    write_very_slow_seconds: float = 30.0
    transient_write_window: int = 3
    stale_after_intervals: float = 3.0
    intervals: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_INTERVALS))
    check_tmpdir: bool = True

    def interval(self, probe: str) -> float:
        return self.intervals.get(probe, DEFAULT_INTERVALS.get(probe, 60.0))

    def stale_after(self, probe: str) -> float:
        """How old a result of `probe` may get before it says nothing any more.

        The one definition of staleness: for each result here, and through
        `Verdict.fresh_until` for the daemon's view of a target that the save hook and
        `fsprobe status` read from the state file.
        """
        return self.stale_after_intervals * self.interval(probe)


#: Passing trouble that only degrades a target and yet stands in the way of a save's writes:
#: a file striped on a target this node has lost waits for the reconnection, one on a target in
#: recovery for its end. A save waits for it (up to `max_wait`), then goes elsewhere.
IN_THE_WAY = frozenset({"lustre_target_disconnected", "lustre_target_recovering"})
#: How long an eviction in an import's state history is worth a notice.
RECENT_EVICTION_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class Headroom:
    """What a new file can still take, and which limit binds (``filesystem``, ``quota:user``...)."""

    bytes: int | None = None
    inodes: int | None = None
    bytes_ratio: float | None = None
    inodes_ratio: float | None = None
    bytes_limited_by: str | None = None
    inodes_limited_by: str | None = None

    @property
    def limited_by(self) -> str | None:
        """The limit that binds the scarcer resource (by ratio): the one to act on first."""
        if self.inodes_ratio is not None and (
            self.bytes_ratio is None or self.inodes_ratio < self.bytes_ratio
        ):
            return self.inodes_limited_by
        return self.bytes_limited_by


@dataclass(frozen=True)
class Verdict:
    """The judgement of one target, and the answers to what a save asks of it.

    `fits` is None when no size was asked about or the headroom is unknown. `fresh_until` is
    when the verdict stops holding if no new probe result comes (the first of its results to
    go stale), None when there is nothing it could hold on. A save reads what it asks as the
    target's `SaveAnswer` (`save_answer`), never the verdict.
    """

    status: Status
    reasons: tuple[Reason, ...]
    headroom: Headroom
    fits: bool | None = None
    fresh_until: float | None = None

    @property
    def refusing(self) -> tuple[Reason, ...]:
        """Why the target cannot take a save, and waiting won't help."""
        return tuple(r for r in self.reasons if r.errno is not None and not r.transient)

    @property
    def passing(self) -> tuple[Reason, ...]:
        """Trouble in the way that is expected to pass by itself."""
        return tuple(r for r in self.reasons if r.transient)

    @property
    def can_take_save(self) -> bool:
        """Write here now: nothing refuses it, nothing passing is bad enough (unhealthy, or
        in the way of its writes) to write elsewhere instead."""
        return not self.refusing and not any(
            r.severity is Severity.UNHEALTHY or r.code in IN_THE_WAY for r in self.passing
        )

    @property
    def acceptable_destination(self) -> bool:
        """Good enough to redirect a save to: judged, and nothing in the way at all."""
        return self.status is not Status.UNKNOWN and not (self.refusing or self.passing)

    @property
    def worth_waiting(self) -> bool:
        """Whether waiting may make the save go better here: trouble that passes, none that
        stays."""
        return bool(self.passing) and not self.refusing

    @property
    def concerns(self) -> tuple[Reason, ...]:
        """The reasons that weigh on the status (every reason but the notices)."""
        return tuple(r for r in self.reasons if r.severity is not Severity.NOTICE)

    @property
    def errno(self) -> str | None:
        """The error a write now would most likely fail with (see `write_errno`)."""
        return write_errno(self.reasons)

    def is_fresh(self, now: float) -> bool:
        """Whether the verdict still holds at `now` without a new probe result."""
        return self.fresh_until is not None and now <= self.fresh_until


def write_errno(reasons: Iterable[Reason]) -> str | None:
    """The error a write would most likely fail with, given reasons ordered worst first: that
    of the first reason that names one."""
    return next((reason.errno for reason in reasons if reason.errno is not None), None)


@dataclass(frozen=True)
class _Limit:
    """One candidate bound on headroom: how much remains and out of what capacity (> 0)."""

    source: str
    remaining: int
    capacity: int

    @property
    def ratio(self) -> float:
        """The share left, within [0, 1] whatever the numbers say (an answer may report more
        free than its size: the ratio is then 1, never above)."""
        return min(1.0, max(0, self.remaining) / self.capacity)


def _quota_limits(entries: Iterable[QuotaEntry], resource: str, now: float) -> list[_Limit]:
    limits = []
    for entry in entries:
        usage: QuotaUsage = getattr(entry, resource)
        remaining = usage.remaining(now)
        capacity = usage.hard if usage.hard is not None else usage.soft
        if remaining is not None and capacity is not None and capacity > 0:
            limits.append(_Limit(entry.source, remaining, capacity))
    return limits


def _tightest(limits: list[_Limit]) -> _Limit | None:
    # On a tie the filesystem, listed first, is named: it is the one everybody shares.
    return min(limits, key=lambda limit: limit.remaining) if limits else None


def compute_headroom(fs: FilesystemInfo | None, quota: QuotaReport | None, now: float) -> Headroom:
    """The headroom for bytes and inodes, from every limit whose capacity is known.

    A filesystem that reports a size of zero (or zero inodes: btrfs, vfat, many FUSE mounts,
    /proc) says nothing about that resource: it is left out, never divided by, and
    `capacity_reasons` says so. Total for any numbers: free above the size counts as the size.
    """
    entries = quota.entries if quota is not None else ()
    byte_limits = _quota_limits(entries, "bytes", now)
    inode_limits = _quota_limits(entries, "inodes", now)
    if fs is not None:
        if fs.size_bytes > 0:
            avail = min(fs.avail_bytes, fs.size_bytes)
            byte_limits.insert(0, _Limit("filesystem", avail, fs.size_bytes))
        if fs.files > 0:
            inode_limits.insert(0, _Limit("filesystem", min(fs.files_free, fs.files), fs.files))
    by_bytes, by_inodes = _tightest(byte_limits), _tightest(inode_limits)
    return Headroom(
        bytes=by_bytes.remaining if by_bytes else None,
        inodes=by_inodes.remaining if by_inodes else None,
        bytes_ratio=by_bytes.ratio if by_bytes else None,
        inodes_ratio=by_inodes.ratio if by_inodes else None,
        bytes_limited_by=by_bytes.source if by_bytes else None,
        inodes_limited_by=by_inodes.source if by_inodes else None,
    )


def capacity_known(fs: FilesystemInfo) -> bool:
    """Whether statvfs measured anything of the filesystem's capacity (its size or inodes)."""
    return fs.size_bytes > 0 or fs.files > 0


def capacity_reasons(fs: FilesystemInfo) -> list[Reason]:
    """A notice for each resource whose capacity the filesystem does not report (zero).

    Not a problem of the target by itself (writes may go fine), but its headroom for that
    resource is unknown; with neither known, statvfs alone judges nothing (see `_status`).
    """
    reasons = []
    if fs.size_bytes <= 0:
        reasons.append(
            Reason(
                "capacity_unknown",
                Severity.NOTICE,
                f"{fs.mountpoint} ({fs.fstype}) reports a size of 0: its free space is "
                "unknown, not judged",
            )
        )
    if fs.files <= 0:
        reasons.append(
            Reason(
                "capacity_unknown",
                Severity.NOTICE,
                f"{fs.mountpoint} ({fs.fstype}) reports no inode count: its free inodes are "
                "unknown, not judged",
            )
        )
    return reasons


def _headroom_reasons(headroom: Headroom, policy: Policy) -> list[Reason]:
    reasons = []
    for code, left, ratio, limited_by, fmt, noun in (
        (
            "space_headroom_low",
            headroom.bytes,
            headroom.bytes_ratio,
            headroom.bytes_limited_by,
            format_bytes,
            "space",
        ),
        (
            "inode_headroom_low",
            headroom.inodes,
            headroom.inodes_ratio,
            headroom.inodes_limited_by,
            format_count,
            "inodes",
        ),
    ):
        if ratio is None or left is None:
            continue
        if ratio < policy.headroom_unhealthy_ratio:
            severity = Severity.UNHEALTHY
        elif ratio < policy.headroom_degraded_ratio:
            severity = Severity.DEGRADED
        else:
            continue
        used = format_percent(1 - ratio)
        reasons.append(
            Reason(
                code,
                severity,
                f"{noun}: {used} used {binding_phrase(limited_by)}, "
                f"only {fmt(left)} ({format_percent(ratio)}) left",
            )
        )
    return reasons


def fit(
    headroom: Headroom, need_bytes: int | None, need_inodes: int | None
) -> tuple[bool | None, tuple[Reason, ...]]:
    """Whether a save of the given size fits; one that does not is refused (ENOSPC/EDQUOT)."""
    return fit_need(
        (need_bytes, need_inodes),
        (headroom.bytes, headroom.inodes),
        (headroom.bytes_limited_by, headroom.inodes_limited_by),
    )


def save_answer(verdict: Verdict, exists: bool | None) -> SaveAnswer:
    """What a save asks of a target, from its verdict: the flat answer the daemon writes into
    the state file beside the report (`exists`: whether the target directory itself exists,
    None when no statvfs says), for a save of any size (`SaveAnswer.fit` fits one)."""
    headroom = verdict.headroom
    return SaveAnswer(
        status=verdict.status,
        can_take_save=verdict.can_take_save,
        worth_waiting=verdict.worth_waiting,
        acceptable_destination=verdict.acceptable_destination,
        headroom_bytes=headroom.bytes,
        headroom_inodes=headroom.inodes,
        bytes_limited_by=headroom.bytes_limited_by,
        inodes_limited_by=headroom.inodes_limited_by,
        exists=exists,
        errno=verdict.errno,
        fresh_until=verdict.fresh_until,
        reasons=verdict.reasons,
    )


def judge_need(verdict: Verdict, need_bytes: int | None, need_inodes: int | None) -> Verdict:
    """`verdict` for a save of this size: whether it fits, and unhealthy if it does not.

    For a verdict made without a size (the daemon's, read from its state file), so that the
    save hook asks the same rule as `evaluate` does with one.
    """
    fits, reasons = fit(verdict.headroom, need_bytes, need_inodes)
    if fits == verdict.fits and not reasons:
        return verdict
    return Verdict(
        max(verdict.status, Status.UNHEALTHY) if reasons else verdict.status,
        _ordered([*reasons, *verdict.reasons]),
        verdict.headroom,
        fits,
        verdict.fresh_until,
    )


_QUOTA_STATE_REASONS = {
    QuotaState.HARD_REACHED: ("quota_hard_reached", Severity.UNHEALTHY, "EDQUOT"),
    QuotaState.GRACE_EXPIRED: ("quota_grace_expired", Severity.UNHEALTHY, "EDQUOT"),
    QuotaState.SOFT_EXCEEDED: ("quota_soft_exceeded", Severity.DEGRADED, None),
}


def _quota_reasons(quota: QuotaReport, policy: Policy, now: float) -> list[Reason]:
    reasons = []
    for entry in quota.entries:
        reasons += _quota_usage_reasons(entry, "bytes", format_bytes, policy, now)
        reasons += _quota_usage_reasons(entry, "inodes", format_count, policy, now)
    if quota.inaccurate or quota.errors:
        detail = "; ".join(quota.errors) or "some storage targets did not answer"
        reasons.append(
            Reason("quota_unavailable", Severity.DEGRADED, f"quota read only in part: {detail}")
        )
    reasons += [Reason("quota_note", Severity.NOTICE, note) for note in quota.notes]
    return reasons


def _quota_usage_reasons(
    entry: QuotaEntry, resource: str, fmt: Callable[[int], str], policy: Policy, now: float
) -> list[Reason]:
    """Where one quota's `resource` (bytes or inodes) stands against its limits."""
    usage: QuotaUsage = getattr(entry, resource)
    state = usage.state_at(now)
    if state is QuotaState.OK:
        return []
    code, severity, errno = _QUOTA_STATE_REASONS[state]
    who = f"{entry.type} quota of {entry.name or entry.id}"
    if entry.pool:
        who += f" in pool {entry.pool}"
    hard = state is QuotaState.HARD_REACHED
    limit = usage.hard if hard else usage.soft
    message = f"{who}: {fmt(usage.used)} {resource} used"
    if limit is not None:
        message += f", {'hard' if hard else 'soft'} limit {fmt(limit)}"
    reasons = []
    if state is QuotaState.GRACE_EXPIRED:
        message += "; grace period expired, writes are refused"
    elif hard:
        message += "; writes are refused"
    elif usage.grace_expires_at is not None:
        left = usage.grace_expires_at - now
        message += f"; grace period ends in {format_duration(left)}"
        if left < policy.grace_expiring_seconds:
            reasons.append(
                Reason(
                    "quota_grace_expiring",
                    Severity.DEGRADED,
                    f"{who}: grace period for {resource} ends in "
                    f"{format_duration(left)}; after that writes are refused",
                )
            )
    return [*reasons, Reason(code, severity, message, errno=errno)]


def _lustre_reasons(targets: Iterable[LustreTarget], policy: Policy) -> list[Reason]:
    """One reason for the targets a new file can meet that are nearly full.

    An MDT counts when a new file's inode can go there (`in_layout`: the directory's MDTs, and
    MDT0000; every MDT where they are not known); an OST when the target directory's layout
    can place data on it (`in_layout`): a full OST outside the layout's pools takes no byte of
    the checkpoint.
    """
    meets = [t for t in targets if t.in_layout]
    full = sorted(
        (
            (_Limit(t.name, t.avail_bytes, t.size_bytes).ratio, t)
            for t in meets
            if t.active
            and t.size_bytes is not None
            and t.size_bytes > 0
            and t.avail_bytes is not None
        ),
        key=lambda pair: pair[0],
    )
    full = [(ratio, t) for ratio, t in full if ratio < policy.lustre_target_min_free_ratio]
    if not full:
        return []
    ratio, worst = full[0]
    where = f" (pool {', '.join(worst.pools)})" if worst.pools else ""
    others = f" (and {len(full) - 1} more)" if len(full) > 1 else ""
    usable = [t for t in meets if t.kind == "OST" and t.active]
    full_osts = [t for _, t in full if t.kind == "OST"]
    restricted = bool(usable) and all(t.pools for t in usable)  # the layout names pools only
    if restricted and len(full_osts) == len(usable):
        pools = ", ".join(sorted({pool for t in usable for pool in t.pools}))
        others += f"; every OST of pool {pools} is nearly full"
    return [
        Reason(
            "lustre_target_full",
            Severity.DEGRADED,
            f"{worst.name}{where} has only {format_bytes(worst.avail_bytes or 0)} "
            f"({format_percent(ratio)}) free{others}: files striped on it fail with ENOSPC",
        )
    ]


def _short(name: str) -> str:
    """``lustre-OST0007`` -> ``OST0007``: the target as an admin names it."""
    return name.rpartition("-")[2] or name


def reached_imports(
    imports: Iterable[LustreImport], targets: Iterable[LustreTarget]
) -> list[LustreImport]:
    """The imports of the targets a new file can meet: MDT0000 and the target directory's MDTs,
    the OSTs its layout reaches (as the imports probe and `lfs df` mark them: all where the
    marks are unknown), and of those OSTs none deactivated (``osc.*.active=0``, or ``inactive
    device`` in `lfs df -v`): no new file gets an object there."""
    targets = tuple(targets)
    outside = {t.name for t in targets if not t.in_layout}
    inactive = {t.name for t in targets if t.kind == "OST" and not t.active}
    return [
        t
        for t in imports
        if t.in_layout
        and t.name not in outside
        and (t.kind != "OST" or (t.active and t.name not in inactive))
    ]


def _lost_when(target: LustreImport, now: float) -> str:
    """`` at 14:02``, `` before 14:02`` where the state history has forgotten, or nothing."""
    if target.lost_at is not None:
        return f" at {format_clock(target.lost_at, now)}"
    if target.lost_before is not None:
        return f" before {format_clock(target.lost_before, now)}"
    return ""


def _import_reasons(
    imports: list[LustreImport], meets: list[LustreImport], now: float
) -> list[Reason]:
    """This node's connection to the targets a new file can meet (`meets`, of all `imports`):
    a lost one degrades the target until it is back, one in recovery until the recovery ends
    (waiting may cure both); an eviction of the last day is a notice with its time (the writes
    in flight then failed with EIO), and so is an OST the admin deactivated."""
    reasons = []
    lost = [t for t in meets if not t.connected]
    if lost:
        worst = lost[0]  # MDTs first, then by index
        others = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
        reasons.append(
            Reason(
                "lustre_target_disconnected",
                Severity.DEGRADED,
                f"this node lost its connection to {_short(worst.name)}{_lost_when(worst, now)} "
                f"({worst.state}){others}: a file it holds waits until the node reconnects",
                transient=True,
            )
        )
    recovering = [t for t in meets if t.recovering]
    if recovering:
        worst = recovering[0]
        others = f" (and {len(recovering) - 1} more)" if len(recovering) > 1 else ""
        reasons.append(
            Reason(
                "lustre_target_recovering",
                Severity.DEGRADED,
                f"{_short(worst.name)} is in recovery ({worst.state}; this node lost it"
                f"{_lost_when(worst, now)} and is connected again){others}: a file it holds "
                f"waits until the recovery ends, at most "
                f"{format_duration(RECOVERY_HARD_SECONDS)} after the server restarted",
                transient=True,
            )
        )
    evicted = [
        t
        for t in meets
        if t.last_eviction is not None and now - t.last_eviction <= RECENT_EVICTION_SECONDS
    ]
    if evicted:
        latest = max(evicted, key=lambda t: t.last_eviction or 0.0)
        assert latest.last_eviction is not None
        reasons.append(
            Reason(
                "lustre_target_evicted",
                Severity.NOTICE,
                f"{_short(latest.name)} evicted this node at "
                f"{format_clock(latest.last_eviction, now)}: the writes it had in flight then "
                "failed with EIO",
            )
        )
    inactive = [t for t in imports if t.kind == "OST" and not t.active]
    if inactive:
        names = ", ".join(_short(t.name) for t in inactive[:3])
        others = f" (and {len(inactive) - 3} more)" if len(inactive) > 3 else ""
        reasons.append(
            Reason(
                "lustre_target_inactive",
                Severity.NOTICE,
                f"{names}{others} deactivated on this node (osc active=0): new files get no "
                "object there",
            )
        )
    return reasons


def _write_reasons(
    latest: ProbeResult, recent_errors: tuple[str | None, ...], policy: Policy
) -> list[Reason]:
    if latest.error == NOT_AS_ROOT:
        # Not run, not failed: the target's saves are as good as before, but nothing tested
        # them, and the admin has a setting to change.
        return [Reason("write_probe_refused", Severity.DEGRADED, latest.message or NOT_AS_ROOT)]
    if not latest.ok:
        error = latest.error or "EUNKNOWN"
        transient = classify(error) is ErrorClass.TRANSIENT
        return [
            Reason(
                "write_failed",
                Severity.DEGRADED if transient else Severity.UNHEALTHY,
                latest.message or f"test write failed with {error}",
                transient=transient,
                errno="ETIMEDOUT" if error == TIMEOUT else error,
            )
        ]
    reasons = []
    window = recent_errors[-policy.transient_write_window :]
    failures = [error for error in window if error is not None]
    if failures:
        reasons.append(
            Reason(
                "write_failed",
                Severity.DEGRADED,
                f"{len(failures)} of the last {len(window)} test writes failed "
                f"({', '.join(failures)}); the latest succeeded",
            )
        )
    probe: WriteProbeResult | None = latest.value
    assert probe is not None  # a result that succeeded holds its value
    total = probe.total_seconds
    if total > policy.write_slow_seconds:
        steps = {step: s for step, s in probe.latency_seconds.items() if step != "total"}
        slowest = max(steps, key=steps.__getitem__, default=None)
        detail = f" ({slowest}: {format_seconds(steps[slowest])})" if slowest else ""
        very_slow = total > policy.write_very_slow_seconds
        reasons.append(
            Reason(
                "write_slow",
                Severity.UNHEALTHY if very_slow else Severity.DEGRADED,
                f"a {format_bytes(probe.bytes)} test save took {format_seconds(total)}{detail}",
                transient=very_slow,
            )
        )
    return reasons


_STAGE_WORDS = {"probe": "probing", "judge": "judging", "publish": "publishing"}


def internal_error(stage: str, summary: str) -> Reason:
    """The reason for a bug of fsprobe's contained at a target's boundary (`stage`: probe,
    judge or publish): the target's status is unknown until that stage gets through again."""
    return Reason(
        "internal_error",
        Severity.DEGRADED,
        f"fsprobe failed {_STAGE_WORDS.get(stage, stage)} this target ({summary}): a bug, "
        "logged with its traceback; the status is unknown, not measured",
    )


def unjudged(stage: str, summary: str) -> Verdict:
    """The verdict on a target that a bug kept from being judged: unknown, nothing measured."""
    return Verdict(Status.UNKNOWN, (internal_error(stage, summary),), Headroom())


def evaluate(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    need_bytes: int | None = None,
    need_inodes: int | None = None,
) -> Verdict:
    """Judge a snapshot. `need_*` asks whether a checkpoint of that size fits (a preflight).

    Each resource is judged by a function of its own below, in the order of the data path;
    the reasons are then ordered worst first.
    """
    judged, reasons = _fresh_results(snapshot, policy, now)
    bugs = {probe: result for probe, result in judged.items() if result.error == INTERNAL}
    reasons += [
        internal_error("probe", f"the {probe} probe raised {result.message}")
        for probe, result in bugs.items()
    ]
    fresh = {probe: result for probe, result in judged.items() if probe not in bugs}
    untrusted = sorted(probe for probe, result in fresh.items() if result.error == UNTRUSTED)
    reasons += _stuck_reasons(fresh)
    reasons += _untrusted_reasons(fresh, untrusted)
    reasons += _failed_probe_reasons(fresh, untrusted)

    fs: FilesystemInfo | None = _value(fresh, "statvfs")
    quota: QuotaReport | None = _value(fresh, "quota")
    reasons += _filesystem_reasons(fs)
    headroom = compute_headroom(fs, quota, now)
    reasons += _headroom_reasons(headroom, policy)
    fits, fit_reasons = fit(headroom, need_bytes, need_inodes)
    reasons += fit_reasons
    reasons += _quota_probe_reasons(fresh.get("quota"), quota, untrusted, policy, now)
    reasons += _lustre_reasons(_value(fresh, "lfs_df") or (), policy)
    imports = _value(fresh, "imports") or ()
    reasons += _import_reasons(
        list(imports), reached_imports(imports, _value(fresh, "lfs_df") or ()), now
    )
    reasons += _write_probe_reasons(
        fresh.get("write"), untrusted, snapshot.recent_write_errors, policy
    )
    reasons += _tmpdir_reasons(_value(fresh, "tmpdir"), policy, need_bytes)

    status = Status.UNKNOWN if bugs else _status(reasons, fresh)
    return Verdict(status, _ordered(reasons), headroom, fits, _fresh_until(judged, policy))


def _fresh_results(
    snapshot: Snapshot, policy: Policy, now: float
) -> tuple[dict[str, ProbeResult], list[Reason]]:
    """The results still young enough to judge (a stuck mark always is), and a transient
    reason for each that is not."""
    fresh: dict[str, ProbeResult] = {}
    reasons = []
    for probe, result in snapshot.results.items():
        age = now - result.finished_at
        if result.stuck or age <= policy.stale_after(probe):
            fresh[probe] = result
        else:
            reasons.append(
                Reason(
                    "probe_stale",
                    Severity.DEGRADED,
                    f"the {probe} probe's last result is {format_duration(age)} old "
                    f"(expected every {format_duration(policy.interval(probe))})",
                    transient=True,
                )
            )
    return fresh, reasons


def _value(fresh: Mapping[str, ProbeResult], probe: str):
    """The value of `probe`'s fresh result, None when it failed or did not run."""
    result = fresh.get(probe)
    return result.value if result is not None and result.ok else None


def _stuck_reasons(fresh: Mapping[str, ProbeResult]) -> list[Reason]:
    stuck = sorted(probe for probe, result in fresh.items() if result.stuck)
    if not stuck:
        return []
    return [
        Reason(
            "mount_stuck",
            Severity.UNHEALTHY,
            f"{' and '.join(stuck)} did not return within the deadline: {fresh[stuck[0]].message}",
            transient=True,
            errno="ETIMEDOUT",
        )
    ]


def _untrusted_reasons(fresh: Mapping[str, ProbeResult], untrusted: list[str]) -> list[Reason]:
    if not untrusted:
        return []
    return [
        Reason(
            "target_untrusted",
            Severity.UNHEALTHY,
            fresh[untrusted[0]].message or "the target path is not to be followed",
            errno="EACCES",  # as a save there is treated: go elsewhere, never retry
        )
    ]


def _failed_probe_reasons(fresh: Mapping[str, ProbeResult], untrusted: list[str]) -> list[Reason]:
    """A transient reason for each probe that failed, but for those judged on their own."""
    return [
        Reason(
            "probe_failed",
            Severity.DEGRADED,
            f"the {probe} probe failed: {result.message or result.error} ({result.error})",
            transient=True,
        )
        for probe, result in fresh.items()
        # write and quota failures have reasons of their own
        if not (result.ok or result.stuck or probe in ("write", "quota", *untrusted))
    ]


def _filesystem_reasons(fs: FilesystemInfo | None) -> list[Reason]:
    if fs is None:
        return []
    reasons = []
    if fs.readonly:
        reasons.append(
            Reason(
                "readonly",
                Severity.UNHEALTHY,
                f"{fs.mountpoint} is mounted read-only",
                errno="EROFS",
            )
        )
    return reasons + capacity_reasons(fs)


def _quota_probe_reasons(
    result: ProbeResult | None,
    quota: QuotaReport | None,
    untrusted: list[str],
    policy: Policy,
    now: float,
) -> list[Reason]:
    """The quota's own reasons when it was read, or why it could not be."""
    reasons = _quota_reasons(quota, policy, now) if quota is not None else []
    if result is not None and not result.ok and not result.stuck and "quota" not in untrusted:
        reasons.append(
            Reason(
                "quota_unavailable",
                Severity.DEGRADED,
                f"quota could not be read: {result.message} ({result.error})",
            )
        )
    return reasons


def _write_probe_reasons(
    result: ProbeResult | None,
    untrusted: list[str],
    recent_errors: tuple[str | None, ...],
    policy: Policy,
) -> list[Reason]:
    if result is None or result.stuck or "write" in untrusted:
        return []
    return _write_reasons(result, recent_errors, policy)


def _tmpdir_reasons(
    tmpdir: TmpdirInfo | None, policy: Policy, need_bytes: int | None
) -> list[Reason]:
    if not policy.check_tmpdir or tmpdir is None or tmpdir.same_device:
        return []
    reasons = [
        Reason(
            "tmpdir_cross_device",
            Severity.NOTICE,
            f"$TMPDIR ({tmpdir.path}) is on another filesystem: a checkpoint that a "
            "framework stages there is copied, not renamed, into place "
            "(fsprobe's own saves never stage there)",
        )
    ]
    room = tmpdir.free_bytes
    if need_bytes is not None and room is not None and need_bytes > room:
        reasons.append(
            Reason(
                "tmpdir_too_small",
                Severity.NOTICE,
                f"$TMPDIR ({tmpdir.path}) has {format_bytes(room)} free, less than the "
                f"{format_bytes(need_bytes)} asked: Lightning's own TorchCheckpointIO stages "
                "each checkpoint there (fsspec) and fails with ENOSPC; fsprobe's saves, "
                "FsprobeCheckpointIO among them, do not stage there",
            )
        )
    return reasons


#: The probes whose success says something about the target's health on its own; the $TMPDIR
#: check alone does not (a target must not read "ok" because only that one has answered yet).
_HEALTH_PROBES = ("statvfs", "write", "quota", "lfs_df")


def _usable(result: ProbeResult) -> bool:
    """Whether a result says something of the target's health: a probe that did not apply
    (quota off Lustre) does not, nor a statvfs that measured no capacity at all (/proc, a FUSE
    mount without statfs)."""
    if not result.ok or result.value is None:
        return False
    if result.probe != "statvfs":
        return True
    return isinstance(result.value, FilesystemInfo) and capacity_known(result.value)


def _status(reasons: list[Reason], fresh: Mapping[str, ProbeResult]) -> Status:
    worst = max((reason.severity.status for reason in reasons), default=Status.OK)
    anything_usable = any(_usable(fresh[kind]) for kind in _HEALTH_PROBES if kind in fresh)
    if not anything_usable and worst is not Status.UNHEALTHY:
        return Status.UNKNOWN
    return worst


def _fresh_until(fresh: Mapping[str, ProbeResult], policy: Policy) -> float | None:
    """When the first of the results judged goes stale (a stuck mark ages like any result:
    a prober that is alive keeps renewing it while the mount hangs)."""
    return min(
        (result.finished_at + policy.stale_after(probe) for probe, result in fresh.items()),
        default=None,
    )


def _ordered(reasons: list[Reason]) -> tuple[Reason, ...]:
    """Worst first, then in the order found (which follows the data path)."""
    return tuple(sorted(reasons, key=lambda reason: -reason.severity))
