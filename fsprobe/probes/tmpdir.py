"""Whether $TMPDIR is on the same filesystem as the target.

Frameworks that stage a checkpoint in $TMPDIR and move it into place get an atomic rename only
when both are on the same device; otherwise the "move" is a slow, non-atomic copy that can fail
half-way with ENOSPC in a small node-local /tmp.
"""

from __future__ import annotations

import os
import tempfile

from fsprobe.model import TmpdirInfo
from fsprobe.mounts import nearest_existing


def current_tmpdir() -> str:
    """The directory `tempfile` would use now.

    `tempfile.gettempdir()` caches its first answer for the life of the process; a daemon or a
    long-lived trainer whose environment changes must see the current one, so the environment is
    read each time and the stdlib is asked only for its fallback.
    """
    for variable in ("TMPDIR", "TEMP", "TMP"):
        candidate = os.environ.get(variable)
        if candidate and os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return tempfile.gettempdir()


def probe_tmpdir(target: str) -> TmpdirInfo:
    tmpdir = current_tmpdir()
    same_device = os.stat(tmpdir).st_dev == os.stat(nearest_existing(target)).st_dev
    return TmpdirInfo(path=tmpdir, same_device=same_device)
