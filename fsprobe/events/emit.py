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
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat

from fsprobe.events.event import MAX_EVENT_BYTES, SaveEvent
from fsprobe.state import default_state_dir

SOCKET_NAME = "events.sock"

log = logging.getLogger("fsprobe.events")


def report(event: SaveEvent, state_dir: str | None = None) -> bool:
    """Send `event` to the daemon of `state_dir` (the default state dir if None); whether it
    was handed to the kernel. Never raises, never blocks."""
    try:
        return _send(event.encode(), state_dir or default_state_dir())
    except Exception as error:  # a report must never fail a save
        log.debug("save event for %s not sent: %s", event.requested, error)
        return False


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
            _send_to(directory, name, data)
            for name in (own_socket_name(os.geteuid()), SOCKET_NAME)
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
