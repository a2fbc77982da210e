"""The trainer's side: one non-blocking datagram to the daemon's socket, never raising.

Its own ``events-<uid>.sock`` first, then ``events.sock``, each only if trusted like the state
file (docs/design.md §13, docs/security.md "Save events"); a goodbye at a clean exit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import stat
import threading

from fsprobe.events.event import MAX_EVENT_BYTES, Goodbye
from fsprobe.state import default_state_dir

SOCKET_NAME = "events.sock"
#: State dirs a process says goodbye to at most (a trainer reports to one or two).
MAX_GOODBYES = 16

log = logging.getLogger("fsprobe.events")


def send(datagram: bytes, state_dir: str | None = None) -> bool:
    """Send a save event's `datagram` (`SaveEvent.encode`) to the daemon of `state_dir` (the
    default state dir if None); whether it was handed to the kernel. Never raises, never
    blocks."""
    try:
        directory = state_dir or default_state_dir()
        sent = _send(datagram, directory)
        if sent:
            _GOODBYES.remember(directory)
        return sent
    except Exception as error:  # a report must never fail a save
        log.debug("save event not sent to %s: %s", state_dir, error)
        return False


class _Goodbyes:
    """The state dirs this process reported saves to, told goodbye once at its clean exit.

    Process-wide by nature (one `atexit` per process); a forked child starts its own list at
    its first report and never says goodbye for its parent.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._dirs: dict[str, None] = {}

    def remember(self, state_dir: str) -> None:
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._dirs = os.getpid(), {}
                atexit.register(self.say)
            if len(self._dirs) < MAX_GOODBYES:
                self._dirs[state_dir] = None

    def say(self) -> None:
        """Send the goodbye (at exit); never raises."""
        with self._lock:
            if self._pid != os.getpid():
                return  # inherited from the parent: not ours to say
            dirs, self._dirs = list(self._dirs), {}
        data = Goodbye(socket.gethostname(), os.getpid()).encode()
        for directory in dirs:
            with contextlib.suppress(Exception):
                _send(data, directory)


_GOODBYES = _Goodbyes()


def own_socket_name(uid: int) -> str:
    """The socket a root daemon keeps for user `uid` alone."""
    return f"events-{uid}.sock"


def _send(data: bytes, state_dir: str) -> bool:
    if len(data) > MAX_EVENT_BYTES:
        return False
    try:
        directory = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no state dir: no daemon
    try:
        if not _trusted(os.fstat(directory), directory=True):
            return False
        return any(
            _send_to(directory, name, data) for name in (own_socket_name(os.geteuid()), SOCKET_NAME)
        )
    finally:
        os.close(directory)


def _send_to(directory: int, name: str, data: bytes) -> bool:
    """Hand `data` to the socket `name` in the state dir, if it is ours or root's."""
    try:
        info = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return False
    if not _trusted(info, directory=False):
        return False
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    with sender, contextlib.suppress(OSError):
        sender.sendto(data, socket.MSG_DONTWAIT, f"/proc/self/fd/{directory}/{name}")
        return True
    return False


def _trusted(info: os.stat_result, directory: bool) -> bool:
    """A state dir we may trust (ours or root's, not writable by others), or a socket of ours
    or root's (a socket is writable by whoever may send to it)."""
    if info.st_uid not in (os.getuid(), 0):
        return False
    if directory:
        return stat.S_ISDIR(info.st_mode) and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stat.S_ISSOCK(info.st_mode)
