"""Is something mounted here, and take it away: without ever touching the mount itself.

A hung FUSE mount blocks any `stat` of its mount point, so `os.path.ismount` would hang the
very teardown that is meant to clean it up. These helpers read the kernel's mount table
instead. (fsprobe has its own mount-table code; the test infrastructure does not lean on the
code it tests.)
"""

from __future__ import annotations

import os
import re
import subprocess

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def mountpoints() -> list[str]:
    """Every mount point of this mount namespace, in mount order."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        fields = (line.split(" ") for line in table)
        return [_OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), f[4]) for f in fields if len(f) > 4]


def mountpoint_path(path: str | os.PathLike[str]) -> str:
    """The absolute, symlink-free form of `path` as the mount table spells it.

    Only the parent is resolved: resolving `path` itself would `lstat` the mount's root, which
    asks the filesystem and hangs when the filesystem does.
    """
    head, tail = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(head), tail)


def is_mounted(path: str | os.PathLike[str]) -> bool:
    return mountpoint_path(path) in mountpoints()


def unmount(path: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Unmount `path`, lazily (detached, freed when its last user goes) if it is busy.

    ``umount --no-canonicalize`` does not stat the mount point, so a hung filesystem cannot
    hang it; each attempt is bounded by `timeout` all the same. Does nothing if nothing is
    mounted there; raises RuntimeError if it stays mounted.
    """
    target = mountpoint_path(path)
    problem = "still mounted"
    for argv in (["umount", "-c", target], ["umount", "-c", "-l", target]):
        if target not in mountpoints():
            return
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            problem = result.stderr.strip() or problem
        except subprocess.TimeoutExpired:
            problem = f"{' '.join(argv)} did not return within {timeout} s"
    if target in mountpoints():
        raise RuntimeError(f"cannot unmount {target}: {problem}")
