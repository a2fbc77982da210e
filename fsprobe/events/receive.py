"""The daemon's side: a datagram socket in the state dir, the kernel's word for the sender.

``SO_PASSCRED`` makes the kernel attach the sender's pid, uid and gid to every datagram: a
sender cannot claim another uid (only root may pass credentials other than its own). Every
bound is the receiver's: datagrams longer than `MAX_EVENT_BYTES` are dropped whole, the
kernel's queue is `RECEIVE_BUFFER` bytes (a sender finds it full and drops its event, never
waits), and each uid may deliver `RATE` events a second after a burst of `BURST`; the rest
are dropped and counted by reason, as are malformed events and those `deliver` refuses.

The socket is made after the daemon holds the state dir's writer lock: one found there is
an earlier daemon's of this dir, and is replaced. It is ``0666`` when the daemon runs as root
(a node daemon hears every user, `admission` decides what counts) and ``0600`` otherwise (a
sidecar hears its own user).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping

from fsprobe.events.admission import Sender, groups_of
from fsprobe.events.emit import SOCKET_NAME
from fsprobe.events.event import MAX_EVENT_BYTES, MalformedEvent, SaveEvent, decode

RECEIVE_BUFFER = 256 * 1024
RATE = 5.0  # events per second and uid, after
BURST = 100
#: uids whose rate is remembered; beyond, the longest quiet one is forgotten.
MAX_SENDERS = 1024
_UCRED = struct.Struct("iII")  # pid_t, uid_t, gid_t

log = logging.getLogger("fsprobe.events")

#: `deliver(sender, event)` takes an event and returns None, or the reason it was refused.
Deliver = Callable[[Sender, SaveEvent], "str | None"]


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
    """Receives save events on ``<state_dir>/events.sock`` in a thread of its own."""

    def __init__(
        self,
        state_dir: str,
        deliver: Deliver,
        *,
        rate: float = RATE,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._state_dir = state_dir
        self._deliver = deliver
        self._buckets = _Buckets(rate, burst, clock)
        self._dropped: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._inode: int | None = None
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._loop, name="fsprobe-events", daemon=True)

    def start(self) -> None:
        """Bind the socket and start receiving; OSError if the socket cannot be made."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            directory = os.open(
                self._state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
            try:
                _remove_socket(directory, None)
                sock.bind(f"/proc/self/fd/{directory}/{SOCKET_NAME}")
                os.chmod(SOCKET_NAME, 0o666 if os.getuid() == 0 else 0o600, dir_fd=directory)
                self._inode = os.stat(SOCKET_NAME, dir_fd=directory, follow_symlinks=False).st_ino
            finally:
                os.close(directory)
        except BaseException:
            sock.close()
            raise
        self._socket = sock
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop receiving and remove the socket (if it is still the one we made)."""
        if self._socket is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._wake[1], b"x")
        self._thread.join(timeout)
        with contextlib.suppress(OSError):
            directory = os.open(self._state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                _remove_socket(directory, self._inode)
            finally:
                os.close(directory)
        self._socket.close()
        self._socket = None

    def dropped(self) -> Mapping[str, int]:
        """Events dropped since the start, by reason."""
        with self._lock:
            return dict(self._dropped)

    def _loop(self) -> None:
        assert self._socket is not None
        while True:
            try:
                ready, _, _ = select.select([self._socket.fileno(), self._wake[0]], [], [], 5.0)
                if self._wake[0] in ready:
                    return
                if ready:
                    self._receive_one(self._socket)
            except Exception:  # contained: the daemon's probing goes on without events
                log.exception("save event receiver")
                self._drop("internal_error")
                time.sleep(0.1)

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
        refused = self._deliver(sender, event)
        if refused is not None:
            self._drop(refused)

    def _drop(self, reason: str) -> None:
        with self._lock:
            self._dropped[reason] += 1


def _credentials(ancillary: list[tuple[int, int, bytes]]) -> Sender | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            pid, uid, gid = _UCRED.unpack_from(data)
            return Sender(uid, gid, pid)
    return None


def _remove_socket(directory: int, inode: int | None) -> None:
    """Remove the socket in the state dir: any (an earlier daemon's), or only ours (`inode`)."""
    try:
        info = os.stat(SOCKET_NAME, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(info.st_mode) and inode in (None, info.st_ino):
        os.unlink(SOCKET_NAME, dir_fd=directory)
