"""The attempts of a save: `RetryState` decides what a failure means for the next attempt
(errno classes, backoff, redirect) and `attempt_until_done` is the one loop of every kind of
save (docs/design.md §7).
"""

from __future__ import annotations

import difflib
import errno as errno_module
import functools
import itertools
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from fsprobe.errors import ErrorClass, classify, errno_code, errno_name, name_of
from fsprobe.events.emit import send
from fsprobe.events.event import Cause, Failure, SaveEvent
from fsprobe.posix.atomic import CLAIMS
from fsprobe.redirect.areas import prepare_directory, redirect_path, remove_mirrored_dirs
from fsprobe.redirect.manifest import UNLOCKED, new_entry, record
from fsprobe.saving.context import SaveContext, default_context
from fsprobe.saving.options import SaveOptions
from fsprobe.saving.preflight import (
    Decision,
    directory_exists,
    find_fallback,
    preflight_save,
    room,
)
from fsprobe.saving.stale import FOREIGN_STALE_SECONDS, clean_abandoned, clean_directory
from fsprobe.units import format_bytes, format_seconds

log = logging.getLogger("fsprobe.save")


class FailedAttempt(Exception):
    """One failed attempt: the errno name that counts (``EUNKNOWN`` if none), the step, the words.

    Raised by an attempt, and kept in `SaveError.attempts` (compared by value). What is kept is
    `bare()`: without the traceback, whose frames would keep the failed attempt's buffers (a
    checkpoint's tensors) alive for as long as the error is.
    """

    def __init__(self, errno: str, step: str, message: str) -> None:
        super().__init__(errno, step, message)
        self.errno, self.step, self.message = errno, step, message

    @classmethod
    def of(cls, error: OSError, step: str) -> FailedAttempt:
        return cls(name_of(error), step, str(error))

    def bare(self) -> FailedAttempt:
        return type(self)(self.errno, self.step, self.message)

    def __str__(self) -> str:
        return f"{self.errno} at {self.step}: {self.message}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FailedAttempt):
            return NotImplemented
        return self.args == other.args

    def __hash__(self) -> int:
        return hash(self.args)


class SaveError(OSError):
    """A save that failed for good; `errno` is the last attempt's, `attempts` holds them all."""

    def __init__(self, path: str, attempts: list[FailedAttempt], message: str) -> None:
        code = errno_code(attempts[-1].errno) if attempts else None
        super().__init__(code, message, path)
        self.attempts = list(attempts)

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (DDP, multiprocessing)
        return (type(self), (self.filename, self.attempts, self.strerror))


class MissingDirectory(SaveError, FileNotFoundError):
    """A save into a directory that does not exist and never did in this process (a typo):
    refused at once, never redirected. A `SaveError` and a `FileNotFoundError`."""


#: Steps at which ENOENT means that the directory to save into is missing (no temp file or
#: staging directory could be made in it).
_MAKING_STEPS = frozenset({"create", "mkdir"})
#: How many names of the nearest existing directory are looked at for one that the missing
#: one was likely meant to be.
SUGGESTION_NAMES = 4096


def missing_directory(directory: str) -> tuple[str, str, list[str]] | None:
    """None if `directory` exists; else its nearest existing ancestor, the first missing name
    under it, and up to three directories there with a name close to that one (`difflib`)."""
    if os.path.isdir(directory):
        return None
    missing, parent = directory, os.path.dirname(directory)
    while parent != missing and not os.path.isdir(parent):
        missing, parent = parent, os.path.dirname(parent)
    name = os.path.basename(missing)
    with os.scandir(parent) as entries:
        names = [e.name for e in itertools.islice(entries, SUGGESTION_NAMES) if e.is_dir()]
    return parent, name, difflib.get_close_matches(name, names, n=3)


@dataclass(frozen=True)
class SaveResult:
    """Where a save landed and what it took; `errors` are the errno names of failed attempts."""

    path: str
    requested_path: str
    redirected: bool
    attempts: int
    bytes: int
    seconds: float
    errors: tuple[str, ...] = ()
    #: Leftovers removed before its attempts: its own failed attempts', crashed saves'.
    leftovers_removed: int = 0


#: What torch's C++ writer says when a write failed underneath it, with or without an OSError;
#: a small file's only write, at its end, fails in its C++ stream: "basic_ios::clear: iostream
#: error" (what Accelerate's `save_state` raised saving a small optimizer state on a full target).
_TORCH_WRITE_FAILURES = (
    "file write failed",
    "unexpected pos",
    "PytorchStreamWriter failed",
    "basic_ios::clear: iostream error",
)
#: How Rust's `std::io::Error` ends its message, the only trace of the errno that writers in
#: Rust leave: safetensors raises ``SafetensorError("Error while serializing: I/O error:
#: Input/output error (os error 5)")``, and Hugging Face writes every model with it.
#: A filesystem with less room than this counts as full (see `failure_of`), and the seconds
#: that looking may take.
FULL_BELOW_BYTES = 1024 * 1024
FULL_TIMEOUT = 10.0
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
#: How torch's archive writer (caffe2/serialize/inline_container.cc) says that it could not
#: open the file it writes, its only trace of the errno: ``RuntimeError("[enforce fail at
#: inline_container.cc:747] . open file failed with strerror: No space left on device")``,
#: what `torch.save(obj, path)` raises when the filesystem has no inode left.
_TORCH_OPEN_FAILURE = re.compile(
    r"open file failed (?:with strerror: (?P<text>[^\n]+)|because of errno (?P<code>\d+))"
)
#: The errno of each strerror text of this C library (what torch printed).
_ERRNO_OF_TEXT = {os.strerror(code): code for code in sorted(errno_module.errorcode, reverse=True)}


#: What ends a save at once, whatever a writer wrapped it in: Ctrl-C, `sys.exit` (a job's
#: SIGTERM handler). Never a failed attempt: no retry, no redirect, nothing said about the
#: filesystem.
INTERRUPTS = (KeyboardInterrupt, SystemExit)


def _first_in(error: BaseException, kinds: type | tuple[type, ...]) -> Any:
    """The first exception of `kinds` in an exception's chain: itself, its cause, its context,
    and so on."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def first_os_error(error: BaseException) -> OSError | None:
    """The first OSError in an exception's chain: itself, its cause, its context, and so on."""
    found: OSError | None = _first_in(error, OSError)
    return found


def interrupt_in(error: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit in an exception's chain, if any: during a
    `torch.save` into a file object, Ctrl-C is raised in the object's `write`, and torch
    surfaces it as ``RuntimeError: ... unexpected pos ...`` with the interrupt in its
    `__context__`."""
    found: BaseException | None = _first_in(error, INTERRUPTS)
    return found


def failure_of(
    error: BaseException,
    step: str,
    where: str | None = None,
    *,
    context: SaveContext | None = None,
) -> FailedAttempt | None:
    """What a writer raising `error` at `step` means for the save; None if not an I/O failure.

    The first OSError in the exception's chain counts, not what surfaced (torch raises a
    RuntimeError with the OSError in its `__context__`); else the errno a message names (Rust's
    ``(os error 5)``, torch's "open file failed with strerror: ..."). A torch write failure
    without any errno is ``EUNKNOWN``, or ENOSPC when `where` (the directory written into) has
    no room left now, asked in `context`'s probe runner (docs/design.md §7). An interrupt in
    the chain (`interrupt_in`) is raised, as it was: no failure of the filesystem.
    """
    interrupt = interrupt_in(error)
    if interrupt is not None:
        raise interrupt from None
    os_error = first_os_error(error)
    if os_error is not None:
        return FailedAttempt.of(os_error, step)
    if isinstance(error, RuntimeError) and any(s in str(error) for s in _TORCH_WRITE_FAILURES):
        if where is not None and _is_full(where, context or default_context()):
            return FailedAttempt("ENOSPC", step, f"{error} (no errno; no room left in {where})")
        return FailedAttempt("EUNKNOWN", step, str(error))
    rust = _RUST_OS_ERROR.search(str(error))
    if rust is not None:
        return FailedAttempt(errno_name(int(rust[1])), step, str(error))
    torch_open = _TORCH_OPEN_FAILURE.search(str(error)) if isinstance(error, RuntimeError) else None
    if torch_open is not None:
        text, code = torch_open["text"], torch_open["code"]
        found = int(code) if code else _ERRNO_OF_TEXT.get(text.strip())
        return FailedAttempt(errno_name(found), step, str(error))
    return None


def _is_full(directory: str, context: SaveContext) -> bool:
    """Whether a new file in `directory` has less than `FULL_BELOW_BYTES` of room: a statvfs
    in the probe worker, bounded like every probe (a mount that hangs now costs the timeout)."""
    left = room(context, directory, FULL_TIMEOUT)
    return left is not None and left < FULL_BELOW_BYTES


def deciding(failures: Iterable[FailedAttempt]) -> FailedAttempt | None:
    """Of failures at once (several ranks), the one that decides what comes next: a permanent
    error before a capacity error before a transient one, else the first."""
    order = (ErrorClass.PERMANENT, ErrorClass.CAPACITY, ErrorClass.TRANSIENT)
    return min(failures, key=lambda f: order.index(classify(f.errno, f.step)), default=None)


def collective_failure(rank: int, requested: str, what: str, error: Exception) -> SaveError:
    """The error of a save whose collective `what` could not complete on this rank."""
    cause = str(error)
    if "Numpy is not available" in cause:  # the receiving side unpickles via tensor.numpy()
        cause += " (torch.distributed's object collectives need numpy: pip install numpy)"
    message = (
        f"rank {rank}: the {what} of the save of {requested} failed: {cause}; nothing was "
        "published (if that error is a lost connection or a timeout, another rank may have "
        "died or hung past the process group's timeout)"
    )
    log.error("%s", message)
    return SaveError(requested, [FailedAttempt("ECONNABORTED", "collective", message)], message)


class NextAttempt(NamedTuple):
    """What follows a failed attempt: the next attempt's destination, after `wait` seconds."""

    destination: str
    wait: float


class RetryState:
    """The attempts of one save of `requested`: the decisions between them, not the writing.

    `destination` is where the current attempt goes (the requested path, or its mirror in a
    fallback) and `number` which attempt it is; `failed` records a failure and says what comes
    next; `succeeded` makes the result. Its end, either way (`succeeded`, `error`, a
    preflight that says ``fail``), is reported once to the daemon (`fsprobe.events`), with
    the `ranks` that wrote it.
    """

    def __init__(
        self,
        requested: str,
        options: SaveOptions,
        ranks: int = 1,
        context: SaveContext | None = None,
        started: float | None = None,
    ) -> None:
        self.requested = requested
        self.options = options
        self.context = context or default_context()
        self.ranks = ranks
        self.destination = requested
        self.number = 1
        self.failures: list[FailedAttempt] = []
        self.leftovers_removed = 0  # by `prepare`, before each attempt
        self._in_fallback: list[bool] = []  # per failure: made in a fallback, not the target
        self._given_up: set[str] = set()  # fallbacks that failed for capacity or for good
        self._skipped: dict[str, str] = {}  # why each fallback could not take the save
        self._missing: str | None = None  # the directory to save into is gone: why, in words
        self._never_existed = False  # ... and it never existed in this process: a typo
        self._cause: Cause | None = None  # why the preflight kept it from the target
        self._start = time.monotonic() if started is None else started  # before its preflight

    def preflight(self) -> None:
        """`begin` with the save's preflight (`preflight_save`), for a caller that made the
        state first."""
        self.begin(preflight_save(self.context, self.requested, self.options))

    def begin(self, decision: Decision | None) -> None:
        """Take the preflight's `decision` (None: none): the first attempt goes where it says;
        `SaveError` if it says ``fail``, or redirects into a directory that never existed."""
        if decision is None:
            return
        cause = decision.cause if decision.action in ("redirect", "fail") else None
        if cause is not None:
            self._cause = Cause(cause.code, decision.errno)
        if decision.action == "fail":
            attempt = FailedAttempt(decision.errno or "EIO", "preflight", decision.summary())
            self.failures.append(attempt)
            self._in_fallback.append(False)
            self._report(None, 0)
            raise SaveError(
                self.requested, [attempt], f"not saving {self.requested}: {decision.summary()}"
            )
        if decision.action == "redirect" and self._never_seen_missing(known=False):
            self.failures.append(FailedAttempt("ENOENT", "preflight", self._missing or ""))
            self._in_fallback.append(False)
            log.warning("save %s: not redirected: %s", self.requested, self._missing)
            raise self.error()
        self.destination = decision.path

    @property
    def fallback(self) -> str | None:
        """The fallback that the destination is the redirect into, None at the target.

        Compared exactly, not by prefix: a fallback may well contain the target (``/scratch``
        and ``/scratch/run7/ckpt``), and a save to the target is then still no redirect.
        """
        if self.destination == self.requested:
            return None
        return next(
            (
                f
                for f in self.options.fallback_dirs
                if redirect_path(f, self.requested) == self.destination
            ),
            None,
        )

    def prepare(self) -> None:
        """Before an attempt: make the destination's mirrored directories in its fallback,
        remove what this process's failed attempts could not (wherever they were), and clean
        the destination's directory of crashed saves' leftovers unless this context did in the
        last hour (`SaveContext.cleaned`). OSError if the fallback's directories cannot be
        made."""
        fallback = self.fallback
        if fallback is not None:
            prepare_directory(fallback, self.destination)
        if CLAIMS.abandoned:
            self.leftovers_removed += len(clean_abandoned())
        directory = os.path.dirname(self.destination)
        cleaned_at = self.context.cleaned.get(directory)
        if cleaned_at is None or time.monotonic() - cleaned_at > FOREIGN_STALE_SECONDS:
            self.leftovers_removed += len(clean_directory(directory))
            self.context.was_cleaned(directory)

    def failed(self, failure: FailedAttempt) -> NextAttempt | None:
        """Record a failed attempt and decide the next one; None means give up."""
        fallback = self.fallback
        if fallback is not None:  # leave no empty mirrored directories in a fallback
            remove_mirrored_dirs(fallback, self.destination)
        self.failures.append(failure.bare())
        self._in_fallback.append(fallback is not None)
        kind = classify(failure.errno, failure.step)
        if fallback is None and failure.errno == "ENOENT" and failure.step in _MAKING_STEPS:
            if self._never_seen_missing(known=True):
                self._log(failure, kind, f"giving up: {self._missing}")
                return None
            self._missing = (
                f"its directory {os.path.dirname(self.requested)}, where this process saved "
                "before, is gone (removed, or purged from scratch?)"
            )
        if self.number == self.options.attempts:
            self._log(failure, kind, "giving up")
            return None
        plan = NextAttempt(self.destination, self.options.backoff.delay(self.number))
        if kind is not ErrorClass.TRANSIENT:
            if fallback is not None:
                self._given_up.add(fallback)
            alternative = find_fallback(
                self.context,
                self.requested,
                [f for f in self.options.fallback_dirs if f not in self._given_up],
                self.options,
                skipped=self._skipped,
            )
            if alternative is not None:
                plan = NextAttempt(alternative, 0.0)
            elif fallback is not None:  # back to the target: it may take it after all
                plan = NextAttempt(
                    self.requested, plan.wait if kind is ErrorClass.CAPACITY else 0.0
                )
            elif kind is ErrorClass.PERMANENT:
                self._log(failure, kind, "giving up")
                return None
        what = f"retrying in {format_seconds(plan.wait)}" if plan.wait else "retrying now"
        if plan.destination != self.destination:
            what = f"redirecting to {plan.destination}, {what}"
        self._log(failure, kind, what)
        if self._missing is not None and plan.destination != self.requested:
            log.warning(
                "save %s: %s; redirected to %s (`fsprobe sync` brings it back once the "
                "directory is there again)",
                self.requested,
                self._missing,
                plan.destination,
            )
        return plan

    def _never_seen_missing(self, known: bool) -> bool:
        """Whether the directory to save into does not exist (`known`: an attempt just failed
        with ENOENT making its temp file there) and this process never saw it exist (no save
        landed in it, no check and no answer of the daemon found it): a typo, refused at once.
        `_missing` then says why, naming the nearest existing directory and the names there it
        was likely meant to be; `_never_existed` is set. Before an attempt it is the one
        existence question (`directory_exists`: remembered, else the daemon's answer, else the
        probe runner); only a directory found missing is looked at for what was meant."""
        directory = os.path.dirname(self.requested)
        if directory in self.context.seen:
            return False
        if not known:
            exists = directory_exists(self.context, directory, self.options)
            if not exists.ok or exists.value:
                return False  # there, or nobody can tell now
        found = (
            self.context.runner()
            .submit(
                directory,
                "exists",
                functools.partial(missing_directory, directory),
                self.options.timeout,
            )
            .result()
        )
        if found.ok and found.value is None:
            self.context.saw(directory)  # there after all: seen now
            return False
        if not (found.ok or known):
            return False  # nobody can tell now
        hint = ""
        if found.ok and isinstance(found.value, tuple):
            parent, name, close = found.value
            hint = f": there is no {name}/ in {parent}"
            if close:
                hint += ", did you mean " + " or ".join(f"{c}/" for c in close) + "?"
        self._missing = (
            f"the directory {directory} does not exist and never did in this process{hint} "
            "(a save into a directory that never existed is not redirected: create it first, "
            "os.makedirs)"
        )
        self._never_existed = True
        return True

    def follow(self, plan: NextAttempt) -> None:
        """Wait as planned; the next attempt goes where planned."""
        if plan.wait:
            self.options.backoff.sleep(plan.wait)
        self.destination = plan.destination
        self.number += 1

    def error(self) -> SaveError:
        """The error for a save that gave up: a `MissingDirectory` for a directory that never
        existed in this process; its message says why each fallback could not take it."""
        summary = ", ".join(f"{f.errno} at {f.step}" for f in self.failures)
        self._report(None, 0)
        message = f"saving {self.requested} failed after {len(self.failures)} attempt(s): {summary}"
        if self._missing is not None:
            message += f"; {self._missing}"
        for fallback, why in self._skipped.items():
            message += f"; fallback {fallback} skipped: {why}"
        kind = MissingDirectory if self._never_existed else SaveError
        return kind(self.requested, self.failures, message)

    def succeeded(self, nbytes: int, digest_of: Callable[[str], str]) -> SaveResult:
        """The current attempt succeeded with `nbytes` written: enter a redirect in the
        fallback's manifest (`digest_of(destination)` is its sha256), log, remember the size
        as the default need of the next save there, result."""
        fallback = self.fallback
        if fallback is not None:
            self._record_redirect(fallback, nbytes, digest_of)
        result = SaveResult(
            path=self.destination,
            requested_path=self.requested,
            redirected=self.destination != self.requested,
            attempts=self.number,
            bytes=nbytes,
            seconds=time.monotonic() - self._start,
            errors=tuple(f.errno for f in self.failures),
            leftovers_removed=self.leftovers_removed,
        )
        if self.failures or result.redirected:
            log.warning(
                "save %s: %s written to %s on attempt %d after %s in %s",
                self.requested,
                format_bytes(nbytes),
                self.destination,
                self.number,
                ", ".join(result.errors) or "no error",
                format_seconds(result.seconds),
            )
        elif log.isEnabledFor(logging.DEBUG):  # no formatting for a message nobody reads
            log.debug(
                "save %s: %s in %s",
                self.requested,
                format_bytes(nbytes),
                format_seconds(result.seconds),
            )
        self._report(result.path, nbytes)
        self.context.remember_save(self.requested, nbytes)
        if not result.redirected:
            self.context.saw(os.path.dirname(self.requested))
        return result

    def _report(self, landed: str | None, nbytes: int) -> None:
        """Tell the daemon how this save ended: the event built and sent (never waits nor fails)."""
        event = SaveEvent(
            requested=self.requested,
            landed=landed,
            bytes=nbytes,
            seconds=time.monotonic() - self._start,
            attempts=max(self.number, len(self.failures)),
            failures=tuple(
                Failure(f.errno, f.step, elsewhere)
                for f, elsewhere in zip(self.failures, self._in_fallback)
            ),
            finished_at=time.time(),
            host=socket.gethostname(),
            pid=os.getpid(),
            ranks=self.ranks,
            cause=self._cause,
        )
        send(event.encode(), self.options.state_dir)

    def _record_redirect(self, fallback: str, nbytes: int, digest_of: Callable[[str], str]) -> None:
        """Add the redirected save to the fallback's manifest, so that `fsprobe sync` finds it.

        The checkpoint itself is safe at this point; a manifest that cannot be written is
        logged loudly, not raised: failing the save now would throw away a good checkpoint.
        """
        requested, actual = self.requested, self.destination
        try:
            entry = new_entry(fallback, requested, actual, nbytes, digest_of(actual))
            if not record(entry):
                self.context.warn_once(
                    f"unlocked:{entry.area.path}", UNLOCKED.format(entry.area.path)
                )
        except OSError as error:
            log.error(
                "save %s: written to %s, but the redirect manifest in %s could not be updated "
                "(%s): copy it back by hand",
                requested,
                actual,
                fallback,
                error,
            )

    def _log(self, failure: FailedAttempt, kind: ErrorClass, plan: str) -> None:
        where = "" if self.destination == self.requested else f" (redirected to {self.destination})"
        log.warning(
            "save %s%s: attempt %d/%d failed at %s with %s (%s): %s; %s",
            self.requested,
            where,
            self.number,
            self.options.attempts,
            failure.step,
            failure.errno,
            kind.value,
            failure.message,
            plan,
        )


class SaveSteps(NamedTuple):
    """What one kind of save does in `attempt_until_done`.

    `write(destination)` makes one attempt and returns the bytes written, raising
    `FailedAttempt` for an I/O failure (anything else it raises ends the save as it is);
    `digest(destination)` is the sha256 that the fallback's manifest records for a redirected
    save; `announce` tells whoever else takes part (the other ranks of a collective save) each
    decision: the next attempt, the result, the error. Each attempt prepares its destination
    first (`RetryState.prepare`; an OSError there fails it at ``mkdir``): `run_attempts` before
    `write`, a collective's or DCP's `write` itself on the coordinator, inside the protocol
    every rank follows (DCP's in its plan, whose first one runs the preflight).
    """

    write: Callable[[str], int]
    digest: Callable[[str], str]
    announce: Callable[[NextAttempt | SaveResult | SaveError], None] = lambda decision: None


def start(
    path: str | os.PathLike[str],
    options: SaveOptions,
    ranks: int = 1,
    context: SaveContext | None = None,
) -> RetryState:
    """The `RetryState` of a new save of `path` (in `context`, `default_context()` unless
    given), its preflight asked (`SaveContext.preflight_save`; `SaveError` if it says
    ``fail``): its `destination` is where the first attempt goes."""
    started = time.monotonic()
    requested = os.path.abspath(os.fspath(path))
    context = context or default_context()
    decision = preflight_save(context, requested, options)
    state = RetryState(requested, options, ranks, context, started=started)
    state.begin(decision)
    return state


def attempt_until_done(state: RetryState, steps: SaveSteps) -> SaveResult:
    """The attempts of every kind of save, its preflight done (`start`): attempt until one
    succeeds, or the attempts give up (`SaveError`)."""
    while True:
        try:
            nbytes = steps.write(state.destination)
        except FailedAttempt as failure:
            plan = state.failed(failure)
            if plan is None:
                gave_up = state.error()
                steps.announce(gave_up)
                raise gave_up from None
            steps.announce(plan)
            state.follow(plan)
            continue
        result = state.succeeded(nbytes, steps.digest)
        steps.announce(result)
        return result


def run_attempts(
    path: str | os.PathLike[str],
    options: SaveOptions,
    steps: SaveSteps,
    context: SaveContext | None = None,
) -> SaveResult:
    """Save `path` in this process: preflight, then `attempt_until_done`, each attempt's
    destination prepared before `steps.write`."""
    state = start(path, options, context=context)

    def attempt(destination: str) -> int:
        try:
            state.prepare()
        except OSError as error:
            raise FailedAttempt.of(error, "mkdir") from error
        return steps.write(destination)

    return attempt_until_done(state, steps._replace(write=attempt))
