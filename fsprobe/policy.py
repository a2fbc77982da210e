"""The health policy: from what the probes saw to ok / degraded / unhealthy / unknown.

A pure function of a snapshot, thresholds and the current time — no I/O, no clock of its own —
so that the daemon, `fsprobe check` and the save hook judge the same facts the same way, and so
that every rule can be tested with plain values.

Headroom is what a new file in the target can still take before a write fails, for bytes and
for inodes: the smallest of what the filesystem has available and what each applicable quota
still allows under the limit enforced now. Its ratio is taken against the capacity of whichever
of them binds, because 5 GiB left is plenty on a 10 GiB quota and nothing on a 10 PiB filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fsprobe.errors import ErrorClass, classify
from fsprobe.model import (
    FilesystemInfo,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Snapshot,
    Status,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.units import (
    format_bytes,
    format_count,
    format_duration,
    format_percent,
    format_seconds,
)

DEFAULT_INTERVALS: Mapping[str, float] = {
    "statvfs": 15.0,
    "write": 60.0,
    "quota": 300.0,
    "lfs_df": 300.0,
    "tmpdir": 60.0,
    "redirect": 60.0,  # counting (and, if asked, syncing back) redirected checkpoints
}


@dataclass(frozen=True)
class Thresholds:
    """Every number the policy judges by; all configurable per target."""

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


@dataclass(frozen=True)
class Reason:
    """Why a target is not ok: a stable code for machines, a sentence with numbers for people.

    `severity` is the status this reason alone would give the target.
    """

    code: str
    severity: Status
    message: str


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
    status: Status
    reasons: tuple[Reason, ...]
    headroom: Headroom
    fits: bool | None = None  # None when nothing was asked (no need given) or headroom unknown


@dataclass(frozen=True)
class _Limit:
    """One candidate bound on headroom: how much remains and out of what capacity."""

    source: str
    remaining: int
    capacity: int


def _quota_limits(entries: Iterable[QuotaEntry], resource: str, now: float) -> list[_Limit]:
    limits = []
    for entry in entries:
        usage: QuotaUsage = getattr(entry, resource)
        remaining = usage.remaining(now)
        capacity = usage.hard if usage.hard is not None else usage.soft
        if remaining is not None and capacity:
            limits.append(_Limit(f"quota:{entry.type}", remaining, capacity))
    return limits


def _tightest(limits: list[_Limit]) -> _Limit | None:
    # On a tie the filesystem, listed first, is named: it is the one everybody shares.
    return min(limits, key=lambda limit: limit.remaining) if limits else None


def compute_headroom(fs: FilesystemInfo | None, quota: QuotaReport | None, now: float) -> Headroom:
    entries = quota.entries if quota is not None else ()
    byte_limits = _quota_limits(entries, "bytes", now)
    inode_limits = _quota_limits(entries, "inodes", now)
    if fs is not None:
        byte_limits.insert(0, _Limit("filesystem", fs.avail_bytes, fs.size_bytes))
        if fs.files > 0:  # some filesystems (FUSE, vfat) have no inode count at all
            inode_limits.insert(0, _Limit("filesystem", fs.files_free, fs.files))
    by_bytes, by_inodes = _tightest(byte_limits), _tightest(inode_limits)
    return Headroom(
        bytes=by_bytes.remaining if by_bytes else None,
        inodes=by_inodes.remaining if by_inodes else None,
        bytes_ratio=by_bytes.remaining / by_bytes.capacity if by_bytes else None,
        inodes_ratio=by_inodes.remaining / by_inodes.capacity if by_inodes else None,
        bytes_limited_by=by_bytes.source if by_bytes else None,
        inodes_limited_by=by_inodes.source if by_inodes else None,
    )


def _binding_phrase(limited_by: str | None) -> str:
    if limited_by is None or limited_by == "filesystem":
        return "on the filesystem"
    return f"under the {limited_by.split(':', 1)[1]} quota"


def _headroom_reasons(headroom: Headroom, thresholds: Thresholds) -> list[Reason]:
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
        if ratio < thresholds.headroom_unhealthy_ratio:
            severity = Status.UNHEALTHY
        elif ratio < thresholds.headroom_degraded_ratio:
            severity = Status.DEGRADED
        else:
            continue
        used = format_percent(1 - ratio)
        reasons.append(
            Reason(
                code,
                severity,
                f"{noun}: {used} used {_binding_phrase(limited_by)}, "
                f"only {fmt(left)} ({format_percent(ratio)}) left",
            )
        )
    return reasons


def fit(
    headroom: Headroom, need_bytes: int | None, need_inodes: int | None
) -> tuple[bool | None, list[Reason]]:
    """Whether a save of the given size fits; a save that does not fit is unhealthy."""
    if need_bytes is None and need_inodes is None:
        return None, []
    reasons = []
    checks = (
        ("space_headroom_low", need_bytes, headroom.bytes, headroom.bytes_limited_by, format_bytes),
        (
            "inode_headroom_low",
            need_inodes,
            headroom.inodes,
            headroom.inodes_limited_by,
            format_count,
        ),
    )
    unknown = False
    for code, need, left, limited_by, fmt in checks:
        if need is None:
            continue
        if left is None:
            unknown = True
        elif need > left:
            reasons.append(
                Reason(
                    code,
                    Status.UNHEALTHY,
                    f"the checkpoint needs {fmt(need)} but only {fmt(left)} is left "
                    f"{_binding_phrase(limited_by)}",
                )
            )
    if reasons:
        return False, reasons
    return (None if unknown else True), []


_QUOTA_STATE_REASONS = {
    QuotaState.HARD_REACHED: ("quota_hard_reached", Status.UNHEALTHY),
    QuotaState.GRACE_EXPIRED: ("quota_grace_expired", Status.UNHEALTHY),
    QuotaState.SOFT_EXCEEDED: ("quota_soft_exceeded", Status.DEGRADED),
}


def _quota_reasons(quota: QuotaReport, thresholds: Thresholds, now: float) -> list[Reason]:
    reasons = []
    for entry in quota.entries:
        for resource, fmt in (("bytes", format_bytes), ("inodes", format_count)):
            usage: QuotaUsage = getattr(entry, resource)
            state = usage.state_at(now)
            if state is QuotaState.OK:
                continue
            code, severity = _QUOTA_STATE_REASONS[state]
            who = f"{entry.type} quota of {entry.name or entry.id}"
            limit = usage.hard if state is QuotaState.HARD_REACHED else usage.soft
            limit_words = f"{'hard' if state is QuotaState.HARD_REACHED else 'soft'} limit"
            message = f"{who}: {fmt(usage.used)} {resource} used"
            if limit is not None:
                message += f", {limit_words} {fmt(limit)}"
            if state is QuotaState.GRACE_EXPIRED:
                message += "; grace period expired, writes are refused"
            elif state is QuotaState.HARD_REACHED:
                message += "; writes are refused"
            elif usage.grace_expires_at is not None:
                left = usage.grace_expires_at - now
                message += f"; grace period ends in {format_duration(left)}"
                if left < thresholds.grace_expiring_seconds:
                    reasons.append(
                        Reason(
                            "quota_grace_expiring",
                            Status.DEGRADED,
                            f"{who}: grace period for {resource} ends in "
                            f"{format_duration(left)}; after that writes are refused",
                        )
                    )
            reasons.append(Reason(code, severity, message))
    if quota.inaccurate or quota.errors:
        detail = "; ".join(quota.errors) or "some storage targets did not answer"
        reasons.append(
            Reason("quota_unavailable", Status.DEGRADED, f"quota read only in part: {detail}")
        )
    return reasons


def _lustre_reasons(targets: Iterable[LustreTarget], thresholds: Thresholds) -> list[Reason]:
    full = sorted(
        (
            (t.avail_bytes / t.size_bytes, t)
            for t in targets
            if t.active and t.size_bytes and t.avail_bytes is not None
        ),
        key=lambda pair: pair[0],
    )
    full = [(ratio, t) for ratio, t in full if ratio < thresholds.lustre_target_min_free_ratio]
    if not full:
        return []
    ratio, worst = full[0]
    others = f" (and {len(full) - 1} more)" if len(full) > 1 else ""
    return [
        Reason(
            "lustre_target_full",
            Status.DEGRADED,
            f"{worst.name} has only {format_bytes(worst.avail_bytes)} "
            f"({format_percent(ratio)}) free{others}: files striped on it fail with ENOSPC",
        )
    ]


def _write_reasons(
    latest: ProbeResult,
    recent_errors: tuple[str | None, ...],
    thresholds: Thresholds,
) -> list[Reason]:
    if not latest.ok:
        persistent = classify(latest.error) is not ErrorClass.TRANSIENT
        return [
            Reason(
                "write_failed",
                Status.UNHEALTHY if persistent else Status.DEGRADED,
                latest.message or f"test write failed with {latest.error}",
            )
        ]
    reasons = []
    window = recent_errors[-thresholds.transient_write_window :]
    failures = [error for error in window if error is not None]
    if failures:
        reasons.append(
            Reason(
                "write_failed",
                Status.DEGRADED,
                f"{len(failures)} of the last {len(window)} test writes failed "
                f"({', '.join(failures)}); the latest succeeded",
            )
        )
    probe: WriteProbeResult = latest.value
    total = probe.total_seconds
    if total > thresholds.write_slow_seconds:
        slowest = max(
            (step for step in probe.latency_seconds if step != "total"),
            key=lambda step: probe.latency_seconds[step],
        )
        reasons.append(
            Reason(
                "write_slow",
                Status.UNHEALTHY if total > thresholds.write_very_slow_seconds else Status.DEGRADED,
                f"a {format_bytes(probe.bytes)} test save took {format_seconds(total)} "
                f"({slowest}: {format_seconds(probe.latency_seconds[slowest])})",
            )
        )
    return reasons


def evaluate(
    snapshot: Snapshot,
    thresholds: Thresholds,
    now: float,
    need_bytes: int | None = None,
    need_inodes: int | None = None,
) -> Verdict:
    """Judge a snapshot. `need_*` asks whether a checkpoint of that size fits (a preflight)."""
    reasons: list[Reason] = []
    fresh = {}
    for probe, result in snapshot.results.items():
        interval = thresholds.intervals.get(probe, DEFAULT_INTERVALS.get(probe, 60.0))
        age = now - result.finished_at
        if result.stuck:
            continue
        if age > thresholds.stale_after_intervals * interval:
            reasons.append(
                Reason(
                    "probe_stale",
                    Status.DEGRADED,
                    f"the {probe} probe's last result is {format_duration(age)} old "
                    f"(expected every {format_duration(interval)})",
                )
            )
        else:
            fresh[probe] = result

    stuck = sorted(probe for probe, result in snapshot.results.items() if result.stuck)
    if stuck:
        blocked = snapshot.results[stuck[0]]
        reasons.append(
            Reason(
                "mount_stuck",
                Status.UNHEALTHY,
                f"{' and '.join(stuck)} did not return within the deadline: {blocked.message}",
            )
        )

    for probe, result in fresh.items():
        if result.ok or probe in ("write", "quota"):
            continue  # write and quota failures have reasons of their own below
        reasons.append(
            Reason(
                "probe_failed",
                Status.DEGRADED,
                f"the {probe} probe failed: {result.message or result.error} ({result.error})",
            )
        )

    def value(probe: str):
        result = fresh.get(probe)
        return result.value if result is not None and result.ok else None

    fs: FilesystemInfo | None = value("statvfs")
    quota: QuotaReport | None = value("quota")
    if fs is not None and fs.readonly:
        reasons.append(
            Reason("readonly", Status.UNHEALTHY, f"{fs.mountpoint} is mounted read-only")
        )

    headroom = compute_headroom(fs, quota, now)
    reasons += _headroom_reasons(headroom, thresholds)
    fits, fit_reasons = fit(headroom, need_bytes, need_inodes)
    reasons += fit_reasons

    if quota is not None:
        reasons += _quota_reasons(quota, thresholds, now)
    quota_result = fresh.get("quota")
    if quota_result is not None and not quota_result.ok:
        reasons.append(
            Reason(
                "quota_unavailable",
                Status.DEGRADED,
                f"quota could not be read: {quota_result.message} ({quota_result.error})",
            )
        )

    reasons += _lustre_reasons(value("lfs_df") or (), thresholds)

    write_result = fresh.get("write")
    if write_result is not None:
        reasons += _write_reasons(write_result, snapshot.recent_write_errors, thresholds)

    tmpdir: TmpdirInfo | None = value("tmpdir")
    if thresholds.check_tmpdir and tmpdir is not None and not tmpdir.same_device:
        reasons.append(
            Reason(
                "tmpdir_cross_device",
                Status.DEGRADED,
                f"$TMPDIR ({tmpdir.path}) is on another filesystem: a checkpoint staged there "
                "is copied, not renamed, into place",
            )
        )

    return Verdict(_status(reasons, fresh), _ordered(reasons), headroom, fits)


#: The probes whose success says something about the target's health on its own; the $TMPDIR
#: check alone does not (a target must not read "ok" because only that one has answered yet).
_HEALTH_PROBES = ("statvfs", "write", "quota", "lfs_df")


def _status(reasons: list[Reason], fresh: Mapping[str, ProbeResult]) -> Status:
    worst = max((reason.severity for reason in reasons), default=Status.OK)
    anything_usable = any(fresh[kind].ok for kind in _HEALTH_PROBES if kind in fresh)
    if not anything_usable and worst is not Status.UNHEALTHY:
        return Status.UNKNOWN
    return worst


def _ordered(reasons: list[Reason]) -> tuple[Reason, ...]:
    """Worst first, then in the order found (which follows the data path)."""
    return tuple(sorted(reasons, key=lambda reason: -reason.severity))
