"""Putting a new directory where an old one is, so that a reader sees the old or the new, whole.

An exchange where the filesystem has it, else two renames through a retired name
(docs/design.md §7, "Putting a directory in place").
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import re
from collections.abc import Callable

from fsprobe.posix.atomic import TempName, hostname, same_version
from fsprobe.posix.tree import remove_tree

log = logging.getLogger("fsprobe.save")

RENAME_NOREPLACE = 1  # <linux/fs.h>
RENAME_EXCHANGE = 2
#: renameat2's system call number where glibc (< 2.28) has no wrapper for it.
_SYSCALL_NUMBERS = {"x86_64": 316, "aarch64": 276, "ppc64le": 357, "s390x": 347}
#: What renameat2 says when this kernel or filesystem cannot exchange.
_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})
_RETIRED_PREFIX = ".fsprobe-retired~"
_RETIRED = re.compile(r"^\.fsprobe-retired~(?P<host>[^~/]+)~(?P<pid>\d+)~(?P<token>[0-9a-f]+)~")
_NAME_MAX = 255


def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    function = getattr(libc, "renameat2", None)  # glibc >= 2.28, musl >= 1.2.2
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        function.argtypes.append(ctypes.c_uint)
        return function
    number = _SYSCALL_NUMBERS.get(platform.machine())
    if number is None:
        return None
    syscall = libc.syscall
    return lambda *args: syscall(ctypes.c_long(number), *args)


_renameat2_call = _renameat2()


def _rename_with(flags: int, dir_fd: int, first: str, second: str) -> bool:
    """renameat2 in `dir_fd`; False where this kernel or filesystem does not support `flags`."""
    if _renameat2_call is None:
        return False
    if _renameat2_call(dir_fd, os.fsencode(first), dir_fd, os.fsencode(second), flags):
        code = ctypes.get_errno()
        if code in _UNSUPPORTED:
            return False
        raise OSError(code, os.strerror(code), second)
    return True


def exchange(dir_fd: int, first: str, second: str) -> bool:
    """Swap `first` and `second` in `dir_fd` atomically; False where that is not supported."""
    return _rename_with(RENAME_EXCHANGE, dir_fd, first, second)


def rename_noreplace(dir_fd: int, source: str, target: str) -> bool:
    """Rename `source` to `target` unless something is at `target`: then False.

    Atomic with ``RENAME_NOREPLACE``; where that is missing (NFS), a check and then a rename,
    which a save landing in between could still lose to (a plain rename replaces only an
    empty directory, and a checkpoint never is one).
    """
    try:
        if _rename_with(RENAME_NOREPLACE, dir_fd, source, target):
            return True
    except FileExistsError:
        return False
    try:
        os.stat(target, dir_fd=dir_fd, follow_symlinks=False)
        return False
    except FileNotFoundError:
        pass
    try:
        os.rename(source, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def replace_if_unchanged(
    dir_fd: int, staging: str, name: str, expected: os.stat_result | None
) -> tuple[bool, str | None]:
    """Put the directory `staging` at `name` only if `name` is still `expected` (None: absent).

    Returns (published, the name the replaced checkpoint now has, to be removed). Not
    published: `name` holds a newer checkpoint (left in place) and `staging` is still there.
    """
    if expected is None:
        return rename_noreplace(dir_fd, staging, name), None
    try:
        if not same_version(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), expected):
            return False, None
    except FileNotFoundError:
        return False, None  # removed meanwhile: whoever did it knew better
    if exchange(dir_fd, staging, name):
        if same_version(os.stat(staging, dir_fd=dir_fd, follow_symlinks=False), expected):
            return True, staging  # the old checkpoint, now under the staging name
        exchange(dir_fd, staging, name)  # a save landed just before: give it its name back
        return False, None
    retired = retired_name(name)
    os.rename(name, retired, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if not same_version(os.stat(retired, dir_fd=dir_fd, follow_symlinks=False), expected):
        rename_noreplace(dir_fd, retired, name)  # a save landed just before: put it back
        return False, None
    if not rename_noreplace(dir_fd, staging, name):
        return False, retired  # a save landed in between; what was retired is older still
    return True, retired


def retired_name(name: str) -> str:
    """A fresh retired name for the checkpoint `name` (see the module docstring)."""
    retired = f"{_RETIRED_PREFIX}{hostname()}~{os.getpid()}~{os.urandom(4).hex()}~{name}"
    if len(os.fsencode(retired)) > _NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, "too long to be retired and restored", name)
    return retired


def parse_retired_name(name: str) -> tuple[TempName, str] | None:
    """(its writer, the checkpoint name it restores to), or None if not a retired name."""
    match = _RETIRED.match(name)
    if match is None:
        return None
    original = name[match.end() :]
    return TempName(match["host"], int(match["pid"]), original), original


def replace_in_two_steps(dir_fd: int, staging: str, name: str) -> str:
    """Retire `name`, rename `staging` to it; returns the retired name (to remove later).

    If the second rename fails, the first is undone, so that the old checkpoint is back.
    """
    retired = retired_name(name)
    os.rename(name, retired, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    try:
        os.rename(staging, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        try:
            os.rename(retired, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as error:
            log.error(
                "could not put the previous checkpoint %s back from %s: %s", name, retired, error
            )
        raise
    return retired


def restore_or_remove_retired(dir_fd: int, retired: str, original: str) -> None:
    """A crashed two-step replace left `retired`: restore it to `original`, or remove it."""
    try:
        os.stat(original, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(retired, original, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        log.warning(
            "restored the checkpoint %s from %s (a save crashed replacing it)", original, retired
        )
        return
    if remove_tree(dir_fd, retired):
        log.info("removed %s, a checkpoint replaced by a save that crashed after it", retired)
