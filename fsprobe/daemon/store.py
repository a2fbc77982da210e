"""What the daemon knows about each target: the latest results, counters, and the verdict.

The scheduler records every probe result here; the store keeps what one result alone cannot
tell (the last few write errors, error counters, the write-latency histogram, when each probe last
succeeded), judges the target with the health policy, and publishes an immutable `TargetView`.
The count of the redirected-checkpoints task (`daemon.tasks`) is kept beside the snapshot,
never in it: no task ever changes a verdict.
Readers (a scrape, the state file, the textfile) only ever take the published views; nothing
here knows about Prometheus or files.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fsprobe.exporters.view import Histogram, TargetView
from fsprobe.model import ProbeResult, Snapshot, WriteProbeResult
from fsprobe.policy import Policy, evaluate


@dataclass(frozen=True)
class TargetSpec:
    """What the store needs to know about a target: how to judge it and which probes run."""

    path: str
    policy: Policy = field(default_factory=Policy)
    intervals: Mapping[str, float] = field(default_factory=dict)  # the probes that run


@dataclass
class _Target:
    """The mutable record of one target, owned by the store and changed under its lock."""

    spec: TargetSpec
    results: dict[str, ProbeResult] = field(default_factory=dict)
    recent_write_errors: deque = field(default_factory=deque)
    errors: Counter = field(default_factory=Counter)
    latency: Histogram = field(default_factory=Histogram)
    last_success: dict[str, float] = field(default_factory=dict)
    redirected_pending_bytes: int | None = None


class Store:
    """Per-target latest results and counters; thread-safe, publishing immutable views."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._views: dict[str, TargetView] = {}
        self._ordered: tuple[TargetView, ...] = ()
        self._version = 0

    def configure(self, specs: Iterable[TargetSpec]) -> None:
        """Watch exactly these targets; a target kept across a reload keeps its history."""
        with self._lock:
            wanted = {spec.path: spec for spec in specs}
            for path in [path for path in self._targets if path not in wanted]:
                del self._targets[path]
                del self._views[path]
            for path, spec in wanted.items():
                target = self._targets.get(path)
                if target is None:
                    target = self._targets[path] = _Target(spec)
                target.spec = spec
                window = spec.policy.transient_write_window
                target.recent_write_errors = deque(target.recent_write_errors, maxlen=window)
                self._publish(target)

    def record(self, path: str, result: ProbeResult) -> TargetView | None:
        """Take one probe result; returns the new view, or None for a target not watched."""
        with self._lock:
            target = self._targets.get(path)
            if target is None:
                return None
            target.results[result.probe] = result
            if result.error is not None:
                target.errors[(result.probe, result.error)] += 1
            if result.ok:
                target.last_success[result.probe] = result.finished_at
            if result.probe == "write" and not result.stuck:
                target.recent_write_errors.append(result.error)
                total = (
                    result.value.latency_seconds.get("total")
                    if isinstance(result.value, WriteProbeResult)
                    else None
                )
                if total is not None:
                    target.latency = target.latency.observe(total)
            return self._publish(target)

    def set_redirected_pending_bytes(self, path: str, pending: int | None) -> TargetView | None:
        """Bytes of checkpoints redirected away from `path` and not synced back (None: not
        known), as the daemon's count task found; returns the new view if it changed."""
        with self._lock:
            target = self._targets.get(path)
            if target is None or target.redirected_pending_bytes == pending:
                return None
            target.redirected_pending_bytes = pending
            return self._publish(target)

    def views(self) -> tuple[TargetView, ...]:
        """Every target's latest view, by path; never blocks on a probe or a lock."""
        return self._ordered

    def view(self, path: str) -> TargetView | None:
        return self._views.get(path)

    def _publish(self, target: _Target) -> TargetView:
        spec = target.spec
        snapshot = Snapshot(spec.path, dict(target.results), tuple(target.recent_write_errors))
        now = self._clock()
        self._version += 1
        view = TargetView(
            path=spec.path,
            snapshot=snapshot,
            verdict=evaluate(snapshot, spec.policy, now),
            intervals=dict(spec.intervals),
            last_success=dict(target.last_success),
            errors=dict(target.errors),
            write_latency=target.latency,
            redirected_pending_bytes=target.redirected_pending_bytes,
            updated_at=now,
            version=self._version,
        )
        self._views[spec.path] = view
        self._ordered = tuple(self._views[path] for path in sorted(self._views))
        return view
