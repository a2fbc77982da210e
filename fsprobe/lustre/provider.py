"""The Lustre quota provider: ``lfs quota [--pool POOL] -u/-g/-p ID DIR``, one ID per call.

It judges what lfs printed (a row beside exit 5 is usable; an "Unexpected quotactl error" row
is not) and turns grace countdowns into absolute times (docs/lfs-output-formats.md).
"""

from __future__ import annotations

import re
import shlex

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.quota_parser import QuotaOutput, Usage, parse_quota
from fsprobe.lustre.runner import lfs_binary, run_lfs, status_error_name
from fsprobe.model import TIMEOUT, Mount, QuotaEntry, QuotaState, QuotaUsage
from fsprobe.posix.identity import Identity
from fsprobe.quota.ids import DirectoryProject, id_name
from fsprobe.quota.provider import (
    Deadline,
    IdOutcome,
    QuotaProvider,
    QuotaReading,
    QuotaRequest,
)
from fsprobe.quota.settings import ServerProbeSettings

_TYPE_FLAGS = {"user": "-u", "group": "-g", "project": "-p"}
_PROJECT_LINE = re.compile(r"^\s*([0-9]+) ([P-]) (.*)$")

#: Hints for the errors a user can do something about (reference 1.9).
_HINTS = {
    "permission_denied": (
        "lfs quota shows other users' and groups' quota to root only; a user may see their own "
        "uid, the groups they are in, and any project"
    ),
    "not_lustre": "the directory is not on a mounted Lustre filesystem",
    "not_enabled": "quota is not enabled for this type on the filesystem",
}


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
    pool: str | None = None,
) -> IdOutcome:
    """Judge one `lfs quota` run for one ID (in `pool`): an entry (maybe with notes) or a
    failure."""
    section = output.section(quota_type, quota_id)
    row = section.rows[0] if section is not None and section.rows else None
    status_name = status_error_name(output.status) if output.status else None

    def failed(error: str, message: str) -> IdOutcome:
        failure = ProbeFailure(error, f"{command}: {message}")
        return IdOutcome(quota_type, quota_id, failure=failure, pool=pool)

    if output.too_old_header is not None:
        return failed(
            "EOPNOTSUPP",
            f"this lfs prints the quota form of Lustre before 2.10 "
            f"({output.too_old_header.text.strip()!r}): fsprobe reads lfs 2.10 and later",
        )
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
    notices: tuple[str, ...] = ()
    if output.unknown_title is not None:
        title = output.unknown_title.text.strip()
        notices = (
            f"lfs quota printed a column title fsprobe does not know ({title!r}); the rows "
            "under it were read by their cells, as every release from 2.10 to 2.17 prints them",
        )
    entry = QuotaEntry(
        type=quota_type,
        id=quota_id,
        name=name,
        bytes=usage_from_cells(row.blocks, now),
        inodes=usage_from_cells(row.inodes, now),
        pool=pool,
    )
    return IdOutcome(
        quota_type, quota_id, entry=entry, notes=tuple(notes), pool=pool, notices=notices
    )


def query(
    directory: str,
    quota_type: str,
    quota_id: int,
    binary: str,
    deadline: Deadline,
    pool: str | None = None,
    identity: Identity | None = None,
) -> IdOutcome:
    """Run `lfs quota` for one ID (in `pool`, as `identity`) and judge it; every failure is
    returned."""
    selector = ("--pool", pool) if pool else ()
    args = ("quota", *selector, _TYPE_FLAGS[quota_type], str(quota_id), directory)
    try:
        run = run_lfs(args, binary=binary, timeout=deadline.remaining(), identity=identity)
    except (OSError, ProbeFailure) as error:
        return IdOutcome(quota_type, quota_id, failure=ProbeFailure.of(error), pool=pool)
    output = parse_quota(run.stdout, run.stderr, run.status)
    return outcome_from_output(
        output,
        quota_type,
        quota_id,
        command=shlex.join(("lfs", *args)),
        now=run.started_at + run.duration,
        name=id_name(quota_type, quota_id),
        pool=pool,
    )


def _limited(outcome: IdOutcome) -> bool:
    """Whether a pool quota has any limit: one without is not configured for that ID."""
    entry = outcome.entry
    if entry is None:
        return True  # a failure is reported
    return any(
        limit is not None
        for usage in (entry.bytes, entry.inodes)
        for limit in (usage.soft, usage.hard)
    )


class LustreQuotaProvider(QuotaProvider):
    name = "lfs"

    def __init__(self, caches: LustreCaches) -> None:
        self.cache = caches.quota
        self.placements = caches.placements

    def applies_to(self, mount: Mount | None) -> bool:
        return mount is not None and mount.fstype == "lustre"

    def _outcome(
        self, request: QuotaRequest, binary: str, quota_type: str, quota_id: int, pool: str | None
    ) -> IdOutcome:
        if quota_id < 0:  # it would reach lfs as an option ("-5"), never as an ID
            failure = ProbeFailure("EINVAL", f"{quota_type} ID {quota_id} is negative")
            return IdOutcome(quota_type, quota_id, failure=failure, pool=pool)
        filesystem = (request.mount.device, request.mount.mountpoint) if request.mount else None
        where = filesystem or request.directory
        key = (where, quota_type, quota_id, binary, pool, request.identity)
        try:
            return self.cache.get(
                key,
                lambda: query(
                    request.directory,
                    quota_type,
                    quota_id,
                    binary,
                    request.deadline,
                    pool,
                    request.identity,
                ),
                ttl=request.settings.cache_seconds,
                wait=request.deadline.remaining(),
            )
        except TimeoutError:
            flag = _TYPE_FLAGS[quota_type]
            message = f"lfs quota {flag} {quota_id}: another probe's call was still running"
            failure = ProbeFailure(TIMEOUT, message)
            return IdOutcome(quota_type, quota_id, failure=failure, pool=pool)

    def _pools(
        self, request: QuotaRequest, binary: str
    ) -> tuple[tuple[str, ...], ProbeFailure | None]:
        """The pools whose quotas apply to new files in the directory, or the failure that
        kept them from being found; none where this `lfs` has no pool quotas."""
        try:
            if not self.placements.has_pool_quotas(binary, request.deadline):
                return (), None
            placement = self.placements.read(
                request.directory, request.mount, binary, request.settings, request.deadline
            )
        except ProbeFailure as failure:
            return (), failure
        return placement.layout.pools, None

    def read(self, request: QuotaRequest) -> QuotaReading:
        """The global quota of each ID, then its quota in each pool of the layout. The pools
        are looked up first, so that the quota rows, whose grace countdowns are made absolute
        with the time of their run, are the last thing read."""
        binary = lfs_binary(request.settings.lfs)
        try:
            self.placements.check_supported(binary, request.deadline)
        except ProbeFailure as unsupported:
            return QuotaReading(
                tuple(IdOutcome(t, i, failure=unsupported) for t, i in request.queries)
            )
        pools, failure = self._pools(request, binary)
        if failure is not None and failure.error == TIMEOUT:  # a hung filesystem: say so
            return QuotaReading(tuple(IdOutcome(t, i, failure=failure) for t, i in request.queries))
        outcomes = [
            self._outcome(request, binary, quota_type, quota_id, None)
            for quota_type, quota_id in request.queries
        ]
        if not any(outcome.entry is not None for outcome in outcomes):
            return QuotaReading(tuple(outcomes))  # lfs answers nothing here: ask no more
        for pool in pools:
            for quota_type, quota_id in request.queries:
                outcome = self._outcome(request, binary, quota_type, quota_id, pool)
                if _limited(outcome):
                    outcomes.append(outcome)
        said = f"pool quotas not read: {failure.error}: {failure.message}" if failure else None
        return QuotaReading(tuple(outcomes), (said,) if said else ())

    def project(
        self, directory: str, settings: ServerProbeSettings, deadline: Deadline
    ) -> DirectoryProject:
        """``lfs project -d DIR`` prints ``<projid> <P or -> <path>``; P is the inherit flag."""
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
        return DirectoryProject(int(match.group(1)), match.group(2) == "P")
