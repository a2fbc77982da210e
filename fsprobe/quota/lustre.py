"""The Lustre quota provider: `lfs quota -u/-g/-p ID DIR`, one ID per call, read by the parser.

Each call names one numeric ID (so the header can be checked against the question), and no
``-v``: per-target rows cost an RPC per OST and the policy does not need them. What lfs printed
is judged here, not in the parser: a row next to a non-zero exit status is still usable when the
status only says that some values are inaccurate (2.14+ exit 5 with ``[...]``); an "Unexpected
quotactl error" row (≤2.15) is not. Grace countdowns become absolute times.
"""

from __future__ import annotations

import re
import shlex

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.quota_parser import QuotaOutput, Usage, parse_quota
from fsprobe.lustre.runner import lfs_binary, run_lfs, status_error_name
from fsprobe.model import TIMEOUT, QuotaEntry, QuotaState, QuotaUsage
from fsprobe.probing.mounts import Mount
from fsprobe.quota.cache import SingleFlight
from fsprobe.quota.ids import id_name
from fsprobe.quota.provider import (
    Deadline,
    IdOutcome,
    QuotaProvider,
    QuotaRequest,
)
from fsprobe.quota.settings import ServerProbeSettings

_TYPE_FLAGS = {"user": "-u", "group": "-g", "project": "-p"}
_PROJECT_LINE = re.compile(r"^\s*([0-9]+) [P-] (.*)$")

#: Hints for the errors a user can do something about (reference 1.9).
_HINTS = {
    "permission_denied": (
        "lfs quota shows other users' and groups' quota to root only; a user may see their own "
        "uid, the groups they are in, and any project"
    ),
    "not_lustre": "the directory is not on a mounted Lustre filesystem",
    "not_enabled": "quota is not enabled for this type on the filesystem",
}

#: Results shared by every target and caller in this process (see `SingleFlight`).
QUOTA_CACHE: SingleFlight[IdOutcome] = SingleFlight()


def _limit(cell: Amount) -> int | None:
    return cell.value if cell.value > 0 else None


def usage_from_cells(cells: Usage, now: float) -> QuotaUsage:
    """Cells of a main row as a QuotaUsage: 0 limits are "no limit", grace made absolute.

    The state follows the server's marks (reference 1.5): a hard limit is reached when usage is
    at it, or when lfs marked the row ``*`` but shows no timer (it hides the timer then); a timer
    that ran out is grace_expired; a running one is soft_exceeded.
    """
    used, soft, hard = cells.used.value, _limit(cells.soft), _limit(cells.hard)
    grace = cells.grace
    marked_at_hard = cells.over and not grace.running and not grace.expired
    if hard is not None and (used >= hard or marked_at_hard):
        state = QuotaState.HARD_REACHED
    elif grace.expired:
        state = QuotaState.GRACE_EXPIRED
    elif grace.running:
        state = QuotaState.SOFT_EXCEEDED
    else:
        state = QuotaState.OK
    expires = now + grace.remaining if grace.remaining is not None else None
    return QuotaUsage(used, soft, hard, expires, state, cells.inaccurate)


def _unparsed_notes(output: QuotaOutput) -> tuple[str, ...]:
    return tuple(f"{PARSE}: cannot read {item.describe()}" for item in output.unparsed)


def _failure_text(output: QuotaOutput) -> str:
    """What lfs said, plus a hint when the message is one a user can act on."""
    said = [m.text for m in output.messages] or [
        u.text.strip() for u in output.unparsed if u.stream == "stderr"
    ]
    text = " ".join(said) or "no message"
    for message in output.messages:
        if message.kind in _HINTS:
            return f"{text} ({_HINTS[message.kind]})"
    if output.usage_text or output.message("usage"):
        return f"lfs rejected the command line: {text}"
    return text


def outcome_from_output(
    output: QuotaOutput,
    quota_type: str,
    quota_id: int,
    *,
    command: str,
    now: float,
    name: str | None = None,
) -> IdOutcome:
    """Judge one `lfs quota` run for one ID: an entry (maybe with notes) or a failure."""
    section = output.section(quota_type, quota_id)
    row = section.rows[0] if section is not None and section.rows else None
    status_name = status_error_name(output.status) if output.status else None

    def failed(error: str, message: str) -> IdOutcome:
        return IdOutcome(quota_type, quota_id, failure=ProbeFailure(error, f"{command}: {message}"))

    unexpected = output.message("unexpected_error")
    if status_name is not None and (row is None or unexpected is not None):
        return failed(status_name, f"exit status {output.status}: {_failure_text(output)}")
    if row is None:
        unread = "; ".join(item.describe() for item in output.unparsed)
        what = f"no quota row for {quota_type} {quota_id}"
        return failed(PARSE, what + (f"; cannot read {unread}" if unread else ""))

    notes = list(_unparsed_notes(output))
    if status_name is not None:
        notes.append(f"{command} exited with status {output.status} ({status_name})")
    if output.errors_notice and not row.inaccurate:
        notes.append("lfs reported errors while collecting usage (some targets did not answer)")
    entry = QuotaEntry(
        type=quota_type,
        id=quota_id,
        name=name,
        bytes=usage_from_cells(row.blocks, now),
        inodes=usage_from_cells(row.inodes, now),
    )
    return IdOutcome(quota_type, quota_id, entry=entry, notes=tuple(notes))


def query(directory: str, quota_type: str, quota_id: int, binary: str, deadline: Deadline):
    """Run `lfs quota` for one ID and judge it; every failure is returned, none raised."""
    args = ("quota", _TYPE_FLAGS[quota_type], str(quota_id), directory)
    try:
        run = run_lfs(args, binary=binary, timeout=deadline.remaining())
    except (OSError, ProbeFailure) as error:
        return IdOutcome(quota_type, quota_id, failure=ProbeFailure.of(error))
    output = parse_quota(run.stdout, run.stderr, run.status)
    return outcome_from_output(
        output,
        quota_type,
        quota_id,
        command=shlex.join(("lfs", *args)),
        now=run.started_at + run.duration,
        name=id_name(quota_type, quota_id),
    )


class LustreQuotaProvider(QuotaProvider):
    name = "lfs"

    def __init__(self, cache: SingleFlight[IdOutcome] = QUOTA_CACHE) -> None:
        self.cache = cache

    def applies_to(self, mount: Mount | None) -> bool:
        return mount is not None and mount.fstype == "lustre"

    def read(self, request: QuotaRequest) -> tuple[IdOutcome, ...]:
        binary = lfs_binary(request.settings.lfs)
        filesystem = (request.mount.device, request.mount.mountpoint) if request.mount else None
        outcomes = []
        for quota_type, quota_id in request.queries:
            if quota_id < 0:  # it would reach lfs as an option ("-5"), never as an ID
                failure = ProbeFailure("EINVAL", f"{quota_type} ID {quota_id} is negative")
                outcomes.append(IdOutcome(quota_type, quota_id, failure=failure))
                continue
            key = (filesystem or request.directory, quota_type, quota_id, binary)
            try:
                outcome = self.cache.get(
                    key,
                    lambda t=quota_type, i=quota_id: query(
                        request.directory, t, i, binary, request.deadline
                    ),
                    ttl=request.settings.cache_seconds,
                    wait=request.deadline.remaining(),
                )
            except TimeoutError:
                flag = _TYPE_FLAGS[quota_type]
                message = f"lfs quota {flag} {quota_id}: another probe's call was still running"
                outcome = IdOutcome(quota_type, quota_id, failure=ProbeFailure(TIMEOUT, message))
            outcomes.append(outcome)
        return tuple(outcomes)

    def project_id(self, directory: str, settings: ServerProbeSettings, deadline: Deadline) -> int:
        """``lfs project -d DIR`` prints ``<projid> <P or -> <path>``."""
        run = run_lfs(
            ("project", "-d", directory),
            binary=lfs_binary(settings.lfs),
            timeout=deadline.remaining(),
        )
        lines = run.stdout.splitlines()
        match = _PROJECT_LINE.match(lines[0]) if lines else None
        if run.status != 0:
            said = run.stderr.strip() or "no message"
            raise ProbeFailure(status_error_name(run.status), f"{run.command}: {said}")
        if match is None:
            raise ProbeFailure(PARSE, f"{run.command}: cannot read {run.stdout.strip()!r}")
        return int(match.group(1))
