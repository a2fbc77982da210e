"""`fsprobe status`: what the running daemon sees, from its state file, at a glance.

Reads the state file only — no probe runs — so it answers at once even on a hung mount. When
the file is missing, stale, untrusted or corrupt, it says so and what to do, and exits 3
(unknown), as a monitoring plugin would.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import click

from fsprobe.cli.render import STATUS_COLORS
from fsprobe.model import Status
from fsprobe.state import StateFile, StateFileError, StateReader, default_state_dir
from fsprobe.units import format_bytes, format_count, format_percent, format_seconds

#: The state counts as stale after this many of its shortest probe interval without a rewrite
#: (the daemon rewrites it after every probe), and never before STALE_FLOOR seconds.
STALE_INTERVALS = 3
STALE_FLOOR = 30.0
_COLUMNS = ("STATUS", "TARGET", "SPACE FREE", "INODES FREE", "QUOTA", "WRITE", "AGE")


def stale_after(state: StateFile) -> float:
    intervals = [
        float(seconds)
        for target in state.targets.values()
        for seconds in (target.get("intervals") or {}).values()
    ]
    return max(STALE_FLOOR, STALE_INTERVALS * min(intervals, default=15.0))


def writer_alive(host: Any, pid: Any) -> bool | None:
    """Whether the daemon that wrote the state still runs; None when it ran on another host."""
    if host != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _status_of(label: Any) -> Status:
    try:
        return Status[str(label).upper()]
    except KeyError:
        return Status.UNKNOWN


def short_age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _headroom(target: Mapping[str, Any], resource: str, fmt) -> str:
    headroom = target.get("headroom") or {}
    left, ratio = headroom.get(resource), headroom.get(f"{resource}_ratio")
    if left is None:
        return "-"
    notes = [format_percent(ratio)] if ratio is not None else []
    limited_by = headroom.get(f"{resource}_limited_by") or "filesystem"
    if limited_by != "filesystem":
        notes.append(f"{limited_by.split(':', 1)[1]} quota")
    return fmt(left) + (f" ({', '.join(notes)})" if notes else "")


def _quota(target: Mapping[str, Any]) -> str:
    """The fullest quota, as "project 42: inodes 93 %"; "-" when there is none."""
    worst: tuple[float, str] | None = None
    for entry in target.get("quota") or ():
        for resource in ("bytes", "inodes"):
            usage = entry[resource]
            limit = usage.get("hard") or usage.get("soft")
            if not limit:
                continue
            ratio = usage["used"] / limit
            state = usage.get("state") or "ok"
            who = f"{entry['type']} {entry.get('name') or entry['id']}"
            text = f"{who}: {resource} {format_percent(ratio)}"
            if state != "ok":
                text += f" {state.replace('_', ' ')}"
            if worst is None or ratio > worst[0]:
                worst = (ratio, text)
    if worst is not None:
        return worst[1]
    return "no limits" if target.get("quota") else "-"


def _write(target: Mapping[str, Any]) -> str:
    probe = (target.get("probes") or {}).get("write") or {}
    if probe.get("stuck"):
        return "stuck"
    write = target.get("write_probe")
    if not write:
        return "-"
    if write.get("ok"):
        return format_seconds(write["latency_seconds"]["total"])
    return f"{write.get('errno') or 'failed'} at {write.get('step') or '?'}"


def _row(path: str, target: Mapping[str, Any], now: float) -> list[str]:
    updated = target.get("updated_at") or target.get("probed_at")
    return [
        str(target["status"]),
        path,
        _headroom(target, "bytes", format_bytes),
        _headroom(target, "inodes", format_count),
        _quota(target),
        _write(target),
        short_age(now - float(updated)) if updated else "-",
    ]


def render_table(state: StateFile, now: float) -> str:
    rows = [_row(path, target, now) for path, target in sorted(state.targets.items())]
    widths = [max(len(row[i]) for row in [list(_COLUMNS), *rows]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(title.ljust(width) for title, width in zip(_COLUMNS, widths)).rstrip()]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        cells[0] = click.style(cells[0], fg=STATUS_COLORS.get(row[0]), bold=True)
        lines.append("  ".join(cells).rstrip())
    for path, target in sorted(state.targets.items()):
        if target["status"] == "ok" or not target.get("reasons"):
            continue
        lines += ["", click.style(path, bold=True)]
        for reason in target["reasons"]:
            severity = reason["severity"]
            word = click.style(f"{severity:<9}", fg=STATUS_COLORS.get(severity))
            lines.append(f"  {word} {reason['code']}: {reason['message']}")
    return "\n".join(lines)


def _writer(state: StateFile) -> str:
    document = state.document
    return f"pid {document.get('pid')} on {document.get('host')}"


def _problem(path: str, message: str, as_json: bool) -> int:
    if as_json:
        click.echo(
            json.dumps({"state_file": path, "status": "unknown", "error": message}, indent=2)
        )
    else:
        click.echo(f"{click.style(' UNKNOWN ', fg='black', bg='magenta')} {message}", err=True)
    return int(Status.UNKNOWN)


@click.command()
@click.option(
    "--state-dir",
    metavar="DIR",
    help="The daemon's state dir [env FSPROBE_STATE_DIR; default $XDG_RUNTIME_DIR/fsprobe, "
    "else /tmp/fsprobe-UID].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object for scripts.")
def status(state_dir: str | None, as_json: bool) -> int:
    """Show what the running `fsprobe run` daemon sees, without probing anything.

    One line per watched target: status, free space and inodes (the tighter of filesystem
    and quota), the fullest quota, the latest test-write latency, and the age of the data.
    Exit status: 0 ok, 1 degraded, 2 unhealthy (the worst target), 3 unknown: no daemon
    state, stale state, or a state file that cannot be trusted.
    """
    state_dir = state_dir or default_state_dir()
    reader = StateReader(state_dir)
    try:
        state = reader.read()
    except StateFileError as error:
        return _problem(reader.path, f"cannot use the state file: {error}", as_json)
    if state is None:
        return _problem(
            reader.path,
            f"no fsprobe daemon has written state in {state_dir}: start one with "
            "`fsprobe run PATH` or point --state-dir / FSPROBE_STATE_DIR at it",
            as_json,
        )
    try:
        return _show(state, time.time(), as_json)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        message = (
            f"state file {state.path} has unexpected content ({type(error).__name__}: {error})"
        )
        return _problem(state.path, message, as_json)


def _show(state: StateFile, now: float, as_json: bool) -> int:
    age, limit = now - state.generated_at, stale_after(state)
    document = state.document
    alive = writer_alive(document.get("host"), document.get("pid"))
    stale = age > limit
    worst = max((_status_of(t["status"]) for t in state.targets.values()), default=Status.UNKNOWN)
    overall = Status.UNKNOWN if stale else worst
    if as_json:
        click.echo(
            json.dumps(
                {
                    "state_file": state.path,
                    "status": overall.label,
                    "stale": stale,
                    "age_seconds": age,
                    "stale_after_seconds": limit,
                    "writer": {
                        "host": document.get("host"),
                        "pid": document.get("pid"),
                        "alive": alive,
                        "version": document.get("version"),
                    },
                    "targets": dict(state.targets),
                },
                indent=2,
            )
        )
        return int(overall)
    table = render_table(state, now)  # before printing anything: it may find bad content
    if stale:
        running = {
            True: "which is still running but has stopped writing it (hung?)",
            False: "which is no longer running",
            None: "on another host",
        }[alive]
        click.echo(
            click.style(" STALE ", fg="black", bg="magenta")
            + f" {state.path} was last written {short_age(age)} ago by {_writer(state)}, "
            f"{running}; the numbers below are that old. Start `fsprobe run` again or point "
            "--state-dir at the running daemon's state dir.\n",
            err=True,
        )
    else:
        click.echo(f"fsprobe daemon {_writer(state)}, state written {short_age(age)} ago\n")
    click.echo(table)
    return int(overall)
