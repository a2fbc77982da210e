"""The resource limits a login of a user gets, for root's processes run as that user.

Read as ``pam_limits`` reads them, only ever lowered from root's (docs/security.md).
"""

from __future__ import annotations

import glob
import grp
import os
import resource
from collections.abc import Iterable

LIMITS_FILES = ("/etc/security/limits.conf", "/etc/security/limits.d/*.conf")
#: Longer than any real limits file; the rest is not read.
_MAX_BYTES = 1 << 20
_RESOURCES = {
    "core": resource.RLIMIT_CORE,
    "data": resource.RLIMIT_DATA,
    "fsize": resource.RLIMIT_FSIZE,
    "memlock": resource.RLIMIT_MEMLOCK,
    "nofile": resource.RLIMIT_NOFILE,
    "rss": resource.RLIMIT_RSS,
    "stack": resource.RLIMIT_STACK,
    "cpu": resource.RLIMIT_CPU,
    "nproc": resource.RLIMIT_NPROC,
    "as": resource.RLIMIT_AS,
    "sigpending": resource.RLIMIT_SIGPENDING,
    "msgqueue": resource.RLIMIT_MSGQUEUE,
}
#: In KiB in limits.conf (pam_limits multiplies them); the others are counts or seconds.
_KIB = frozenset({"core", "data", "fsize", "memlock", "rss", "stack", "as"})
#: A login's limits where no line says otherwise: (soft, hard).
LOGIN_DEFAULTS = {resource.RLIMIT_NOFILE: (1024, 524288), resource.RLIMIT_CORE: (0, 0)}


def login_limits(user: str, groups: Iterable[int]) -> dict[int, tuple[int, int]]:
    """{resource: (soft, hard)} that a login of `user` (with `groups`) would get."""
    group_names = set()
    for gid in groups:
        try:
            group_names.add(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    limits = dict(LOGIN_DEFAULTS)
    ranks: dict[tuple[int, int], int] = {}  # (resource, 0 soft / 1 hard) -> rank of its line
    for domain, kind, item, value in _lines():
        rank = _rank(domain, user, group_names)
        if rank == 0:
            continue
        number = _value(item, value)
        if item not in _RESOURCES or number is None:
            continue
        limit = _RESOURCES[item]
        soft, hard = limits.get(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        for which in (0, 1):
            if kind not in ("-", ("soft", "hard")[which]) or ranks.get((limit, which), 0) > rank:
                continue
            ranks[(limit, which)] = rank
            soft, hard = (number, hard) if which == 0 else (soft, number)
        limits[limit] = (soft, hard)
    return limits


def _rank(domain: str, user: str, group_names: set[str]) -> int:
    """How specific a line's domain is for this user: 0 when it is not about them."""
    if domain == user:
        return 3
    if domain.startswith("@") and domain[1:] in group_names:
        return 2
    return 1 if domain == "*" else 0


def lower_to(limits: dict[int, tuple[int, int]]) -> None:
    """Lower this process's limits to `limits` (never raise one)."""
    for limit, (soft, hard) in limits.items():
        current_soft, current_hard = resource.getrlimit(limit)
        hard = _smaller(hard, current_hard)
        soft = _smaller(_smaller(soft, current_soft), hard)
        resource.setrlimit(limit, (soft, hard))


def _smaller(first: int, second: int) -> int:
    if first == resource.RLIM_INFINITY:
        return second
    if second == resource.RLIM_INFINITY:
        return first
    return min(first, second)


def _value(item: str, value: str) -> int | None:
    if value in ("unlimited", "infinity", "-1"):
        return resource.RLIM_INFINITY
    try:
        number = int(value)
    except ValueError:
        return None
    if number < 0:
        return None
    return number * 1024 if item in _KIB else number


def _lines() -> list[tuple[str, str, str, str]]:
    """(domain, type, item, value) of every line of the limits files, in pam_limits' order."""
    paths = [LIMITS_FILES[0], *sorted(glob.glob(LIMITS_FILES[1]))]
    lines = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not os.path.isfile(f"/proc/self/fd/{fd}"):
                continue
            text = os.read(fd, _MAX_BYTES).decode("utf-8", "replace")
        finally:
            os.close(fd)
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) == 4:
                lines.append((fields[0], fields[1], fields[2], fields[3]))
    return lines
