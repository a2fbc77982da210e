"""`fsprobe.save_async()` and `fsprobe.wait_saves()`: checkpoints written in the background.

The training thread pays for a snapshot only (`fsprobe.saving.cpu_copy`: the tensors copied to
CPU memory, so that the optimizer's next in-place update cannot reach the checkpoint); the
preflight, the write, its retries and its redirect run in a background thread, exactly as
`fsprobe.save` runs them. The rules, and why:

- **One save per destination at a time, in order.** Two saves of ``last.pt`` running at once
  would race for the rename, and the older one could win. A later save of the same path waits
  until the earlier one has finished; saves of different paths run side by side, on at most
  `WORKERS` threads.
- **Bounded memory.** Every save waiting for its turn holds a full snapshot. When `MAX_WAITING`
  are already waiting, the next `save_async` blocks *before* taking its snapshot until one of
  them has started: a filesystem slower than the save interval slows the training down instead
  of running the host out of memory. A warning says so.
- **Nothing lost silently.** A failure is set on the future and logged as an error on the
  ``fsprobe.save`` logger, whether or not anyone looks at the future.
- **Interpreter exit waits.** The threads are daemon threads, and an `atexit` handler waits for
  every save still queued or running, saying so in the log. Non-daemon threads would be joined
  before `atexit` handlers run, without a word; worse, Python 3.12 refuses to start a thread
  from then on, which a queued save could need.

A forked child (a DataLoader worker) starts with no background saves: its parent's are the
parent's to finish.
"""

from __future__ import annotations

import atexit
import collections
import inspect
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from fsprobe.extras import import_extra
from fsprobe.saving.cpu_copy import cpu_copy
from fsprobe.saving.file import save
from fsprobe.saving.retry import SaveError, SaveResult
from fsprobe.units import format_seconds

log = logging.getLogger("fsprobe.save")

#: Threads writing checkpoints: saves of different paths in parallel, never unboundedly many.
WORKERS = 2
#: Saves that may wait for their turn, each holding a snapshot, before `save_async` blocks.
MAX_WAITING = 2
#: How often a wait that goes on (for a slot, at exit) says so in the log.
REPORT_EVERY = 60.0

#: A job: called in the caller's thread once a slot is free; returns what writes in the
#: background. The snapshot is taken in the first step, the save made in the second.
Prepare = Callable[[], Callable[[], SaveResult]]


@dataclass
class _Job:
    destination: str
    write: Callable[[], SaveResult] | None  # holds the snapshot; None once taken
    future: Future[Any]

    def take(self) -> Callable[[], SaveResult] | None:
        """The write, which the job then no longer holds (nor its snapshot)."""
        write, self.write = self.write, None
        return write


class BackgroundSaves:
    """A bounded pool of writer threads with one in-order queue per destination."""

    def __init__(self, workers: int = WORKERS, max_waiting: int = MAX_WAITING) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self.forget()

    def forget(self) -> None:
        """Start empty (also in a forked child: its parent's saves and threads are not its own)."""
        self._changed = threading.Condition()
        self._queues: dict[str, collections.deque[_Job]] = {}  # waiting, per destination
        self._ready: collections.deque[str] = collections.deque()  # whose next job may start
        self._running: dict[str, _Job] = {}
        self._waiting = 0  # jobs in all queues
        self._reserved = 0  # slots taken by callers still snapshotting
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, destination: str, prepare: Prepare) -> Future[Any]:
        """Queue a save of `destination`; `prepare` runs here, once a waiting slot is free."""
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
        job = _Job(destination, write, Future())
        with self._changed:
            self._reserved -= 1
            queue = self._queues.setdefault(destination, collections.deque())
            queue.append(job)
            self._waiting += 1
            if len(queue) == 1 and destination not in self._running:
                self._ready.append(destination)
            if self._idle == 0 and len(self._threads) < self.workers:
                self._start_thread()
            self._changed.notify_all()
        return job.future

    def pending(self) -> list[str]:
        """The destinations of the saves running or waiting, running ones first."""
        with self._changed:
            waiting = [job.destination for queue in self._queues.values() for job in queue]
            return [*self._running, *waiting]

    def wait(self, timeout: float | None = None, report: str | None = None) -> None:
        """Until no save is running or waiting; `TimeoutError` after `timeout` seconds."""
        with self._changed:
            done = self._wait_for(self._idle_now, timeout, report)
        if not done:
            raise FutureTimeoutError(
                f"background saves still running after {format_seconds(timeout or 0)}: "
                + ", ".join(self.pending())
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
                destination = self._ready.popleft()
                job = self._queues[destination].popleft()
                self._waiting -= 1
                self._running[destination] = job
                self._changed.notify_all()  # a waiting slot is free
            try:
                _run(job)
            finally:
                with self._changed:
                    del self._running[destination]
                    if self._queues[destination]:
                        self._ready.append(destination)
                    else:
                        del self._queues[destination]
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
    if isinstance(error, SaveError):  # its attempts were logged one by one already
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


_SAVE_PARAMETERS = inspect.signature(save).parameters
#: The process's background saves, which `save_async` and `wait_saves` use.
SAVES = BackgroundSaves()


def _check_arguments(obj: object, path: object, save_kwargs: dict[str, Any]) -> None:
    """TypeError now for what `fsprobe.save` or `torch.save` would refuse in the background."""
    torch = import_extra("torch", "torch", "fsprobe.save_async")  # on use, as fsprobe.save
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"fsprobe.save_async needs a path, not {type(path).__name__}: a file object the "
            "caller holds cannot be written behind its back (use fsprobe.save)"
        )
    inspect.signature(save).bind(obj, path, **save_kwargs)
    for_torch = {k: v for k, v in save_kwargs.items() if k not in _SAVE_PARAMETERS}
    inspect.signature(torch.save).bind(obj, None, **for_torch)


def save_async(obj: object, path: str | os.PathLike[str], **save_kwargs: Any) -> Future[SaveResult]:
    """`fsprobe.save(obj, path, **save_kwargs)` in the background; returns its `Future`.

    Returns once `obj` is snapshotted (its tensors copied to CPU memory); the future's result
    is the `SaveResult`, or its exception the `SaveError` (or whatever else the save raised).
    Saves of the same path are written one at a time, in the order they were made. Arguments
    the save would refuse are refused here, at once, not hours later on the future.
    """
    _check_arguments(obj, path, save_kwargs)
    requested = os.path.abspath(os.fspath(path))  # now: the cwd may change before the write

    def prepare() -> Callable[[], SaveResult]:
        copied = cpu_copy(obj)
        return lambda: save(copied, requested, **save_kwargs)

    return SAVES.submit(requested, prepare)


def wait_saves(timeout: float | None = None) -> None:
    """Wait until every background save of this process has finished, failed or not.

    Raises `TimeoutError` (`concurrent.futures.TimeoutError`) if some are still running after
    `timeout` seconds. Failures are on each save's future (and in the log), not raised here.
    """
    SAVES.wait(timeout)


def _wait_at_exit() -> None:
    pending = SAVES.pending()
    if not pending:
        return
    log.warning(
        "waiting for %d background save(s) to finish before exiting: %s",
        len(pending),
        ", ".join(pending),
    )
    SAVES.wait(report="still waiting for background saves before exiting: " + ", ".join(pending))
    log.info("background saves finished")


atexit.register(_wait_at_exit)
os.register_at_fork(after_in_child=SAVES.forget)
