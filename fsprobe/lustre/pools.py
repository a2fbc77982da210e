"""OST pools (``lfs pool_list FSNAME.POOL``), the filesystem's name, and `lfs --version`.

The path form of ``pool_list`` is not used (up to 2.12 it printed the path, LU-12473).
"""

from __future__ import annotations

import re

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.runner import LfsRun, status_error_name
from fsprobe.model import Mount

#: The first version whose `lfs quota` takes ``--pool``.
POOL_QUOTA_VERSION = (2, 14)
#: The oldest `lfs` whose output fsprobe reads (before it, ``Disk quotas for user ...``).
OLDEST_VERSION = (2, 10)

_SOURCE = re.compile(r":/([A-Za-z0-9_-]{1,8})(?:/.*)?$")
_POOL_HEADER = re.compile(r"^Pool: (\S+)$")
_MEMBER = re.compile(r"^(\S+)_UUID$")
_VERSION = re.compile(r"^lfs (\d+)\.(\d+)(?:[.\w+~-]*)$")
_GETNAME = re.compile(r"^(\S+)-([0-9a-f]+) \S.*$")


def _failed(run: LfsRun) -> ProbeFailure:
    said = run.stderr.strip() or "no message"
    return ProbeFailure(status_error_name(run.status), f"{run.command}: {said}")


def fsname_from_mount(mount: Mount | None) -> str | None:
    """The filesystem name in a Lustre client mount's source, or None when it shows none."""
    if mount is None:
        return None
    match = _SOURCE.search(mount.source)
    return match.group(1) if match else None


def parse_getname_instance(run: LfsRun) -> tuple[str, str]:
    """The filesystem name and the mount's instance from ``lfs getname DIR``."""
    if run.status != 0:
        raise _failed(run)
    lines = run.stdout.splitlines()
    match = _GETNAME.match(lines[0]) if len(lines) == 1 else None
    if match is None:
        raise ProbeFailure(PARSE, f"{run.command}: cannot read {run.stdout.strip()[:200]!r}")
    return match.group(1), match.group(2)


def parse_pool_members(run: LfsRun, fsname: str, pool: str) -> frozenset[str]:
    """The OSTs (names without ``_UUID``) of `pool` from ``lfs pool_list FSNAME.POOL``."""
    if run.status != 0:
        raise _failed(run)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    header = _POOL_HEADER.match(lines[0]) if lines else None
    if header is None or header.group(1) != f"{fsname}.{pool}":
        first = lines[0] if lines else ""
        raise ProbeFailure(PARSE, f"{run.command}: expected 'Pool: {fsname}.{pool}', not {first!r}")
    members = set()
    for line in lines[1:]:
        member = _MEMBER.match(line.strip())
        if member is None:
            raise ProbeFailure(PARSE, f"{run.command}: cannot read {line.strip()!r}")
        members.add(member.group(1))
    return frozenset(members)


def parse_printed_version(run: LfsRun) -> tuple[tuple[int, int], str]:
    """(major, minor) from ``lfs --version``, and the version as it printed it (``2.15.3``)."""
    match = _VERSION.match(run.stdout.strip()) if run.status == 0 else None
    if match is None:
        said = (run.stdout.strip() or run.stderr.strip()) or "nothing"
        raise ProbeFailure(PARSE, f"{run.command}: cannot read a version in {said!r}")
    return (int(match.group(1)), int(match.group(2))), match.group(0)[len("lfs ") :]


def too_old(printed: str) -> ProbeFailure:
    """The failure of an `lfs` older than `OLDEST_VERSION`, naming what it printed."""
    oldest = ".".join(map(str, OLDEST_VERSION))
    return ProbeFailure(
        "EOPNOTSUPP",
        f"lfs {printed} is older than fsprobe supports: it reads the output of lfs {oldest} and "
        "later; install a newer Lustre client (or name one with --lfs)",
    )
