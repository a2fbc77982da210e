"""`fsprobe status`: what the running daemon sees, read from its state file (no probe runs).

A missing, stale, untrusted or corrupt file, or a writer that is gone (its lock on the state
dir, not a pid), is said with what to do, and exits 3 (docs/reference.md).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

import click

from fsprobe.cli.render import STATUS_COLORS, reason_lines
from fsprobe.events.evidence import BY_SAVE
from fsprobe.model import LastSave, QuotaReport, Status, WriteProbeResult
from fsprobe.posix.paths import escaped
from fsprobe.report import TargetState
from fsprobe.state import (
    WRITER,
    StateFile,
    StateFileError,
    StateReader,
    Writer,
    default_state_dir,
    writer_running,
)
from fsprobe.units import format_bytes, format_count, format_percent, format_seconds

_COLUMNS = (
    "STATUS",
    "TARGET",
    "SPACE FREE",
    "INODES FREE",
    "QUOTA",
    "WRITE",
    "LAST SAVE",
    "AGE",
)


def pid_alive(host: str | None, pid: int | None) -> bool | None:
    """A guess at whether `pid` on `host` still runs; None for another host or no pid.

    Only for a state file without a writer lock: a pid may have been reused since.
    """
    if host != socket.gethostname() or pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def short_age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _headroom(left: int | None, ratio: float | None, limited_by: str | None, fmt) -> str:
    if left is None:
        return "-"
    notes = [format_percent(ratio)] if ratio is not None else []
    if limited_by and limited_by != "filesystem":
        notes.append(f"{limited_by.split(':', 1)[1]} quota")
    return fmt(left) + (f" ({', '.join(notes)})" if notes else "")


def _quota(quota: QuotaReport | None, now: float) -> str:
    """The fullest quota, as "project 42: inodes 93 %"; "-" when there is none."""
    if quota is None or not quota.entries:
        return "-"
    worst: tuple[float, str] | None = None
    for entry in quota.entries:
        for resource, usage in (("bytes", entry.bytes), ("inodes", entry.inodes)):
            limit = usage.hard or usage.soft
            if not limit:
                continue
            ratio = usage.used / limit
            text = f"{entry.type} {entry.name or entry.id}: {resource} {format_percent(ratio)}"
            state = usage.state_at(now).value
            if state != "ok":
                text += f" {state.replace('_', ' ')}"
            if worst is None or ratio > worst[0]:
                worst = (ratio, text)
    return worst[1] if worst is not None else "no limits"


def _write(target: TargetState) -> str:
    result = target.report.snapshot.get("write")
    if result is None:
        return "-"
    if result.stuck:
        return "stuck"
    write: WriteProbeResult | None = result.value
    if write is None:
        return result.error or "failed"
    if write.ok:
        return "by save" if write.message == BY_SAVE else format_seconds(write.total_seconds)
    return f"{write.errno or 'failed'} at {write.step or '?'}"


def _last_save(save: LastSave | None, now: float) -> str:
    """The latest real save in short: "retried 2 min ago" ("-" when none was heard of)."""
    return "-" if save is None else f"{save.outcome} {short_age(now - save.at)} ago"


def _last_save_line(save: LastSave) -> str:
    """The latest real save in full: when, how long, how it went, where it landed."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(save.at))
    size = f"{format_bytes(save.bytes)} " if save.landed is not None else ""
    line = f"last save {save.outcome} at {when}: {size}in {format_seconds(save.seconds)}"
    if save.failures:
        line += " after " + ", ".join(f"{errno} at {step}" for errno, step in save.failures)
    where = escaped(save.requested)
    if save.landed is not None and save.landed != save.requested:
        where += f" -> {escaped(save.landed)}"
    ranks = f", {save.ranks} ranks" if save.ranks > 1 else ""
    return f"{line}; {where} (uid {save.uid}, pid {save.pid} on {escaped(save.host)}{ranks})"


def _row(path: str, target: TargetState, now: float) -> list[str]:
    headroom = target.report.verdict.headroom
    return [
        target.report.status.label,
        escaped(path),
        _headroom(headroom.bytes, headroom.bytes_ratio, headroom.bytes_limited_by, format_bytes),
        _headroom(headroom.inodes, headroom.inodes_ratio, headroom.inodes_limited_by, format_count),
        "elsewhere"
        if target.server_probes_elsewhere
        else _quota(target.report.snapshot.value("quota"), now),
        _write(target),
        _last_save(target.last_save, now),
        short_age(now - target.updated_at),
    ]


def render_table(targets: dict[str, TargetState], now: float) -> str:
    rows = [_row(path, target, now) for path, target in targets.items()]
    widths = [max(len(row[i]) for row in [list(_COLUMNS), *rows]) for i in range(len(_COLUMNS))]
    lines = ["  ".join(title.ljust(width) for title, width in zip(_COLUMNS, widths)).rstrip()]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        cells[0] = click.style(cells[0], fg=STATUS_COLORS.get(row[0]), bold=True)
        lines.append("  ".join(cells).rstrip())
    for path, target in targets.items():
        details = reason_lines(target.report.reasons) if target.report.reasons else []
        if target.server_probes_elsewhere:
            details.append(f"  server probes: not here, {target.server_probes_elsewhere}")
        if target.last_save is not None:
            details.append(f"  {_last_save_line(target.last_save)}")
        if details:
            lines += ["", click.style(escaped(path), bold=True), *details]
    return "\n".join(lines)


@dataclass(frozen=True)
class _Assessment:
    """What the state says about its writer and its age, judged once for both outputs."""

    running: bool | None  # None: cannot tell (another host, no lock, no pid)
    gone: bool  # a daemon that is not running any more (a --once run is never "gone")
    stale: bool  # some target's verdict no longer holds
    fresh_until: float | None
    status: Status


def _assess(
    state: StateFile, targets: dict[str, TargetState], running: bool | None, now: float
) -> _Assessment:
    writer = state.writer
    if running is None:
        running = pid_alive(writer.host, writer.pid)
    gone = running is False and not writer.once
    ends = [t.report.verdict.fresh_until for t in targets.values()]
    known = [end for end in ends if end is not None]
    fresh_until = None if len(known) < len(ends) else min(known, default=None)
    stale = any(not t.report.verdict.is_fresh(now) for t in targets.values())
    worst = max((t.report.status for t in targets.values()), default=Status.UNKNOWN)
    unknown = gone or stale or writer.failure is not None
    return _Assessment(running, gone, stale, fresh_until, Status.UNKNOWN if unknown else worst)


def _clock(moment: float, now: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(moment))
    return f"{when} ({short_age(now - moment)} ago)"


def _describe(writer: Writer) -> str:
    command = "fsprobe run --once" if writer.once else "fsprobe run"
    return f"{command} (pid {writer.pid} on {writer.host})"


def _warning(state: StateFile, assessment: _Assessment, now: float) -> str | None:
    """The line that says why the numbers below cannot be taken as current, if they cannot."""
    writer = state.writer
    if writer.failure is not None:
        since = writer.stopped_at if writer.stopped_at is not None else state.generated_at
        doing = "stopped" if assessment.gone else "is running but not probing"
        return (
            f"{_describe(writer)} {doing} since {_clock(since, now)}: {writer.failure}. "
            "The numbers below are its last view, not current"
            + ("." if assessment.gone else "; restart it (and report the bug in its log).")
        )
    if assessment.gone:
        if writer.stopped_at is not None:
            return (
                f"{_describe(writer)} is not running since {_clock(writer.stopped_at, now)}: "
                "it stopped cleanly. The numbers below are its last view; start it again to "
                "watch these targets."
            )
        return (
            f"{_describe(writer)} is not running since {_clock(state.generated_at, now)} at "
            "the latest (its last write): it did not stop cleanly (killed, or crashed?). "
            "The numbers below are its last view; start it again to watch these targets."
        )
    if assessment.stale:
        why = {
            True: "which is still running but has stopped writing it (hung?)",
            False: "which has exited (a one-off run)",
            None: "on another host",
        }[assessment.running]
        return (
            f"{state.path} was last written {short_age(now - state.generated_at)} ago by "
            f"{_describe(writer)}, {why}; the numbers below are that old. Start `fsprobe run` "
            "again or point --state-dir at the running daemon's state dir."
        )
    return None


def _problem(path: str, message: str, as_json: bool) -> int:
    if as_json:
        click.echo(
            json.dumps({"state_file": path, "status": "unknown", "error": message}, indent=2)
        )
    else:
        badge = click.style(" UNKNOWN ", fg="black", bg="magenta")
        click.echo(f"{badge} {escaped(message)}", err=True)
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
    state, a daemon that is not running any more, stale state, or a state file that cannot
    be trusted.
    """
    state_dir = state_dir or default_state_dir()
    reader = StateReader(state_dir)
    try:
        state = reader.read()
        targets = {}
        if state is not None:
            writer = state.writer  # the top level: read here, where its error is caught
            targets = {name: TargetState.read(state, name) for name in state.names}
    except StateFileError as error:
        return _problem(reader.path, f"cannot use the state file: {error}", as_json)
    if state is None:
        return _problem(
            reader.path,
            f"no fsprobe daemon has written state in {state_dir}: start one with "
            "`fsprobe run PATH` or point --state-dir / FSPROBE_STATE_DIR at it",
            as_json,
        )
    now = time.time()
    assessment = _assess(state, targets, writer_running(state_dir), now)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "state_file": state.path,
                    "status": assessment.status.label,
                    "running": assessment.running,
                    "stale": assessment.stale,
                    "age_seconds": now - state.generated_at,
                    "fresh_until": assessment.fresh_until,
                    "writer": {**WRITER.encode(writer), "alive": assessment.running},
                    "targets": {path: target.to_dict() for path, target in targets.items()},
                },
                indent=2,
            )
        )
        return int(assessment.status)
    warning = _warning(state, assessment, now)
    if warning is not None:
        badge = " NOT RUNNING " if assessment.gone else " STALE "
        click.echo(
            click.style(badge, fg="black", bg="magenta") + f" {escaped(warning)}\n", err=True
        )
    else:
        age = short_age(now - state.generated_at)
        click.echo(f"{escaped(_describe(writer))}, state written {age} ago\n")
    click.echo(render_table(targets, now))
    return int(assessment.status)
