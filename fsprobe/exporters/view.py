"""`TargetView`: an immutable view of one target as the daemon last saw it, for its readers."""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsprobe.model import LastSave, Snapshot
from fsprobe.policy import Verdict

#: Buckets of the write-latency histogram: from a local SSD (1 ms) to a server in trouble (60 s).
#: The 5 s and 30 s bounds are the policy's slow and very slow write thresholds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram as a value: `observe` returns a new one.

    `counts[i]` counts observations in bucket i alone (the last one is ``+Inf``); the
    cumulative form Prometheus wants is computed when exported.
    """

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS) + 1)
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> Histogram:
        index = bisect.bisect_left(self.bounds, value)  # a value equal to a bound belongs to it
        counts = list(self.counts)
        counts[index] += 1
        return Histogram(self.bounds, tuple(counts), self.total + value)

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(0.001, n), ..., (inf, count)]``: upper bounds with cumulative counts."""
        running, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            buckets.append((bound, running))
        return buckets


#: Buckets of the save-duration histogram: from a small file (0.1 s) to a checkpoint of
#: hundreds of GiB on a busy server (an hour).
SAVE_BUCKETS: tuple[float, ...] = (
    *LATENCY_BUCKETS[LATENCY_BUCKETS.index(0.1) :],
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


@dataclass(frozen=True)
class SaveProblem:
    """The latest save of one outcome other than ok, for an alert to name: when the daemon
    heard of it, the file asked for, the user, the errno (and step) that kept it from the
    target, the fallback directory it landed in instead (where it landed, when that names
    none), whether a fallback was tried (``none``, ``tried``: it failed there too,
    ``landed``), and the reason the preflight kept it from the target (a code of the policy's,
    ``none`` when no preflight did: the errno and step are then an attempt's). The sender's
    words: the exporter shows them only as `plain_label`s."""

    at: float
    file: str
    uid: int
    errno: str
    step: str
    fallback: str
    landed: str | None = None
    reason: str = "none"


@dataclass(frozen=True)
class SaveStats:
    """What the daemon heard of real saves into one target (`fsprobe.events`), since its start.

    `interval` is the target's regular save interval as seen (the median gap between its
    last successful saves), None until three were seen: what "overdue" is measured against;
    None again once no process that saved is left (`savers`).
    """

    outcomes: Mapping[str, int] = field(default_factory=dict)
    failed_attempts: Mapping[str, int] = field(default_factory=dict)  # errno -> n
    duration: Histogram = field(
        default_factory=lambda: Histogram(SAVE_BUCKETS, (0,) * (len(SAVE_BUCKETS) + 1))
    )
    bytes: int = 0
    last: LastSave | None = None
    last_success_at: float | None = None
    interval: float | None = None
    savers: int = 0  # processes that saved and are expected to save again (still alive)
    problems: Mapping[str, SaveProblem] = field(default_factory=dict)  # outcome -> the latest


@dataclass(frozen=True)
class TargetView:
    """One target: the latest snapshot and verdict, and the counters kept since the start.

    `version` grows with every change and is unique across targets, so that renderers can
    cache per target.
    """

    path: str
    snapshot: Snapshot
    verdict: Verdict
    intervals: Mapping[str, float] = field(default_factory=dict)
    #: probe -> the age (seconds) past which the daemon judges its last result stale: the
    #: policy's `stale_after`, with the write probe's interval widened while saves stand in
    stale_after: Mapping[str, float] = field(default_factory=dict)
    last_success: Mapping[str, float] = field(default_factory=dict)
    errors: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (probe, errno) -> n
    write_latency: Histogram = field(default_factory=Histogram)  # of whole write probes
    #: op -> seconds of the last write probe that ran (kept while saves stand in for it)
    write_steps: Mapping[str, float] = field(default_factory=dict)
    redirected_pending_bytes: int | None = None
    redirect_problems: Mapping[str, int] = field(default_factory=dict)  # problem -> n
    saves: SaveStats = field(default_factory=SaveStats)
    skipped: Mapping[str, int] = field(default_factory=dict)  # probe -> runs a save stood for
    server_probes_elsewhere: str | None = None  # why quota and lfs df do not run here
    updated_at: float = 0.0
    version: int = 0

    @property
    def mount_stuck(self) -> bool:
        return any(result.stuck for result in self.snapshot.results.values())

    @property
    def values_trusted(self) -> bool:
        """Whether the filesystem's value series are exported at all.

        When statvfs failed or the mount is stuck, the last numbers are not the truth any more;
        they are left out rather than shown (or zeroed), and `probe_success` / `mount_stuck`
        say why.
        """
        statvfs = self.snapshot.get("statvfs")
        return statvfs is not None and statvfs.ok and not self.mount_stuck
