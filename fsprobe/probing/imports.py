"""The import-state probe: this node's connection to every MDT and OST of the target's mount.

One ``lctl get_param`` (no RPC) reads the imports of every mount; the target's is the only one
of its filesystem, or else the one ``lfs getname`` names (kept like the layout). With several
MDTs, each is marked by whether a new file in the directory meets it (``lfs getdirstripe``,
kept like the layout). The policy judges the OSTs that the `lfs df` probe marks as reached by
the layout.
"""

from __future__ import annotations

from dataclasses import replace

from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.df import lfs_df_applies
from fsprobe.lustre.imports import lctl_binary, own_mount, read_states
from fsprobe.lustre.placement import meets_mdt
from fsprobe.lustre.pools import fsname_from_mount
from fsprobe.lustre.runner import lfs_binary
from fsprobe.model import LustreImport
from fsprobe.probing.quota import locate
from fsprobe.quota.provider import Deadline
from fsprobe.quota.settings import ServerProbeSettings


def probe_imports(
    target: str, settings: ServerProbeSettings, *, caches: LustreCaches
) -> tuple[LustreImport, ...] | None:
    """The import of every MDT and OST of the target's mount; None when not on Lustre.
    The `lfs getname` answer is kept in `caches`.

    Raises ProbeFailure (ENOENT for a missing `lctl`, or a missing `lfs` where it is needed, the
    errno name of an exit status, TIMEOUT, E2BIG, PARSE, ENODEV) when they cannot be read.
    """
    directory, mount, _identity = locate(target)  # any user may read them: root asks
    if not lfs_df_applies(settings, mount):
        return None
    deadline = Deadline.after(settings.timeout)
    mounts = read_states(lctl_binary(settings.lctl), deadline)
    fsname = fsname_from_mount(mount)
    binary = lfs_binary(settings.lfs)
    ttl = max(settings.cache_seconds, settings.timeout)
    try:
        imports = own_mount(mounts, fsname, None)
    except ValueError:  # several mounts of the filesystem: ask which one is the target's
        fsname, instance = caches.placements.instance(directory, mount, binary, ttl, deadline)
        imports = own_mount(mounts, fsname, instance)
    if not any(t.kind == "MDT" and t.index > 0 for t in imports):
        return imports  # one MDT: every new file meets it
    mdts = caches.placements.known_mdts(directory, binary, ttl, deadline)
    return tuple(
        replace(t, in_layout=meets_mdt(t.index, mdts)) if t.kind == "MDT" else t for t in imports
    )
