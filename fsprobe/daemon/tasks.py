"""The daemon's tasks: counting and syncing back redirected checkpoints of a target.

Not probes: their results never enter a snapshot or a verdict (docs/design.md §8).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from fsprobe.daemon.config import TargetConfig
from fsprobe.daemon.logs import event
from fsprobe.daemon.readiness import VerdictReadiness
from fsprobe.daemon.schedule import Key, Schedule
from fsprobe.daemon.store import Store
from fsprobe.events.admission import may_write
from fsprobe.exporters.view import TargetView
from fsprobe.model import ProbeResult
from fsprobe.posix.identity import Identity
from fsprobe.probing.runner import Executor
from fsprobe.redirect.manifest import MAX_AREA_ENTRIES, FallbackCount, count_fallbacks
from fsprobe.redirect.sync import SyncOutcome, sync
from fsprobe.saving.stale import clean_directory

#: How long copying checkpoints back may take before the task is reported overdue: copying
#: gigabytes is slow, not hung.
SYNC_DEADLINE = 3600.0

#: A redirected save brings its target's count forward, but to no sooner than this many seconds
#: after the last count began: a stream of events must not have root count back to back.
COUNT_SOON_GAP = 5.0

#: Outcomes of a sync worth a warning: something is wrong with a checkpoint or the copy.
_ALARMING = frozenset({"failed", "checksum_mismatch", "skipped"})


@dataclass(frozen=True)
class PlannedTask:
    """One task of one target: how often, how long at most, and the work for a given view."""

    interval: float
    deadline: float
    work: Callable[[TargetView], Callable[[], object] | None]  # None: nothing to do now


def _count(
    target: TargetConfig, seen: Callable[[str], tuple[str, ...]], _view: TargetView
) -> Callable[[], object] | None:
    """Count the configured fallbacks and those the target's redirected saves landed in
    (`Store.seen_fallbacks`); nothing while there are none. Only the configured ones can have
    problems of the target's (squats, crowding): a fallback a user's event names is hers."""
    fallbacks = tuple(dict.fromkeys((*target.fallback_dirs, *seen(target.path))))
    if not fallbacks:
        return None
    return functools.partial(
        count_fallbacks,
        fallbacks,
        target.path,
        max_entries=MAX_AREA_ENTRIES,
        judged=target.fallback_dirs,
        writes=Writers(target.path),
    )


class Writers:
    """Whether a user may write a target, as the kernel says when asked as her (admission's
    rule, `events.admission.may_write`), asked once per user and count: a copy is pending
    for a target only if its owner's sync could bring it home."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._known: dict[int, bool] = {}

    def __call__(self, uid: int) -> bool:
        if uid not in self._known:
            self._known[uid] = uid == 0 or _may_write(uid, self._target)
        return self._known[uid]


def _may_write(uid: int, target: str) -> bool:
    try:
        own = uid == os.geteuid()  # a daemon not root: its own copies, as itself
        return may_write(Identity.of_process() if own else Identity.of_account(uid), target)
    except OSError as error:  # a kernel before 5.8 cannot say: counted, as before
        return error.errno == errno.ENOSYS


def _sync(target: TargetConfig, rounds: Iterator[int], view: TargetView) -> Callable[[], object]:
    """The next sync round of `target`: `rounds` numbers them, so that another user's run
    goes first each round; the runs as users share the task's deadline."""
    return functools.partial(
        sync,
        target.fallback_dirs,
        under=target.path,
        ready=VerdictReadiness(view.verdict),
        clean=clean_directory,
        max_entries=MAX_AREA_ENTRIES,
        round_seconds=SYNC_DEADLINE,
        rotation=next(rounds),
    )


def planned_tasks(
    target: TargetConfig, seen: Callable[[str], tuple[str, ...]] = lambda path: ()
) -> dict[str, PlannedTask]:
    """The tasks of `target`, sync before count. The count also covers the fallbacks `seen`
    in its redirected saves' events; the sync (root's, opt-in) only the configured ones."""
    tasks = {}
    if target.sync_redirected and target.fallback_dirs:
        tasks["sync"] = PlannedTask(
            target.redirect_interval,
            SYNC_DEADLINE,
            functools.partial(_sync, target, itertools.count()),
        )
    tasks["count"] = PlannedTask(
        target.redirect_interval,
        target.settings.deadline,
        functools.partial(_count, target, seen),
    )
    return tasks


def _take(store: Store, path: str, kind: str, result: ProbeResult) -> TargetView | None:
    """Log what a task run did and record its count; returns the target's view if it changed."""
    if result.error is not None:
        event(
            logging.WARNING,
            "task_failed",
            target=path,
            task=kind,
            errno=result.error,
            message=result.message,
        )
    if kind == "sync":
        report = result.value
        outcomes = list(report or ())
        superseded = {o.entry.actual: o for o in outcomes if o.action == "superseded"}
        for actual in store.first_seen(path, "superseded", superseded):
            outcome = superseded[actual]
            event(
                logging.INFO,
                "redirect_superseded",
                target=path,
                requested=outcome.entry.requested,
                copy=actual,
                message=outcome.message,
            )  # once: the copy stays (until --prune-superseded), and is not pending
        _log_too_many_entries(
            store, path, [o.entry.area.path for o in outcomes if o.action == "too_many_entries"]
        )
        for fallback in store.first_seen(
            path, "fallback_missing", report.missing if report is not None else ()
        ):
            event(
                logging.WARNING,
                "fallback_missing",
                target=path,
                fallback=fallback,
                message="the fallback directory does not exist (a typo, or not mounted on this "
                "node): nothing is synced back from it",
            )  # once: a missing directory is found every round
        for outcome in outcomes:
            if outcome.action not in ("superseded", "too_many_entries"):
                _log_outcome(path, outcome)
        failures = report.failures if report is not None else []
        for failure in failures:
            event(
                logging.ERROR,
                "sync_as_user_failed",
                target=path,
                uid=failure.uid,
                fallback=failure.fallback,
                message=failure.cause,
            )
        return store.count_redirect_problems(path, "sync_as_user_failed", len(failures))
    count: FallbackCount | None = result.value if result.ok else None
    changed = store.set_redirected_pending_bytes(path, count.pending_bytes if count else None)
    found = store.first_seen(path, "squat", count.squatted if count else ())
    for squat in found:
        event(logging.WARNING, "area_squatted", target=path, area=squat)
    _log_too_many_entries(store, path, count.too_many_entries if count else ())
    crowded = store.first_seen(path, "crowded", count.crowded if count else ())
    for message in crowded:
        event(logging.ERROR, "fallback_crowded", target=path, message=message)
    changed = store.count_redirect_problems(path, "fallback_crowded", len(crowded)) or changed
    return store.count_redirect_problems(path, "area_squatted", len(found)) or changed


def _log_too_many_entries(store: Store, path: str, areas: Iterable[str]) -> None:
    """Once per area (the count and the sync find it every round): its copies stay put."""
    for area in store.first_seen(path, "too_many_entries", areas):
        event(
            logging.WARNING,
            "area_too_many_entries",
            target=path,
            area=area,
            message=f"its directory copies hold more than {MAX_AREA_ENTRIES} entries: "
            "neither counted nor synced, left where they are",
        )


def _log_outcome(path: str, outcome: SyncOutcome) -> None:
    if outcome.action == "waiting":
        return  # the usual case until the target recovers: the count says it all
    event(
        logging.WARNING if outcome.action in _ALARMING else logging.INFO,
        "sync",
        target=path,
        action=outcome.action,
        requested=outcome.entry.requested,
        message=outcome.message,
    )


#: Wake this long after a run's deadline, so that the run reads as overdue when checked.
_DEADLINE_SLACK = 0.01


@dataclass
class _Run:
    deadline: float
    started: float
    future: Future
    reported_overdue: bool = False

    def overdue(self, now: float) -> bool:
        return not self.future.done() and now - self.started > self.deadline


class Tasks:
    """Starts the due tasks in the worker and takes their results; driven by the scheduler.

    Has no thread of its own: the scheduler's loop calls `dispatch`, `finished` and `watchdog`,
    and sleeps no longer than `wake_times` allows.
    """

    def __init__(self, store: Store, executor: Executor) -> None:
        self.store = store
        self._executor = executor
        self._schedule = Schedule()
        self._tasks: dict[Key, PlannedTask] = {}
        self._running: dict[Key, _Run] = {}
        self._counted: dict[str, float] = {}  # target -> when its last count began

    def configure(self, targets: Iterable[TargetConfig], now: float) -> None:
        """Plan the tasks of these targets (at start and on a reload); a run out is kept."""
        self._tasks = {
            (target.path, kind): task
            for target in targets
            for kind, task in planned_tasks(target, self.store.seen_fallbacks).items()
        }
        for key, task in self._tasks.items():
            if key in self._schedule:
                self._schedule.set_interval(key, task.interval, now)
            else:
                self._schedule.add(key, task.interval, now)
        self._schedule.retain(self._tasks)
        self._counted = {p: at for p, at in self._counted.items() if (p, "count") in self._tasks}

    def dispatch(self, now: float, done: Callable[[Key, Future], None]) -> None:
        """Start every due task that is not still out; `done(key, future)` when one ends."""
        for key in self._schedule.due(now):
            self._schedule.advance(key, now)
            view = self.store.view(key[0])
            if key in self._running or view is None:
                continue
            work = self._tasks[key].work(view)
            if work is None:
                continue
            task = self._tasks[key]
            future = self._executor.submit(key[1], work)
            if key[1] == "count":
                self._counted[key[0]] = now
            self._running[key] = _Run(task.deadline, now, future)
            future.add_done_callback(functools.partial(done, key))

    def finished(self, key: Key, future: Future) -> TargetView | None:
        """Take the result of a task run; returns the target's view if it changed."""
        run = self._running.get(key)
        if run is None or run.future is not future:
            return None  # a task of a target no longer watched
        del self._running[key]
        path, kind = key
        result: ProbeResult = future.result()
        if run.reported_overdue:
            event(logging.INFO, "task_returned", target=path, task=kind, seconds=result.duration)
        if kind == "sync" and (path, "count") in self._schedule:
            self._schedule.run_now((path, "count"), time.monotonic())  # show what it did
        return _take(self.store, path, kind, result)

    def watchdog(self, now: float) -> None:
        """Log, once, every run that overran its deadline (it is left to finish, never repeated
        meanwhile: a hung fallback costs one blocked thread of the worker)."""
        for (path, kind), run in self._running.items():
            if not run.reported_overdue and run.overdue(now):
                run.reported_overdue = True
                event(
                    logging.WARNING,
                    "task_overdue",
                    target=path,
                    task=kind,
                    errno="TIMEOUT",
                    deadline=run.deadline,
                )

    def count_soon(self, path: str, now: float) -> None:
        """Count `path`'s fallbacks at the next turn (a save was just redirected), or no
        sooner than `COUNT_SOON_GAP` after its last count began."""
        if (path, "count") in self._schedule:
            last = self._counted.get(path)
            soon = now if last is None else max(now, last + COUNT_SOON_GAP)
            self._schedule.run_now((path, "count"), soon)

    def wake_times(self) -> list[float]:
        """When the scheduler must look again: the next due task and the next deadline (of a
        run not yet reported overdue: one that was has nothing more to wake for)."""
        times = [
            run.started + run.deadline + _DEADLINE_SLACK
            for run in self._running.values()
            if not run.reported_overdue
        ]
        earliest = self._schedule.earliest()
        return [*times, earliest] if earliest is not None else times


def run_tasks_once(targets: Iterable[TargetConfig], store: Store, executor: Executor) -> None:
    """Every task of every target once, each bounded by its deadline: for `fsprobe run
    --once`, after the probes (a sync judges readiness from them)."""
    for target in targets:
        for kind, task in planned_tasks(target, store.seen_fallbacks).items():
            view = store.view(target.path)
            work = task.work(view) if view is not None else None
            if work is None:
                continue
            future = executor.submit(kind, work)
            try:
                result: ProbeResult = future.result(timeout=task.deadline)
            except FutureTimeout:
                event(
                    logging.WARNING,
                    "task_overdue",
                    target=target.path,
                    task=kind,
                    errno="TIMEOUT",
                    deadline=task.deadline,
                )
                continue
            _take(store, target.path, kind, result)
