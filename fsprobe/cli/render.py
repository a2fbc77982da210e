"""Human output: a target's report as a short block a person can read at a glance.

Works on the JSON form of a report (`Report.to_dict()`), so that `fsprobe check` (fresh probes)
and `fsprobe status` (the daemon's state file) show exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from fsprobe.units import (
    format_bytes,
    format_count,
    format_duration,
    format_percent,
    format_seconds,
)

STATUS_COLORS = {"ok": "green", "degraded": "yellow", "unhealthy": "red", "unknown": "magenta"}
_LABEL_WIDTH = 8


def status_badge(status: str) -> str:
    return click.style(f" {status.upper()} ", fg="black", bg=STATUS_COLORS.get(status, "white"))


def _line(label: str, text: str) -> str:
    return f"  {label:<{_LABEL_WIDTH}}  {text}"


def _limit_note(limited_by: str | None) -> str:
    if not limited_by or limited_by == "filesystem":
        return ""
    return click.style(f"  (the {limited_by.split(':', 1)[1]} quota binds)", fg="cyan")


def _headroom_lines(report: Mapping[str, Any]) -> list[str]:
    fs, headroom = report.get("filesystem"), report["headroom"]
    lines = []
    for label, resource, fmt, unit, capacity in (
        ("space", "bytes", format_bytes, "", "size_bytes"),
        ("inodes", "inodes", format_count, " inodes", "files"),
    ):
        left, limited_by = headroom.get(resource), headroom.get(f"{resource}_limited_by")
        if left is None:
            continue
        text = f"{fmt(left)}{unit} free"
        if fs and limited_by == "filesystem":
            text += f" of {fmt(fs[capacity])}"
        text += f"  ({format_percent(headroom[f'{resource}_ratio'])} left)"
        lines.append(_line(label, text + _limit_note(limited_by)))
    return lines


def _usage_text(usage: Mapping[str, Any], fmt, now: float) -> str:
    limit = usage.get("hard") or usage.get("soft")
    text = fmt(usage["used"])
    if usage.get("soft") is not None:
        text += f" / soft {fmt(usage['soft'])}"
    if usage.get("hard") is not None:
        text += f" / hard {fmt(usage['hard'])}"
    if limit:
        text += f" ({format_percent(usage['used'] / limit)})"
    if usage.get("state") == "grace_expired":
        text += click.style(", grace expired", fg="red")
    elif usage.get("state") == "hard_reached":
        text += click.style(", hard limit reached", fg="red")
    elif usage.get("grace_expires_at"):
        left = format_duration(usage["grace_expires_at"] - now)
        text += click.style(f", grace ends in {left}", fg="yellow")
    return text


def _has_limits(usage: Mapping[str, Any]) -> bool:
    return usage.get("soft") is not None or usage.get("hard") is not None


def quota_lines(entries: list[Mapping[str, Any]], now: float) -> list[str]:
    """Per quota ID: one line when it has no limits, else one line per limited resource."""
    lines = []
    for entry in entries:
        who = f"{entry['type']} {entry.get('name') or entry['id']}"
        label = "" if lines else "quota"
        space, inodes = entry["bytes"], entry["inodes"]
        if not (_has_limits(space) or _has_limits(inodes)):
            used = f"{format_bytes(space['used'])}, {format_count(inodes['used'])} inodes"
            lines.append(_line(label, f"{who:<16} {used}  (no limits)"))
            continue
        limited = [
            (noun, usage, fmt)
            for noun, usage, fmt in (
                ("space", space, format_bytes),
                ("inodes", inodes, format_count),
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


def _write_line(write: Mapping[str, Any] | None) -> list[str]:
    if write is None:
        return []
    latency = write.get("latency_seconds") or {}
    steps = sorted(
        ((step, seconds) for step, seconds in latency.items() if step != "total"),
        key=lambda item: -item[1],
    )
    detail = ", ".join(f"{step} {format_seconds(seconds)}" for step, seconds in steps[:3])
    if write.get("ok"):
        text = f"{format_bytes(write['bytes'])} atomic save in {format_seconds(latency['total'])}"
        return [_line("write", f"{text}  ({detail})")]
    return [_line("write", click.style(write.get("message") or "failed", fg="red"))]


def _need_line(report: Mapping[str, Any]) -> list[str]:
    need = report.get("need") or {}
    if need.get("bytes") is None and need.get("inodes") is None:
        return []
    parts = []
    if need.get("bytes") is not None:
        parts.append(format_bytes(need["bytes"]))
    if need.get("inodes") is not None:
        parts.append(f"{format_count(need['inodes'])} inode{'s' if need['inodes'] != 1 else ''}")
    fits = report.get("fits")
    answer = {True: click.style("fits", fg="green"), False: click.style("does NOT fit", fg="red")}
    return [_line("need", f"{' + '.join(parts)}: {answer.get(fits, 'cannot tell')}")]


def render_report(report: Mapping[str, Any], now: float) -> str:
    """The full block for one target, status first, reasons last."""
    fs = report.get("filesystem")
    where = f"{fs['fstype']} on {fs['mountpoint']}" if fs else "filesystem not readable"
    lines = [
        f"{status_badge(report['status'])} {click.style(report['path'], bold=True)}  ({where})"
    ]
    lines += _headroom_lines(report)
    if report.get("quota"):
        lines += quota_lines(report["quota"], now)
    lines += _write_line(report.get("write_probe"))
    tmpdir = report.get("tmpdir")
    if tmpdir is not None:
        same = "same filesystem" if tmpdir["same_device"] else "another filesystem"
        lines.append(_line("tmpdir", f"{tmpdir['path']}: {same}"))
    lines += _need_line(report)
    if report["reasons"]:
        lines.append("")
        width = max(len(reason["code"]) for reason in report["reasons"])
        for reason in report["reasons"]:
            severity = click.style(
                f"{reason['severity']:<9}", fg=STATUS_COLORS.get(reason["severity"])
            )
            lines.append(f"  {severity} {reason['code']:<{width}}  {reason['message']}")
    return "\n".join(lines)
