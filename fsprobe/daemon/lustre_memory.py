"""What the daemon remembers of each Lustre target beyond an import's 16-entry state history.

The history forgets: a long outage pushes the moment of the loss out of it (each reconnect
attempt adds two entries), idle cycles push an eviction out within about 20 minutes. The daemon
reads the imports every 15 s and keeps, per target, when it first knew the target lost (a
moment the history showed, or only that it was before the oldest entry) until the target is
connected again, and every eviction it saw for 24 hours. What it cannot know stays said as
"before": a moment is never made up. The daemon keeps it across restarts in its memory file
(`daemon.memory`, key ``lustre``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from fsprobe.model import LustreImport, ProbeResult

#: How long an eviction is remembered (the policy reports one for as long).
EVICTION_SECONDS = 24 * 3600.0
#: At most this many evictions are kept per target (a node evicted more often than that in a
#: day needs no older ones to be told).
MAX_EVICTIONS = 64


@dataclass(frozen=True)
class Remembered:
    """One target: when it was first known lost (`lost_at`, or only `lost_before`) while it
    is, and the evictions seen within the last day, oldest first."""

    lost_at: float | None = None
    lost_before: float | None = None
    evictions: tuple[float, ...] = ()


def _loss(known: Remembered | None, seen: LustreImport) -> tuple[float | None, float | None]:
    """(lost_at, lost_before) of a target read lost: what the history shows when it shows
    the moment, else the earliest the daemon knew."""
    if seen.lost_at is not None:  # the history still holds the moment it left FULL/IDLE
        return seen.lost_at, None
    assert seen.lost_before is not None
    if known is not None and known.lost_at is not None and known.lost_at <= seen.lost_before:
        return known.lost_at, None
    if known is not None and known.lost_before is not None:
        return None, min(known.lost_before, seen.lost_before)
    return None, seen.lost_before


class LustreMemory:
    """Per target name (``lustre-OST0007``), what the daemon saw of it; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, Remembered] = {}
        self._version = 0  # grows with every change of what `remembered` returns

    def recall(self, imports: tuple[LustreImport, ...], now: float) -> tuple[LustreImport, ...]:
        """Take what `imports` show, and return them with what was remembered added: the
        first known moment (or bound) of a loss the history forgot, the latest eviction."""
        recalled = []
        with self._lock:
            for seen in imports:
                known = self._targets.get(seen.name)
                evictions = set(known.evictions if known is not None else ())
                if seen.last_eviction is not None:
                    evictions.add(seen.last_eviction)
                kept = tuple(sorted(t for t in evictions if now - t <= EVICTION_SECONDS))
                kept = kept[-MAX_EVICTIONS:]
                lost_at = lost_before = None
                if seen.lost_at is not None or seen.lost_before is not None:
                    lost_at, lost_before = _loss(known, seen)
                memory = Remembered(lost_at, lost_before, kept)
                if memory != self._targets.get(seen.name, Remembered()):
                    self._version += 1
                if memory == Remembered():
                    self._targets.pop(seen.name, None)
                else:
                    self._targets[seen.name] = memory
                recalled.append(
                    dataclasses.replace(
                        seen,
                        lost_at=lost_at,
                        lost_before=lost_before,
                        last_eviction=kept[-1] if kept else None,
                    )
                )
        return tuple(recalled)

    def take(self, result: ProbeResult) -> ProbeResult:
        """An imports probe result with what was remembered added (as of when it ended); any
        other unchanged."""
        if result.probe != "imports" or not result.ok or not result.value:
            return result
        return dataclasses.replace(result, value=self.recall(result.value, result.finished_at))

    def remembered(self) -> tuple[int, dict[str, Remembered]]:
        """What to keep across a restart, and its version (it grows with every change)."""
        with self._lock:
            return self._version, dict(self._targets)

    def restore(self, targets: Mapping[str, Remembered]) -> None:
        """Start from what an earlier daemon of this state dir remembered; the next reading of
        each target keeps what still holds (a target back is forgotten then)."""
        with self._lock:
            self._targets = dict(targets)
