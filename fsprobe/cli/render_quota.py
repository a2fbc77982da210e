"""`fsprobe quota` output: a table for a person, JSON for scripts.

The last line names the quota that stops the next write, and when: a hard limit reached or an
expired grace period now, a running grace period when it ends, else the one with least room.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from fsprobe.model import QuotaEntry, QuotaReport, QuotaState, QuotaUsage
from fsprobe.posix.paths import escaped
from fsprobe.report import QUOTA_ENTRY
from fsprobe.units import format_bytes, format_count, format_duration, format_percent

_RESOURCES = (("space", "bytes"), ("inodes", "inodes"))
_STATE_WORDS = {
    QuotaState.OK: "ok",
    QuotaState.SOFT_EXCEEDED: "over soft limit",
    QuotaState.GRACE_EXPIRED: "grace expired",
    QuotaState.HARD_REACHED: "hard limit reached",
}
_COLUMNS = ("QUOTA", "", "USED", "SOFT", "HARD", "USE", "STATE")


def who(entry: QuotaEntry) -> str:
    """``user alice (1000)``, ``project 4242``, ``user alice (1000) in pool flash``."""
    pool = f" in pool {entry.pool}" if entry.pool else ""
    if entry.name:
        return f"{entry.type} {entry.name} ({entry.id}){pool}"
    return f"{entry.type} {entry.id}{pool}"


def _amount(value: int | None, resource: str) -> str:
    if value is None:
        return "-"
    return format_bytes(value) if resource == "bytes" else format_count(value)


def _enforced(usage: QuotaUsage) -> int | None:
    """The limit the percentage is taken of: the hard one, else the soft one."""
    return usage.hard if usage.hard is not None else usage.soft


def grace_words(usage: QuotaUsage, now: float) -> str:
    """``expires in 2 days 4 hours``, ``expired``, or empty when no timer runs."""
    if usage.state_at(now) is QuotaState.GRACE_EXPIRED:
        return "expired"
    if usage.grace_expires_at is None:
        return ""
    left = usage.grace_expires_at - now
    return f"expires in {format_duration(left)}" if left > 0 else "expired"


def _state(usage: QuotaUsage, now: float) -> str:
    state = usage.state_at(now)
    words = _STATE_WORDS[state]
    grace = grace_words(usage, now)
    if state is QuotaState.SOFT_EXCEEDED and grace:
        words = f"{words}, grace {grace}"
    return words + (" (inaccurate)" if usage.inaccurate else "")


def _rows(report: QuotaReport, now: float) -> Iterator[tuple[str, ...]]:
    for entry in report.entries:
        for number, (word, resource) in enumerate(_RESOURCES):
            usage: QuotaUsage = getattr(entry, resource)
            limit = _enforced(usage)
            share = format_percent(usage.used / limit) if limit else "-"
            yield (
                who(entry) if number == 0 else "",
                word,
                _amount(usage.used, resource),
                _amount(usage.soft, resource),
                _amount(usage.hard, resource),
                share,
                _state(usage, now),
            )


def table(report: QuotaReport, now: float) -> str:
    rows = [_COLUMNS, *_rows(report, now)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    right = {2, 3, 4, 5}
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


_NO_LIMIT = ((3, 0.0), "No quota limit applies to new files here.")


def _urgency(
    usage: QuotaUsage, name: str, resource: str, now: float
) -> tuple[tuple[int, float], str]:
    """(sort key, sentence): writes failing now first, then the earliest grace, then room left.

    The key is (0, 0) for "fails now", (1, seconds left) for a running grace period, (2, share
    of the hard limit still free), and (3, 0) when no limit applies.
    """
    state = usage.state_at(now)
    if state is QuotaState.HARD_REACHED:
        limit = _amount(usage.hard, resource)
        return (0, 0.0), f"Writes fail now: {name} reached its hard limit ({limit})."
    if state is QuotaState.GRACE_EXPIRED:
        limit = _amount(usage.soft, resource)
        return (0, 0.0), f"Writes fail now: {name} is over its soft limit ({limit}), grace expired."
    if state is QuotaState.SOFT_EXCEEDED:
        limit = _amount(usage.soft, resource)
        expires = usage.grace_expires_at
        when = grace_words(usage, now) or "at an unknown time"
        if expires is not None:
            when += time.strftime(" (%Y-%m-%d %H:%M)", time.localtime(expires))
        return (1, expires - now if expires is not None else 0.0), (
            f"Writes fail when the grace period ends: {name} is over its soft limit ({limit}); "
            f"grace {when}, unless usage drops below it."
        )
    remaining = usage.remaining(now)
    if usage.hard and remaining is not None:
        left, used = _amount(remaining, resource), format_percent(usage.used / usage.hard)
        return (2, remaining / usage.hard), (
            f"Closest limit: {name}, {left} left ({used} of the hard limit used)."
        )
    return _NO_LIMIT


def verdict(report: QuotaReport, now: float) -> str:
    """One sentence: which quota stops the next write, and when."""
    candidates = [
        _urgency(getattr(entry, resource), f"{who(entry)} {word}", resource, now)
        for entry in report.entries
        for word, resource in _RESOURCES
    ]
    return min(candidates, default=_NO_LIMIT, key=lambda candidate: candidate[0])[1]


def render(
    path: str, mountpoint: str | None, fstype: str | None, report: QuotaReport, now: float
) -> str:
    """The human output of `fsprobe quota`."""
    where = f"{fstype or 'unknown filesystem'} at {escaped(mountpoint or '?')}"
    lines = [f"Quota for new files in {escaped(path)} ({where}, read with {report.provider})", ""]
    lines.append(table(report, now) if report.entries else "(no quota entries)")
    lines += ["", verdict(report, now)]
    lines += [f"Note: {escaped(note)}." for note in report.notes]
    if report.inaccurate:
        lines.append(
            "Note: values marked inaccurate were printed in [brackets] by lfs: a storage "
            "target did not answer while usage was collected, so the real figures may be higher."
        )
    return "\n".join(lines)


def as_json(
    path: str, mountpoint: str | None, provider: str | None, report: QuotaReport | None
) -> dict:
    """``{path, mountpoint, provider, quota: [...], inaccurate, errors: [...], notes: [...]}``."""
    return {
        "path": path,
        "mountpoint": mountpoint,
        "provider": provider,
        "quota": [QUOTA_ENTRY.encode(e) for e in report.entries] if report is not None else None,
        "inaccurate": report.inaccurate if report is not None else False,
        "errors": list(report.errors) if report is not None else [],
        "notes": list(report.notes) if report is not None else [],
    }
