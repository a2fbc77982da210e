"""The fault filesystem's journal: which calls reached it, in what order, and how each ended.

Operation counts tell whether a save called ``fsync`` at all; they cannot tell a fsync of the
temp file before the rename that publishes it from one after it, or from a fsync of some other
file. Durability is a matter of order, so the filesystem also keeps the sequence of the calls
that change or sync something (:data:`JOURNALED_OPS`; ``getattr``, ``read`` and ``statfs`` are
left out, they would only bury the rest). :mod:`tests.support.durability` reads it.

An entry is ``[op, paths, error]``: ``paths`` are the paths inside the mount that the call
named (both for ``rename`` and ``link``; ``""`` for an open file that was unlinked meanwhile),
``error`` the errno name the call ended with (``None`` on success), whether a fault rule or the
backing filesystem raised it. The journal keeps the latest :data:`MAX_ENTRIES` calls and says
how many older ones it dropped, so that a reader never mistakes a cut journal for a whole one.
"""

from __future__ import annotations

import errno as errno_module
import functools
import threading
from collections import deque
from typing import Any, Callable, TypeVar

#: The operations the journal records: every call that creates, changes, syncs or releases.
JOURNALED_OPS = frozenset(
    {
        "create",
        "open",
        "write",
        "truncate",
        "flush",
        "fsync",
        "release",
        "mknod",
        "mkdir",
        "symlink",
        "link",
        "unlink",
        "rmdir",
        "rename",
        "chmod",
        "chown",
        "utimens",
        "opendir",
        "fsyncdir",
        "releasedir",
    }
)

#: Bound on the journal (a 512 MiB save is about 4096 writes of 128 KiB).
MAX_ENTRIES = 100_000

#: How many leading arguments of an operation are paths inside the mount (one for the rest).
_PATH_ARGS = {"rename": 2, "link": 2}

F = TypeVar("F", bound=Callable[..., Any])


def _error_name(error: BaseException) -> str:
    code = getattr(error, "errno", None)
    if isinstance(code, int):
        return errno_module.errorcode.get(code, str(code))
    return type(error).__name__


class Journal:
    """The bounded, thread-safe sequence of journaled calls."""

    def __init__(self, limit: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._entries: deque[list[Any]] = deque(maxlen=limit)
        self._dropped = 0

    def record(self, op: str, paths: tuple[str | None, ...], error: str | None) -> None:
        entry = [op, [path or "" for path in paths], error]
        with self._lock:
            if len(self._entries) == self._entries.maxlen:
                self._dropped += 1
            self._entries.append(entry)

    def to_dict(self) -> dict[str, Any]:
        """``{"entries": [[op, paths, error], ...], "dropped": n}``, oldest entry first."""
        with self._lock:
            return {"entries": list(self._entries), "dropped": self._dropped}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._dropped = 0


def journaled(method: F) -> F:
    """Record every call of an operation method in ``self.journal``, with how it ended.

    The operation name is the method's name. ``functools.wraps`` keeps the signature visible
    (mfusepy inspects ``create``'s), and the error is recorded before it propagates.
    """
    op = method.__name__
    if op not in JOURNALED_OPS:
        raise ValueError(f"{op} is not a journaled operation")
    path_args = _PATH_ARGS.get(op, 1)

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = method(self, *args, **kwargs)
        except BaseException as error:
            self.journal.record(op, args[:path_args], _error_name(error))
            raise
        self.journal.record(op, args[:path_args], None)
        return result

    return run  # type: ignore[return-value]
