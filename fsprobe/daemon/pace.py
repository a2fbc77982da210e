"""When the daemon runs `lfs df`: the per-OST fullness only as often as the space needs, and in
the same wake of the OST imports as the quota probe.

Every `lfs df` sends a statfs RPC to every OST and wakes every OST import this node let go idle
(a CONNECT now, a DISCONNECT after `idle_timeout`, 20 s): load that `idle_timeout` exists to
spare the servers. `lfs quota` wakes them too (it asks every OST for the usage). So `lfs df`
runs right after a quota probe, whose wake it shares: every `lfs_df_interval` (an hour) while
the filesystem and every MDT and OST a new file can meet have room, after every quota probe
while one of them is tight or `lfs df` has not answered yet. Its own timer, one quota interval
later, only runs it when no quota probe came. Costs and the promise: docs/reference.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsprobe.daemon.config import TargetConfig
from fsprobe.exporters.view import TargetView
from fsprobe.model import FilesystemInfo, LustreTarget


def _free_ratio(sizes: Iterable[tuple[int | None, int | None]]) -> float | None:
    """The least free / total of (free, total) pairs that have a total; None if none has."""
    ratios = [free / total for free, total in sizes if free is not None and total]
    return min(ratios, default=None)


def least_free(view: TargetView) -> float | None:
    """The least free ratio, of bytes and inodes, of the filesystem (statvfs) and of every
    active MDT and OST the layout reaches (the last `lfs df`); None when `lfs df` has not
    answered."""
    targets = view.snapshot.value("lfs_df")
    if not isinstance(targets, tuple):
        return None
    reached = [t for t in targets if isinstance(t, LustreTarget) and t.active and t.in_layout]
    pairs = [(t.avail_bytes, t.size_bytes) for t in reached]
    pairs += [(t.files_free, t.files) for t in reached]
    filesystem = view.snapshot.value("statvfs")
    if isinstance(filesystem, FilesystemInfo):
        pairs += [(filesystem.avail_bytes, filesystem.size_bytes)]
        pairs += [(filesystem.files_free, filesystem.files)]
    least = _free_ratio(pairs)
    return 1.0 if least is None else least


def lfs_df_interval(target: TargetConfig, view: TargetView | None) -> float:
    """`lfs_df_interval`, or `quota_interval` when shorter and space is tight (less than
    `lfs_df_tight_ratio` free somewhere a new file can land) or not known yet."""
    quiet = target.intervals["lfs_df"]
    tight = min(quiet, target.intervals["quota"])
    least = least_free(view) if view is not None else None
    if least is None or least < target.lfs_df_tight_ratio:
        return tight
    return quiet


def rides_with_quota(target: TargetConfig, view: TargetView | None) -> bool:
    """Whether `lfs df` runs after the quota probe rather than on a timer of its own: when its
    pace is no shorter than the quota interval."""
    return lfs_df_interval(target, view) >= target.intervals["quota"]


def lfs_df_timer(target: TargetConfig, view: TargetView | None) -> float:
    """The interval of `lfs df`'s own timer: its pace, one quota interval more when a quota
    probe brings it along (the timer only catches a quota probe that did not come)."""
    pace = lfs_df_interval(target, view)
    return pace + target.intervals["quota"] if rides_with_quota(target, view) else pace


def due_after_quota(target: TargetConfig, view: TargetView | None, since: float | None) -> bool:
    """Whether the quota probe that just ended brings `lfs df` along, `since` seconds after the
    last `lfs df` started (None: none yet): when half a quota interval short of its pace, so
    that the quota probe nearest to it does."""
    if not rides_with_quota(target, view):
        return False
    pace = lfs_df_interval(target, view)
    return since is None or since >= pace - target.intervals["quota"] / 2
