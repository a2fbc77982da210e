"""The `lfs df` probe: the MDTs and OSTs a new checkpoint can meet, marked by layout (§4)."""

from __future__ import annotations

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.df import lfs_df_applies, read_targets
from fsprobe.lustre.runner import lfs_binary
from fsprobe.model import LustreTarget
from fsprobe.probing.quota import locate
from fsprobe.quota.provider import Deadline
from fsprobe.quota.settings import ServerProbeSettings


def probe_lfs_df(
    target: str, settings: ServerProbeSettings, *, caches: LustreCaches
) -> tuple[LustreTarget, ...] | None:
    """Every MDT and OST of the target's filesystem; None when `lfs df` does not apply.
    Answers are kept in `caches`.

    Raises ProbeFailure (ENOENT for a missing `lfs`, the errno name of the exit status, TIMEOUT,
    E2BIG, PARSE) when the tables cannot be read. Targets that lfs could not ask are included with
    unknown sizes; inactive ones with ``active=False``.
    """
    directory, mount, _identity = locate(target)  # any user may ask `lfs df`: root asks
    if not lfs_df_applies(settings, mount):
        return None
    deadline = Deadline.after(settings.timeout)
    binary = lfs_binary(settings.lfs)
    caches.placements.check_supported(binary, deadline)
    targets = read_targets(directory, mount, binary, settings, deadline, caches.df)
    try:
        placement = caches.placements.read(directory, mount, binary, settings, deadline)
    except ProbeFailure:
        return targets
    return placement.mark(targets)
