"""`fsprobe sync`: copy redirected checkpoints back once their target can take them again."""

from __future__ import annotations

import json
import sys
from collections import Counter

import click

from fsprobe.cli.meter import TerminalMeter
from fsprobe.cli.options import DIRECTORY, SECONDS, absolute_path
from fsprobe.posix.paths import escaped
from fsprobe.redirect.fallback import FALLBACK_ENV, all_fallback_dirs
from fsprobe.redirect.sync import ROUND_SECONDS, SyncReport
from fsprobe.redirect.sync import sync as run_sync
from fsprobe.saving.preflight import preflight_readiness
from fsprobe.saving.stale import clean_directory

#: Outcomes that need a person: the copy failed or does not match what was saved.
_TROUBLE = frozenset({"failed", "checksum_mismatch", "skipped", "too_many_entries"})
#: Outcomes that leave the entry pending for a later run.
_LEFT = frozenset({"waiting", "superseded", "would_sync"})

_COLORS = {
    "synced": "green",
    "pruned": "green",
    "would_sync": "cyan",
    "waiting": "yellow",
    "superseded": "yellow",
    "failed": "red",
    "checksum_mismatch": "red",
    "skipped": "red",
    "too_many_entries": "red",
}


def _line(action: str, path: str, message: str) -> str:
    label = click.style(f"{action:<17}", fg=_COLORS.get(action))
    # Each part escaped (messages name paths too): a name cannot forge a line of the output.
    return f"{label} {escaped(path)}\n{'':<17}   {escaped(message)}"


def human_lines(report: SyncReport) -> list[str]:
    """What a person reads: each entry that was acted on, then one line per file for the copies
    that later saves overwrote (``replaced``; `--json` lists each)."""
    lines = [
        _line(o.action, o.entry.requested, o.message) for o in report if o.action != "replaced"
    ]
    replaced = Counter(o.entry.requested for o in report if o.action == "replaced")
    for path, count in replaced.items():
        copies = "1 earlier copy" if count == 1 else f"{count} earlier copies"
        lines.append(_line("replaced", path, f"{copies} overwritten by later saves; forgotten"))
    return lines


def exit_status(report: SyncReport) -> int:
    """0: nothing left; 1: entries still pending (target not ready, newer original); 2: trouble,
    a user root could not act for, a fallback whose areas root could not all list, or a
    fallback directory that does not exist."""
    outcomes = report.outcomes
    if report.failures or report.crowded or report.missing:
        return 2
    if any(o.action in _TROUBLE for o in outcomes):
        return 2
    if any(o.action in _LEFT for o in outcomes):
        return 1
    return 0


@click.command()
@click.option(
    "--fallback-dir",
    "fallback_dirs",
    multiple=True,
    type=DIRECTORY,
    metavar="DIR",
    help=f"A fallback directory to look in (repeatable; also ${FALLBACK_ENV}, colon-separated).",
)
@click.option("--dry-run", is_flag=True, help="Only say what would be copied back.")
@click.option(
    "--prune-superseded",
    is_flag=True,
    help="Remove redirected copies whose original is newer (kept by default).",
)
@click.option(
    "--under",
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=str),
    callback=absolute_path,
    help="Only the checkpoints meant for DIR or below it.",
)
@click.option("--state-dir", metavar="DIR", help="Where the daemon's state file is.")
@click.option(
    "--timeout",
    type=SECONDS,
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Deadline for judging each target (a hung mount answers by then).",
)
@click.option(
    "--round-timeout",
    type=SECONDS,
    default=ROUND_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="As root: how long the runs as the other users may take in all; each gets an equal "
    "share and is killed past it (an error for that user, the others go on).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object for scripts.")
def sync(
    fallback_dirs: tuple[str, ...],
    dry_run: bool,
    prune_superseded: bool,
    under: str | None,
    state_dir: str | None,
    timeout: float,
    round_timeout: float,
    as_json: bool,
) -> int:
    """Copy checkpoints that fsprobe.save redirected to a fallback back where they belong.

    For each entry of <fallback>/.fsprobe-redirects.jsonl whose target is healthy again and
    has room, the checkpoint is copied back atomically, its sha256 checked before the rename,
    and the fallback copy and the entry are removed. A newer checkpoint at the original path
    is never overwritten.

    \b
    Exit status: 0 nothing left to do, 1 entries still pending, 2 a copy failed or did not
    match its checksum, a fallback directory does not exist, or (as root) a user's
    checkpoints could not be synced as that user, 64 usage error.

    \b
    Examples:
      fsprobe sync --fallback-dir /scratch/$USER/fallback --dry-run
      FSPROBE_FALLBACK_DIRS=/scratch/$USER/fallback fsprobe sync --json
    """
    directories = all_fallback_dirs(fallback_dirs)
    if not directories:
        raise click.UsageError(f"give --fallback-dir DIR or set {FALLBACK_ENV}")
    report = run_sync(
        directories,
        dry_run=dry_run,
        prune_superseded=prune_superseded,
        state_dir=state_dir,
        timeout=timeout,
        under=under,
        ready=preflight_readiness(state_dir, timeout),
        clean=clean_directory,
        round_seconds=round_timeout,
        meter=TerminalMeter(sys.stderr) if not as_json and sys.stderr.isatty() else None,
    )
    if as_json:
        document = {
            "fallback_dirs": list(directories),
            "dry_run": dry_run,
            "entries": [outcome.to_dict() for outcome in report],
            "failures": [failure.to_dict() for failure in report.failures],
            "crowded": report.crowded,
            "missing": report.missing,
        }
        click.echo(json.dumps(document, indent=2))
    elif report.outcomes:
        click.echo("\n".join(human_lines(report)))
    elif not report.failures and not report.crowded and not report.missing:
        click.echo(f"nothing to sync in {', '.join(map(escaped, directories))}")
    for missing in report.missing:
        click.echo(
            f"fsprobe sync: the fallback directory {escaped(missing)} does not exist "
            "(a typo, or not mounted here?): nothing can have been redirected there",
            err=True,
        )
    for crowded in report.crowded:
        click.echo(f"fsprobe sync: not every area was synced: {escaped(crowded)}", err=True)
    for failure in report.failures:  # one line per user, also under --json
        click.echo(
            f"fsprobe sync: cannot sync uid {failure.uid}'s checkpoints in "
            f"{escaped(failure.fallback)}: {escaped(failure.cause)}",
            err=True,
        )
    return exit_status(report)
