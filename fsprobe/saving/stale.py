"""Cleaning up after crashed saves: temp files whose writer is gone.

A save killed mid-write (SIGKILL, OOM, a node crash) leaves its hidden temp file beside the
checkpoints, often gigabytes that count against the quota that made the next save fail. Before
writing, `fsprobe.save` removes such leftovers from the destination directory, and only there.

Only names that `fsprobe.atomic.parse_temp_name` recognises are candidates: the naming scheme is
the proof that fsprobe created the file, and nothing else is ever deleted. Among those, a file
is stale when it was written on this host by a process that no longer exists, or on another
host (whose processes cannot be checked from here) and not modified for an hour. A writer that
is still alive, this very process included (another thread may be saving), keeps its file.
"""

from __future__ import annotations

import logging
import os
import stat
import time

import psutil

from fsprobe.atomic import TempName, hostname, parse_temp_name

log = logging.getLogger("fsprobe.save")

#: A temp file from another host is stale once it has not been written to for this long.
FOREIGN_STALE_SECONDS = 3600.0


def is_stale(name: TempName, mtime: float, now: float, this_host: str) -> bool:
    """Whether a temp file's writer is certainly gone."""
    if name.host == this_host:
        return name.pid != os.getpid() and not psutil.pid_exists(name.pid)
    return now - mtime > FOREIGN_STALE_SECONDS


def remove_stale_temps(directory: str) -> list[str]:
    """Remove stale temp files of crashed saves in `directory`; returns the paths removed.

    Never raises: cleaning up is a courtesy, and must not be why a save fails.
    """
    this_host, now = hostname(), time.time()
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError as error:
        log.debug("not cleaning %s: %s", directory, error)
        return removed
    for entry in entries:
        name = parse_temp_name(entry.name)
        if name is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue  # gone meanwhile: its writer finished or someone else cleaned
        if not stat.S_ISREG(info.st_mode) or not is_stale(name, info.st_mtime, now, this_host):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("cannot remove the stale temp file %s: %s", entry.path, error)
            continue
        log.info(
            "removed %s (%d bytes), left by a crashed save (pid %d on %s)",
            entry.path,
            info.st_size,
            name.pid,
            name.host,
        )
        removed.append(entry.path)
    return removed
