"""Human output: a target's report as a short block a person can read at a glance.

Works on the typed `Report`, so that `fsprobe check` (fresh probes) and whatever reads a report
back from the daemon's state file show exactly the same thing.
"""

from __future__ import annotations

import click

from fsprobe.model import (
    FilesystemInfo,
    LustreImport,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Reason,
)
from fsprobe.policy import Headroom, reached_imports
from fsprobe.posix.paths import escaped
from fsprobe.report import Report
from fsprobe.units import (
    format_bytes,
    format_clock,
    format_count,
    format_duration,
    format_percent,
    format_seconds,
)

STATUS_COLORS = {
    "ok": "green",
    "notice": "cyan",
    "degraded": "yellow",
    "unhealthy": "red",
    "unknown": "magenta",
}
_LABEL_WIDTH = 8


def status_badge(status: str) -> str:
    return click.style(f" {status.upper()} ", fg="black", bg=STATUS_COLORS.get(status, "white"))


def _line(label: str, text: str) -> str:
    return f"  {label:<{_LABEL_WIDTH}}  {text}"


def _limit_note(limited_by: str | None) -> str:
    if not limited_by or limited_by == "filesystem":
        return ""
    kind, _, pool = limited_by.split(":", 1)[1].partition("@")
    which = f"{kind} quota of pool {pool}" if pool else f"{kind} quota"
    return click.style(f"  (the {which} binds)", fg="cyan")


def _headroom_lines(fs: FilesystemInfo | None, headroom: Headroom) -> list[str]:
    lines = []
    for label, left, ratio, limited_by, capacity, fmt, unit in (
        (
            "space",
            headroom.bytes,
            headroom.bytes_ratio,
            headroom.bytes_limited_by,
            fs.size_bytes if fs else None,
            format_bytes,
            "",
        ),
        (
            "inodes",
            headroom.inodes,
            headroom.inodes_ratio,
            headroom.inodes_limited_by,
            fs.files if fs else None,
            format_count,
            " inodes",
        ),
    ):
        if left is None:
            continue
        text = f"{fmt(left)}{unit} free"
        if capacity is not None and limited_by == "filesystem":
            text += f" of {fmt(capacity)}"
        if ratio is not None:
            text += f"  ({format_percent(ratio)} left)"
        lines.append(_line(label, text + _limit_note(limited_by)))
    return lines


def _usage_text(usage: QuotaUsage, fmt, now: float) -> str:
    limit = usage.hard or usage.soft
    text = fmt(usage.used)
    if usage.soft is not None:
        text += f" / soft {fmt(usage.soft)}"
    if usage.hard is not None:
        text += f" / hard {fmt(usage.hard)}"
    if limit:
        text += f" ({format_percent(usage.used / limit)})"
    state = usage.state_at(now)
    if state is QuotaState.GRACE_EXPIRED:
        text += click.style(", grace expired", fg="red")
    elif state is QuotaState.HARD_REACHED:
        text += click.style(", hard limit reached", fg="red")
    elif usage.grace_expires_at:
        left = format_duration(usage.grace_expires_at - now)
        text += click.style(f", grace ends in {left}", fg="yellow")
    return text


def _has_limits(usage: QuotaUsage) -> bool:
    return usage.soft is not None or usage.hard is not None


def quota_lines(entries: tuple[QuotaEntry, ...], now: float) -> list[str]:
    """Per quota ID: one line when it has no limits, else one line per limited resource."""
    lines: list[str] = []
    for entry in entries:
        who = f"{entry.type} {entry.name or entry.id}" + (f"@{entry.pool}" if entry.pool else "")
        label = "" if lines else "quota"
        if not (_has_limits(entry.bytes) or _has_limits(entry.inodes)):
            used = f"{format_bytes(entry.bytes.used)}, {format_count(entry.inodes.used)} inodes"
            lines.append(_line(label, f"{who:<16} {used}  (no limits)"))
            continue
        limited = [
            (noun, usage, fmt)
            for noun, usage, fmt in (
                ("space", entry.bytes, format_bytes),
                ("inodes", entry.inodes, format_count),
            )
            if _has_limits(usage)
        ]
        for index, (noun, usage, fmt) in enumerate(limited):
            name = who if index == 0 else ""
            lines.append(
                _line(
                    label if index == 0 else "",
                    f"{name:<16} {noun:<6} {_usage_text(usage, fmt, now)}",
                )
            )
    return lines


def _write_line(report: Report) -> list[str]:
    result = report.snapshot.get("write")
    if result is None:
        return []
    if result.stuck:
        return [_line("write", click.style(f"stuck: {escaped(result.message or '')}", fg="red"))]
    write = result.value
    if write is None:
        return [
            _line(
                "write", click.style(escaped(result.message or result.error or "failed"), fg="red")
            )
        ]
    steps = sorted(
        ((step, seconds) for step, seconds in write.latency_seconds.items() if step != "total"),
        key=lambda item: -item[1],
    )
    detail = ", ".join(f"{step} {format_seconds(seconds)}" for step, seconds in steps[:3])
    if write.ok:
        text = f"{format_bytes(write.bytes)} atomic save in {format_seconds(write.total_seconds)}"
        return [_line("write", f"{text}  ({detail})")]
    return [_line("write", click.style(escaped(write.message or "failed"), fg="red"))]


def _connection_line(report: Report, now: float) -> list[str]:
    """This node's connection to the Lustre targets a new file can meet (the imports probe)."""
    imports: tuple[LustreImport, ...] | None = report.snapshot.value("imports")
    if not imports:
        return []
    meets = reached_imports(imports, report.snapshot.value("lfs_df") or ())
    lost = [t for t in meets if not t.connected]
    recovering = [t for t in meets if t.recovering]
    text = f"{len(meets) - len(lost)} of {len(meets)} targets connected"
    if lost:
        names = ", ".join(f"{escaped(t.name)} {escaped(t.state)}{_since(t, now)}" for t in lost[:3])
        text = click.style(f"{text}; lost: {names}", fg="yellow")
    if recovering:
        names = ", ".join(f"{escaped(t.name)} {escaped(t.state)}" for t in recovering[:3])
        text += click.style(f"; in recovery: {names}", fg="yellow")
    inactive = [t for t in imports if not t.active]
    if inactive:
        text += f"; deactivated: {', '.join(escaped(t.name) for t in inactive[:3])}"
    evicted = [t.last_eviction for t in meets if t.last_eviction is not None]
    if evicted:
        text += f"; last evicted at {format_clock(max(evicted), now)}"
    return [_line("lustre", text)]


def _since(target: LustreImport, now: float) -> str:
    if target.lost_at is not None:
        return f" since {format_clock(target.lost_at, now)}"
    if target.lost_before is not None:
        return f" since before {format_clock(target.lost_before, now)}"
    return ""


def _need_line(report: Report) -> list[str]:
    if report.need_bytes is None and report.need_inodes is None:
        return []
    parts = []
    if report.need_bytes is not None:
        parts.append(format_bytes(report.need_bytes))
    if report.need_inodes is not None:
        plural = "s" if report.need_inodes != 1 else ""
        parts.append(f"{format_count(report.need_inodes)} inode{plural}")
    answer: dict[bool | None, str] = {
        True: click.style("fits", fg="green"),
        False: click.style("does NOT fit", fg="red"),
    }
    return [_line("need", f"{' + '.join(parts)}: {answer.get(report.fits, 'cannot tell')}")]


def reason_lines(reasons: tuple[Reason, ...], indent: str = "  ") -> list[str]:
    """One line per reason: severity, code, sentence."""
    width = max((len(reason.code) for reason in reasons), default=0)
    lines = []
    for reason in reasons:
        label = reason.severity.label
        severity = click.style(f"{label:<9}", fg=STATUS_COLORS.get(label))
        lines.append(f"{indent}{severity} {reason.code:<{width}}  {escaped(reason.message)}")
    return lines


def render_summary(path: str, status: str, reasons: tuple[Reason, ...]) -> str:
    """One line for one target: status, path, and each reason with its sentence (what
    `fsprobe run --once` prints, for the mail cron sends)."""
    line = f"{status_badge(status)} {escaped(path)}"
    if reasons:
        line += "  " + "; ".join(f"{r.code}: {escaped(r.message)}" for r in reasons)
    return line


def render_report(report: Report, now: float) -> str:
    """The full block for one target, status first, reasons last."""
    fs: FilesystemInfo | None = report.snapshot.value("statvfs")
    where = f"{fs.fstype} on {escaped(fs.mountpoint)}" if fs else "filesystem not readable"
    path = click.style(escaped(report.path), bold=True)
    lines = [f"{status_badge(report.status.label)} {path}  ({where})"]
    if fs is not None and not fs.target_exists:
        lines.append(
            f"  does not exist: judged by {escaped(fs.probed_path)}, its nearest existing parent"
        )
    lines += _headroom_lines(fs, report.verdict.headroom)
    quota: QuotaReport | None = report.snapshot.value("quota")
    if quota is not None and quota.entries:
        lines += quota_lines(quota.entries, now)
    lines += _write_line(report)
    lines += _connection_line(report, now)
    tmpdir = report.snapshot.value("tmpdir")
    if tmpdir is not None:
        same = "same filesystem" if tmpdir.same_device else "another filesystem"
        if not tmpdir.same_device and tmpdir.free_bytes is not None:
            same += f", {format_bytes(tmpdir.free_bytes)} free"
        lines.append(_line("tmpdir", f"{escaped(tmpdir.path)}: {same}"))
    lines += _need_line(report)
    if report.reasons:
        lines += ["", *reason_lines(report.reasons)]
    return "\n".join(lines)
