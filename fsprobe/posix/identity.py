"""Who a probe acts as: a uid, the gid a new file gets, the groups that open doors.

How a program started for it (`lfs`) becomes it; a probe thread: `fsprobe.probing.credentials`.
Why: docs/security.md, "Probes".
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass

from fsprobe.posix.limits import login_limits, lower_to

#: Where the kernel says which gid stands for "nobody's" (used as a real gid below).
_OVERFLOW_GID = "/proc/sys/kernel/overflowgid"


@dataclass(frozen=True)
class Identity:
    """The IDs a probe acts with: `gid` is what a new file is charged to, `groups` what the
    kernel checks permissions against (a user's supplementary groups)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def of_process(cls) -> Identity:
        return cls(os.geteuid(), os.getegid(), tuple(os.getgroups()))

    @classmethod
    def of_account(cls, uid: int, gid: int | None = None) -> Identity:
        """`uid` with its account's groups; `gid` (the gid a new file gets) defaults to the
        account's primary group. A uid without an account has only `gid` (or its own number:
        there is no primary group to know)."""
        try:
            account = pwd.getpwuid(uid)
        except KeyError:
            primary = uid if gid is None else gid
            return cls(uid, primary, (primary,))
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
        return cls(uid, account.pw_gid if gid is None else gid, tuple(groups))

    def is_process(self) -> bool:
        """Whether this process already acts as this identity (nothing to switch)."""
        return (self.uid, self.gid) == (os.geteuid(), os.getegid()) and set(self.groups) == set(
            os.getgroups()
        )

    def describe(self) -> str:
        return f"uid {self.uid} (gid {self.gid})"


def exec_as(identity: Identity) -> Callable[[], None]:
    """What a child forked to run a program for `identity` calls before ``exec``.

    The program then runs with the identity's uid and groups and no capability, and the kernel
    marks it *not dumpable*, so that the user cannot trace it and run code of theirs inside
    root's service: ``exec`` leaves a process dumpable only when its real and effective IDs
    agree, so its real gid is made "nobody's" (the overflow gid), its effective gid stays the
    identity's (Lustre checks the effective uid and the groups; the real gid opens nothing).
    The program gets the limits a login of the user would (`fsprobe.posix.limits`), read here,
    before the fork, and only ever lowered from root's: not a service's raised ones.
    The returned function runs between fork and exec in a single-threaded child, so glibc's
    broadcast of ``setgroups`` to every thread reaches only that child. PermissionError here
    for a gid that is the overflow gid itself (nothing left to tell real from effective).
    """
    groups = list(identity.groups)
    limits = login_limits(_account_name(identity.uid), groups)
    real_gid = _overflow_gid()
    if real_gid == identity.gid:
        raise PermissionError(
            f"cannot start a program as {identity.describe()} that it could not trace: "
            "its gid is the overflow gid"
        )

    def become() -> None:
        lower_to(limits)
        os.setgroups(groups)
        os.setresgid(real_gid, identity.gid, identity.gid)
        os.setresuid(identity.uid, identity.uid, identity.uid)

    return become


def _account_name(uid: int) -> str:
    """The account name of `uid`; "" for a uid without one (only ``*`` lines are its)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def _overflow_gid() -> int:
    try:
        with open(_OVERFLOW_GID, encoding="ascii") as source:
            return int(source.read(32))
    except (OSError, ValueError):
        return 65534
