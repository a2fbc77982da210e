"""What a process's `lfs` probes remember: kept a while, asked once at a time per key."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.placement import Placements
from fsprobe.model import LustreTarget
from fsprobe.quota.cache import SingleFlight
from fsprobe.quota.provider import IdOutcome


@dataclass(frozen=True)
class LustreCaches:
    """The `lfs df` tables, the `lfs quota` rows and the placements, shared by every target
    whose probes are handed this object (one `lfs` call per filesystem and ID per interval).
    Where probes run builds one: the worker's `main`, each `ThreadExecutor`."""

    df: SingleFlight[tuple[LustreTarget, ...] | ProbeFailure] = field(default_factory=SingleFlight)
    quota: SingleFlight[IdOutcome] = field(default_factory=SingleFlight)
    placements: Placements = field(default_factory=Placements)
