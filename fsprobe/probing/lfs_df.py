"""The `lfs df` probe: free space and inodes of the MDTs and OSTs a new checkpoint can meet.

`statvfs` sums the whole filesystem; one full OST still fails the writes striped onto it, and
only `lfs df` shows it. Each OST is marked with the target directory's layout pools that hold
it and whether the layout can place data there at all (`fsprobe.lustre.placement`), so that
the policy judges only the OSTs the checkpoint can land on. When the layout cannot be read,
every OST counts (and the quota probe reports why).
"""

from __future__ import annotations

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.df import lfs_df_applies, read_targets
from fsprobe.lustre.placement import PLACEMENTS
from fsprobe.lustre.runner import lfs_binary
from fsprobe.model import LustreTarget
from fsprobe.probing.quota import locate
from fsprobe.quota.provider import Deadline
from fsprobe.quota.settings import ServerProbeSettings


def probe_lfs_df(target: str, settings: ServerProbeSettings) -> tuple[LustreTarget, ...] | None:
    """Every MDT and OST of the target's filesystem; None when `lfs df` does not apply.

    Raises ProbeFailure (ENOENT for a missing `lfs`, the errno name of the exit status, TIMEOUT,
    E2BIG, PARSE) when the tables cannot be read. Targets that lfs could not ask are included with
    unknown sizes; inactive ones with ``active=False``.
    """
    directory, mount, _identity = locate(target)  # any user may ask `lfs df`: root asks
    if not lfs_df_applies(settings, mount):
        return None
    deadline = Deadline.after(settings.timeout)
    binary = lfs_binary(settings.lfs)
    targets = read_targets(directory, mount, binary, settings, deadline)
    try:
        placement = PLACEMENTS.read(directory, mount, binary, settings, deadline)
    except ProbeFailure:
        return targets
    return placement.mark(targets)
