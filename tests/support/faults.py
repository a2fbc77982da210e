"""Fault rules of the fault filesystem: fail, slow down or block an operation, on demand.

Every filesystem operation passes through :meth:`Faults.gate` before it touches the backing
tree. The gate counts the operation, then applies the rules that match it, oldest first:

- ``fail``: raise an errno; the first rule that fails a call ends the evaluation;
- ``delay``: hold the call for ``seconds``, then go on (a slow disk, a hang that ends);
- ``block``: hold the call until the rule is removed or the filesystem shuts down (a hung
  mount). As a safety net, a call is let go after ``max_hold`` seconds (default 120) with an
  ERROR in the log, which fails the test at teardown: a forgotten rule costs two minutes,
  not the whole CI run.

Removing a rule (or shutting down) ends every hold at once. A thread held here sleeps in the
kernel uninterruptibly, as on a hung NFS or Lustre mount: even SIGKILL cannot end it, and a
process with such a thread cannot exit, so its pipes stay open. A test that waits for a
process which left a thread behind on a blocked call (``subprocess.run`` of a CLI that
abandons its probe) must use ``delay`` (a hang that ends by itself) or remove the rule from
another thread.

A rule matches an operation by name (``op``, a glob over the names in :data:`OPS`, so ``"*"``
is every operation) and optionally by path (``path``, a glob over the path inside the mount such
as ``/ckpt/.model.pt.tmp``; ``*`` crosses ``/``; a rename matches if either its source or its
destination does). Among its matching calls a rule lets the first ``after`` pass untouched, then
acts on the next ``times`` (``None``: on all of them). So "fail the 3rd write" is
``after=2, times=1``, "the next 5 writes" is ``times=5`` and "every write" is ``times=None``.

A ``sticky`` fail rule also breaks the file handle it hit: later ``write``, ``fsync`` and
``flush`` calls on that handle fail with the same errno until it is closed. This matters because
the kernel splits a large ``write(2)`` into requests of at most 1 MiB and turns a failure after
the first one into a short write, which Python and libstdc++ simply retry: a one-shot fault in
the middle of a large write is otherwise invisible to the application (as it would be on a
real filesystem).

The kernel retries some failures by itself, so a one-shot fault there may never reach the
caller: ESTALE on any path-based call (the VFS tries once more), a failed ``getattr`` of an
entry it had cached (it drops the entry and looks it up afresh), a failed ``read`` (readahead
failed, so it reads the page once more). Use ``times=None`` (or enough times) there. The kernel
also sends ``getattr`` (a lookup is counted as one) ahead of most path-based calls, so getattr
counts are not one per ``os.stat``.

A blocked call holds whatever the kernel locked for it, as on a real hung mount: a held
``create``, ``mkdir``, ``unlink`` or ``rename`` holds its directory, so other creations and
even lookups in that directory wait too. Block in a sub-directory to keep the rest usable.
"""

from __future__ import annotations

import errno as errno_module
import fnmatch
import itertools
import logging
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: The operation names the gate sees, as the FUSE high-level API names them. Note that opening
#: a file that does not exist yet with O_CREAT is ``create``, not ``open``.
OPS = frozenset(
    {
        "getattr",
        "readlink",
        "mknod",
        "mkdir",
        "unlink",
        "rmdir",
        "symlink",
        "rename",
        "link",
        "chmod",
        "chown",
        "truncate",
        "open",
        "create",
        "read",
        "write",
        "statfs",
        "flush",
        "release",
        "fsync",
        "opendir",
        "readdir",
        "releasedir",
        "fsyncdir",
        "utimens",
    }
)

ACTIONS = ("fail", "delay", "block")

#: How long a block holds a call at most before it is let go with an error in the log.
DEFAULT_MAX_HOLD = 120.0

log = logging.getLogger("faultfs")

#: Operations that a broken (sticky-failed) file handle refuses.
STICKY_OPS = frozenset({"write", "fsync", "flush"})


def errno_value(value: int | str) -> int:
    """``5`` or ``"EIO"`` → ``5``; anything else is a ValueError."""
    if isinstance(value, str):
        code = getattr(errno_module, value, None)
        if not value.startswith("E") or not isinstance(code, int):
            raise ValueError(f"unknown errno name {value!r}")
        return code
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"errno must be a positive int or a name like 'EIO', not {value!r}")


@dataclass
class Rule:
    """One fault rule and what it has done so far."""

    id: int
    action: str
    op: str
    path: str | None = None
    errno: int | None = None
    seconds: float = 0.0
    after: int = 0
    times: int | None = None
    sticky: bool = False
    seen: int = 0  # matching calls so far
    hits: int = 0  # calls the rule acted on
    waiting: int = 0  # calls blocked on it right now
    released: threading.Event = field(default_factory=threading.Event)

    def matches(self, op: str, paths: tuple[str, ...]) -> bool:
        if not fnmatch.fnmatchcase(op, self.op):
            return False
        return self.path is None or any(fnmatch.fnmatchcase(p, self.path) for p in paths)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "op": self.op,
            "path": self.path,
            "errno": None if self.errno is None else errno_module.errorcode.get(self.errno),
            "errno_code": self.errno,
            "seconds": self.seconds,
            "after": self.after,
            "times": self.times,
            "sticky": self.sticky,
            "seen": self.seen,
            "hits": self.hits,
            "waiting": self.waiting,
        }


class Faults:
    """The rule set, the operation counters and the read-only switch; safe across threads."""

    def __init__(self, max_hold: float = DEFAULT_MAX_HOLD) -> None:
        self.max_hold = max_hold
        self._lock = threading.Lock()
        self._rules: dict[int, Rule] = {}
        self._ids = itertools.count(1)
        self._counts: Counter[str] = Counter()
        self._broken: dict[int, int] = {}  # file handle -> errno of a sticky failure
        self._stopping = threading.Event()
        self.readonly = False

    # -- rules -------------------------------------------------------------------------------

    def add(
        self,
        action: str,
        op: str,
        *,
        path: str | None = None,
        errno: int | str | None = None,
        seconds: float = 0.0,
        after: int = 0,
        times: int | None = None,
        sticky: bool = False,
    ) -> Rule:
        """Validate and install a rule; return it (its `id` is what the client keeps)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")
        if not isinstance(op, str) or not op:
            raise ValueError("op must be an operation name or a glob")
        if not any(c in op for c in "*?[") and op not in OPS:
            raise ValueError(f"unknown operation {op!r}; known: {sorted(OPS)}")
        if path is not None and not isinstance(path, str):
            raise ValueError("path must be a glob string or null")
        if not isinstance(after, int) or after < 0:
            raise ValueError("after must be an int >= 0")
        if times is not None and (not isinstance(times, int) or times < 1):
            raise ValueError("times must be an int >= 1 or null (every call)")
        if action == "fail":
            if errno is None:
                raise ValueError("a fail rule needs an errno")
            errno = errno_value(errno)
        elif errno is not None or sticky:
            raise ValueError("errno and sticky only apply to fail rules")
        if action == "delay" and (not isinstance(seconds, (int, float)) or seconds <= 0):
            raise ValueError("a delay rule needs seconds > 0")
        if self._stopping.is_set():
            raise ValueError("the filesystem is shutting down; it takes no more rules")
        with self._lock:
            rule = Rule(
                next(self._ids), action, op, path, errno, float(seconds), after, times, sticky
            )
            self._rules[rule.id] = rule
        return rule

    def remove(self, rule_id: int) -> None:
        """Remove a rule; calls blocked on it go on."""
        with self._lock:
            rule = self._rules.pop(rule_id, None)
        if rule is None:
            raise KeyError(f"no rule with id {rule_id}")
        rule.released.set()

    def clear(self) -> None:
        """Remove every rule and forget broken handles; every blocked call goes on."""
        with self._lock:
            rules = list(self._rules.values())
            self._rules.clear()
            self._broken.clear()
        for rule in rules:
            rule.released.set()

    def rules(self) -> list[dict[str, Any]]:
        with self._lock:
            return [rule.to_dict() for rule in self._rules.values()]

    def shutdown(self) -> None:
        """Release everything for good: teardown must never wait on a blocked call."""
        self._stopping.set()
        self.clear()

    # -- counters ----------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()

    # -- the gate ----------------------------------------------------------------------------

    def gate(
        self, op: str, *paths: str | None, fh: int | None = None, mutating: bool = False
    ) -> None:
        """Count `op`, then apply the matching rules; raise OSError for an injected failure.

        `paths` are the paths inside the mount (None for an open file that was unlinked),
        `fh` the file handle for handle-based operations, `mutating` whether the call would
        change the tree (refused with EROFS while the filesystem is read-only).
        """
        named = tuple(p for p in paths if p is not None)
        with self._lock:
            self._counts[op] += 1
            broken = self._broken.get(fh) if fh is not None and op in STICKY_OPS else None
            candidates = [rule for rule in self._rules.values() if rule.matches(op, named)]
        if broken is not None:
            raise OSError(broken, errno_module.errorcode.get(broken, str(broken)))
        for rule in candidates:
            if not self._take(rule):
                continue
            if rule.action != "fail":
                self._hold(rule)
                continue
            assert rule.errno is not None
            if rule.sticky and fh is not None:
                with self._lock:
                    self._broken[fh] = rule.errno
            raise OSError(rule.errno, errno_module.errorcode.get(rule.errno, ""))
        if mutating and self.readonly:
            raise OSError(errno_module.EROFS, "read-only (faultfs)")

    def forget_handle(self, fh: int) -> None:
        """A handle was closed: its number may be reused by the next open."""
        with self._lock:
            self._broken.pop(fh, None)

    def _take(self, rule: Rule) -> bool:
        """Count a matching call against the rule; True if the rule acts on it."""
        with self._lock:
            if rule.released.is_set():  # removed meanwhile
                return False
            rule.seen += 1
            if rule.seen <= rule.after or (rule.times is not None and rule.hits >= rule.times):
                return False
            rule.hits += 1
            if rule.action != "fail":
                rule.waiting += 1
            return True

    def _hold(self, rule: Rule) -> None:
        """Hold a call for a delay's seconds or, for a block, until the rule is removed."""
        limit = rule.seconds if rule.action == "delay" else self.max_hold
        try:
            if not rule.released.wait(limit) and rule.action == "block":
                log.error(
                    "block rule %d (%s) held a call for %.0f s and let it go: "
                    "did the test forget to remove the rule?",
                    rule.id,
                    rule.op,
                    limit,
                )
        finally:
            with self._lock:
                rule.waiting -= 1
