"""Bugs contained at a target's boundary: counted by target and stage, logged once each.

The target becomes `unknown` (`internal_error`); a recurring bug is one log line and a counter.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping

#: Where a bug was caught: in a probe (its worker), in the policy, in an output.
STAGES = ("probe", "judge", "publish")

#: Logs one contained bug: (target, stage, "ValueError: ...", traceback text).
LogBug = Callable[[str, str, str, str], None]


class InternalErrors:
    """The count of contained bugs per (target, stage); thread-safe, versioned for caches."""

    def __init__(self, log: LogBug) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged: dict[tuple[str, str, str], str] = {}  # failing now -> summary logged
        self.version = 0

    def failed(self, path: str, stage: str, summary: str, traceback: str, part: str = "") -> None:
        """Count one bug of `path` at `stage`; log it unless the same one is failing already
        in the same `part` of that stage (a probe kind, an output)."""
        with self._lock:
            self._counts[(path, stage)] += 1
            self.version += 1
            key = (path, stage, part)
            repeat = self._logged.get(key) == summary
            self._logged[key] = summary
        if not repeat:
            self._log(path, stage, summary, traceback)

    def passed(self, path: str, stage: str, part: str = "") -> None:
        """`path` got through `part` of `stage`: the next bug there is logged again."""
        if (path, stage, part) in self._logged:
            with self._lock:
                self._logged.pop((path, stage, part), None)

    def counts(self) -> Mapping[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def forget(self, watched: set[str]) -> None:
        """Drop the counts of targets no longer watched."""
        with self._lock:
            for key in [key for key in self._counts if key[0] not in watched]:
                del self._counts[key]
            for part in [part for part in self._logged if part[0] not in watched]:
                del self._logged[part]
            self.version += 1


def summary(error: BaseException) -> str:
    """``ValueError: bad value``: what a contained bug is called in a reason and the log."""
    return f"{type(error).__name__}: {error}"
