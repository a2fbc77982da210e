"""Which mount a path lives on, from ``/proc/self/mountinfo``.

mountinfo names the device as ``major:minor`` and is this mount namespace's table; its mount
points are octal-escaped (``\\040``) and unescaped before comparison.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fsprobe.model import Mount
from fsprobe.posix.paths import is_under

MOUNTINFO = "/proc/self/mountinfo"

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """Undo the kernel's octal escaping of spaces, tabs, newlines and backslashes."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """Parse the text of a mountinfo file; malformed lines are skipped, not fatal."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            device, mountpoint, options = fields[2], fields[4], fields[5]
            fstype, source = fields[separator + 1], fields[separator + 2]
        except (ValueError, IndexError):
            continue
        mounts.append(
            Mount(
                mountpoint=unescape(mountpoint),
                fstype=unescape(fstype),
                source=unescape(source),
                device=device,
                readonly="ro" in options.split(","),
            )
        )
    return mounts


def read_mounts(path: str = MOUNTINFO) -> list[Mount]:
    with open(path, encoding="utf-8", errors="surrogateescape") as table:
        return parse_mountinfo(table.read())


def find_mount(real_path: str, mounts: Iterable[Mount] | None = None) -> Mount | None:
    """The mount that holds `real_path` (already resolved): longest prefix, last mounted wins.

    When several mounts are stacked on the same mount point, the one listed last is the one
    visible, which is why ties go to the later entry.
    """
    best: Mount | None = None
    for mount in read_mounts() if mounts is None else mounts:
        if is_under(real_path, mount.mountpoint) and (
            best is None or len(mount.mountpoint) >= len(best.mountpoint)
        ):
            best = mount
    return best
