"""The `lfs df` probe: the MDTs and OSTs a new checkpoint can meet, marked by layout and, with
several MDTs, by the directory's (§4)."""

from __future__ import annotations

from dataclasses import replace

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.df import lfs_df_applies, read_targets
from fsprobe.lustre.placement import meets_mdt
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
    if any(t.kind == "MDT" and t.index > 0 for t in targets):  # DNE: the directory's MDTs
        ttl = max(settings.cache_seconds, settings.timeout)
        mdts = caches.placements.known_mdts(directory, binary, ttl, deadline)
        targets = tuple(
            replace(t, in_layout=meets_mdt(t.index, mdts)) if t.kind == "MDT" else t
            for t in targets
        )
    try:
        placement = caches.placements.read(directory, mount, binary, settings, deadline)
    except ProbeFailure:
        return targets
    return placement.mark(targets)
