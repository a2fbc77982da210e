"""After each batch of results: the state file, the textfile, the scrape cache.

Each target's part of the state file is encoded once per change of that target, not per write.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence

from fsprobe import __version__
from fsprobe.daemon.logs import event
from fsprobe.daemon.lustre_memory import LustreMemory
from fsprobe.daemon.memory import Remembered, boot_id, write_memory
from fsprobe.errors import name_of
from fsprobe.exporters.contained import summary
from fsprobe.exporters.exposition import Exposition
from fsprobe.exporters.textfile import open_textfile_dir, write_textfile
from fsprobe.exporters.view import TargetView
from fsprobe.model import Snapshot
from fsprobe.policy import unjudged
from fsprobe.posix.outputdir import OutputDirectory, UntrustedOutput
from fsprobe.report import Report, TargetState
from fsprobe.state import StateFileError, Writer, write_state

#: How long the supervisor waits for the scheduler's publishing before it gives up on a write.
_SUPERVISOR_PATIENCE = 1.0


def target_state(view: TargetView) -> TargetState:
    """A target in the state file: its report, its probes' intervals, when it was judged."""
    return TargetState(
        Report(view.path, view.snapshot, view.verdict),
        dict(view.intervals),
        view.updated_at,
        view.saves.last,
        view.server_probes_elsewhere,
    )


class Publisher:
    """Writes the outputs from the store's views; remembers which output is failing."""

    def __init__(
        self,
        views: Callable[[], Sequence[TargetView]],
        exposition: Exposition,
        state_dir: str | OutputDirectory,
        textfile_dir: str | None = None,
        clock: Callable[[], float] = time.time,
        once: bool = False,
        memory: Callable[[int], tuple[int, Mapping[str, Remembered] | None]] | None = None,
        lustre: LustreMemory | None = None,
    ) -> None:
        """`state_dir` is the writer lock's open state dir once the lock is taken; `memory`
        (the store's) and `lustre` say what to keep in the memory file, and its version."""
        self._views = views
        self.exposition = exposition
        self.state_dir = state_dir
        self._textfile_dir = textfile_dir
        self._textfile: OutputDirectory | None = None  # opened at its first write, then kept
        self._clock = clock
        self._writer = Writer(socket.gethostname(), os.getpid(), __version__, once=once)
        self._texts: dict[str, tuple[int, str]] = {}
        self._failing: dict[str, str] = {}  # output -> errno name, while it fails
        self._memory = memory
        self._lustre = lustre
        self._boot = boot_id()
        self._remembered = (0, 0)  # the versions of the memory last written (0: nothing kept)
        self._remembered_targets: Mapping[str, Remembered] = {}  # the saves' part of it
        # The scheduler thread publishes; the supervisor (main thread) also writes the state
        # when the scheduler stops turning, and must not wait for one stalled in an output.
        self._lock = threading.Lock()

    def publish(self, changed: Iterable[TargetView] = ()) -> None:
        """Bring every output up to date with the store."""
        with self._lock:
            self._publish(changed)

    def _publish(self, changed: Iterable[TargetView]) -> None:
        self.exposition.warm(changed)
        self._write_state(self._views(), self._writer)
        if self._textfile_dir:
            self._write("textfile", self._write_textfile)
        self._remember()

    def _remember(self) -> None:
        """Write the memory file if what it holds changed (a save heard of, a saver gone):
        with the state file, so that a daemon killed at any moment left what it published."""
        if self._memory is None:
            return
        version, changed = self._memory(self._remembered[0])
        targets = self._remembered_targets if changed is None else changed
        lustre_version, lustre = self._lustre.remembered() if self._lustre else (0, {})
        if (version, lustre_version) == self._remembered:
            return
        self._write("memory", lambda: write_memory(self.state_dir, targets, self._boot, lustre))
        if "memory" not in self._failing:
            self._remembered, self._remembered_targets = (version, lustre_version), targets

    @property
    def textfile_dir(self) -> str | None:
        return self._textfile_dir

    @textfile_dir.setter
    def textfile_dir(self, path: str | None) -> None:
        if path != self._textfile_dir:
            self.close()
            self._textfile_dir = path

    def _write_textfile(self) -> str:
        if self._textfile is None:
            assert self._textfile_dir is not None
            self._textfile = open_textfile_dir(self._textfile_dir)
        return write_textfile(self._textfile, self.exposition.fsprobe_text())

    def close(self) -> None:
        """Close the textfile dir (the next write opens it again)."""
        if self._textfile is not None:
            self._textfile.close()
            self._textfile = None

    def publish_stopped(self) -> None:
        """Write the state once more, saying that its writer stops now: `fsprobe status` then
        tells "not running since ..." from a writer that is alive."""
        now = self._clock()
        if self._lock.acquire(timeout=_SUPERVISOR_PATIENCE):
            try:
                self._writer = dataclasses.replace(self._writer, stopped_at=now)
                self._write_state(self._views(), self._writer)
                self._remember()
            finally:
                self._lock.release()

    def publish_failure(self, failure: str | None) -> None:
        """Say in the state file why the daemon is not probing (None: it is again), so that
        `fsprobe status` says so at once.

        Called by the supervisor while the scheduler may be stalled inside `publish` (an
        output on a hung mount): it then writes the targets as last encoded, without waiting.
        """
        self._writer = dataclasses.replace(self._writer, failure=failure)
        if self._lock.acquire(timeout=_SUPERVISOR_PATIENCE):
            try:
                self._write_state(self._views(), self._writer)
            finally:
                self._lock.release()
            return
        texts = {path: text for path, (_version, text) in list(self._texts.items())}
        self._write(
            "state", lambda: write_state(self.state_dir, self._clock(), self._writer, texts)
        )

    def _write_state(self, views: Sequence[TargetView], writer: Writer) -> None:
        self._write(
            "state",
            lambda: write_state(self.state_dir, self._clock(), writer, self._target_texts(views)),
        )

    def _target_texts(self, views: Sequence[TargetView]) -> dict[str, str]:
        """Each target's JSON, encoded again only when its view changed."""
        texts = {}
        for view in views:
            cached = self._texts.get(view.path)
            if cached is None or cached[0] != view.version:
                cached = self._texts[view.path] = (view.version, self._encode(view))
            texts[view.path] = cached[1]
        for path in [path for path in self._texts if path not in texts]:
            del self._texts[path]
        return texts

    def _encode(self, view: TargetView) -> str:
        """A target's JSON; one that a bug keeps from encoding is written as unknown, with
        the reason internal_error and nothing measured, and the other targets as they are."""
        internal = self.exposition.internal_errors
        try:
            text = json.dumps(target_state(view).to_dict(), separators=(",", ":"))
        except Exception as error:
            internal.failed(
                view.path, "publish", summary(error), traceback.format_exc(), part="state"
            )
            verdict = unjudged("publish", summary(error))
            report = Report(view.path, Snapshot(view.path), verdict)
            bare = TargetState(report, dict(view.intervals), view.updated_at)
            return json.dumps(bare.to_dict(), separators=(",", ":"))
        internal.passed(view.path, "publish", part="state")
        return text

    def _write(self, output: str, write: Callable[[], str]) -> None:
        try:
            path = write()
        except (OSError, StateFileError, UntrustedOutput) as error:
            errno = name_of(error) if isinstance(error, OSError) else "UNTRUSTED"
            if self._failing.get(output) != errno:
                self._failing[output] = errno
                event(logging.ERROR, "output_failed", output=output, errno=errno, message=error)
            return
        if self._failing.pop(output, None) is not None:
            event(logging.INFO, "output_recovered", output=output, path=path)
