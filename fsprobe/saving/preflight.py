"""`fsprobe.preflight()`: right before a save, can the target take it now, and if not, where to?

The daemon's fresh, trusted state file answers in microseconds (each target's `SaveAnswer`,
which the policy worked out in the daemon); otherwise cheap probes run inline in the
context's probe runner, judged there, and are reused for `INLINE_CACHE_SECONDS`. These
functions fit the save's need against the answer and decide ``proceed``, ``delay``,
``redirect`` or ``fail`` (docs/design.md §7); what they remember is the `SaveContext`'s.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fsprobe.model import ProbeResult, Reason, SaveAnswer, Severity, Status
from fsprobe.saving.context import Need, SaveContext, default_context
from fsprobe.saving.options import DEFAULT_TIMEOUT, SaveOptions, save_options
from fsprobe.state import REASON, StateFile, StateFileError
from fsprobe.units import format_bytes, format_duration, format_seconds

if TYPE_CHECKING:  # types only
    from typing_extensions import Unpack

    from fsprobe.redirect.manifest import Entry
    from fsprobe.saving.options import SaveOverrides

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

    @property
    def cause(self) -> Reason | None:
        """The reason that keeps the save from the requested target: the first (worst) that
        refuses it or stands in its way, else the first concern; None when there is none."""
        kept = [r for r in self.reasons if r.transient or r.errno is not None]
        return next(iter(kept or self.concerns), None)

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


def expected_need(context: SaveContext, path: str) -> int | None:
    """What the next save of `path` needs by default, or None before the first save there.

    The last save of the same file (``last.pt`` saved every epoch), else the last save into
    the same directory (``epoch-7.pt`` after ``epoch-6.pt``), times `NEED_MARGIN`.
    """
    sizes = context.sizes
    last = sizes.get(path, sizes.get(os.path.dirname(path)))
    return math.ceil(last * NEED_MARGIN) if last is not None else None


# -- the daemon's state file --------------------------------------------------------------------


def _read_state(
    context: SaveContext, state_dir: str | None, path: str | None = None
) -> tuple[StateFile | None, Watched | None]:
    """The daemon's trusted state file, or None (said once) when there is none to use; and with
    `path`, the watched target that judges it with that target's answer (None if none does,
    or if its entry does not read: said once). The file is asked once, for both."""
    reader = context.readers.get(state_dir) or context.reader(state_dir)
    state: StateFile | None = None
    try:
        state = reader.read()
        watched = None if state is None or path is None else state.watching(path)
    except (StateFileError, OSError) as error:  # the file, or this target's entry in it
        _not_using(context, error)
        return state, None
    if state is None:
        context.warn_once(
            f"absent:{reader.path}",
            f"no fsprobe state file at {reader.path} (no `fsprobe run` on this node?); "
            "probing inline instead",
            logging.INFO,
        )
    return state, watched


def _watched(context: SaveContext, state: StateFile | None, path: str) -> Watched | None:
    """The watched target that judges `path` and its answer (None if none does, or, said
    once, if its entry does not read)."""
    try:
        return None if state is None else state.watching(path)
    except StateFileError as error:
        _not_using(context, error)
        return None


def _not_using(context: SaveContext, error: Exception) -> None:
    message = f"not using the fsprobe state file: {error}; probing inline instead"
    context.warn_once(f"state:{error}", message)


def _from_state(context: SaveContext, watched: Watched | None, need: Need) -> _Judged | None:
    """The answer of the watched target (`watched`) fitted to this save's `need`, or None if
    it has none to give (said once when its state file holds no answer: an older daemon).
    The last fit is kept (`SaveContext.fitted`): a save like the last one, while the state
    reader hands out the same parsed file, asks only the answer's freshness again."""
    if watched is None:
        return None
    target, answer = watched
    if answer is None:
        context.warn_once(
            f"unanswered:{target}",
            f"the fsprobe state for {target} holds no answer for a save (written by an older "
            "`fsprobe run`?); probing inline",
        )
        return None
    last = context.fitted  # replaced whole, never mutated
    if last is not None and last[0] is answer and last[1] == need:
        fitted = last[2]
    else:
        fitted = answer.fit(*need)
        context.fitted = (answer, need, fitted)
    if answer.status is Status.UNKNOWN:
        return None  # the daemon has seen nothing yet; a probe of our own says more
    now = time.time()
    if answer.fresh_until is None or now > answer.fresh_until:
        since = f" {format_duration(now - answer.fresh_until)} ago" if answer.fresh_until else ""
        context.warn_once(
            f"stale:{target}",
            f"the fsprobe state for {target} went stale{since}: is `fsprobe run` still "
            "running? probing inline",
        )
        return None
    return _Judged(target, fitted, "state")


# -- the one existence question -----------------------------------------------------------------


def existence(
    context: SaveContext,
    directories: Iterable[str],
    state: StateFile | None,
    deadline: float,
) -> dict[str, Callable[[], ProbeResult[bool]]]:
    """Whether each directory exists, as a call that answers: remembered when this process saw
    it (`SaveContext.seen`), else from the daemon's fresh answer where it watches the
    directory itself, else from a check started in the probe runner now (a hung mount must
    not hang the caller), which is the only part that may start a process. Found, it is
    remembered. The one question of the fallback warning, the redirect and the typo check.

    A directory that does not exist is a mistake (a typo, scratch not mounted here) that the
    probes would not notice: they judge the nearest existing ancestor.
    """
    checks: dict[str, Callable[[], ProbeResult[bool]]] = {}
    for directory in directories:
        known = True if directory in context.seen else _exists_in_state(context, directory, state)
        if known is not None:
            if known:
                context.saw(directory)
            checks[directory] = functools.partial(ProbeResult, "exists", time.time(), 0.0, known)
        else:
            run = context.inline().is_directory(directory, deadline)
            checks[directory] = functools.partial(_remembered, context, directory, run.result)
    return checks


def _remembered(
    context: SaveContext, directory: str, result: Callable[[], ProbeResult[bool]]
) -> ProbeResult[bool]:
    """The runner's answer on whether `directory` exists; remembered when it does."""
    found = result()
    if found.ok and found.value:
        context.saw(directory)
    return found


def _exists_in_state(context: SaveContext, directory: str, state: StateFile | None) -> bool | None:
    """Whether the daemon, watching `directory` itself with a fresh answer, found it a
    directory; None when its state cannot say."""
    watched = _watched(context, state, directory)
    if watched is None or watched[0] != directory or watched[1] is None:
        return None
    answer = watched[1]
    if answer.fresh_until is None or time.time() > answer.fresh_until:
        return None
    return answer.exists


def directory_exists(
    context: SaveContext, directory: str, options: SaveOptions
) -> ProbeResult[bool]:
    """Whether `directory` exists (`existence`, with the state file of `options`)."""
    state = _read_state(context, options.state_dir)[0]
    return existence(context, [directory], state, options.timeout)[directory]()


def warn_missing_fallbacks(context: SaveContext, options: SaveOptions) -> None:
    """Say once per context, at the first save that names it, which fallback directory of
    `options` does not exist (`existence`): a save could never be redirected there."""
    new = [f for f in options.fallback_dirs if f"fallback:{f}" not in context.said]
    if not new:
        return
    checks = existence(context, new, _read_state(context, options.state_dir)[0], options.timeout)
    for fallback, check in checks.items():
        exists = check()
        if exists.ok and exists.value:
            context.note(f"fallback:{fallback}")
            continue
        why = exists.message or "it does not exist"
        context.warn_once(
            f"fallback:{fallback}",
            f"the fallback directory {fallback} cannot take a redirected save: {why}",
        )


# -- inline probes ------------------------------------------------------------------------------


def _judge_all(
    context: SaveContext,
    directories: Iterable[str],
    need: Need,
    state: StateFile | None,
    timeout: float,
    fresh: bool = False,
) -> dict[str, _Judged]:
    """Judge each directory from the state file, and probe those it says nothing (fresh)
    about, inline: snapshots reused for `INLINE_CACHE_SECONDS` unless `fresh`."""
    judgements: dict[str, _Judged] = {}
    unanswered = []
    for directory in dict.fromkeys(directories):
        judged = _from_state(context, _watched(context, state, directory), need)
        if judged is None:
            unanswered.append(directory)
        else:
            judgements[directory] = judged
    if not unanswered:
        return judgements
    inline = context.inline()
    settings = inline.settings(timeout)
    probed = []
    now = time.monotonic()
    for directory in unanswered:
        cached = context.probed.get(directory)
        if cached is not None and not fresh and now - cached[0] < INLINE_CACHE_SECONDS:
            answer = inline.answer(cached[1], settings)
            judgements[directory] = _Judged(directory, answer.fit(*need), "probe")
        else:
            probed.append(directory)
    for directory, snapshot in inline.snapshots(probed, settings).items():
        context.remember(context.probed, directory, (time.monotonic(), snapshot))
        answer = inline.answer(snapshot, settings)
        judgements[directory] = _Judged(directory, answer.fit(*need), "probe")
    return judgements


def room(context: SaveContext, directory: str, timeout: float) -> int | None:
    """The bytes a new file in `directory` has room for now (None: unknown), from a bounded
    statvfs in the probe runner (a mount that hangs now costs `timeout`)."""
    return context.inline().room(os.path.abspath(directory), timeout)


# -- the decisions ------------------------------------------------------------------------------


def _candidates(
    context: SaveContext, requested: str, fallback_dirs: Sequence[str]
) -> list[_Candidate]:
    """Where `requested` would land in each of these fallbacks, in order (none that would land
    it in its own directory)."""
    if not fallback_dirs:
        return []  # the common case, on the path of every save
    directory = os.path.dirname(requested)
    candidates = (_Candidate(f, context.redirect_path(f, requested)) for f in fallback_dirs)
    return [c for c in candidates if c.directory != directory]


def find_fallback(
    context: SaveContext,
    path: str | os.PathLike[str],
    fallback_dirs: Iterable[str | os.PathLike[str]],
    options: SaveOptions,
    skipped: dict[str, str] | None = None,
) -> str | None:
    """Where in the first fallback that can take it a save of `path` should go, or None; why
    each fallback before it could not is put in `skipped` (by fallback directory).

    For a save whose target just failed with a capacity or permanent error: whatever the
    target looked like a moment ago, it cannot take this write, so only the fallbacks are
    asked (each judged like a target in `preflight`; a fallback is never redirected further).
    Exactly these directories are asked, not the `options`' own.
    """
    requested = os.path.abspath(os.fspath(path))
    need = options.need_bytes
    if need is None:
        need = expected_need(context, requested)
    candidates = _candidates(context, requested, tuple(os.fspath(d) for d in fallback_dirs))
    if not candidates:
        return None
    state = _read_state(context, options.state_dir)[0]
    exists = existence(context, [c.fallback for c in candidates], state, options.timeout)
    judgements = _judge_all(
        context,
        [c.directory for c in candidates],
        (need, options.need_inodes),
        state,
        options.timeout,
        fresh=True,
    )
    return _first_acceptable(candidates, exists, judgements, requested, skipped)


def preflight_save(context: SaveContext, requested: str, options: SaveOptions) -> Decision | None:
    """The preflight of a save of `requested` (absolute): the fallbacks that do not exist said
    once (`warn_missing_fallbacks`), then the decision (None without a preflight)."""
    warn_missing_fallbacks(context, options)
    return decide(context, requested, options) if options.preflight else None


def _judged_directory(
    context: SaveContext,
    requested: str,
    itself: bool,
    judge: str | None,
    timeout: float,
) -> str:
    """The directory that judges a save of `requested`, worked out when it has to be probed or
    judged again: its parent, where a save's temp file or staging directory goes; with
    `itself`, `requested` when the watched target that judges it (`judge`) is `requested`
    itself or, when none does, when it is a directory (asked in the probe runner: a hung mount
    must not hang the caller)."""
    parent = os.path.dirname(requested)
    if not itself or (judge is not None and judge != requested):
        return parent  # the same watched target judges both
    if judge == requested:
        return requested
    found = context.inline().is_directory(requested, timeout).result()
    return requested if found.ok and found.value else parent


def decide(
    context: SaveContext,
    path: str | os.PathLike[str],
    options: SaveOptions,
    *,
    directory_itself: bool = False,
) -> Decision:
    """The decision on a save of `path` with resolved `options` (`SaveOptions.resolved`: their
    fallback directories are the candidates for a redirect, as they are), judged by the parent
    of `path`, where a save's temp file or staging directory goes, whether or not `path` exists
    yet; with `directory_itself`, by `path` when it is a directory."""
    timeout = options.timeout
    requested = os.path.abspath(os.fspath(path))
    # The state file is read once: every answer below is from it. The watched target that
    # judges `requested` judges its parent too, unless it is `requested` itself: the directory
    # judged is worked out only when something is probed or judged again (`_judged_directory`).
    state, watched = _read_state(
        context, options.state_dir, requested if directory_itself else os.path.dirname(requested)
    )
    need_bytes = options.need_bytes
    if need_bytes is None:
        need_bytes = expected_need(context, requested)
    need = (need_bytes, options.need_inodes)

    # Fallbacks are worked out only when needed: the common case, a healthy target in a
    # fresh state file, pays for none of it.
    candidates: list[_Candidate] | None = None
    exists: dict[str, Callable[[], ProbeResult[bool]]] | None = None
    target = _from_state(context, watched, need)
    directory = ""  # the healthy target that the state answers for needs none
    if target is None or (options.max_wait > 0 and target.answer.worth_waiting):
        judge = watched[0] if watched else None if state is None else state.target_for(requested)
        directory = _judged_directory(context, requested, directory_itself, judge, timeout)
    if target is None:
        # The target has to be probed: the fallbacks are judged alongside it, so that a hung
        # target costs `timeout` once, not once more for the fallbacks. When the daemon's
        # state answers, nothing is probed and no fallback judged unless a redirect is needed.
        candidates = _candidates(context, requested, options.fallback_dirs)
        exists = existence(context, [c.fallback for c in candidates], state, timeout)
        judged = _judge_all(
            context, [directory, *(c.directory for c in candidates)], need, state, timeout
        )
        target = judged[directory]
    waited = 0.0
    if options.max_wait > 0 and target.answer.worth_waiting:

        def judge_again(deadline: float) -> _Judged:
            now = _read_state(context, options.state_dir)[0]
            again = min(timeout, deadline)
            return _judge_all(context, [directory], need, now, again, fresh=True)[directory]

        target, waited = _wait_for_recovery(target, options.max_wait, judge_again)

    answer = target.answer
    action, where = ("delay" if waited else "proceed"), requested
    if not answer.can_take_save and candidates is None:
        candidates = _candidates(context, requested, options.fallback_dirs)
    if not answer.can_take_save and candidates:
        exists = exists or existence(context, [c.fallback for c in candidates], state, timeout)
        judgements = _judge_all(  # from the state, or what was probed above (cached)
            context, [c.directory for c in candidates], need, state, timeout
        )
        found = _first_acceptable(candidates, exists, judgements, requested)
        if found is not None:
            action, where = "redirect", found
    if (
        action != "redirect"
        and options.on_unhealthy == "fail"
        and (not answer.can_take_save or answer.status is Status.UNHEALTHY)
    ):
        action = "fail"
    decision = Decision(  # by position: made before every save
        action,
        where,
        answer.status,
        answer.reasons,
        waited,
        target.source,
        requested,
        need_bytes,
        answer.fits,
        answer.errno,
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
    worth_a_warning = decision.action != "proceed" or (decision.reasons and decision.concerns)
    level = logging.WARNING if worth_a_warning else logging.DEBUG
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
    The inline probe, when the state file cannot answer, asks no quota (`lfs quota` costs a
    metadata-server RPC per save). `context` is `default_context()` unless given.
    """
    chosen = save_options(options, overrides)
    return decide(context or default_context(), path, chosen, directory_itself=True)


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
