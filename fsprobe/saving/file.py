"""`fsprobe.atomic_write()` and `fsprobe.save()`: a checkpoint save that survives a bad minute.

The sequence (DESIGN §7): preflight; remove the temp files of crashed saves; write a hidden temp
file in the destination directory through a Python file object; flush, fsync, close;
`os.replace` over the final name; fsync the directory. The previous checkpoint stays untouched
until the rename, so a failure at any step costs the new checkpoint at most, never the old one.

A failed attempt removes its temp file and is classified by errno (`fsprobe.errors.classify`):

- transient (EIO, ESTALE, ETIMEDOUT, ..., or a failure without errno): back off, retry;
- capacity (ENOSPC, EDQUOT): redirect to a fallback that can take it, else back off and retry
  (a soft-quota bounce passes, a sibling job's cleanup frees space);
- permanent (EACCES, EROFS, ENAMETOOLONG, ...): redirect, else give up at once.

Why a Python file object: `torch.save(obj, "path")` writes through a C++ stream that loses the
errno (every failure reads "file write failed"). Given a file object, torch calls its `write`,
and the real `OSError` is raised there; torch may then surface a secondary RuntimeError
("unexpected pos ...") with the OSError only in its `__context__`, or none at all. So the file
object records the first OSError it sees, and that is what counts, not what surfaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

from fsprobe.atomic import fsync_directory, open_exclusive, temp_name
from fsprobe.errors import ErrorClass, classify, errno_code, name_of
from fsprobe.saving.fallback import (
    all_fallback_dirs,
    prepare_directory,
    redirect_path,
    remove_mirrored_dirs,
)
from fsprobe.saving.manifest import new_entry, record, sha256_of
from fsprobe.saving.preflight import DEFAULT_TIMEOUT, Decision, find_fallback, remember_save
from fsprobe.saving.preflight import preflight as run_preflight
from fsprobe.saving.stale import remove_stale_temps
from fsprobe.units import format_bytes, format_seconds

log = logging.getLogger("fsprobe.save")

DEFAULT_ATTEMPTS = 5
#: A new file gets what `open()` would give it: 0o666 less the umask (checkpoints are often
#: shared with the group; the temp file's mode is the checkpoint's mode after the rename).
FILE_MODE = 0o666
#: What torch's C++ writer says when a write failed underneath it, with or without an OSError.
_TORCH_WRITE_FAILURES = ("file write failed", "unexpected pos", "PytorchStreamWriter failed")
#: Decision codes (DESIGN §7) for a preflight `fail`, by reason code: the errno a write would get.
_FAIL_ERRNOS = {
    "readonly": "EROFS",
    "quota_hard_reached": "EDQUOT",
    "quota_grace_expired": "EDQUOT",
    "space_headroom_low": "ENOSPC",
    "inode_headroom_low": "ENOSPC",
    "mount_stuck": "ETIMEDOUT",
}


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: before retry n, sleep U(0, min(cap, base·2ⁿ⁻¹)).

    The defaults give 5 attempts about 30 s in all at most (2 + 4 + 8 + 15 s, half that on
    average). Jitter keeps the hundreds of ranks that hit the same hiccup from retrying in
    lockstep. `sleep` and `random` are injectable for tests.
    """

    base: float = 2.0
    cap: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = random.random

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failed attempt."""
        return self.random() * min(self.cap, self.base * 2 ** (failures - 1))


class FailedAttempt(NamedTuple):
    """One failed attempt: errno name (``EUNKNOWN`` if none), the step, and what was said."""

    errno: str
    step: str
    message: str


class SaveError(OSError):
    """A save that failed for good; `errno` is the last attempt's, `attempts` holds them all."""

    def __init__(self, path: str, attempts: list[FailedAttempt], message: str) -> None:
        code = errno_code(attempts[-1].errno) if attempts else None
        super().__init__(code, message, path)
        self.attempts = list(attempts)

    def __reduce__(self):  # picklable across processes (DDP, multiprocessing)
        return (type(self), (self.filename, self.attempts, self.strerror))


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


class AtomicFile:
    """The binary file that `write` gets: the temp file, remembering the first OSError raised.

    `name` is the temp file's path (not the final one), as for any file object.
    """

    def __init__(self, fd: int, name: str) -> None:
        self.name = name
        self._file: BinaryIO = open(fd, "wb", closefd=True)  # noqa: SIM115 - closed by close()
        self.first_error: OSError | None = None
        self.first_error_step: str | None = None

    def _record(self, error: OSError, step: str) -> None:
        if self.first_error is None:
            self.first_error, self.first_error_step = error, step

    def _call(self, step: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except OSError as error:
            self._record(error, step)
            raise

    def write(self, data: Any) -> int:
        return self._call("write", lambda: self._file.write(data))

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._call("flush", self._file.flush)

    def fileno(self) -> int:
        return self._file.fileno()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        return self._call("write", lambda: self._file.truncate(size))

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        """Close; on NFS a deferred write error may surface only here."""
        if not self._file.closed:
            self._call("close", self._file.close)

    def sync(self) -> None:
        """flush and fsync: the data is on stable storage before the rename makes it visible."""
        if self._file.closed:  # the writer closed it itself: fsync through a new descriptor
            fd = os.open(self.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                self._call("fsync", lambda: os.fsync(fd))
            finally:
                os.close(fd)
            return
        self.flush()
        self._call("fsync", lambda: os.fsync(self._file.fileno()))

    def size(self) -> int:
        if self._file.closed:
            return os.stat(self.name).st_size
        self.flush()
        return os.fstat(self._file.fileno()).st_size

    def discard(self) -> None:
        """Close after a failure: errors now are echoes of the first, recorded but not raised."""
        with contextlib.suppress(OSError):
            self.close()


class _Failure(Exception):
    """A failed attempt, with the errno that counts (the first one seen) and its step."""

    def __init__(self, errno: str, step: str, message: str) -> None:
        super().__init__(message)
        self.errno, self.step, self.message = errno, step, message

    @classmethod
    def of(cls, error: OSError, step: str) -> _Failure:
        return cls(name_of(error), step, str(error))


def _first_os_error(error: BaseException) -> OSError | None:
    """The first OSError in an exception's chain: itself, its cause, its context, and so on."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError):
            return current
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return None


def _io_failure(error: BaseException, stream: AtomicFile) -> _Failure | None:
    """What `write` raising `error` means for the save; None if it is not an I/O failure."""
    if stream.first_error is not None:
        return _Failure.of(stream.first_error, stream.first_error_step or "write")
    os_error = _first_os_error(error)
    if os_error is not None:
        return _Failure.of(os_error, "write")
    if isinstance(error, RuntimeError) and any(s in str(error) for s in _TORCH_WRITE_FAILURES):
        return _Failure("EUNKNOWN", "write", str(error))  # no errno: treated as transient
    return None


def _write_once(final: str, write: Callable[[AtomicFile], object], fsync: bool) -> int:
    """One attempt: temp file, write, fsync, rename, fsync dir. Returns the bytes written.

    Raises `_Failure` for an I/O failure; anything else `write` raises (a pickling error, a
    bug) is re-raised as it is. The temp file is removed on every way out but success.
    """
    directory = os.path.dirname(final)
    temporary = os.path.join(directory, temp_name(os.path.basename(final)))
    try:
        fd = open_exclusive(temporary, FILE_MODE)
    except OSError as error:
        raise _Failure.of(error, "create") from error
    stream = AtomicFile(fd, temporary)
    step, renamed = "write", False
    try:
        try:
            write(stream)
        except Exception as error:
            failure = _io_failure(error, stream)
            if failure is None:
                raise
            raise failure from error
        if fsync:
            step = "fsync"
            stream.sync()
        step = "close"
        size = stream.size()
        stream.close()
        step = "rename"
        os.replace(temporary, final)
        renamed = True
        if fsync:
            step = "fsync_dir"
            fsync_directory(directory)
        return size
    except OSError as error:
        if stream.first_error is not None:
            raise _Failure.of(stream.first_error, stream.first_error_step or step) from error
        raise _Failure.of(error, step) from error
    finally:
        if not renamed:
            stream.discard()
            _remove_temp(temporary)


def _remove_temp(temporary: str) -> None:
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    except OSError as error:  # the next save's stale-temp cleanup gets another chance
        log.warning("could not remove the temp file %s: %s", temporary, error)


def _fallback_of(destination: str, requested: str, fallbacks: Iterable[str]) -> str | None:
    """The fallback that `destination` is the redirect of `requested` into, or None.

    Compared exactly, not by prefix: a fallback may well contain the target (``/scratch`` and
    ``/scratch/run7/ckpt``), and a save to the target is then still no redirect.
    """
    if destination == requested:
        return None
    return next((f for f in fallbacks if redirect_path(f, requested) == destination), None)


def _preflight_failure(requested: str, decision: Decision) -> SaveError:
    errno = next((_FAIL_ERRNOS[r.code] for r in decision.reasons if r.code in _FAIL_ERRNOS), "EIO")
    attempt = FailedAttempt(errno, "preflight", decision.summary())
    return SaveError(requested, [attempt], f"not saving {requested}: {decision.summary()}")


def atomic_write(
    path: str | os.PathLike[str],
    write: Callable[[AtomicFile], object],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    backoff: Backoff | None = None,
    fallback_dirs: Iterable[str | os.PathLike[str]] = (),
    max_wait: float = 0.0,
    need_bytes: int | None = None,
    preflight: bool = True,
    fsync: bool = True,
    redirect: bool = True,
    on_unhealthy: str = "proceed",
    state_dir: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> SaveResult:
    """Write `path` atomically through `write(fileobj)`, retrying and redirecting on failure.

    `write` gets a binary file object (the temp file) and writes the whole content; it is
    called again from scratch on every attempt. `fallback_dirs` (plus ``FSPROBE_FALLBACK_DIRS``)
    are where the save may be redirected (`redirect=False` never redirects); `max_wait`,
    `need_bytes`, `on_unhealthy`, `state_dir` and `timeout` go to the preflight
    (`preflight=False` skips it). Raises `SaveError` when every attempt failed, or at once for
    a permanent error with nowhere to redirect; the file at `path` is then as it was before.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    backoff = backoff or Backoff()
    requested = os.path.abspath(os.fspath(path))
    start = time.monotonic()
    fallbacks = all_fallback_dirs(fallback_dirs) if redirect else ()
    destination = requested
    if preflight:
        decision = run_preflight(
            requested,
            need_bytes,
            max_wait=max_wait,
            fallback_dirs=fallbacks,
            redirect=redirect,
            on_unhealthy=on_unhealthy,
            state_dir=state_dir,
            timeout=timeout,
        )
        if decision.action == "fail":
            raise _preflight_failure(requested, decision)
        destination = decision.path

    failures: list[FailedAttempt] = []
    given_up: set[str] = set()  # fallbacks that failed for capacity or for good
    cleaned: set[str] = set()
    for attempt in range(1, attempts + 1):
        fallback = _fallback_of(destination, requested, fallbacks)
        try:
            if fallback is not None:
                try:
                    prepare_directory(fallback, destination)
                except OSError as error:
                    raise _Failure.of(error, "mkdir") from error
            directory = os.path.dirname(destination)
            if directory not in cleaned:
                cleaned.add(directory)
                remove_stale_temps(directory)
            size = _write_once(destination, write, fsync)
        except _Failure as failure:
            if fallback is not None:  # leave no empty mirrored directories in a fallback
                remove_mirrored_dirs(fallback, destination)
            failures.append(FailedAttempt(failure.errno, failure.step, failure.message))
            kind = classify(failure.errno)
            if attempt == attempts:
                _log_failure(requested, destination, attempt, attempts, failure, kind, "giving up")
                break
            next_destination, wait = destination, backoff.delay(attempt)
            if kind is not ErrorClass.TRANSIENT:
                if fallback is not None:
                    given_up.add(fallback)
                alternative = find_fallback(
                    requested,
                    [f for f in fallbacks if f not in given_up],
                    need_bytes,
                    state_dir=state_dir,
                    timeout=timeout,
                )
                if alternative is not None:
                    next_destination, wait = alternative, 0.0
                elif fallback is not None:
                    next_destination = requested
                    wait = wait if kind is ErrorClass.CAPACITY else 0.0
                elif kind is ErrorClass.PERMANENT:
                    _log_failure(
                        requested, destination, attempt, attempts, failure, kind, "giving up"
                    )
                    break
            plan = f"retrying in {format_seconds(wait)}" if wait else "retrying now"
            if next_destination != destination:
                plan = f"redirecting to {next_destination}, {plan}"
            _log_failure(requested, destination, attempt, attempts, failure, kind, plan)
            destination = next_destination
            if wait:
                backoff.sleep(wait)
            continue
        return _succeeded(requested, destination, fallback, attempt, size, start, failures)
    summary = ", ".join(f"{f.errno} at {f.step}" for f in failures)
    raise SaveError(
        requested,
        failures,
        f"saving {requested} failed after {len(failures)} attempt(s): {summary}",
    )


def _log_failure(
    requested: str,
    destination: str,
    attempt: int,
    attempts: int,
    failure: _Failure,
    kind: ErrorClass,
    plan: str,
) -> None:
    where = "" if destination == requested else f" (redirected to {destination})"
    log.warning(
        "save %s%s: attempt %d/%d failed at %s with %s (%s): %s; %s",
        requested,
        where,
        attempt,
        attempts,
        failure.step,
        failure.errno,
        kind.value,
        failure.message,
        plan,
    )


def _succeeded(
    requested: str,
    destination: str,
    fallback: str | None,
    attempt: int,
    size: int,
    start: float,
    failures: list[FailedAttempt],
) -> SaveResult:
    remember_save(requested, size)
    result = SaveResult(
        path=destination,
        requested_path=requested,
        redirected=destination != requested,
        attempts=attempt,
        bytes=size,
        seconds=time.monotonic() - start,
        errors=tuple(f.errno for f in failures),
    )
    if fallback is not None:
        _record_redirect(fallback, requested, destination, size)
    if failures or result.redirected:
        log.warning(
            "save %s: %s written to %s on attempt %d after %s in %s",
            requested,
            format_bytes(size),
            destination,
            attempt,
            ", ".join(result.errors) or "no error",
            format_seconds(result.seconds),
        )
    else:
        log.debug(
            "save %s: %s in %s", requested, format_bytes(size), format_seconds(result.seconds)
        )
    return result


def _record_redirect(fallback: str, requested: str, actual: str, size: int) -> None:
    """Add the redirected save to the fallback's manifest, so that `fsprobe sync` finds it.

    The checkpoint itself is safe at this point; a manifest that cannot be written is logged
    loudly, not raised: failing the save now would throw away a good checkpoint.
    """
    try:
        record(new_entry(fallback, requested, actual, size, sha256_of(actual)))
    except OSError as error:
        log.error(
            "save %s: written to %s, but the redirect manifest in %s could not be updated "
            "(%s): copy it back by hand",
            requested,
            actual,
            fallback,
            error,
        )


def save(
    obj: object,
    path: str | os.PathLike[str],
    *,
    attempts: int = DEFAULT_ATTEMPTS,
    fallback_dirs: Iterable[str | os.PathLike[str]] = (),
    max_wait: float = 0.0,
    backoff: Backoff | None = None,
    need_bytes: int | None = None,
    preflight: bool = True,
    fsync: bool = True,
    redirect: bool = True,
    on_unhealthy: str = "proceed",
    state_dir: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    **torch_save_kwargs: Any,
) -> SaveResult:
    """`torch.save(obj, path, **torch_save_kwargs)`, made atomic, retried and redirectable.

    A drop-in for `torch.save` with a path; see `atomic_write` for the other arguments.
    """
    import torch  # lazily: `import fsprobe` must not import torch

    return atomic_write(
        path,
        lambda stream: torch.save(obj, stream, **torch_save_kwargs),
        attempts=attempts,
        backoff=backoff,
        fallback_dirs=fallback_dirs,
        max_wait=max_wait,
        need_bytes=need_bytes,
        preflight=preflight,
        fsync=fsync,
        redirect=redirect,
        on_unhealthy=on_unhealthy,
        state_dir=state_dir,
        timeout=timeout,
    )
