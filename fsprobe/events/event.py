"""One save as the daemon hears of it, and its wire form (compact JSON, bounded in size).

Everything but the kernel's credentials is the sender's claim: every field is checked for its
type and bound (`BOUNDS`) when decoded.
"""

from __future__ import annotations

import builtins
import errno as errno_module
import json
import re
from dataclasses import dataclass
from typing import Any

from fsprobe.model import REASON_CODES
from fsprobe.units import check_number

#: The largest datagram a sender sends and a receiver reads; longer ones are dropped whole.
MAX_EVENT_BYTES = 8192
#: The failed attempts an event lists (a save has 5 by default); more are only counted.
MAX_FAILURES = 16
#: Longest path kept (PATH_MAX); a longer one makes the event malformed.
MAX_PATH = 4096
#: Longest host name (a fully qualified one: 255).
MAX_HOST = 255
#: The smallest and largest value of each number: a file size is an off_t, a pid at most
#: PID_MAX_LIMIT, a save lasts at most a year, and it finished before 2106.
BOUNDS: dict[str, tuple[int, int]] = {
    "bytes": (0, 2**63 - 1),
    "seconds": (0, 366 * 86400),
    "attempts": (1, 2**31 - 1),
    "finished_at": (0, 2**32),
    "pid": (0, 2**22),
    "ranks": (1, 2**24),
}
OUTCOMES = ("ok", "retried", "redirected", "failed")
SCHEMA = 1
#: The errno names a failed attempt may carry (they label a metric: a sender must not make up
#: new ones); any other is counted as ``EUNKNOWN``.
ERRNO_NAMES = frozenset(errno_module.errorcode.values()) | {"EUNKNOWN", "TIMEOUT"}
#: The reasons a preflight's cause may carry: the policy's codes, and ``unknown`` for any other.
REASONS = REASON_CODES | {"unknown"}
#: What a step is (``fsync_dir``): a name, not words to whoever reads an alert; any other is
#: counted as ``unknown``.
STEP_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class Goodbye:
    """A saving process that exits cleanly: expect no more saves from it (its pid is the
    kernel's, like a save's)."""

    host: str
    pid: int

    def encode(self) -> builtins.bytes:
        document = {
            "schema": SCHEMA,
            "goodbye": True,
            "host": self.host[:MAX_HOST],
            "pid": self.pid,
        }
        return json.dumps(document, separators=(",", ":")).encode("utf-8", "surrogateescape")


class MalformedEvent(ValueError):
    """A datagram that is not a save event of this schema."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt: its errno name, the step it failed at, and whether it was made in
    a fallback (not in the requested target)."""

    errno: str
    step: str
    in_fallback: bool = False


@dataclass(frozen=True)
class Cause:
    """Why the preflight kept a save from its target (redirected it, or refused it): the code
    of the verdict's reason (``space_headroom_low``) and the errno a write would have met."""

    reason: str
    errno: str | None = None


@dataclass(frozen=True)
class SaveEvent:
    """One finished save: `requested` is the path asked for, `landed` where it is now (None
    for a failed save), `attempts` how many were made, `failures` the failed ones, `cause`
    why the preflight kept it from the target (None: it did not)."""

    requested: str
    landed: str | None
    bytes: int
    seconds: float
    attempts: int
    failures: tuple[Failure, ...]
    finished_at: float
    host: str
    pid: int
    ranks: int = 1
    cause: Cause | None = None

    @property
    def outcome(self) -> str:
        """``failed``, ``redirected`` (landed elsewhere), ``retried`` (after failed attempts)
        or ``ok``; a redirect is the stronger news, so it wins over a retry."""
        if self.landed is None:
            return "failed"
        if self.landed != self.requested:
            return "redirected"
        return "retried" if self.failures else "ok"

    @property
    def succeeded(self) -> bool:
        return self.landed is not None

    def encode(self) -> builtins.bytes:
        """The datagram (the sender drops one longer than `MAX_EVENT_BYTES`)."""
        document = {
            "schema": SCHEMA,
            "requested": self.requested,
            "landed": self.landed,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "attempts": self.attempts,
            "failures": [
                [f.errno, f.step, "fallback" if f.in_fallback else "target"]
                for f in self.failures[:MAX_FAILURES]
            ],
            "finished_at": self.finished_at,
            "host": self.host[:MAX_HOST],
            "pid": self.pid,
            "ranks": self.ranks,
        }
        if self.cause is not None:
            document["cause"] = [self.cause.reason, self.cause.errno]
        return json.dumps(document, separators=(",", ":")).encode("utf-8", "surrogateescape")


def decode(data: bytes) -> SaveEvent | Goodbye:
    """The event in a datagram; `MalformedEvent` for anything else."""
    if len(data) > MAX_EVENT_BYTES:
        raise MalformedEvent(f"{len(data)} bytes, more than {MAX_EVENT_BYTES}")
    try:
        document = json.loads(data.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError) as error:  # (nested 8,000 deep)
        raise MalformedEvent(f"not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise MalformedEvent("not a save event of schema 1")
    if document.get("goodbye") is True:
        return Goodbye(_host(_field(document, "host", str)), _count(document, "pid"))
    landed = document.get("landed")
    failures = _field(document, "failures", list)
    if len(failures) > MAX_FAILURES or not all(
        isinstance(f, list)
        and len(f) == 3
        and all(_is_name(part) for part in f)
        and f[2] in ("target", "fallback")
        for f in failures
    ):
        raise MalformedEvent("failures must be at most 16 [errno, step, target|fallback]")
    event = SaveEvent(
        requested=_path(_field(document, "requested", str)),
        landed=None if landed is None else _path(_field(document, "landed", str)),
        bytes=_count(document, "bytes"),
        seconds=_number(document, "seconds"),
        attempts=_count(document, "attempts"),
        failures=tuple(
            Failure(
                e if e in ERRNO_NAMES else "EUNKNOWN",
                step if STEP_NAME.fullmatch(step) else "unknown",
                where == "fallback",
            )
            for e, step, where in failures
        ),
        finished_at=_number(document, "finished_at"),
        host=_host(_field(document, "host", str)),
        pid=_count(document, "pid"),
        ranks=_count(document, "ranks"),
        cause=_cause(document.get("cause")),
    )
    return event


def _cause(value: object) -> Cause | None:
    """The preflight's cause as sent (absent from earlier senders): a reason code fsprobe's
    policy has (any other is ``unknown``) and an errno name as a failure's (else
    ``EUNKNOWN``), or null."""
    if value is None:
        return None
    if not (
        isinstance(value, list)
        and len(value) == 2
        and _is_name(value[0])
        and (value[1] is None or _is_name(value[1]))
    ):
        raise MalformedEvent("cause must be [reason, errno or null]")
    reason, errno = value
    return Cause(
        reason if reason in REASONS else "unknown",
        None if errno is None else errno if errno in ERRNO_NAMES else "EUNKNOWN",
    )


def _field(document: dict[str, Any], key: str, kind: type) -> Any:
    value = document.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MalformedEvent(f"{key} must be a {kind.__name__}")
    return value


def _count(document: dict[str, Any], key: str) -> int:
    value: int = _bounded(key, document.get(key), whole=True)
    return value


def _number(document: dict[str, Any], key: str) -> float:
    return float(_bounded(key, document.get(key), whole=False))


def _bounded(key: str, value: Any, whole: bool) -> Any:
    """`value` if it is a number (a whole one if `whole`) within `BOUNDS[key]`."""
    low, high = BOUNDS[key]
    try:
        check_number(value, low, high, whole=whole)
    except (TypeError, ValueError) as error:
        raise MalformedEvent(f"{key} must be {error}") from None
    return value


def _host(value: str) -> str:
    if len(value) > MAX_HOST:
        raise MalformedEvent(f"host must be at most {MAX_HOST} characters")
    return value


def _path(value: str) -> str:
    if not value.startswith("/") or len(value) > MAX_PATH or "\0" in value:
        raise MalformedEvent("paths must be absolute, at most 4096 characters, without NUL")
    return value


def _is_name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 32 and value.isprintable()
