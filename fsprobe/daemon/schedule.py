"""When each probe of each target runs next: intervals with jitter, as a pure timetable.

Time is passed in, never read, so the rules are tested with plain numbers.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

Key = tuple[str, str]  # (target path, probe kind)

JITTER = 0.10
#: The first runs are spread over at most this many seconds (and a tenth of the interval).
START_SPREAD = 2.0


class Schedule:
    """Next due time per (target, probe); `due` lists what to start, `advance` re-arms it."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._intervals: dict[Key, float] = {}
        self._due: dict[Key, float] = {}

    def jittered(self, interval: float) -> float:
        return interval * self._rng.uniform(1 - JITTER, 1 + JITTER)

    def add(self, key: Key, interval: float, now: float) -> None:
        """Start timing `key`: its first run comes within the start window."""
        self._intervals[key] = interval
        self._due[key] = now + self._rng.uniform(0, min(START_SPREAD, interval * JITTER))

    def set_interval(self, key: Key, interval: float, now: float) -> None:
        """Change the interval of a known key; the next run is no later than one new interval."""
        self._intervals[key] = interval
        self._due[key] = min(self._due[key], now + self.jittered(interval))

    def interval(self, key: Key) -> float:
        return self._intervals[key]

    def rearm(self, key: Key, interval: float, started: float) -> None:
        """Change the interval of a known key, counted from its last run's start, `started`."""
        self._intervals[key] = interval
        self._due[key] = started + self.jittered(interval)

    def retain(self, keys: Iterable[Key]) -> None:
        """Forget every key not in `keys`."""
        keep = set(keys)
        for key in [key for key in self._due if key not in keep]:
            del self._due[key], self._intervals[key]

    def __contains__(self, key: Key) -> bool:
        return key in self._due

    def due(self, now: float) -> list[Key]:
        """The keys whose time has come, earliest first."""
        return sorted(
            (key for key, at in self._due.items() if at <= now), key=self._due.__getitem__
        )

    def advance(self, key: Key, now: float) -> float:
        """A run of `key` starts now: the next one is one jittered interval later."""
        self._due[key] = now + self.jittered(self._intervals[key])
        return self._due[key]

    def run_now(self, key: Key, now: float) -> None:
        """Bring `key` forward to now (a target that just recovered from a hung mount)."""
        if key in self._due:
            self._due[key] = min(self._due[key], now)

    def earliest(self) -> float | None:
        return min(self._due.values(), default=None)
