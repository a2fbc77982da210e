"""Whether $TMPDIR is on the target's filesystem (else a framework's "move" is a slow copy)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping

from fsprobe.model import TmpdirInfo
from fsprobe.probing.plan import TMPDIR_VARIABLES
from fsprobe.probing.target import OWNER, open_target


def current_tmpdir(environ: Mapping[str, str] | None = None) -> str:
    """The directory `tempfile` would use with this environment.

    `tempfile.gettempdir()` caches its first answer for the life of the process, and the probe
    may run in a worker process started with an older environment, so the variables are passed
    in and only the stdlib's fallback is asked of `tempfile`.
    """
    environ = os.environ if environ is None else environ
    for variable in TMPDIR_VARIABLES:
        candidate = environ.get(variable)
        if candidate and os.path.isdir(candidate):
            return os.path.abspath(candidate)
    return tempfile.gettempdir()


def probe_tmpdir(
    target: str, environ: Mapping[str, str] | None = None, probe_as: str = OWNER
) -> TmpdirInfo:
    tmpdir = current_tmpdir(environ)
    with open_target(target, probe_as) as directory:
        same_device = os.stat(tmpdir).st_dev == os.fstat(directory.fd).st_dev
    if same_device:  # its room is the target's, which statvfs measures: no second statfs there
        return TmpdirInfo(tmpdir, same_device)
    room = os.statvfs(tmpdir)
    return TmpdirInfo(tmpdir, same_device, free_bytes=room.f_bavail * room.f_frsize)
