"""Which targets a sender may report saves into: those it could have written to.

Decided from the kernel's credentials and the daemon's last stat of the target, never by
touching the path (docs/security.md, "Save events").
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from fsprobe.model import DirectoryOwner


@dataclass(frozen=True)
class Sender:
    """Who sent a datagram, as the kernel says; `groups` as /proc said while it lived."""

    uid: int
    gid: int
    pid: int
    groups: frozenset[int] = frozenset()


def groups_of(pid: int, uid: int, gid: int, proc: str = "/proc") -> frozenset[int]:
    """The groups of process `pid`, if it still runs as `uid` (else only `gid`: a pid
    reused by someone else must not lend its groups)."""
    found = {gid}
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


def may_report(sender: Sender, owner: DirectoryOwner | None, daemon_uid: int | None = None) -> bool:
    """Whether `sender` could have saved into the directory owned as `owner` (None: not
    known yet, so no)."""
    if sender.uid == 0 or sender.uid == (os.getuid() if daemon_uid is None else daemon_uid):
        return True
    if owner is None:
        return False
    if owner.uid == sender.uid:
        return True
    if owner.mode & stat.S_IWGRP and owner.gid in (sender.groups or {sender.gid}):
        return True
    return bool(owner.mode & stat.S_IWOTH)
