"""`SaveContext`: what one process keeps between its saves, and nothing that decides.

Memories, each bounded: the size of the last save per file and directory, the directories
seen to exist and those cleaned of crashed saves' leftovers, the warnings said once, the
state readers and the answers read from them fitted to a need, the inline probes' results;
and what only some saves use, built on first use: the inline probes with their runner, and
the writer threads of background saves (docs/design.md §3, §7). The preflight
(`fsprobe.saving.preflight`) and the attempts (`fsprobe.saving.retry`) decide; they read a
memory as the dict it is and write it through `remember` and the methods below.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Optional, TypeVar

from fsprobe.model import SaveAnswer, Snapshot
from fsprobe.state import StateReader

if TYPE_CHECKING:  # types only: what is built on first use
    from fsprobe.probing.runner import ProbeRunner
    from fsprobe.saving.inline import InlineProbes
    from fsprobe.saving.writers import BackgroundSaves

log = logging.getLogger("fsprobe.preflight")

#: The per-directory memories of a `SaveContext` are bounded: a run saving into ``epoch-<n>/``
#: directories for weeks must not grow them without end. The oldest entry goes first.
MEMORY_ENTRIES = 1024

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: A save's need: (bytes, inodes), None for what it does not say.
Need = tuple[Optional[int], Optional[int]]  # a runtime alias: no `|` before Python 3.10


class SaveContext:
    """What one process keeps between its saves. Every public function takes one as
    ``context=``, `default_context()` unless given; a test or an embedding builds its own.

    Its memories are plain dicts, read as such and written through `remember` (bounded,
    under a lock): `sizes` (the bytes of the last save, by file path and by directory),
    `seen` (directories seen to exist: a save landed there, or a check or the daemon's answer
    found them), `cleaned` (when, by `time.monotonic`, each directory was cleaned of crashed
    saves' leftovers), `probed` (the inline probes' snapshots, by directory, with when),
    `said` (the keys of what `warn_once` said) and `readers` (one `StateReader` per state
    directory as the options name it, so that its parse cache serves every call). One memory
    holds one entry, replaced whole by the preflight: `fitted`, the last answer from a state
    file fitted to a need (the answer, the need, the fitted answer), reused while the state
    reader hands out the same parsed file and the need is the same. The inline probes and their
    runner (`fsprobe.probing.worker.shared_runner` unless given) and the background writers
    are built on first use.
    """

    def __init__(
        self,
        runner: Callable[[], ProbeRunner] | None = None,
        memory_entries: int = MEMORY_ENTRIES,
    ) -> None:
        self._runner = runner
        self._entries = memory_entries
        self._lock = threading.Lock()
        self.said: set[str] = set()
        self._probes: InlineProbes | None = None
        self._background: BackgroundSaves | None = None
        self.sizes: dict[str, int] = {}
        self.seen: dict[str, None] = {}
        self.cleaned: dict[str, float] = {}
        self.fitted: tuple[SaveAnswer, Need, SaveAnswer] | None = None
        self.probed: dict[str, tuple[float, Snapshot]] = {}
        self.readers: dict[str | None, StateReader] = {}

    def remember(self, memory: dict[K, V], key: K, value: V) -> None:
        """Set `memory[key]` (one of this context's), forgetting the oldest entry once there
        are more than the context keeps."""
        with self._lock:
            memory.pop(key, None)  # re-inserted last: the most recently used is kept longest
            memory[key] = value
            while len(memory) > self._entries:
                memory.pop(next(iter(memory)))

    def remember_save(self, path: str, nbytes: int) -> None:
        """A save of `path` landed with `nbytes`: the default need of the next one there."""
        path = os.path.abspath(path)
        self.remember(self.sizes, path, nbytes)
        self.remember(self.sizes, os.path.dirname(path), nbytes)

    def saw(self, directory: str) -> None:
        """`directory` existed in this process: a save landed in it (not redirected), or a
        check or the daemon's answer found it."""
        self.remember(self.seen, os.path.abspath(directory), None)

    def was_cleaned(self, directory: str) -> None:
        """`directory` was just cleaned of crashed saves' leftovers (`fsprobe.saving.stale`)."""
        self.remember(self.cleaned, directory, time.monotonic())

    def warn_once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        """Log `message` the first time `key` comes up in this context: a trainer saves often."""
        if self.note(key):
            log.log(level, "%s", message)

    def note(self, key: str) -> bool:
        """Mark `key` as said; whether it was new (`warn_once` says it only then)."""
        with self._lock:
            if key in self.said:
                return False
            self.said.add(key)
            return True

    def reader(self, state_dir: str | None) -> StateReader:
        """The reader of the state file in `state_dir`, made on first use (None: the default
        state directory, `fsprobe.state.default_state_dir` when the reader is made)."""
        reader = self.readers.get(state_dir)
        if reader is None:  # two threads may race here; setdefault keeps one reader for both
            reader = self.readers.setdefault(state_dir, StateReader(state_dir))
        return reader

    # What only some saves use is built, or its module imported, on first use: the only
    # fsprobe imports inside a function (docs/design.md §3, tests/package/test_layout.py).

    def background(self) -> BackgroundSaves:
        """The writer threads of this context's background saves (started on first use)."""
        with self._lock:
            if self._background is None:
                from fsprobe.saving.writers import BackgroundSaves

                self._background = BackgroundSaves()
            return self._background

    def inline(self) -> InlineProbes:
        """This context's inline probes (built on first use)."""
        with self._lock:
            if self._probes is None:
                from fsprobe.saving.inline import InlineProbes

                self._probes = InlineProbes(self._runner)
            return self._probes

    def runner(self) -> ProbeRunner:
        """The probe runner inline probes run in (started on first use)."""
        return self.inline().runner()

    def redirect_path(self, fallback: str, requested: str) -> str:
        """Where a save of `requested` lands in `fallback` (`fsprobe.redirect.areas`, loaded
        on first use: only a redirect needs it)."""
        from fsprobe.redirect.areas import redirect_path

        return redirect_path(fallback, requested)


_DEFAULT = SaveContext()


def default_context() -> SaveContext:
    """The process's `SaveContext`, which every public function uses unless handed one
    (``context=``), as client_python's ``REGISTRY``."""
    return _DEFAULT
