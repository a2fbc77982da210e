"""`fsprobe.preflight()`: right before a save, can the target take it now, and if not, where to?

The daemon's fresh, trusted state file answers in microseconds (each target's `SaveAnswer`,
which the policy worked out in the daemon); otherwise cheap probes run inline in the
context's probe runner, judged there, and are reused for `INLINE_CACHE_SECONDS`. This module
fits the save's need against the answer and decides ``proceed``, ``delay``, ``redirect`` or
``fail`` (docs/design.md §7). `SaveContext` holds what a process keeps between saves.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fsprobe.model import ProbeResult, Reason, SaveAnswer, Severity, Snapshot, Status
from fsprobe.saving.options import DEFAULT_TIMEOUT, SaveOptions, save_options
from fsprobe.state import REASON, StateFile, StateFileError, StateReader, default_state_dir
from fsprobe.units import format_bytes, format_duration, format_seconds

if TYPE_CHECKING:  # types only: what is built on first use (`SaveContext`), or redirected
    from typing_extensions import Unpack

    from fsprobe.probing.plan import ProbeSettings
    from fsprobe.probing.runner import ProbeRunner
    from fsprobe.redirect.manifest import Entry
    from fsprobe.saving.inline import InlineProbes
    from fsprobe.saving.options import SaveOverrides
    from fsprobe.saving.writers import BackgroundSaves

    #: A watched target in the state file, and its answer to a save (None: it has none).
    Watched = tuple[str, SaveAnswer | None]

log = logging.getLogger("fsprobe.preflight")

#: How long an inline probe result is reused: about one statvfs interval of the daemon.
INLINE_CACHE_SECONDS = 15.0
#: How often the target is judged again while waiting for it to recover.
POLL_SECONDS = 1.0
#: `need_bytes` defaults to the last save into the same directory times this margin.
NEED_MARGIN = 1.1


class Decision(NamedTuple):
    """What preflight decided, and why. `path` is where to write (a fallback's on redirect).

    `status` and `reasons` are those of the requested target (they say why a save was delayed
    or redirected), `errno` the error a write to it would most likely fail with now;
    `wait_seconds` is how long preflight waited; `source` is ``"state"`` when the daemon's
    state file answered, ``"probe"`` when preflight probed itself.

    A named tuple, not a frozen dataclass: one is made before every save, in 0.5 µs, not 2.
    """

    action: str
    path: str
    status: Status
    reasons: tuple[Reason, ...]
    wait_seconds: float = 0.0
    source: str = "probe"
    requested_path: str = ""
    need_bytes: int | None = None
    fits: bool | None = None
    errno: str | None = None

    @property
    def redirected(self) -> bool:
        return self.action == "redirect"

    @property
    def concerns(self) -> tuple[Reason, ...]:
        """The reasons that weigh on the status (not the notices, such as $TMPDIR's)."""
        if not self.reasons:
            return ()
        return tuple(r for r in self.reasons if r.severity is not Severity.NOTICE)

    def summary(self) -> str:
        """One line for a log: the action, the target's status and the reasons that matter."""
        text = f"{self.action} (target {self.status.label}"
        if self.wait_seconds:
            text += f", waited {format_seconds(self.wait_seconds)}"
        text += ")"
        if self.redirected:
            text += f" to {self.path}"
        if self.concerns:
            text += ": " + "; ".join(f"{r.code}: {r.message}" for r in self.concerns)
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "path": self.path,
            "requested_path": self.requested_path,
            "status": self.status.label,
            "reasons": [REASON.encode(reason) for reason in self.reasons],
            "wait_seconds": self.wait_seconds,
            "source": self.source,
            "need_bytes": self.need_bytes,
            "fits": self.fits,
        }


class _Judged(NamedTuple):
    """The answer on one directory for one save, and whence it came (state file or probe)."""

    directory: str
    answer: SaveAnswer
    source: str


#: The per-directory memories of a `SaveContext` are bounded: a run saving into ``epoch-<n>/``
#: directories for weeks must not grow them without end. The oldest entry goes first.
MEMORY_ENTRIES = 1024


def _remember(memory: dict[Any, Any], key: object, value: object, entries: int) -> None:
    """Set `memory[key]`, forgetting the oldest entry once there are more than `entries`."""
    memory.pop(key, None)  # re-inserted last: the most recently used is kept longest
    memory[key] = value
    while len(memory) > entries:
        memory.pop(next(iter(memory)))


def _wait_for_recovery(
    target: _Judged, max_wait: float, judge: Callable[[float], _Judged]
) -> tuple[_Judged, float]:
    """Judge the target again every `POLL_SECONDS` until waiting is no longer worth it (it
    recovered, or it refuses the save for good) or `max_wait` has passed."""
    start = time.monotonic()
    until = start + max_wait
    log.info(
        "preflight: %s is %s (%s); waiting up to %s for it to recover",
        target.directory,
        target.answer.status.label,
        ", ".join(r.code for r in target.answer.reasons if r.transient),
        format_seconds(max_wait),
    )
    while (remaining := until - time.monotonic()) > 0:
        time.sleep(min(POLL_SECONDS, remaining))
        target = judge(max(0.05, until - time.monotonic()))
        if not target.answer.worth_waiting:
            break
    return target, time.monotonic() - start


class SaveContext:
    """What one process keeps between its saves, and the preflight that uses it.

    The state readers (one per state directory, so that its parse cache serves every call),
    the verdicts made from the state file, the inline probes' results (reused for
    `INLINE_CACHE_SECONDS`), the size of the last save per file and per directory (the default
    need of the next one), the directories cleaned of crashed saves' leftovers, the warnings
    said once, the inline probes and the probe runner they run in
    (`fsprobe.probing.worker.shared_runner` unless given), and the writer threads of its
    background saves; the last two are built on first use. Every public function takes one as
    ``context=``, `default_context()` unless given; a test or an embedding builds its own.
    """

    def __init__(
        self,
        runner: Callable[[], ProbeRunner] | None = None,
        memory_entries: int = MEMORY_ENTRIES,
    ) -> None:
        self._runner = runner
        self._entries = memory_entries
        self._lock = threading.Lock()
        self._last_sizes: dict[str, int] = {}  # by file path and by directory
        self._seen: dict[str, None] = {}  # directories seen to exist (`saw`)
        self._readers: dict[str, StateReader] = {}
        self._warned: set[str] = set()
        #: Answers from the state file fitted to a need, by directory, with the answer and the
        #: need: reused while the `StateReader` hands out the same parsed file.
        self._state_judgements: dict[
            str, tuple[SaveAnswer, tuple[int | None, int | None], _Judged]
        ] = {}
        self._inline_cache: dict[str, tuple[float, Snapshot]] = {}
        self._probes: InlineProbes | None = None
        self._background: BackgroundSaves | None = None
        #: When (`time.monotonic`) this context cleaned each directory of crashed saves'
        #: leftovers (`was_cleaned`, docs/design.md §7, Cleanup).
        self.cleaned: dict[str, float] = {}

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

    def _candidates(self, requested: str, fallback_dirs: Sequence[str]) -> list[_Candidate]:
        """Where `requested` would land in each of these fallbacks, in order (none that would
        land it in its own directory)."""
        if not fallback_dirs:
            return []  # the common case, on the path of every save
        from fsprobe.redirect.areas import redirect_path

        directory = os.path.dirname(requested)
        candidates = (_Candidate(f, redirect_path(f, requested)) for f in fallback_dirs)
        return [c for c in candidates if c.directory != directory]

    # -- remembered save sizes ------------------------------------------------------------------

    def remember_save(self, path: str, nbytes: int) -> None:
        """Remember the size of a successful save, as the default need of the next one there."""
        path = os.path.abspath(path)
        with self._lock:
            _remember(self._last_sizes, path, nbytes, self._entries)
            _remember(self._last_sizes, os.path.dirname(path), nbytes, self._entries)

    def expected_need(self, path: str) -> int | None:
        """What the next save of `path` needs by default, or None before the first save there.

        The last save of the same file (``last.pt`` saved every epoch), else the last save into
        the same directory (``epoch-7.pt`` after ``epoch-6.pt``), times `NEED_MARGIN`.
        """
        path = os.path.abspath(path)
        with self._lock:
            last = self._last_sizes.get(path, self._last_sizes.get(os.path.dirname(path)))
        return math.ceil(last * NEED_MARGIN) if last is not None else None

    def saw(self, directory: str) -> None:
        """`directory` existed in this process: a save landed in it (not redirected), or a
        check found it."""
        with self._lock:
            _remember(self._seen, os.path.abspath(directory), None, self._entries)

    def has_seen(self, directory: str) -> bool:
        """Whether `directory` was `saw`n (and is still remembered: the most recent
        `memory_entries` directories are)."""
        with self._lock:
            return os.path.abspath(directory) in self._seen

    def was_cleaned(self, directory: str) -> None:
        """`directory` was just cleaned of crashed saves' leftovers (`fsprobe.saving.stale`)."""
        with self._lock:
            _remember(self.cleaned, directory, time.monotonic(), self._entries)

    def warn_missing_fallbacks(self, options: SaveOptions) -> None:
        """Say once per process, at the first save that names it, which fallback directory of
        `options` does not exist (checked in the probe runner, bounded by `options.timeout`):
        a save could never be redirected there."""
        with self._lock:
            new = [f for f in options.fallback_dirs if f"fallback:{f}" not in self._warned]
        if not new:
            return
        checks = self._check_existence(new, self._read_state(options.state_dir)[0], options.timeout)
        for fallback, check in checks.items():
            exists = check()
            if exists.ok and exists.value:
                with self._lock:
                    self._warned.add(f"fallback:{fallback}")
                continue
            why = exists.message or "it does not exist"
            self.warn_once(
                f"fallback:{fallback}",
                f"the fallback directory {fallback} cannot take a redirected save: {why}",
            )

    # -- the daemon's state file ----------------------------------------------------------------

    def warn_once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        """Log `message` the first time `key` comes up in this context: a trainer saves often."""
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.log(level, "%s", message)

    def _read_state(
        self, state_dir: str | None, directory: str | None = None
    ) -> tuple[StateFile | None, Watched | None]:
        """The daemon's trusted state file, or None (said once) when there is none to use; and
        with `directory`, the watched target that judges it with that target's state (None if
        none does, or if its entry does not read: said once). The file is asked once, for both.
        """
        state_dir = state_dir or default_state_dir()
        reader = self._readers.get(state_dir)
        if reader is None:  # two threads may race here; setdefault keeps one reader for both
            reader = self._readers.setdefault(state_dir, StateReader(state_dir))
        state: StateFile | None = None
        try:
            state = reader.read()
            watched = None if state is None or directory is None else state.watching(directory)
        except (StateFileError, OSError) as error:  # the file, or this target's entry in it
            self._not_using(error)
            return state, None
        if state is None:
            self.warn_once(
                f"absent:{reader.path}",
                f"no fsprobe state file at {reader.path} (no `fsprobe run` on this node?); "
                "probing inline instead",
                logging.INFO,
            )
        return state, watched

    def _watched(self, state: StateFile | None, directory: str) -> Watched | None:
        """The watched target that judges `directory` and its state, as `_read_state` says."""
        try:
            return None if state is None else state.watching(directory)
        except StateFileError as error:
            self._not_using(error)
            return None

    def _not_using(self, error: Exception) -> None:
        message = f"not using the fsprobe state file: {error}; probing inline instead"
        self.warn_once(f"state:{error}", message)

    def _from_state(
        self,
        directory: str,
        watched: Watched | None,
        need_bytes: int | None,
        need_inodes: int | None,
    ) -> _Judged | None:
        """The daemon's answer on `directory` (judged by `watched`) fitted to this save, or
        None if it has none to give (said once when its state file holds no answer: an older
        daemon). The fit is made once per answer and need; only its freshness is asked again."""
        if watched is None:
            return None
        target, answer = watched
        if answer is None:
            self.warn_once(
                f"unanswered:{target}",
                f"the fsprobe state for {target} holds no answer for a save (written by an "
                "older `fsprobe run`?); probing inline",
            )
            return None
        need = (need_bytes, need_inodes)
        cached = self._state_judgements.get(directory)  # replaced whole, never mutated
        if cached is not None and cached[0] is answer and cached[1] == need:
            judged = cached[2]
        else:
            judged = _Judged(target, answer.fit(need_bytes, need_inodes), "state")
            with self._lock:
                _remember(self._state_judgements, directory, (answer, need, judged), self._entries)
        if answer.status is Status.UNKNOWN:
            return None  # the daemon has seen nothing yet; a probe of our own says more
        now = time.time()
        if answer.fresh_until is None or now > answer.fresh_until:
            since = (
                f" {format_duration(now - answer.fresh_until)} ago" if answer.fresh_until else ""
            )
            self.warn_once(
                f"stale:{target}",
                f"the fsprobe state for {target} went stale{since}: is `fsprobe run` "
                "still running? probing inline",
            )
            return None
        return judged

    def _exists_in_state(self, directory: str, state: StateFile | None) -> bool | None:
        """Whether the daemon, watching `directory` itself with a fresh answer, found it a
        directory; None when its state cannot say."""
        watched = self._watched(state, directory)
        if watched is None or watched[0] != directory or watched[1] is None:
            return None
        answer = watched[1]
        if answer.fresh_until is None or time.time() > answer.fresh_until:
            return None
        return answer.exists

    # -- inline probes --------------------------------------------------------------------------

    def _inline_settings(self, timeout: float) -> ProbeSettings:
        return self.inline().settings(timeout)

    def _probe_inline(
        self, directories: list[str], settings: ProbeSettings, fresh: bool
    ) -> dict[str, Snapshot]:
        """Snapshots of every directory, probed in parallel (or reused from the cache)."""
        snapshots: dict[str, Snapshot] = {}
        probed = []
        now = time.monotonic()
        for directory in directories:
            with self._lock:
                cached = self._inline_cache.get(directory)
            if cached is not None and not fresh and now - cached[0] < INLINE_CACHE_SECONDS:
                snapshots[directory] = cached[1]
                continue
            probed.append(directory)
        for directory, snapshot in self.inline().snapshots(probed, settings).items():
            with self._lock:
                _remember(
                    self._inline_cache, directory, (time.monotonic(), snapshot), self._entries
                )
            snapshots[directory] = snapshot
        return snapshots

    def _judge_all(
        self,
        directories: Iterable[str],
        need_bytes: int | None,
        need_inodes: int | None,
        state: StateFile | None,
        probe_settings: Callable[[], ProbeSettings],
        fresh: bool = False,
    ) -> dict[str, _Judged]:
        """Judge each directory from the state file, and probe those it says nothing (fresh)
        about. `probe_settings` is called only when something has to be probed: the common
        case, a fresh state file, should not pay for building probe settings it does not use.
        """
        judgements: dict[str, _Judged] = {}
        unanswered = []
        for directory in dict.fromkeys(directories):
            judged = self._from_state(
                directory, self._watched(state, directory), need_bytes, need_inodes
            )
            if judged is None:
                unanswered.append(directory)
            else:
                judgements[directory] = judged
        if not unanswered:
            return judgements
        settings = probe_settings()
        inline = self.inline()
        for directory, snapshot in self._probe_inline(unanswered, settings, fresh).items():
            answer = inline.answer(snapshot, settings).fit(need_bytes, need_inodes)
            judgements[directory] = _Judged(directory, answer, "probe")
        return judgements

    def _check_existence(
        self, fallbacks: Iterable[str], state: StateFile | None, deadline: float
    ) -> dict[str, Callable[[], ProbeResult[bool]]]:
        """Whether each fallback exists, as a call that answers: from the daemon's fresh state
        where it watches the fallback itself, else from a check started in the probe runner
        now (a hung fallback must not hang the caller).

        A fallback that does not exist is a mistake (a typo, scratch not mounted here) that the
        probes would not notice: they judge the nearest existing ancestor.
        """
        checks: dict[str, Callable[[], ProbeResult[bool]]] = {}
        for fallback in fallbacks:
            known = self._exists_in_state(fallback, state)
            if known is not None:
                checks[fallback] = functools.partial(ProbeResult, "exists", time.time(), 0.0, known)
            else:
                checks[fallback] = self.inline().is_directory(fallback, deadline).result
        return checks

    def room(self, directory: str, timeout: float) -> int | None:
        """The bytes a new file in `directory` has room for now (None: unknown), from a bounded
        statvfs in the probe runner (a mount that hangs now costs `timeout`)."""
        return self.inline().room(os.path.abspath(directory), timeout)

    # -- the decisions --------------------------------------------------------------------------

    def find_fallback(
        self,
        path: str | os.PathLike[str],
        fallback_dirs: Iterable[str | os.PathLike[str]],
        options: SaveOptions,
        *,
        skipped: dict[str, str] | None = None,
    ) -> str | None:
        """Where in the first fallback that can take it a save of `path` should go, or None;
        why each fallback before it could not is put in `skipped` (by fallback directory).

        For a save whose target just failed with a capacity or permanent error: whatever the
        target looked like a moment ago, it cannot take this write, so only the fallbacks are
        asked (each judged like a target in `preflight`; a fallback is never redirected
        further). Exactly these directories are asked, not the `options`' own.
        """
        requested = os.path.abspath(os.fspath(path))
        need = options.need_bytes
        if need is None:
            need = self.expected_need(requested)
        candidates = self._candidates(requested, tuple(os.fspath(d) for d in fallback_dirs))
        if not candidates:
            return None
        state = self._read_state(options.state_dir)[0]
        existence = self._check_existence([c.fallback for c in candidates], state, options.timeout)
        judgements = self._judge_all(
            [c.directory for c in candidates],
            need,
            options.need_inodes,
            state,
            functools.partial(self._inline_settings, options.timeout),
            fresh=True,
        )
        return _first_acceptable(candidates, existence, judgements, requested, skipped)

    def preflight_save(self, requested: str, options: SaveOptions) -> Decision | None:
        """The preflight of a save of `requested` (absolute): the fallbacks that do not exist
        said once (`warn_missing_fallbacks`), then the decision (None without a preflight)."""
        self.warn_missing_fallbacks(options)
        return self.preflight(requested, options) if options.preflight else None

    def _judged_directory(self, requested: str, state: StateFile | None, timeout: float) -> str:
        """`requested` if it is a directory, else its parent; decided without touching the
        filesystem when the daemon watches `requested` itself or, as usual, judges both the
        same way (then the parent), and otherwise in the probe runner (a hung mount must not
        hang the caller): an inline probe comes next anyway."""
        parent = os.path.dirname(requested)
        if state is not None:
            watched = state.target_for(requested)
            if watched == requested:
                return requested
            if watched is not None:
                return parent  # the same watched target judges both
        result = self.inline().is_directory(requested, timeout).result()
        return requested if result.ok and result.value else parent

    def preflight(
        self,
        path: str | os.PathLike[str],
        options: SaveOptions,
        *,
        directory_itself: bool = False,
    ) -> Decision:
        """The decision on a save of `path` with resolved `options` (`SaveOptions.resolved`:
        their fallback directories are the candidates for a redirect, as they are), judged by
        the parent of `path`, where a save's temp file or staging directory goes, whether or
        not `path` exists yet; with `directory_itself`, by `path` when it is a directory."""
        timeout, need_inodes = options.timeout, options.need_inodes
        requested = os.path.abspath(os.fspath(path))
        # The state file is read once: every answer below is from it. A directory judged
        # itself is judged by the same watched target as its parent (`_judged_directory`).
        state, watched = self._read_state(
            options.state_dir, requested if directory_itself else os.path.dirname(requested)
        )
        if directory_itself:
            directory = self._judged_directory(requested, state, timeout)
        else:
            directory = os.path.dirname(requested)
        need = options.need_bytes
        if need is None:
            need = self.expected_need(requested)
        probe_settings = functools.partial(self._inline_settings, timeout)

        # Fallbacks are worked out only when needed: the common case, a healthy target in a
        # fresh state file, pays for none of it.
        candidates: list[_Candidate] | None = None
        existence: dict[str, Callable[[], ProbeResult[bool]]] | None = None
        target = self._from_state(directory, watched, need, need_inodes)
        if target is None:
            # The target has to be probed: the fallbacks are judged alongside it, so that a
            # hung target costs `timeout` once, not once more for the fallbacks. When the
            # daemon's state answers, nothing is probed and no fallback judged unless a
            # redirect is needed.
            candidates = self._candidates(requested, options.fallback_dirs)
            existence = self._check_existence([c.fallback for c in candidates], state, timeout)
            judged = self._judge_all(
                [directory, *(c.directory for c in candidates)],
                need,
                need_inodes,
                state,
                probe_settings,
            )
            target = judged[directory]
        waited = 0.0
        if options.max_wait > 0 and target.answer.worth_waiting:

            def judge_again(deadline: float) -> _Judged:
                again = functools.partial(self._inline_settings, min(timeout, deadline))
                now = self._read_state(options.state_dir)[0]
                return self._judge_all([directory], need, need_inodes, now, again, True)[directory]

            target, waited = _wait_for_recovery(target, options.max_wait, judge_again)

        answer = target.answer
        action, where = ("delay" if waited else "proceed"), requested
        if not answer.can_take_save and candidates is None:
            candidates = self._candidates(requested, options.fallback_dirs)
        if not answer.can_take_save and candidates:
            existence = existence or self._check_existence(
                [c.fallback for c in candidates], state, timeout
            )
            judgements = self._judge_all(  # from the state, or what was probed above (cached)
                [c.directory for c in candidates], need, need_inodes, state, probe_settings
            )
            found = _first_acceptable(candidates, existence, judgements, requested)
            if found is not None:
                action, where = "redirect", found
        if (
            action != "redirect"
            and options.on_unhealthy == "fail"
            and (not answer.can_take_save or answer.status is Status.UNHEALTHY)
        ):
            action = "fail"
        decision = Decision(
            action=action,
            path=where,
            status=answer.status,
            reasons=answer.reasons,
            wait_seconds=waited,
            source=target.source,
            requested_path=requested,
            need_bytes=need,
            fits=answer.fits,
            errno=answer.errno,
        )
        _log_decision(decision)
        return decision


class _Candidate(NamedTuple):
    """Where a save would land in one fallback."""

    fallback: str
    path: str

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)


def _first_acceptable(
    candidates: Sequence[_Candidate],
    existence: Mapping[str, Callable[[], ProbeResult[bool]]],
    judgements: Mapping[str, _Judged],
    requested: str,
    skipped: dict[str, str] | None = None,
) -> str | None:
    """The path in the first candidate that can take the save; why each one before could not
    is logged, and put in `skipped` when given."""
    for candidate in candidates:
        answer = judgements[candidate.directory].answer
        exists = existence[candidate.fallback]()
        if exists.ok and exists.value and answer.acceptable_destination:
            return candidate.path
        if not (exists.ok and exists.value):
            why = exists.message or "it does not exist"
        else:
            trouble = [r for r in answer.reasons if r.transient or r.errno is not None]
            why = "; ".join(r.message for r in trouble) or answer.status.label
        if skipped is not None:
            skipped[candidate.fallback] = why
        # A fallback someone pointed elsewhere (target_untrusted) is an attack, not weather.
        untrusted = any(r.code == "target_untrusted" for r in answer.reasons)
        log.log(
            logging.WARNING if untrusted else logging.INFO,
            "preflight: fallback %s cannot take %s: %s",
            candidate.fallback,
            requested,
            why,
        )
    return None


def _log_decision(decision: Decision) -> None:
    level = logging.WARNING if decision.concerns or decision.action != "proceed" else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    need = f" (need {format_bytes(decision.need_bytes)})" if decision.need_bytes else ""
    log.log(
        level,
        "preflight %s%s from %s: %s",
        decision.requested_path,
        need,
        decision.source,
        decision.summary(),
    )


_DEFAULT = SaveContext()


def default_context() -> SaveContext:
    """The process's `SaveContext`, which every public function uses unless handed one
    (``context=``), as client_python's ``REGISTRY``."""
    return _DEFAULT


def preflight(
    path: str | os.PathLike[str],
    options: SaveOptions | None = None,
    *,
    context: SaveContext | None = None,
    **overrides: Unpack[SaveOverrides],
) -> Decision:
    """Decide, right before writing the checkpoint `path`, whether and where to write it.

    `path` is the checkpoint about to be written: a file (as `save` and `atomic_write` take
    it) or a checkpoint directory (as `save_dir` takes it). What is judged is the directory
    that will hold it, its parent; but a `path` that is an existing directory is judged
    itself (`preflight(CKPT_DIR)` asks about CKPT_DIR, not about the directory above it).
    `options` and keyword overrides are a save's (`SaveOptions`; those of the preflight
    count): `need_bytes` defaults to the size of the last successful save into the same
    directory times 1.1 (no fit check before the first one); `fallback_dirs` (and
    ``FSPROBE_FALLBACK_DIRS``, colon-separated) are tried in order for a redirect, unless
    `redirect` is False; `on_unhealthy="fail"` turns "attempt it anyway" into ``fail``.
    An inline probe asks no quota (`lfs quota` costs a metadata-server RPC per save).
    `context` is `default_context()` unless given.
    """
    return (context or _DEFAULT).preflight(
        path, save_options(options, overrides), directory_itself=True
    )


def preflight_readiness(
    state_dir: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> Callable[[Entry], str | None]:
    """Whether a target can take a redirected copy back now, for `fsprobe.redirect.sync`: None
    if it can, else why not. A bounded preflight that neither waits nor redirects."""

    def ready(entry: Entry) -> str | None:
        decision = preflight(
            entry.requested,
            need_bytes=entry.bytes,
            redirect=False,
            on_unhealthy="fail",
            state_dir=state_dir,
            timeout=timeout,
        )
        return decision.summary() if decision.action == "fail" else None

    return ready
