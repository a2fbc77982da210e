"""The quota provider interface: what the probe needs from any filesystem's quota tool.

A provider reports each ID's outcome as data (`IdOutcome`); `assemble` makes the `QuotaReport`.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from fsprobe.errors import ProbeFailure
from fsprobe.model import Mount, QuotaEntry, QuotaReport
from fsprobe.posix.identity import Identity
from fsprobe.quota.ids import DirectoryProject
from fsprobe.quota.settings import ServerProbeSettings


@dataclass(frozen=True)
class Deadline:
    """A point in time (monotonic clock) that every step of one probe shares."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())


@dataclass(frozen=True)
class IdOutcome:
    """The quota of one (type, id), in `pool` or filesystem-wide: an entry, or a failure;
    `notes` are non-fatal problems, `notices` worth knowing but no problem of the quota."""

    type: str
    id: int
    entry: QuotaEntry | None = None
    failure: ProbeFailure | None = None
    notes: tuple[str, ...] = ()
    pool: str | None = None
    notices: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuotaReading:
    """What a provider read: one outcome per query, and problems that belong to no one ID."""

    outcomes: tuple[IdOutcome, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class QuotaRequest:
    """What to read: the IDs charged for new files in `directory`, on `mount`, by `deadline`,
    asked as `identity` (who probes the directory; None: this process)."""

    directory: str
    mount: Mount | None
    queries: tuple[tuple[str, int], ...]
    settings: ServerProbeSettings
    deadline: Deadline
    identity: Identity | None = None


class QuotaProvider(abc.ABC):
    """Reads quota for one kind of filesystem."""

    #: The value of --quota-provider that selects this provider, and QuotaReport.provider.
    name: str = ""

    @abc.abstractmethod
    def applies_to(self, mount: Mount | None) -> bool:
        """Whether ``--quota-provider auto`` should use this provider for `mount`."""

    @abc.abstractmethod
    def read(self, request: QuotaRequest) -> QuotaReading:
        """One outcome per query (and per pool quota that applies), in order; must return by
        `request.deadline` (plus slack)."""

    def project(
        self, directory: str, settings: ServerProbeSettings, deadline: Deadline
    ) -> DirectoryProject:
        """The project of `directory` by the provider's own means, when the ioctl fails."""
        raise ProbeFailure("EOPNOTSUPP", f"{self.name} cannot read project IDs")


def _label(outcome: IdOutcome) -> str:
    return f"{outcome.type} {outcome.id}" + (f" in pool {outcome.pool}" if outcome.pool else "")


def assemble(
    provider: str,
    reading: QuotaReading,
    errors: tuple[str, ...] = (),
    notes: tuple[str, ...] = (),
) -> QuotaReport:
    """The report of every ID that was read; raises the failure when none was.

    Failed IDs and non-fatal problems become `QuotaReport.errors`, one sentence each, so a
    partial result (user read, group failed) is still reported rather than lost. `notes` say
    why a quota is not asked for (`QuotaReport.notes`); the outcomes' notices join them, each
    once.
    """
    outcomes = reading.outcomes
    entries = tuple(outcome.entry for outcome in outcomes if outcome.entry is not None)
    failed = [outcome for outcome in outcomes if outcome.failure is not None]
    if not entries and failed:
        first = failed[0].failure
        assert first is not None
        if all(o.failure is not None and o.failure.same_as(first) for o in failed):
            message = first.message
        elif all(o.failure is not None and o.failure.error == first.error for o in failed):
            others = ", ".join(_label(o) for o in failed[1:])
            message = first.message + (f" (and the same for {others})" if others else "")
        else:
            message = "; ".join(f"{_label(o)}: {o.failure.message}" for o in failed if o.failure)
        raise ProbeFailure(first.error, message)
    said = [f"{_label(o)}: {o.failure.error}: {o.failure.message}" for o in failed if o.failure]
    said += [f"{_label(o)}: {note}" for o in outcomes for note in o.notes]
    said += [*reading.errors, *errors]
    inaccurate = any(entry.bytes.inaccurate or entry.inodes.inaccurate for entry in entries)
    notices = tuple(dict.fromkeys(notice for o in outcomes for notice in o.notices))
    return QuotaReport(
        provider, entries, inaccurate=inaccurate, errors=tuple(said), notes=(*notes, *notices)
    )
