"""What the daemon knows about each target: latest results, counters, save events, the verdict.

It publishes an immutable `TargetView` per change; readers only ever take the views. A task's
count is kept beside the view, never in it; the saving processes are `daemon.savers`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
import time
import traceback
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from fsprobe.daemon.logs import event, log_bug
from fsprobe.daemon.memory import Remembered
from fsprobe.daemon.savers import (
    SILENT_INTERVALS,
    SILENT_UNTIMED,
    Saver,
    Savers,
    StartTime,
    crowding,
    process_start,
)
from fsprobe.errors import NOT_AS_ROOT
from fsprobe.events.admission import Sender
from fsprobe.events.event import Goodbye, SaveEvent
from fsprobe.events.evidence import write_evidence
from fsprobe.exporters.contained import InternalErrors, summary
from fsprobe.exporters.view import Histogram, LastSave, SaveProblem, SaveStats, TargetView
from fsprobe.model import (
    INTERNAL,
    DirectoryOwner,
    FilesystemInfo,
    ProbeResult,
    Snapshot,
    WriteProbeResult,
)
from fsprobe.policy import Policy, Verdict, evaluate, unjudged
from fsprobe.posix.paths import is_under
from fsprobe.redirect.areas import fallback_of

#: Things a target remembers having reported once (squatted areas, superseded copies).
MAX_SEEN_KEPT = 10_000
#: Fallback directories a target remembers from its redirected saves (the latest ones; beyond,
#: the oldest of the uid with the most is forgotten).
MAX_SEEN_FALLBACKS = 8
#: Successful saves whose gaps give a target's regular save interval (their median).
INTERVAL_SAVES = 9
#: While a target is saved at a regular interval, a landed save stands for the write probe for
#: this many of those intervals (a save a little late is not yet a reason to probe) ...
EVIDENCE_SAVE_INTERVALS = 1.5
#: ... but never for more than this many write-probe intervals.
MAX_EVIDENCE_PROBE_INTERVALS = 10.0


@dataclass(frozen=True)
class TargetSpec:
    """What the store needs to know about a target: how to judge it and which probes run."""

    path: str
    policy: Policy = field(default_factory=Policy)
    intervals: Mapping[str, float] = field(default_factory=dict)  # the probes that run
    server_probes_elsewhere: str | None = None  # why quota and lfs df do not run here


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
    redirect_problems: Counter = field(default_factory=Counter)
    seen_once: set = field(default_factory=set)  # (kind, key) reported once (`first_seen`)
    owner: DirectoryOwner | None = None  # of the target directory, as statvfs last saw it
    saves: SaveStats = field(default_factory=SaveStats)
    save_times: deque = field(default_factory=lambda: deque(maxlen=INTERVAL_SAVES))
    written_at: float | None = None  # the last real save that stood for the write probe
    probe_passes: bool | None = None  # the latest write probe that ran: passed (or refused)
    probed_at: float | None = None  # when the write probe last ran
    write_steps: Mapping[str, float] = field(default_factory=dict)  # of the last one that ran
    skipped: Counter = field(default_factory=Counter)  # probe -> runs left out (`take`)
    savers: Savers = field(default_factory=Savers)  # the processes expected to save again
    seen_fallbacks: OrderedDict = field(default_factory=OrderedDict)  # (fallback, uid) landed in
    bug: tuple[str, str] | None = None  # (stage, summary) of a bug caught handling a result

    def take(self, result: ProbeResult, probed: bool = True) -> None:
        """Record one probe result, or (not `probed`) a save's evidence of one
        (`fsprobe.events.evidence`), whose errors the save counters count instead."""
        self.results[result.probe] = result
        if result.error == NOT_AS_ROOT:  # not run (root may not write there): not an error
            self.skipped[result.probe] += 1
            if result.probe == "write" and probed:
                self.probe_passes = True  # nothing failed: saves are all there is to go by
            return
        if result.error is not None and probed:
            self.errors[(result.probe, result.error)] += 1
        if result.probe == "write" and probed:
            self.probe_passes = result.ok
            steps = (
                result.value.latency_seconds if isinstance(result.value, WriteProbeResult) else {}
            )
            self.write_steps = {op: seconds for op, seconds in steps.items() if op != "total"}
        if result.ok:
            self.last_success[result.probe] = result.finished_at
            if isinstance(result.value, FilesystemInfo):
                self.owner = result.value.owner
        if result.probe == "write" and not result.stuck:
            self.recent_write_errors.append(result.error)
            total = (
                result.value.latency_seconds.get("total")
                if isinstance(result.value, WriteProbeResult)
                else None
            )
            if total is not None:
                self.latency = self.latency.observe(total)

    def evidence_window(self) -> float | None:
        """How long a landed save stands for the write probe (None: no write probe): its
        interval, or while the target is saved at a regular interval, 1.5 of those (at most
        10 probe intervals), so that saves every few minutes replace a probe every minute."""
        interval = self.spec.intervals.get("write")
        regular = self.saves.interval
        if interval is None or regular is None:
            return interval
        return min(
            max(interval, EVIDENCE_SAVE_INTERVALS * regular),
            MAX_EVIDENCE_PROBE_INTERVALS * interval,
        )

    def saves_stand_in(self) -> bool:
        """Whether a landed save may stand for the write probe: there is none, or its latest
        run passed (never while the target's own probe fails, nor before it first ran)."""
        return "write" not in self.spec.intervals or self.probe_passes is True

    def policy(self) -> Policy:
        """The target's policy, with the write results judged stale by the evidence window
        (a save every few minutes is as fresh as a probe every minute)."""
        policy, window = self.spec.policy, self.evidence_window()
        if window is None or window == self.spec.intervals.get("write"):
            return policy
        return dataclasses.replace(policy, intervals={**policy.intervals, "write": window})

    def add_save(self, sender: Sender, save: SaveEvent, now: float) -> None:
        """Count one save event in `saves`."""
        before = self.saves
        outcome = save.outcome
        failed = Counter(before.failed_attempts)
        failed.update(f.errno for f in save.failures)
        last_success_at = before.last_success_at
        if save.succeeded:
            last_success_at = now
            self.save_times.append(now)
        self.saves = SaveStats(
            outcomes={**before.outcomes, outcome: before.outcomes.get(outcome, 0) + 1},
            failed_attempts=dict(failed),
            duration=before.duration.observe(save.seconds),
            bytes=before.bytes + save.bytes,
            last=LastSave(
                at=now,
                outcome=outcome,
                seconds=save.seconds,
                bytes=save.bytes,
                requested=save.requested,
                landed=save.landed,
                uid=sender.uid,
                pid=save.pid,
                host=save.host,
                ranks=save.ranks,
                failures=tuple((f.errno, f.step) for f in save.failures),
            ),
            last_success_at=last_success_at,
            interval=self.regular_interval(),
            savers=len(self.savers),
            problems=before.problems
            if outcome == "ok"
            else {**before.problems, outcome: _problem(sender, save, now)},
        )

    def regular_interval(self) -> float | None:
        """The median gap between the last successful saves, from the third on."""
        times = list(self.save_times)
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        return statistics.median(gaps) if len(gaps) >= 2 else None

    def remembered(self) -> Remembered:
        saves = self.saves
        return Remembered(
            tuple(self.savers),
            tuple(self.save_times),
            saves.last,
            saves.last_success_at,
            dict(saves.problems),
        )

    def recall(self, remembered: Remembered, alive: Callable[[Saver], bool]) -> int:
        """Take what an earlier daemon knew of this target's saves: its savers that still
        live, the times of its saves, its last save and problems; how many savers were gone."""
        savers = [saver for saver in remembered.savers if alive(saver)]
        for saver in savers:
            self.savers.heard(saver)
        self.save_times.extend(remembered.save_times)
        self.saves = dataclasses.replace(
            self.saves,
            last=remembered.last,
            last_success_at=remembered.last_success_at,
            problems=dict(remembered.problems),
            interval=self.regular_interval(),
        )
        self.savers_changed()
        return len(remembered.savers) - len(savers)

    def hear_fallback(self, fallback: str, uid: int) -> None:
        """A redirected save of `uid` landed in `fallback`: remember it (the latest ones, at
        most `MAX_SEEN_FALLBACKS`; a user crowds out only her own)."""
        seen = self.seen_fallbacks
        seen.pop((fallback, uid), None)
        seen[(fallback, uid)] = None
        if len(seen) > MAX_SEEN_FALLBACKS:
            del seen[crowding([(key, key[1]) for key in seen])]

    def savers_changed(self) -> None:
        """After a saver left: with none left the job ended, and its save interval with it
        (the next job's saves measure their own)."""
        interval = self.saves.interval
        if not self.savers:
            self.save_times.clear()
            interval = None
        self.saves = dataclasses.replace(self.saves, savers=len(self.savers), interval=interval)


def _problem(sender: Sender, save: SaveEvent, now: float) -> SaveProblem:
    """What an alert says of a save that did not simply land: the errno that kept it from
    the target (the last failure there), and what became of the fallback."""
    in_target = [f for f in save.failures if not f.in_fallback]
    cause = (in_target or list(save.failures))[-1:] or None
    if save.outcome == "redirected":
        fallback = "landed"
    else:
        fallback = "tried" if any(f.in_fallback for f in save.failures) else "none"
    errno, step = (cause[0].errno, cause[0].step) if cause else ("EUNKNOWN", "unknown")
    if save.cause is not None and not in_target:  # the preflight kept it from the target
        errno, step = save.cause.errno or "EUNKNOWN", "preflight"
    return SaveProblem(
        at=now,
        file=save.requested,
        uid=sender.uid,
        errno=errno,
        step=step,
        fallback=fallback,
        landed=_landed_in(sender, save) if save.outcome == "redirected" else None,
        reason=save.cause.reason if save.cause is not None else "none",
    )


def _landed_in(sender: Sender, save: SaveEvent) -> str | None:
    """Where a redirected save landed, for an alert: the fallback directory, or where the
    event says when that names none."""
    if save.landed is None:
        return None
    return fallback_of(save.requested, save.landed, sender.uid) or save.landed


class Store:
    """Per-target latest results and counters; thread-safe, publishing immutable views.

    A bug while judging a target (the policy raising) is contained here: that target's
    verdict is `unknown` with the reason `internal_error`, counted in `internal_errors`, and
    every other target is judged as before.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        internal: InternalErrors | None = None,
        started: StartTime = process_start,
    ) -> None:
        self._clock = clock
        self._started = started
        self.internal_errors = internal if internal is not None else InternalErrors(log_bug)
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._views: dict[str, TargetView] = {}
        self._ordered: tuple[TargetView, ...] = ()
        self._version = 0
        self._memory_version = 0  # grows with every change of what `memory` returns
        self._recalled: dict[str, Remembered] = {}  # an earlier daemon's, until configured
        self._alive: Callable[[Saver], bool] = lambda saver: True

    def configure(self, specs: Iterable[TargetSpec]) -> None:
        """Watch exactly these targets; a target kept across a reload keeps its history."""
        with self._lock:
            wanted = {spec.path: spec for spec in specs}
            for path in [path for path in self._targets if path not in wanted]:
                del self._targets[path]
                del self._views[path]
            self.internal_errors.forget(set(wanted))
            for path, spec in wanted.items():
                target = self._targets.get(path)
                if target is None:
                    target = self._targets[path] = _Target(spec)
                    self._take_recalled(target)
                target.spec = spec
                window = spec.policy.transient_write_window
                target.recent_write_errors = deque(target.recent_write_errors, maxlen=window)
                self._publish(target)
            self._recalled.clear()  # a target configured later starts afresh

    def recall(self, remembered: Mapping[str, Remembered], same_boot: bool) -> None:
        """What an earlier daemon of this state dir knew of the saves (`daemon.memory`), for
        the targets of the first configuration: a saver whose pid can be looked up is kept
        only if that pid still holds the process it was (never one of another boot), one
        outside our pid namespace as every such saver is."""
        started = self._started

        def alive(saver: Saver) -> bool:
            if saver.started is None:
                return True
            return same_boot and started(saver.pid) == saver.started

        with self._lock:
            self._recalled, self._alive = dict(remembered), alive
            if remembered:  # rewritten even if no target takes its part: none is kept
                self._memory_version += 1
            for target in self._targets.values():
                self._take_recalled(target)

    def _take_recalled(self, target: _Target) -> None:
        remembered = self._recalled.pop(target.spec.path, None)
        if remembered is None:
            return
        gone = target.recall(remembered, self._alive)
        self._memory_version += 1
        event(
            logging.INFO,
            "memory_recalled",
            target=target.spec.path,
            savers=len(target.savers),
            gone=gone,
            last_save_at=remembered.last.at if remembered.last is not None else None,
        )

    def memory(self, known: int = -1) -> tuple[int, dict[str, Remembered] | None]:
        """What to remember across a restart, and its version (it changes with it); None
        for what while the version is still `known` (nothing to build at every publish)."""
        with self._lock:
            if self._memory_version == known:
                return known, None
            return self._memory_version, {
                path: target.remembered()
                for path, target in self._targets.items()
                if target.saves.last is not None or target.savers
            }

    def record(self, path: str, result: ProbeResult) -> TargetView | None:
        """Take one probe result; returns the new view, or None for a target not watched."""
        with self._lock:
            target = self._targets.get(path)
            if target is None:
                return None
            target.bug = None
            if result.error == INTERNAL:
                self.internal_errors.failed(
                    path,
                    "probe",
                    f"the {result.probe} probe raised {result.message}",
                    result.detail,
                    part=result.probe,
                )
            else:
                self.internal_errors.passed(path, "probe", part=result.probe)
            target.take(result)
            if result.probe == "write":
                target.probed_at = self._clock()
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

    def first_seen(self, path: str, kind: str, keys: Iterable[str]) -> list[str]:
        """Of `keys` (squatted areas, superseded copies) the daemon found for `path`, those
        not seen before: each is reported and counted once (at most `MAX_SEEN_KEPT` are
        remembered per target)."""
        with self._lock:
            target = self._targets.get(path)
            if target is None:
                return []
            new = list(dict.fromkeys(k for k in keys if (kind, k) not in target.seen_once))
            room = max(0, MAX_SEEN_KEPT - len(target.seen_once))
            target.seen_once.update((kind, key) for key in new[:room])
            return new

    def count_redirect_problems(self, path: str, problem: str, count: int) -> TargetView | None:
        """`count` more of `problem` (`fsprobe.exporters.metrics.REDIRECT_PROBLEMS`) in the
        fallback directories of `path`; returns the new view if anything was counted."""
        with self._lock:
            target = self._targets.get(path)
            if target is None or count <= 0:
                return None
            target.redirect_problems[problem] += count
            return self._publish(target)

    def record_save(self, sender: Sender, save: SaveEvent) -> tuple[str | None, TargetView | None]:
        """Take one save event that its sender may report (`fsprobe.events.admission`):
        ``(None, the new view)``, or ``("unwatched", None)``: the path is in no watched
        target (any more)."""
        with self._lock:
            target = self._target_of(save.requested)
            if target is None:
                return "unwatched", None
            now = self._clock()
            if sender.pid == 0:  # outside our pid namespace: until its goodbye or a silence
                target.savers.heard(Saver(sender.uid, save.host, save.pid, None, now))
            elif (started := self._started(save.pid)) is not None:  # else gone already
                target.savers.heard(Saver(sender.uid, save.host, save.pid, started, now))
            target.add_save(sender, save, now)
            self._memory_version += 1
            for evidence in write_evidence(save, target.spec.path, now, target.saves_stand_in()):
                target.take(evidence, probed=False)
                if evidence.ok:
                    target.written_at = now
            if save.outcome == "redirected" and save.landed is not None:
                fallback = fallback_of(save.requested, save.landed, sender.uid)
                if fallback is not None:
                    target.hear_fallback(fallback, sender.uid)
            return None, self._publish(target)

    def seen_fallbacks(self, path: str) -> tuple[str, ...]:
        """The fallback directories that saves redirected away from `path` landed in, as
        their events said (at most `MAX_SEEN_FALLBACKS`): counted like configured ones."""
        with self._lock:
            target = self._targets.get(path)
            seen = target.seen_fallbacks if target is not None else {}
            return tuple(dict.fromkeys(fallback for fallback, _uid in seen))

    def goodbye(self, sender: Sender, goodbye: Goodbye) -> list[TargetView]:
        """A saving process exits cleanly: expect no more saves from it; the changed views."""
        with self._lock:
            changed = []
            for target in self._targets.values():
                if target.savers.goodbye(goodbye.host, goodbye.pid, sender.uid):
                    target.savers_changed()
                    self._memory_version += 1
                    changed.append(self._publish(target))
            return changed

    def forget_gone_savers(self) -> list[TargetView]:
        """Stop expecting saves from the saving processes that are gone (or, outside our pid
        namespace, silent for `SILENT_INTERVALS` save intervals); the changed views."""
        with self._lock:
            changed = []
            now = self._clock()
            for target in self._targets.values():
                interval = target.saves.interval
                silent = SILENT_INTERVALS * interval if interval is not None else SILENT_UNTIMED
                if target.savers.forget_gone(self._started, now, silent):
                    target.savers_changed()
                    self._memory_version += 1
                    changed.append(self._publish(target))
            return changed

    def owner_uids(self) -> frozenset[int]:
        """The owners of the watched targets' directories, as statvfs last saw them (the
        users the event receiver gives a socket of their own)."""
        with self._lock:
            return frozenset(t.owner.uid for t in self._targets.values() if t.owner is not None)

    def skip_write_probe(self, path: str) -> TargetView | None:
        """Whether a real save that landed in `path` within the write probe's interval stands
        for the probe due now: the new view (the skip counted), or None to run the probe. The
        probe still runs once in `MAX_EVIDENCE_PROBE_INTERVALS` of its intervals, and while
        it fails: saves never hide for longer that the target's own write fails."""
        with self._lock:
            target = self._targets.get(path)
            window = target.evidence_window() if target is not None else None
            if target is None or window is None or target.written_at is None:
                return None
            now, interval = self._clock(), target.spec.intervals["write"]
            if now - target.written_at >= window or not target.saves_stand_in():
                return None
            if target.probed_at is None or now - target.probed_at >= (
                MAX_EVIDENCE_PROBE_INTERVALS * interval
            ):
                return None
            target.skipped["write"] += 1
            return self._publish(target)

    def target_of(self, path: str) -> str | None:
        """The watched target that holds `path` (the innermost, if targets nest), or None."""
        with self._lock:
            target = self._target_of(path)
            return None if target is None else target.spec.path

    def _target_of(self, path: str) -> _Target | None:
        """The watched target that holds `path` (the innermost, if targets nest)."""
        holding = [t for p, t in self._targets.items() if is_under(path, p)]
        return max(holding, key=lambda t: len(t.spec.path), default=None)

    def contain(self, path: str, stage: str, error: Exception) -> TargetView | None:
        """A bug raised while handling a result of `path` outside the store (the scheduler's
        part of it): count and log it, and judge the target unknown until its next result."""
        self.internal_errors.failed(path, stage, summary(error), traceback.format_exc())
        with self._lock:
            target = self._targets.get(path)
            if target is None:
                return None
            target.bug = (stage, summary(error))
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
        policy = target.policy()
        view = TargetView(
            path=spec.path,
            snapshot=snapshot,
            verdict=self._judge(target, snapshot, now),
            intervals=dict(spec.intervals),
            stale_after={probe: policy.stale_after(probe) for probe in spec.intervals},
            last_success=dict(target.last_success),
            errors=dict(target.errors),
            write_latency=target.latency,
            write_steps=target.write_steps,
            redirected_pending_bytes=target.redirected_pending_bytes,
            redirect_problems=dict(target.redirect_problems),
            saves=target.saves,
            skipped=dict(target.skipped),
            server_probes_elsewhere=spec.server_probes_elsewhere,
            updated_at=now,
            version=self._version,
        )
        self._views[spec.path] = view
        self._ordered = tuple(self._views[path] for path in sorted(self._views))
        return view

    def _judge(self, target: _Target, snapshot: Snapshot, now: float) -> Verdict:
        if target.bug is not None:
            return unjudged(*target.bug)
        try:
            verdict = evaluate(snapshot, target.policy(), now)
        except Exception as error:  # a bug of the policy's: this target only, never the others
            self.internal_errors.failed(
                snapshot.target, "judge", summary(error), traceback.format_exc()
            )
            return unjudged("judge", summary(error))
        self.internal_errors.passed(snapshot.target, "judge")
        return verdict
