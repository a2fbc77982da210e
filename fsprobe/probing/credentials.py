"""Acting as a user in one thread: the write probe's calls made with her fsuid, groups and no
capability (docs/design.md §4, "Who probes"); everything is put back on the way out.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
from collections.abc import Iterator
from typing import Any

from fsprobe.posix.identity import Identity

#: The raw setgroups system call (glibc's setgroups() broadcasts to every thread).
_SETGROUPS = {"x86_64": 116, "aarch64": 159, "ppc64le": 81, "s390x": 206}
#: <linux/capability.h>: _LINUX_CAPABILITY_VERSION_3, two 32-bit sets.
_CAPABILITY_VERSION = 0x20080522
_NO_CHANGE = 0xFFFFFFFF  # setfsuid(-1): only reports the current fsuid


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_Sets: Any = _Data * 2  # ctypes array type: mypy sees no type in it
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, call: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{call}: {os.strerror(code)}")


def _set_groups(groups: tuple[int, ...]) -> None:
    number = _SETGROUPS.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no per-thread setgroups known on {platform.machine()}")
    array = (ctypes.c_uint32 * max(1, len(groups)))(*groups)
    _check(_libc.syscall(number, len(groups), array), "setgroups")


def _capabilities() -> _Sets:
    sets = _Sets()
    _check(_libc.capget(ctypes.byref(_Header(_CAPABILITY_VERSION, 0)), sets), "capget")
    return sets


def _set_capabilities(sets: _Sets) -> None:
    _check(_libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION, 0)), sets), "capset")


def _set_fs_ids(uid: int, gid: int) -> None:
    """setfsgid/setfsuid never fail loudly: they return the old ID; the new one is checked."""
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    if _libc.setfsuid(_NO_CHANGE) != uid or _libc.setfsgid(_NO_CHANGE) != gid:
        raise PermissionError(errno.EPERM, f"cannot act as uid {uid} and gid {gid} here")


@contextlib.contextmanager
def acting_as(identity: Identity) -> Iterator[None]:
    """Make this thread's file system calls as `identity` until the block ends.

    Nothing changes when the process already is `identity` (a user's own `fsprobe check`).
    PermissionError when it cannot switch (not root), OSError(ENOSYS) where the raw setgroups
    system call is not known.
    """
    if identity.is_process():
        yield
        return
    saved_groups = tuple(os.getgroups())  # the kernel's per-thread list: this thread's
    saved_uid, saved_gid = _libc.setfsuid(_NO_CHANGE), _libc.setfsgid(_NO_CHANGE)
    saved_capabilities = _capabilities()
    with contextlib.ExitStack() as undo:  # each step undone only once it was made
        _set_groups(identity.groups)
        undo.callback(_set_groups, saved_groups)
        undo.callback(_set_fs_ids, saved_uid, saved_gid)
        _set_fs_ids(identity.uid, identity.gid)
        # Run last on the way out: raising what is permitted needs no capability, and the
        # two undo steps above need CAP_SETGID back.
        undo.callback(_set_capabilities, saved_capabilities)
        empty = _capabilities()
        for half in empty:
            half.effective = 0
        _set_capabilities(empty)
        yield
