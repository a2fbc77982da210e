"""The daemon's side: datagram sockets in the state dir, the kernel's word for the sender.

Every bound is the receiver's (size, queue, a rate per uid, admission checks); sockets and
their modes: docs/design.md §13 and docs/security.md, "Save events".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping

from fsprobe.events.admission import PARKED, Admission, Sender, groups_of
from fsprobe.events.emit import SOCKET_NAME, own_socket_name
from fsprobe.events.event import MAX_EVENT_BYTES, Goodbye, MalformedEvent, SaveEvent, decode

RECEIVE_BUFFER = 256 * 1024
RATE = 5.0  # events per second and uid, after
BURST = 100
#: uids whose rate is remembered; beyond, the longest quiet one is forgotten.
MAX_SENDERS = 1024
#: Sockets of their own kept for target owners at most (one per distinct owner, normally far
#: fewer); the owners of further targets share ``events.sock``.
MAX_OWNERS = 256
#: How often (seconds) the receiver looks for owners of watched targets new or gone.
OWNERS_EVERY = 0.5
_OWN_SOCKET = re.compile(r"events-[0-9]+\.sock")
_UCRED = struct.Struct("iII")  # pid_t, uid_t, gid_t

log = logging.getLogger("fsprobe.events")

#: `deliver(sender, event)` takes an event (a save or a goodbye) and returns None, or the
#: reason it was refused.
Deliver = Callable[[Sender, "SaveEvent | Goodbye"], "str | None"]
#: `target_of(path)`: the watched target that holds `path`, or None.
TargetOf = Callable[[str], "str | None"]


class _Buckets:
    """A token bucket per uid: `RATE` a second, `BURST` at most."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self._rate, self._burst, self._clock = rate, burst, clock
        self._buckets: OrderedDict[int, tuple[float, float]] = OrderedDict()

    def take(self, uid: int) -> bool:
        now = self._clock()
        tokens, then = self._buckets.pop(uid, (float(self._burst), now))
        tokens = min(float(self._burst), tokens + (now - then) * self._rate)
        allowed = tokens >= 1.0
        self._buckets[uid] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_SENDERS:
            self._buckets.popitem(last=False)
        return allowed


class Receiver:
    """Receives save events on ``<state_dir>/events.sock`` and, as root, on a socket of each
    target owner's own (`owners`), in a thread of its own; hands on those for a watched target
    (`target_of`) that their sender may report into (`admission`)."""

    def __init__(
        self,
        state_dir: str,
        deliver: Deliver,
        owners: Callable[[], Iterable[int]],
        target_of: TargetOf,
        *,
        admission: Admission[tuple[Sender, SaveEvent]] | None = None,
        rate: float = RATE,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state_dir = state_dir
        self._deliver = deliver
        self._owners = owners
        self._buckets = _Buckets(rate, burst, clock)
        self._dropped: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._sockets: dict[int | None, _Bound] = {}  # owner uid (None: shared) -> its socket
        self._unbindable: set[int] = set()  # owners whose socket could not be made (logged)
        self._owners_at = 0.0
        self._selector: selectors.BaseSelector | None = None
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._decided = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # an admission check is back
        self._target_of = target_of
        self._admission: Admission[tuple[Sender, SaveEvent]] = admission or Admission(self._checked)
        self._thread = threading.Thread(target=self._loop, name="fsprobe-events", daemon=True)

    def start(self) -> None:
        """Bind the shared socket and start receiving; OSError if it cannot be made."""
        directory = _open_directory(self._state_dir)
        try:
            _remove_stale_sockets(directory)
            shared = _bind(directory, SOCKET_NAME, 0o666 if os.getuid() == 0 else 0o600)
        finally:
            os.close(directory)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake[0], selectors.EVENT_READ, "wake")
        self._selector.register(self._decided[0], selectors.EVENT_READ, "decided")
        self._sockets[None] = shared
        self._selector.register(shared.sock, selectors.EVENT_READ, None)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop receiving and remove the sockets (those that are still the ones we made)."""
        if self._selector is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._wake[1], b"x")
        self._thread.join(timeout)
        directory: int | None = None
        with contextlib.suppress(OSError):
            directory = _open_directory(self._state_dir)
        try:
            for uid in list(self._sockets):
                self._close(directory, uid)
        finally:
            if directory is not None:
                os.close(directory)
        self._selector.close()
        self._selector = None

    def dropped(self) -> Mapping[str, int]:
        """Events dropped since the start, by reason."""
        with self._lock:
            return dict(self._dropped)

    def _loop(self) -> None:
        assert self._selector is not None
        while True:
            try:
                self._follow_owners()
                ready = self._selector.select(OWNERS_EVERY)
                if any(key.data == "wake" for key, _ in ready):
                    return
                for key, _ in ready:  # one datagram per ready socket and turn: none waits
                    if key.data == "decided":
                        with contextlib.suppress(OSError):
                            os.read(self._decided[0], 4096)
                    else:
                        self._receive_one(key.fileobj)  # type: ignore[arg-type]
                for (sender, event), refused in self._admission.decided():
                    self._hand_on(sender, event, refused)
            except Exception:  # contained: the daemon's probing goes on without events
                log.exception("save event receiver")
                self._drop("internal_error")
                time.sleep(0.1)

    def _follow_owners(self) -> None:
        """As root, keep one socket per owner of a watched target (at most `MAX_OWNERS`):
        bind those of new owners, close those of owners no longer watched."""
        now = time.monotonic()
        if os.getuid() != 0 or now - self._owners_at < OWNERS_EVERY:
            return
        self._owners_at = now
        wanted = set(sorted(set(self._owners()))[:MAX_OWNERS])
        self._unbindable &= wanted
        have = {uid for uid in self._sockets if uid is not None}
        missing = wanted - have - self._unbindable
        if not missing and have <= wanted:
            return
        directory = _open_directory(self._state_dir)
        try:
            for uid in have - wanted:
                self._close(directory, uid)
            for uid in sorted(missing):
                try:
                    bound = _bind(directory, own_socket_name(uid), 0o600, uid)
                except OSError as error:
                    self._unbindable.add(uid)
                    log.error("no save event socket of its own for uid %d: %s", uid, error)
                    continue
                assert self._selector is not None
                self._sockets[uid] = bound
                self._selector.register(bound.sock, selectors.EVENT_READ, uid)
        finally:
            os.close(directory)

    def _close(self, directory: int | None, uid: int | None) -> None:
        """Stop listening on the socket of `uid` (None: the shared one) and remove it."""
        bound = self._sockets.pop(uid)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(bound.sock)
        if directory is not None:
            with contextlib.suppress(OSError):
                _remove_socket(directory, bound.name, bound.inode)
        bound.sock.close()

    def _receive_one(self, sock: socket.socket) -> None:
        try:
            data, ancillary, flags, _ = sock.recvmsg(
                MAX_EVENT_BYTES + 1, socket.CMSG_SPACE(_UCRED.size), socket.MSG_DONTWAIT
            )
        except BlockingIOError:
            return
        sender = _credentials(ancillary)
        if sender is None:
            return self._drop("no_credentials")
        if not self._buckets.take(sender.uid):
            return self._drop("rate_limited")
        if flags & socket.MSG_TRUNC or len(data) > MAX_EVENT_BYTES:
            return self._drop("too_large")
        try:
            event = decode(data)
        except MalformedEvent:
            return self._drop("malformed")
        sender = dataclasses.replace(sender, groups=groups_of(sender.pid, sender.uid, sender.gid))
        if sender.pid:  # the kernel's pid, unless the sender is outside our pid namespace
            event = dataclasses.replace(event, pid=sender.pid)
        if isinstance(event, Goodbye):  # of the sender's own process: no target to admit
            return self._hand_on(sender, event, None)
        target = self._target_of(event.requested)
        if target is None:
            return self._drop("unwatched")
        admitted = self._admission.ask(sender, target, (sender, event))
        if admitted != PARKED:
            self._hand_on(sender, event, admitted)

    def _hand_on(self, sender: Sender, event: SaveEvent | Goodbye, refused: str | None) -> None:
        """Deliver an event whose admission was decided (`refused` None), or count it."""
        if refused is None:
            refused = self._deliver(sender, event)
        if refused is not None:
            self._drop(refused)

    def _checked(self) -> None:
        """An admission check is back (from its thread): wake the loop to hand its events on."""
        with contextlib.suppress(OSError):
            os.write(self._decided[1], b"x")

    def _drop(self, reason: str) -> None:
        with self._lock:
            self._dropped[reason] += 1


def _credentials(ancillary: list[tuple[int, int, bytes]]) -> Sender | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            pid, uid, gid = _UCRED.unpack_from(data)
            return Sender(uid, gid, pid)
    return None


@dataclasses.dataclass(frozen=True)
class _Bound:
    """A socket we bound in the state dir: its name there and its inode (ours to remove)."""

    sock: socket.socket
    name: str
    inode: int


def _open_directory(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _bind(directory: int, name: str, mode: int, owner: int | None = None) -> _Bound:
    """A receiving socket `name` in the state dir, replacing any left there. Its mode is set
    on the socket before it is bound (Linux makes the file with it, less the umask), so a
    socket for `owner` is never a moment open to anyone but root and then `owner`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        os.fchmod(sock.fileno(), mode)
        _remove_socket(directory, name, None)
        sock.bind(f"/proc/self/fd/{directory}/{name}")
        os.chmod(name, mode, dir_fd=directory)
        if owner is not None:
            os.chown(name, owner, -1, dir_fd=directory, follow_symlinks=False)
        inode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_ino
    except BaseException:
        sock.close()
        raise
    return _Bound(sock, name, inode)


def _remove_stale_sockets(directory: int) -> None:
    """Remove the sockets an earlier daemon of this state dir left (we hold its lock)."""
    for name in os.listdir(directory):
        if name == SOCKET_NAME or _OWN_SOCKET.fullmatch(name):
            _remove_socket(directory, name, None)


def _remove_socket(directory: int, name: str, inode: int | None) -> None:
    """Remove the socket `name` in the state dir: any (an earlier daemon's), or only ours
    (`inode`)."""
    try:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(info.st_mode) and inode in (None, info.st_ino):
        os.unlink(name, dir_fd=directory)
