"""Running probes so that a hung mount blocks a worker thread, never the caller.

Past its deadline a probe is *stuck* and abandoned; no new probe of a target starts while one
is stuck (docs/design.md §4, "Running a probe").
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Protocol, Union

from fsprobe.errors import ProbeFailure, name_of
from fsprobe.model import INTERNAL, TIMEOUT, ProbeResult


@dataclass(frozen=True)
class ProbeCall:
    """A probe named, not held: `fsprobe.probing.probes.PROBES[name](*args)`, looked up where it
    runs (the worker, or `fsprobe.probing.threads`), so that the caller loads no probe code."""

    name: str
    args: tuple[object, ...]


#: What an executor runs: a plain function (module-level, to reach a worker) or a named probe.
Work = Union[Callable[[], object], ProbeCall]


def timed_call(probe: str, function: Callable[[], object]) -> ProbeResult:
    """Run `function` and turn its outcome, whatever it is, into a `ProbeResult`."""
    started_at = time.time()
    start = time.monotonic()

    def result(**outcome) -> ProbeResult:
        return ProbeResult(probe, started_at, time.monotonic() - start, **outcome)

    try:
        return result(value=function())
    except ProbeFailure as failure:
        return result(value=failure.value, error=failure.error, message=failure.message)
    except OSError as error:
        return result(error=name_of(error), message=str(error))
    except Exception as error:  # a bug in a probe must not take the daemon down with it
        return result(
            error=INTERNAL,
            message=f"{type(error).__name__}: {error}",
            detail=traceback.format_exc(),
        )


@dataclass
class Run:
    """One probe run in flight or done; `result()` never waits past the deadline."""

    target: str
    probe: str
    deadline: float
    started_at: float = field(default_factory=time.time)
    started_monotonic: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)

    def elapsed(self) -> float:
        return time.monotonic() - self.started_monotonic

    def overdue(self) -> bool:
        return not self.future.done() and self.elapsed() > self.deadline

    def stuck_result(self) -> ProbeResult:
        elapsed = max(self.elapsed(), self.deadline)
        return ProbeResult(
            self.probe,
            self.started_at,
            elapsed,
            error=TIMEOUT,
            message=(
                f"{self.probe} probe has not returned after {elapsed:.1f} s "
                f"(deadline {self.deadline:g} s): the mount looks hung"
            ),
            stuck=True,
        )

    def result(self) -> ProbeResult:
        """The probe's result, or a stuck result once its deadline has passed."""
        try:
            return self.future.result(timeout=max(0.0, self.deadline - self.elapsed()))
        except FutureTimeout:
            return self.stuck_result()


class Executor(Protocol):
    def submit(self, probe: str, work: Work) -> Future: ...


class ProbeRunner:
    """Starts probes with deadlines, at most one per (target, probe) at a time."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._lock = threading.Lock()
        self._in_flight: dict[tuple[str, str], Run] = {}

    def submit(self, target: str, probe: str, work: Work, deadline: float) -> Run:
        """Start `work` as the `probe` of `target`, unless the target is blocked.

        Returns the run already in flight for the same probe, or, when another probe of the target
        is stuck, a run that is already finished with a stuck result naming the blocker.
        """
        with self._lock:
            running = self._in_flight.get((target, probe))
            if running is not None:
                return running
            blocker = next(
                (r for (t, _), r in self._in_flight.items() if t == target and r.overdue()), None
            )
            if blocker is not None:
                return self._blocked_run(target, probe, deadline, blocker)
            run = Run(target, probe, deadline)
            self._in_flight[(target, probe)] = run
        outcome = self.executor.submit(probe, work)
        outcome.add_done_callback(lambda done: self._finish(run, done.result()))
        return run

    def _finish(self, run: Run, result: ProbeResult) -> None:
        with self._lock:
            self._in_flight.pop((run.target, run.probe), None)
        run.future.set_result(result)

    @staticmethod
    def _blocked_run(target: str, probe: str, deadline: float, blocker: Run) -> Run:
        run = Run(target, probe, deadline)
        run.future.set_result(
            ProbeResult(
                probe,
                run.started_at,
                0.0,
                error=TIMEOUT,
                message=(
                    f"not started: the {blocker.probe} probe of this target has been blocked "
                    f"for {blocker.elapsed():.0f} s (hung mount)"
                ),
                stuck=True,
            )
        )
        return run
