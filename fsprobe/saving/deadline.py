"""`save_timeout`: an attempt runs in a thread of its own and is abandoned past its deadline;
an abandoned attempt publishes nothing and writes no more, and an interrupt removes what it
made (docs/design.md §7, "Abandoning an attempt").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fsprobe.model import TIMEOUT
from fsprobe.saving.retry import FailedAttempt
from fsprobe.units import format_seconds

log = logging.getLogger("fsprobe.save")

#: How long an interrupt waits for the attempt it abandons to stop at its next write: a thread
#: still in torch when the interpreter exits aborts it. One held in the kernel is left behind.
STOP_SECONDS = 10.0


class Progress:
    """Where an attempt is (`step`), whether the save has abandoned it, and how to remove what
    it made (its temp file or staging directory) should the save be interrupted meanwhile."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self.step = "create"
        self.abandoned = threading.Event()
        self.stop = stop or threading.Event()  # set by another thread: the save is interrupted
        self._lock = threading.Lock()
        self._remove: Callable[[], object] | None = None

    def at(self, step: str) -> None:
        """The attempt enters `step`."""
        self.step = step

    def made(self, remove: Callable[[], object]) -> None:
        """The attempt made something that `remove()` removes (it must never fail), which the
        attempt removes itself on its way out; raises if the save is already abandoned."""
        with self._lock:
            self._remove = remove
        self.go_on()

    def publishing(self) -> None:
        """The attempt publishes now (`go_on` first): what it made becomes the checkpoint, which
        an interrupt from here on leaves in place."""
        with self._lock:
            self.go_on()
            self._remove = None

    def interrupt(self) -> None:
        """The save was interrupted while the attempt runs in a thread of its own: abandon it,
        and remove what it made now, before the interrupt ends the process."""
        with self._lock:
            self.abandoned.set()
            remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    def go_on(self) -> None:
        """Raise instead of writing on or publishing when the save has gone on without this
        attempt, or KeyboardInterrupt when another thread interrupted the save (its `stop`:
        a background save, `fsprobe.saving.writers`)."""
        if self.stop.is_set():
            raise KeyboardInterrupt(f"the save was interrupted at {self.step}")
        if self.abandoned.is_set():
            raise FailedAttempt(TIMEOUT, self.step, "abandoned at the save's deadline")


def bounded(
    timeout: float | None,
    attempt: Callable[[str, Progress], int],
    destination: str,
    stop: threading.Event | None = None,
) -> int:
    """`attempt(destination, progress)`, one attempt of a save, with at most `timeout` seconds
    for it; inline when None. (`functools.partial` of it is a `SaveSteps.write`.)

    The attempt raises `FailedAttempt` (``TIMEOUT``, at the step it is stuck in) past the
    deadline, KeyboardInterrupt at its next step once `stop` is set, and whatever `attempt`
    raised otherwise.
    """
    progress = Progress(stop)
    if timeout is None:
        return attempt(destination, progress)
    written: list[int] = []
    raised: list[BaseException] = []
    finished = threading.Event()

    def run() -> None:
        try:
            written.append(attempt(destination, progress))
        except BaseException as error:  # handed to the waiting save, not lost in the thread
            raised.append(error)
        finally:
            finished.set()

    thread = threading.Thread(target=run, name=f"fsprobe-save {destination}", daemon=True)
    thread.start()
    try:
        done = finished.wait(timeout)
    except BaseException:  # Ctrl-C (or sys.exit in a signal handler) while waiting
        progress.interrupt()
        finished.wait(STOP_SECONDS)
        raise
    finally:
        if not finished.is_set():
            progress.abandoned.set()
    if not done:
        log.error(
            "save %s: no answer from the filesystem for %s at %s; abandoned, its thread is "
            "left behind (it publishes nothing if it ever returns)",
            destination,
            format_seconds(timeout),
            progress.step,
        )
        raise FailedAttempt(
            TIMEOUT, progress.step, f"the write took longer than {format_seconds(timeout)}"
        )
    if raised:  # popped: a list in this frame would hold the error in a reference cycle
        raise raised.pop()
    return written[0]
