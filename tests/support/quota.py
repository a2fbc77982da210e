"""A Lustre-like quota for the fault filesystem: usage, soft and hard limits, grace timers.

The fault filesystem charges every byte and inode of its tree to one quota (there is one owner:
whoever the test pretends to be), so that a test sees the same numbers in three places: the
EDQUOT of a real `write`, the fake `lfs quota` that asks the control socket, and fsprobe's view.

Semantics, for bytes and inodes alike (the way Lustre enforces them):

- usage may reach the hard limit but never exceed it: a change that would take usage above the
  hard limit fails with EDQUOT (the whole request; nothing is charged);
- usage above the soft limit starts a grace timer (its start time is recorded); while the grace
  runs, growth is allowed up to the hard limit; once ``now >= start + grace`` any further growth
  fails with EDQUOT (``grace = 0`` expires at once);
- usage back at or below the soft limit stops the timer; lowering the soft limit below current
  usage starts it; limits can be changed or lifted (``None``) at any time;
- only growth is ever refused: overwriting, shrinking and deleting always pass, as on Lustre.

Bytes are the apparent sizes of regular files (a sparse file counts its full length); inodes are
files, directories and symlinks, not counting the root. This module is pure bookkeeping: the
filesystem reports every change through :meth:`Quota.charge` and :meth:`Quota.release`.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Lustre's default grace period, one week.
DEFAULT_GRACE = 7 * 24 * 3600

RESOURCES = ("bytes", "inodes")


@dataclass
class Limit:
    """One resource's usage, limits and grace timer."""

    used: int = 0
    soft: int | None = None
    hard: int | None = None
    grace: float = DEFAULT_GRACE
    grace_start: float | None = None

    def soft_exceeded(self) -> bool:
        return self.soft is not None and self.used > self.soft

    def grace_expired(self, now: float) -> bool:
        return self.grace_start is not None and now >= self.grace_start + self.grace

    def refusal(self, amount: int, now: float) -> bool:
        """Whether growing usage by `amount` must fail with EDQUOT."""
        if amount <= 0:
            return False
        if self.hard is not None and self.used + amount > self.hard:
            return True
        return self.soft_exceeded() and self.grace_expired(now)

    def update_timer(self, now: float) -> None:
        """Start the grace timer when usage first goes above soft; stop it when it drops back."""
        if not self.soft_exceeded():
            self.grace_start = None
        elif self.grace_start is None:
            self.grace_start = now

    def state(self, now: float) -> str:
        """The worst that applies, named as fsprobe names it.

        ``hard_reached`` > ``grace_expired`` > ``soft_exceeded`` > ``ok``.
        """
        if self.hard is not None and self.used >= self.hard:
            return "hard_reached"
        if self.soft_exceeded():
            return "grace_expired" if self.grace_expired(now) else "soft_exceeded"
        return "ok"

    def to_dict(self, now: float) -> dict[str, Any]:
        expires = None if self.grace_start is None else self.grace_start + self.grace
        return {
            "used": self.used,
            "soft": self.soft,
            "hard": self.hard,
            "grace": self.grace,
            "grace_start": self.grace_start,
            "grace_expires_at": expires,
            "state": self.state(now),
        }


class Quota:
    """Thread-safe usage and limits for the whole tree.

    `lock` is re-entrant and public so that the filesystem can hold it across "check, write,
    charge" and two concurrent writers cannot both squeeze under the same limit.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.lock = threading.RLock()
        self._clock = clock
        self._limits = {name: Limit() for name in RESOURCES}

    def check(self, *, nbytes: int = 0, inodes: int = 0) -> None:
        """Raise EDQUOT if growing usage by these amounts is not allowed now."""
        now = self._clock()
        with self.lock:
            for name, amount in (("bytes", nbytes), ("inodes", inodes)):
                if self._limits[name].refusal(amount, now):
                    raise OSError(errno.EDQUOT, f"{os.strerror(errno.EDQUOT)} ({name})")

    def charge(self, *, nbytes: int = 0, inodes: int = 0) -> None:
        """Record a change of usage (negative amounts free), without checking limits."""
        now = self._clock()
        with self.lock:
            for name, amount in (("bytes", nbytes), ("inodes", inodes)):
                limit = self._limits[name]
                limit.used = max(0, limit.used + amount)
                limit.update_timer(now)

    def release(self, *, nbytes: int = 0, inodes: int = 0) -> None:
        """Record freed usage: the counterpart of :meth:`charge` that reads better at unlink."""
        self.charge(nbytes=-nbytes, inodes=-inodes)

    def set_usage(self, *, nbytes: int, inodes: int) -> None:
        """Replace the usage, e.g. after a rescan of the backing tree."""
        now = self._clock()
        with self.lock:
            for name, value in (("bytes", nbytes), ("inodes", inodes)):
                self._limits[name].used = value
                self._limits[name].update_timer(now)

    def configure(self, resource: str, **fields: Any) -> None:
        """Change `soft`, `hard` and/or `grace` of one resource; ``None`` lifts a limit."""
        if resource not in RESOURCES:
            raise ValueError(f"unknown quota resource {resource!r}")
        unknown = set(fields) - {"soft", "hard", "grace"}
        if unknown:
            raise ValueError(f"unknown quota fields {sorted(unknown)}")
        for key, value in fields.items():
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"quota {resource}.{key} must be a number >= 0 or null")
            if key == "grace" and value is None:
                raise ValueError("a grace period cannot be null")
        now = self._clock()
        with self.lock:
            limit = self._limits[resource]
            for key, value in fields.items():
                setattr(limit, key, value)
            limit.update_timer(now)

    def to_dict(self) -> dict[str, Any]:
        """The `quota` reply of the control socket (shape in the faultfs module docstring)."""
        now = self._clock()
        with self.lock:
            reply: dict[str, Any] = {name: self._limits[name].to_dict(now) for name in RESOURCES}
        reply["now"] = now
        return reply


def scan_usage(root: str) -> tuple[int, int]:
    """(bytes of regular files, inodes) of a tree, the root itself not counted.

    Hard links are counted once, like the filesystem's own accounting does.
    """
    nbytes = inodes = 0
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            inodes += 1
            if stat.S_ISREG(st.st_mode):
                nbytes += st.st_size
    return nbytes, inodes
