"""The trainer's side: one datagram to the daemon's socket, sent without ever waiting.

A save calls `report` once at its end. The socket is ``<state dir>/events.sock``, in the same
state dir whose state file the preflight reads, so a sidecar sharing that dir and a node
daemon whose dir the trainer was pointed at (``FSPROBE_STATE_DIR``) both hear it. Sent
with ``MSG_DONTWAIT`` on a non-blocking socket: no daemon (no socket, ECONNREFUSED), a full
queue (EAGAIN) or anything else is silently nothing, and no exception ever reaches the save.

A root daemon also listens on a socket of each target owner's own, ``events-<uid>.sock``
(mode 0600, that user's): the kernel queues only ``net.unix.max_dgram_qlen`` datagrams per
socket, shared by all its senders, so another user flooding ``events.sock`` would find the
shared queue full for us. The sender tries the socket of its effective uid first (the one
the kernel lets it send to) and the shared one if that is missing or refuses the datagram.

The dir is trusted as the state file is (owned by us or root, not writable by others) and
the socket must belong to us or root: an event names the paths of one's checkpoints, and is
not handed to a socket that someone else planted. The dir is opened once and the socket
reached through ``/proc/self/fd`` (no path is resolved twice, and a long state dir does not
run into the 108 bytes of a socket address).

A process that reported a save says goodbye to the same daemons when it exits cleanly
(`atexit`): the daemon then expects no more saves from it (a checkpoint is not overdue for a
job that ended). A process killed outright says nothing; the daemon sees its pid gone.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import stat
import threading

from fsprobe.events.event import MAX_EVENT_BYTES, Goodbye, SaveEvent
from fsprobe.state import default_state_dir

SOCKET_NAME = "events.sock"
#: State dirs a process says goodbye to at most (a trainer reports to one or two).
MAX_GOODBYES = 16

log = logging.getLogger("fsprobe.events")


def report(event: SaveEvent, state_dir: str | None = None) -> bool:
    """Send `event` to the daemon of `state_dir` (the default state dir if None); whether it
    was handed to the kernel. Never raises, never blocks."""
    try:
        directory = state_dir or default_state_dir()
        sent = _send(event.encode(), directory)
        if sent:
            _GOODBYES.remember(directory)
        return sent
    except Exception as error:  # a report must never fail a save
        log.debug("save event for %s not sent: %s", event.requested, error)
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
