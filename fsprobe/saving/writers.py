"""The background writers of one `SaveContext`: a bounded pool, one in-order queue per
destination; interpreter exit waits for them, an interrupt ends them (docs/saving.md,
"Saving in the background").
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from fsprobe.units import format_seconds

log = logging.getLogger("fsprobe.save")

#: Threads writing checkpoints: saves of different paths in parallel, never unboundedly many.
WORKERS = 2
#: Saves that may wait for their turn, each holding a snapshot, before `save_async` blocks.
MAX_WAITING = 2
#: How often a wait that goes on (for a slot, at exit) says so in the log.
REPORT_EVERY = 60.0
#: How long an interrupt waits for the running saves to stop and remove their temp files: a
#: save stops at its next write, but one held in the kernel (a hung mount) cannot.
STOP_SECONDS = 10.0

#: A job: called in the caller's thread once a slot is free; returns what writes in the
#: background. The snapshot is taken in the first step, the save made in the second.
Prepare = Callable[[], Callable[[], Any]]


@dataclass
class _Job:
    destination: str
    queue: str  # the jobs of one queue run one at a time, in order
    write: Callable[[], Any] | None  # holds the snapshot; None once taken
    future: Future[Any]
    stop: threading.Event | None = None  # set to interrupt the write (None: it cannot be)

    def take(self) -> Callable[[], Any] | None:
        """The write, which the job then no longer holds (nor its snapshot)."""
        write, self.write = self.write, None
        return write


class BackgroundSaves:
    """A bounded pool of writer threads with one in-order queue per destination."""

    def __init__(self, workers: int = WORKERS, max_waiting: int = MAX_WAITING) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self.forget()
        _POOLS.add(self)

    def forget(self) -> None:
        """Start empty (also in a forked child: its parent's saves and threads are not its own)."""
        self._changed = threading.Condition()
        self._queues: dict[str, collections.deque[_Job]] = {}  # waiting, per queue
        self._ready: collections.deque[str] = collections.deque()  # whose next job may start
        self._running: dict[str, _Job] = {}
        self._waiting = 0  # jobs in all queues
        self._reserved = 0  # slots taken by callers still snapshotting
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(
        self,
        destination: str,
        prepare: Prepare,
        queue: str | None = None,
        stop: threading.Event | None = None,
    ) -> Future[Any]:
        """Queue a save of `destination`; `prepare` runs here, once a waiting slot is free.
        Saves of one `queue` (by default their destination) are written one at a time; `stop`
        is what the write stops at (raising KeyboardInterrupt) once set by `interrupt`."""
        with self._changed:
            self._wait_for(
                lambda: self._waiting + self._reserved < self.max_waiting,
                None,
                f"{self.max_waiting} save(s) already waiting for their turn, the save of "
                f"{destination} waits for one of them to start (the filesystem is slower "
                "than the saves come)",
            )
            self._reserved += 1
        try:
            write = prepare()
        except BaseException:
            with self._changed:
                self._reserved -= 1
                self._changed.notify_all()
            raise
        job = _Job(destination, queue or destination, write, Future(), stop)
        with self._changed:
            self._reserved -= 1
            waiting = self._queues.setdefault(job.queue, collections.deque())
            waiting.append(job)
            self._waiting += 1
            if len(waiting) == 1 and job.queue not in self._running:
                self._ready.append(job.queue)
            if self._idle == 0 and len(self._threads) < self.workers:
                self._start_thread()
            self._changed.notify_all()
        return job.future

    def pending(self) -> list[str]:
        """The destinations of the saves running or waiting, running ones first."""
        with self._changed:
            waiting = [job.destination for queue in self._queues.values() for job in queue]
            return [*(job.destination for job in self._running.values()), *waiting]

    def wait(self, timeout: float | None = None, report: str | None = None) -> None:
        """Until no save is running or waiting; `TimeoutError` after `timeout` seconds. An
        interrupt meanwhile interrupts the saves (`interrupt`) and is raised on."""
        try:
            with self._changed:
                done = self._wait_for(self._idle_now, timeout, report)
        except BaseException:  # Ctrl-C, or sys.exit in a signal handler
            self.interrupt()
            raise
        if not done:
            raise FutureTimeoutError(
                f"background saves still running after {format_seconds(timeout or 0)}: "
                + ", ".join(self.pending())
            )

    def interrupt(self) -> None:
        """End every save: those waiting are cancelled (never written), those running stop at
        their next write, their temp files removed (KeyboardInterrupt on their futures); waits
        `STOP_SECONDS` at most for them, and says which it had to leave behind."""
        with self._changed:
            waiting = [job for queue in self._queues.values() for job in queue]
            running = list(self._running.values())
        cancelled = [job.destination for job in waiting if job.future.cancel()]
        stops = [job.stop for job in running if job.stop is not None]
        for stop in stops:
            stop.set()
        log.warning(
            "interrupted: %d background save(s) stopped, %d cancelled before they started%s",
            len(stops),
            len(cancelled),
            f" ({', '.join(cancelled)})" if cancelled else "",
        )
        with self._changed:
            stopped = self._wait_for(
                lambda: not any(j is job for j in self._running.values() for job in running),
                STOP_SECONDS,
                None,
            )
        if not stopped:
            log.error(
                "background save(s) still running %s after the interrupt, left behind (held by "
                "the filesystem?): %s",
                format_seconds(STOP_SECONDS),
                ", ".join(self.pending()),
            )

    def _idle_now(self) -> bool:
        return not self._running and not self._waiting and not self._reserved

    def _wait_for(
        self, condition: Callable[[], bool], timeout: float | None, report: str | None
    ) -> bool:
        """Wait on the condition variable (held) until `condition()`; False on timeout.

        Waits in steps of `REPORT_EVERY`, logging `report` (when given) at each step, so that
        a save stuck on a hung mount shows in the log instead of a silent hang.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        started = time.monotonic()
        while not condition():
            step = REPORT_EVERY
            if deadline is not None:
                step = min(step, deadline - time.monotonic())
                if step <= 0:
                    return False
            if not self._changed.wait(step) and report and not condition():
                log.warning("%s (%s so far)", report, format_seconds(time.monotonic() - started))
        return True

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._work, name=f"fsprobe-save-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            with self._changed:
                self._idle += 1
                while not self._ready:
                    self._changed.wait()
                self._idle -= 1
                key = self._ready.popleft()
                job = self._queues[key].popleft()
                self._waiting -= 1
                self._running[key] = job
                self._changed.notify_all()  # a waiting slot is free
            try:
                _run(job)
            finally:
                with self._changed:
                    del self._running[key]
                    if self._queues[key]:
                        self._ready.append(key)
                    else:
                        del self._queues[key]
                    self._changed.notify_all()


def _run(job: _Job) -> None:
    """Write one checkpoint and settle its future; a failure is also logged, never dropped.

    The snapshot is freed before the future settles and before `wait_saves` can return: once
    they have, the main thread may end the interpreter, and a daemon thread that is then still
    inside torch's C++ code (freeing tensors) is stopped there by `pthread_exit`, which aborts
    the process ("terminate called without an active exception"), as measured before this
    order was kept.
    """
    write = job.take()
    if write is None or not job.future.set_running_or_notify_cancel():
        return  # cancelled while waiting: not written
    try:
        result, error = write(), None
    except BaseException as caught:  # the future must settle whatever happened
        result, error = None, caught
        _release_snapshot(caught)
    del write  # the last reference to the snapshot
    if error is None:
        job.future.set_result(result)
        return
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        log.warning("background save of %s interrupted: nothing written", job.destination)
    elif isinstance(error, OSError) and hasattr(error, "attempts"):  # a SaveError: its attempts
        # were logged one by one already
        log.error("background save of %s failed: %s", job.destination, error)
    else:
        log.error("background save of %s failed", job.destination, exc_info=error)
    job.future.set_exception(error)


def _release_snapshot(error: BaseException) -> None:
    """Clear the local variables of the frames the error went through.

    They hold the snapshot (``save(obj, ...)``), and the future keeps the error for as long as
    the caller keeps the future: without this, every failed save would pin a copy of the model.
    The traceback itself (files, lines) stays.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current = current.__cause__ or current.__context__


#: Every pool of this process that has saves to finish at exit or to forget in a forked child
#: (per process: `atexit` and `fork` are).
_POOLS: weakref.WeakSet[BackgroundSaves] = weakref.WeakSet()


def _wait_at_exit() -> None:
    interrupted = isinstance(getattr(sys, "last_value", None), KeyboardInterrupt)
    for pool in list(_POOLS):
        pending = pool.pending()
        if not pending:
            continue
        if interrupted:  # Ctrl-C ends the process: its saves end now, not when they are done
            pool.interrupt()
            continue
        log.warning(
            "waiting for %d background save(s) to finish before exiting: %s",
            len(pending),
            ", ".join(pending),
        )
        pool.wait(report="still waiting for background saves before exiting: " + ", ".join(pending))
        log.info("background saves finished")


def _forget_in_child() -> None:
    for pool in list(_POOLS):
        pool.forget()


atexit.register(_wait_at_exit)
os.register_at_fork(after_in_child=_forget_in_child)
