"""The scheduler: one thread that starts every probe and task on time and never waits for one.

How it bounds a hung mount and how it is supervised: docs/design.md §8, "The daemon".
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from fsprobe.daemon.config import QUOTA_KINDS, TargetConfig
from fsprobe.daemon.logs import event
from fsprobe.daemon.lustre_memory import LustreMemory
from fsprobe.daemon.pace import due_after_quota, lfs_df_timer
from fsprobe.daemon.savers import CHECK_EVERY
from fsprobe.daemon.schedule import Key, Schedule
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.daemon.tasks import Tasks
from fsprobe.events.admission import Sender
from fsprobe.events.event import Goodbye, SaveEvent
from fsprobe.exporters.view import TargetView
from fsprobe.model import FilesystemInfo, ProbeResult, Status
from fsprobe.probing.plan import PlannedProbe, plan
from fsprobe.probing.runner import ProbeRunner, Run

#: Wake this long after a run's deadline, so that the run reads as overdue when checked.
_DEADLINE_SLACK = 0.01
#: The longest the loop sleeps without a reason (it re-reads the clock at least this often).
_MAX_SLEEP = 5.0
#: The loop counts as stalled after this many of the shortest probe interval without a turn
#: (never less than `_MAX_SLEEP`: an idle loop turns that often at least).
STALL_INTERVALS = 3.0


def planned_probes(target: TargetConfig) -> dict[str, PlannedProbe]:
    """The probes that run on `target`: the plan, less quota and `lfs df` where disabled
    (`lfs df` alone with ``lfs_df_probe = false``: its per-OST series are the largest)."""
    probes = plan(target.path, target.settings)
    if not target.quota_enabled:
        for kind in QUOTA_KINDS:
            probes.pop(kind, None)
    if not target.lfs_df_enabled:
        probes.pop("lfs_df", None)
    return probes


def target_spec(target: TargetConfig) -> TargetSpec:
    """How the store judges `target`: its policy and the intervals of the probes that run."""
    kinds = planned_probes(target)
    intervals = {kind: target.intervals[kind] for kind in kinds}
    return TargetSpec(
        target.path, target.settings.policy, intervals, target.server_probes_elsewhere
    )


@dataclass(frozen=True)
class _Done:
    key: Key
    run: Run


@dataclass(frozen=True)
class _TaskDone:
    key: Key
    future: Future


@dataclass(frozen=True)
class _Saved:
    view: TargetView


@dataclass(frozen=True)
class _Configure:
    targets: tuple[TargetConfig, ...]


_STOP = object()


class Scheduler:
    """Runs the probes and tasks of every target on their intervals; `publish` gets the changed
    views."""

    def __init__(
        self,
        store: Store,
        publish: Callable[[Sequence[TargetView]], None],
        runner: ProbeRunner,
        lustre: LustreMemory,
    ) -> None:
        self.store = store
        self.lustre = lustre
        self.runner = runner
        self._publish = publish
        self._schedule = Schedule()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._probes: dict[str, dict[str, PlannedProbe]] = {}
        self._targets: dict[str, TargetConfig] = {}
        self._lfs_df_started: dict[str, float] = {}  # path -> when its last `lfs df` started
        self._running: dict[Key, Run] = {}
        self._marked_stuck: set[Key] = set()  # runs in flight whose stuck result is published
        self._thread: threading.Thread | None = None
        self.tasks = Tasks(store, self.runner.executor)
        self._last_turn = time.monotonic()
        self._shortest_interval = _MAX_SLEEP
        self._died: str | None = None
        self._savers_checked = 0.0

    # -- called from other threads -------------------------------------------------------------

    def configure(self, targets: Iterable[TargetConfig]) -> None:
        """Watch these targets from now on (at start and on a reload)."""
        self._inbox.put(_Configure(tuple(targets)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fsprobe-scheduler", daemon=True)
        self._thread.start()

    def health(self, now: float | None = None) -> str | None:
        """None while the loop turns; else why it does not: died (and of what) or stalled."""
        if self._died is not None:
            return f"the scheduler loop died: {self._died}"
        if self._thread is None:
            return None
        now = time.monotonic() if now is None else now
        silent = now - self._last_turn
        window = max(STALL_INTERVALS * self._shortest_interval, _MAX_SLEEP)
        if silent > window:  # said the same way for as long as it lasts: one log line
            return (
                f"the scheduler loop has not turned for more than {window:g} s "
                f"({STALL_INTERVALS:g} x the shortest probe interval, or {_MAX_SLEEP:g} s)"
            )
        return None

    @property
    def died(self) -> bool:
        return self._died is not None

    def stop(self, timeout: float = 0.5) -> None:
        """Stop after the current step; probes in flight are abandoned, not waited for."""
        self._inbox.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)

    def saved(self, sender: Sender, save: SaveEvent | Goodbye) -> str | None:
        """Take a save event or a goodbye (from the receiver's thread): None, or why it was
        refused. The new view is published by the scheduler's thread, with the probes' results."""
        if isinstance(save, Goodbye):
            for changed in self.store.goodbye(sender, save):
                self._inbox.put(_Saved(changed))
                event(logging.INFO, "saver_left", target=changed.path, pid=save.pid, host=save.host)
            return None
        refused, view = self.store.record_save(sender, save)
        if view is None:
            event(logging.DEBUG, "save_refused", path=save.requested, uid=sender.uid, why=refused)
            return refused
        self._inbox.put(_Saved(view))
        last = view.saves.last
        assert last is not None
        event(
            logging.INFO if last.outcome == "ok" else logging.WARNING,
            "save",
            target=view.path,
            outcome=last.outcome,
            path=save.requested,
            landed=save.landed,
            seconds=round(save.seconds, 3),
            bytes=save.bytes,
            attempts=save.attempts,
            errno=",".join(f"{f.errno}@{f.step}" for f in save.failures) or None,
            reason=save.cause.reason if save.cause is not None else None,
            uid=sender.uid,
            pid=save.pid,
            host=save.host,
            ranks=save.ranks,
        )
        return None

    def _done(self, key: Key, run: Run, _future: object) -> None:
        self._inbox.put(_Done(key, run))

    def _task_done(self, key: Key, future: Future) -> None:
        self._inbox.put(_TaskDone(key, future))

    # -- the scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._turns()
        except BaseException as error:  # recorded for the supervisor; then the thread ends
            self._died = f"{type(error).__name__}: {error}"
            event(
                logging.ERROR,
                "scheduler_died",
                error=self._died,
                traceback=traceback.format_exc().rstrip(),
            )

    def _turns(self) -> None:
        while True:
            self._last_turn = time.monotonic()
            try:
                message = self._inbox.get(timeout=self._sleep_time(time.monotonic()))
            except queue.Empty:
                message = None
            changed: dict[str, TargetView] = {}
            while message is not None:
                if message is _STOP:
                    return
                self._contained(message, changed)
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    message = None
            now = time.monotonic()
            if now - self._savers_checked >= CHECK_EVERY:
                self._savers_checked = now
                changed.update((view.path, view) for view in self.store.forget_gone_savers())
            self._watchdog(changed)
            self.tasks.watchdog(now)
            self._dispatch(now, changed)
            self.tasks.dispatch(now, self._task_done)
            if changed:
                try:
                    self._publish(list(changed.values()))
                except Exception:  # an output failing must not stop the probes
                    logging.getLogger(__name__).exception("publishing the results failed")

    def _sleep_time(self, now: float) -> float:
        wake = [now + _MAX_SLEEP, *self.tasks.wake_times()]
        earliest = self._schedule.earliest()
        if earliest is not None:
            wake.append(earliest)
        wake += [
            run.started_monotonic + run.deadline + _DEADLINE_SLACK
            for key, run in self._running.items()
            if key not in self._marked_stuck
        ]
        return max(0.0, min(wake) - now)

    def _contained(self, message: object, changed: dict[str, TargetView]) -> None:
        """Handle `message`; a bug while handling one target's result costs that target."""
        try:
            self._handle(message, changed)
        except Exception as error:
            key = getattr(message, "key", None)
            if key is None:
                raise  # not one target's: the loop dies, and the supervisor sees it
            view = self.store.contain(key[0], "probe", error)
            if view is not None:
                changed[view.path] = view

    def _handle(self, message: object, changed: dict[str, TargetView]) -> None:
        if isinstance(message, _Configure):
            self._apply(message.targets, changed)
        elif isinstance(message, _Done):
            self._finished(message.key, message.run, changed)
        elif isinstance(message, _Saved):
            current = self.store.view(message.view.path)
            if current is not None:
                changed[current.path] = current
            last = message.view.saves.last
            if last is not None and last.outcome == "redirected":
                self.tasks.count_soon(message.view.path, time.monotonic())
        elif isinstance(message, _TaskDone):
            view = self.tasks.finished(message.key, message.future)
            if view is not None:
                changed[view.path] = view

    def _apply(self, targets: Sequence[TargetConfig], changed: dict[str, TargetView]) -> None:
        now = time.monotonic()
        self._probes = {target.path: planned_probes(target) for target in targets}
        self._targets = {target.path: target for target in targets}
        self._lfs_df_started = {
            path: at for path, at in self._lfs_df_started.items() if path in self._targets
        }
        self.store.configure(target_spec(target) for target in targets)
        keys = []
        for target in targets:
            for kind in self._probes[target.path]:
                key = (target.path, kind)
                keys.append(key)
                interval = target.intervals[kind]
                if kind == "lfs_df":
                    interval = lfs_df_timer(target, self.store.view(target.path))
                if key in self._schedule:
                    self._schedule.set_interval(key, interval, now)
                else:
                    self._schedule.add(key, interval, now)
        self._schedule.retain(keys)
        intervals = [
            target.intervals[kind] for target in targets for kind in self._probes[target.path]
        ]
        self._shortest_interval = min(intervals, default=_MAX_SLEEP)
        self.tasks.configure(targets, now)
        for key in [key for key in self._running if key not in self._schedule]:
            del self._running[key]
            self._marked_stuck.discard(key)
        changed.update((view.path, view) for view in self.store.views())

    def _finished(self, key: Key, run: Run, changed: dict[str, TargetView]) -> None:
        if self._running.get(key) is not run:
            return  # a run of a target no longer watched, or already handled
        del self._running[key]
        was_stuck = key in self._marked_stuck
        self._marked_stuck.discard(key)
        path, kind = key
        result: ProbeResult = run.future.result()
        self._record(path, result, changed)
        if was_stuck:
            event(logging.INFO, "probe_returned", target=path, probe=kind, seconds=run.elapsed())
        if not result.stuck:
            self._rerun_refused(path)

    def _rerun_refused(self, path: str) -> None:
        """Probes that were refused while another probe of `path` hung: run them now."""
        view = self.store.view(path)
        if view is None:
            return
        now = time.monotonic()
        for kind, result in view.snapshot.results.items():
            if result.stuck and (path, kind) not in self._running:
                self._schedule.run_now((path, kind), now)

    def _watchdog(self, changed: dict[str, TargetView]) -> None:
        """Publish a stuck result, once, for every run that overran its deadline."""
        for key, run in self._running.items():
            if key in self._marked_stuck or not run.overdue():
                continue
            self._marked_stuck.add(key)
            path, kind = key
            event(
                logging.WARNING,
                "mount_stuck",
                target=path,
                probe=kind,
                errno="TIMEOUT",
                deadline=run.deadline,
            )
            self._record(path, run.stuck_result(), changed)

    def _dispatch(self, now: float, changed: dict[str, TargetView]) -> None:
        for key in self._schedule.due(now):
            self._schedule.advance(key, now)
            if key in self._running:  # the previous run is still out: one per target and probe
                if key in self._marked_stuck:
                    # Still hung: say so again, as of now. A result goes stale after a few
                    # intervals (the policy's rule), and a stuck mark never renewed would make
                    # a live daemon's view of a hung mount read as stale.
                    self._record(key[0], self._running[key].stuck_result(), changed)
                continue
            path, kind = key
            if kind == "write":
                skipped = self.store.skip_write_probe(path)
                if skipped is not None:  # a real save in this interval stands for the probe
                    changed[path] = skipped
                    continue
            planned = self._probes[path][kind]
            if kind == "lfs_df":
                self._lfs_df_started[path] = now
            run = self.runner.submit(path, kind, planned.work, planned.deadline)
            self._running[key] = run
            run.future.add_done_callback(functools.partial(self._done, key, run))

    def _record(self, path: str, result: ProbeResult, changed: dict[str, TargetView]) -> None:
        before = self.store.view(path)
        view = self.store.record(path, self.lustre.take(result))
        if view is None:
            return
        changed[path] = view
        log_result(before, view, result)
        self._pace_lfs_df(path, view, result.probe)

    def _pace_lfs_df(self, path: str, view: TargetView, probe: str) -> None:
        """`lfs df` as often as the space needs, after a quota probe (`fsprobe.daemon.pace`)."""
        key, target = (path, "lfs_df"), self._targets.get(path)
        if target is None or key not in self._schedule:
            return
        now, started = time.monotonic(), self._lfs_df_started.get(path)
        interval = lfs_df_timer(target, view)
        if interval != self._schedule.interval(key):
            if started is None:
                self._schedule.set_interval(key, interval, now)
            else:
                self._schedule.rearm(key, interval, started)
        since = None if started is None else now - started
        if probe == "quota" and key not in self._running and due_after_quota(target, view, since):
            self._schedule.run_now(key, now)


def _log_existence(previous: ProbeResult | None, result: ProbeResult, path: str) -> None:
    """A target that does not exist is judged by its nearest existing parent: say so at the
    first statvfs (a mistyped path looks just like a checkpoint directory not made yet), and
    when it appears or goes."""
    if result.probe != "statvfs" or not isinstance(result.value, FilesystemInfo):
        return
    was = previous.value.target_exists if previous is not None and previous.value else None
    now = result.value.target_exists
    if now == was or (now and was is None):
        return
    if now:
        event(logging.INFO, "target_exists", target=path)
    else:
        event(
            logging.WARNING,
            "target_missing",
            target=path,
            judged_by=result.value.probed_path,
            message="does not exist: judged by its nearest existing parent",
        )


def log_result(before: TargetView | None, after: TargetView, result: ProbeResult) -> None:
    """The events one result gives: always at debug, on a change at info or warning."""
    path, kind = after.path, result.probe
    event(
        logging.DEBUG,
        "probe",
        target=path,
        probe=kind,
        ok=result.ok,
        errno=result.error,
        seconds=round(result.duration, 6),
        stuck=result.stuck or None,
    )
    previous = before.snapshot.get(kind) if before is not None else None
    if result.error is not None and (previous is None or previous.error != result.error):
        event(
            logging.WARNING,
            "probe_failed",
            target=path,
            probe=kind,
            errno=result.error,
            message=result.message,
        )
    elif result.ok and previous is not None and previous.error is not None:
        event(logging.INFO, "probe_recovered", target=path, probe=kind)
    _log_existence(previous, result, path)
    old = before.verdict.status if before is not None else None
    new = after.verdict.status
    if old is not None and old != new:
        # Worse is a warning; so is trouble first seen (a target unhealthy when the daemon
        # starts goes from unknown, the highest status, down to unhealthy).
        bad = new > old or (old is Status.UNKNOWN and new is not Status.OK)
        event(
            logging.WARNING if bad else logging.INFO,
            "status_changed",
            target=path,
            old=old.label,
            new=new.label,
            reasons=",".join(reason.code for reason in after.verdict.reasons) or None,
        )
