"""Which targets a sender may report saves into: those the kernel lets it write.

Asked of the kernel as the sender (faccessat2 in a thread acting as it), cached, never waited
on by the receiver: docs/security.md, "Save events".
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import pwd
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fsprobe.posix.identity import Identity
from fsprobe.probing.credentials import acting_as

#: How long a decision is kept (seconds): a user whose access is revoked may report for as
#: long, one who was given access waits as long.
TTL = 30.0
MAX_DECISIONS = 4096
#: How long a check may take before its events are refused (a hung mount).
DEADLINE = 5.0
MAX_CHECKS = 32
#: Checks of one target at once: a hung mount holds at most these threads, never every slot.
MAX_CHECKS_PER_TARGET = 4
#: Checks for one sender's uid at once: a user's events to many targets of a hung mount (any
#: watched target, hers or not) hold at most these threads, never every slot.
MAX_CHECKS_PER_UID = 8
#: Events waiting for one check: more than a sender's whole burst and its rate until the
#: deadline (receive.BURST 100 + 5 s x RATE 5), so a first burst loses nothing to its check.
MAX_PARKED = 128
#: What `Admission.ask` and `decided` say besides None (admitted): the reasons an event is
#: refused (the kernel says no; no check could decide) and that it waits for its check.
NOT_PERMITTED = "not_permitted"
UNVERIFIED = "unverified"
PARKED = "parked"
#: faccessat2 has the same number on every architecture Linux gave it to (5.8 and later).
_FACCESSAT2 = 439
_AT_FDCWD = -100
_AT_EACCESS = 0x200
_libc = ctypes.CDLL(None, use_errno=True)

log = logging.getLogger("fsprobe.events")

Item = TypeVar("Item")


@dataclass(frozen=True)
class Sender:
    """Who sent a datagram, as the kernel says; `groups` as /proc said while it lived."""

    uid: int
    gid: int
    pid: int
    groups: frozenset[int] = frozenset()

    def identity(self) -> Identity:
        return Identity(self.uid, self.gid, tuple(sorted(self.groups | {self.gid})))


def groups_of(pid: int, uid: int, gid: int, proc: str = "/proc") -> frozenset[int]:
    """The groups of process `pid`, if it still runs as `uid` (else only `gid`: a pid
    reused by someone else must not lend its groups; pid 0, a sender outside our pid
    namespace, has none to read: `account_groups` then)."""
    found = {gid}
    if pid <= 0:
        return frozenset(found)
    try:
        with open(f"{proc}/{pid}/status", "rb") as status:
            lines = status.read(16384).decode("ascii", "replace").splitlines()
    except OSError:
        return frozenset(found)
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        if int(fields.get("Uid", "").split()[0]) != uid:
            return frozenset(found)
        found.update(int(g) for g in fields.get("Groups", "").split())
    except (IndexError, ValueError):
        pass
    return frozenset(found)


def account_groups(uid: int, gid: int) -> frozenset[int]:
    """The groups the account database gives `uid` (with `gid`): a sender whose process the
    kernel does not show us (pid 0) is taken to have its account's groups. Only `gid` when
    the uid has no account here. May wait on the name service: called in a check's thread."""
    try:
        name = pwd.getpwuid(uid).pw_name
        return frozenset(os.getgrouplist(name, gid)) | {gid}
    except (KeyError, OSError):
        return frozenset({gid})


def sender_identity(sender: Sender) -> Identity:
    """Whom to check as: the sender with its process's groups, or (pid 0) its account's."""
    if sender.pid == 0:
        sender = Sender(sender.uid, sender.gid, 0, account_groups(sender.uid, sender.gid))
    return sender.identity()


def may_write(identity: Identity, directory: str) -> bool:
    """Whether the kernel lets `identity` create a file in `directory` (which must exist: in
    a target not made yet no save has landed, whoever may make it). Acts as `identity` in the
    calling thread (root only); OSError(ENOSYS) on a kernel without faccessat2."""
    path = os.fsencode(os.path.abspath(directory))
    with acting_as(identity):
        if _libc.syscall(_FACCESSAT2, _AT_FDCWD, path, os.W_OK | os.X_OK, _AT_EACCESS) == 0:
            return True
        code = ctypes.get_errno()
    if code == errno.ENOSYS:
        raise OSError(code, "faccessat2: not in this kernel (Linux 5.8 and later)")
    return False


Key = tuple[int, int, frozenset[int], str]


@dataclass
class _Check(Generic[Item]):
    started: float
    parked: list[Item] = field(default_factory=list)


class Admission(Generic[Item]):
    """The admission rule with its cache and its checks in flight (see the module)."""

    def __init__(
        self,
        wake: Callable[[], None],
        *,
        daemon_uid: int | None = None,
        check: Callable[[Identity, str], bool] = may_write,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = TTL,
        max_decisions: int = MAX_DECISIONS,
        deadline: float = DEADLINE,
        max_checks: int = MAX_CHECKS,
    ) -> None:
        self._wake, self._check, self._clock = wake, check, clock
        self._daemon_uid = os.getuid() if daemon_uid is None else daemon_uid
        self._ttl, self._max_decisions = ttl, max_decisions
        self._deadline, self._max_checks = deadline, max_checks
        self._decisions: OrderedDict[Key, tuple[str | None, float]] = OrderedDict()
        self._checks: dict[Key, _Check[Item]] = {}  # in flight, parked events not yet decided
        self._running: set[Key] = set()  # threads not back yet (overrun ones included)
        self._finished: list[tuple[Key, str | None]] = []
        self._lock = threading.Lock()
        self._unable: set[str] = set()  # kinds of errors checks met (each logged once)

    def ask(self, sender: Sender, target: str, item: Item) -> str | None:
        """Whether `sender` may report into `target`: None (yes) or why not (`NOT_PERMITTED`,
        `UNVERIFIED`) now, or `PARKED`: `item` waits for its check (`decided`)."""
        if sender.uid in (0, self._daemon_uid):
            return None
        key = (sender.uid, sender.gid, sender.groups, target)
        now = self._clock()
        known = self._decisions.get(key)
        if known is not None and now - known[1] < self._ttl:
            return known[0]
        check = self._checks.get(key)
        if check is not None:
            if len(check.parked) >= MAX_PARKED:
                return UNVERIFIED
            check.parked.append(item)
            return PARKED
        with self._lock:
            if (
                key in self._running  # its check hangs still
                or len(self._running) >= self._max_checks
                or sum(k[3] == target for k in self._running) >= MAX_CHECKS_PER_TARGET
                or sum(k[0] == sender.uid for k in self._running) >= MAX_CHECKS_PER_UID
            ):
                return UNVERIFIED
            self._running.add(key)
        thread = threading.Thread(
            target=self._run, args=(key, sender), name="fsprobe-admission", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: nothing decided
            with self._lock:
                self._running.discard(key)
            return UNVERIFIED
        self._checks[key] = _Check(now, [item])
        return PARKED

    def decided(self) -> list[tuple[Item, str | None]]:
        """The parked events decided since the last call, each with None (admitted) or why
        not (`UNVERIFIED` for those whose check overran its deadline)."""
        with self._lock:
            finished, self._finished = self._finished, []
        now = self._clock()
        out: list[tuple[Item, str | None]] = []
        for key, allowed in finished:
            self._decisions.pop(key, None)
            self._decisions[key] = (allowed, now)
            while len(self._decisions) > self._max_decisions:
                self._decisions.popitem(last=False)
            check = self._checks.pop(key, None)
            out += [(item, allowed) for item in (check.parked if check else ())]
        for key in [k for k, c in self._checks.items() if now - c.started >= self._deadline]:
            out += [(item, UNVERIFIED) for item in self._checks.pop(key).parked]
        return out

    def _run(self, key: Key, sender: Sender) -> None:
        allowed: str | None
        try:
            allowed = None if self._check(sender_identity(sender), key[3]) else NOT_PERMITTED
        except Exception as error:  # cannot act as the user here: nothing is admitted
            allowed, kind = UNVERIFIED, f"{type(error).__name__} {getattr(error, 'errno', '')}"
            with self._lock:
                new = kind not in self._unable
                self._unable.add(kind)
            if new:
                log.error("cannot check whether uid %d may write %s: %s", key[0], key[3], error)
        with self._lock:
            self._running.discard(key)
            self._finished.append((key, allowed))
        self._wake()
