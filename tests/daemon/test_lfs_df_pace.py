"""How often the daemon runs `lfs df`: hourly while there is room, as often as quota while space
is tight where a new file can land (fsprobe/daemon/pace.py; the costs in docs/reference.md)."""

from __future__ import annotations

import dataclasses

import pytest

from fsprobe.daemon.config import LFS_DF_TIGHT_RATIO, Overrides, load
from fsprobe.daemon.pace import due_after_quota, least_free, lfs_df_interval, lfs_df_timer
from fsprobe.exporters.view import TargetView
from fsprobe.model import LustreTarget, Snapshot
from fsprobe.policy import Policy, evaluate
from tests.support.policy import NOW, filesystem_info, probe

GiB = 2**30


def target_config(**defaults):
    config = load(Overrides(paths=("/ckpt",)), environ={})
    (target,) = config.targets
    return dataclasses.replace(target, **defaults) if defaults else target


def ost(index: int, free: float, *, in_layout: bool = True, active: bool = True) -> LustreTarget:
    size = 100 * GiB
    return LustreTarget(
        name=f"proj-OST{index:04x}",
        kind="OST",
        index=index,
        size_bytes=size if active else None,
        avail_bytes=int(size * free) if active else None,
        files=10**6 if active else None,
        files_free=10**6 if active else None,
        active=active,
        in_layout=in_layout,
    )


MDT = LustreTarget("proj-MDT0000", "MDT", 0, 10 * GiB, 9 * GiB, 10**7, 9 * 10**6)


def view(*targets: LustreTarget | None, fs_free: float = 0.5) -> TargetView:
    results = [probe("statvfs", filesystem_info(int(fs_free * 1000), 1000, 100, 90))]
    if targets != (None,):
        results.append(probe("lfs_df", (MDT, *targets)))
    snapshot = Snapshot("/ckpt", {r.probe: r for r in results})
    return TargetView("/ckpt", snapshot, evaluate(snapshot, Policy(), NOW))


def test_the_defaults_are_an_hour_and_the_quota_interval_below_a_fifth_free():
    target = target_config()
    assert (target.intervals["lfs_df"], target.intervals["quota"]) == (3600.0, 300.0)
    assert target.lfs_df_tight_ratio == LFS_DF_TIGHT_RATIO == 0.20


@pytest.mark.parametrize(
    ("targets", "fs_free", "interval"),
    [
        ((ost(0, 0.6), ost(1, 0.5)), 0.5, 3600.0),  # room everywhere
        ((ost(0, 0.6), ost(1, 0.1)), 0.5, 300.0),  # one OST of the layout is tight
        ((ost(0, 0.6), ost(1, 0.01, in_layout=False)), 0.5, 3600.0),  # no new file lands there
        ((ost(0, 0.6), ost(1, 0.0, active=False)), 0.5, 3600.0),  # deactivated: nothing lands
        ((ost(0, 0.6), ost(1, 0.5)), 0.15, 300.0),  # the filesystem is tight
        ((None,), 0.5, 300.0),  # lfs df has not answered (or failed): as often as quota
    ],
)
def test_lfs_df_runs_hourly_with_room_and_as_often_as_quota_when_tight(targets, fs_free, interval):
    assert lfs_df_interval(target_config(), view(*targets, fs_free=fs_free)) == interval


def test_inodes_count_like_bytes():
    full_of_objects = dataclasses.replace(ost(0, 0.9), files_free=10**5 // 2)  # 5 % of 1M left
    assert least_free(view(full_of_objects)) == pytest.approx(0.05)
    assert lfs_df_interval(target_config(), view(full_of_objects)) == 300.0


def test_before_any_result_and_with_a_shorter_setting_the_setting_holds():
    assert lfs_df_interval(target_config(), None) == 300.0
    quick = target_config(intervals={**target_config().intervals, "lfs_df": 60.0})
    assert lfs_df_interval(quick, view(ost(0, 0.1))) == 60.0  # never slower than asked
    assert lfs_df_interval(quick, view(ost(0, 0.9))) == 60.0


def test_the_ratio_is_configurable():
    never_tight = target_config(lfs_df_tight_ratio=0.0)
    assert lfs_df_interval(never_tight, view(ost(0, 0.01))) == 3600.0


def test_lfs_df_comes_after_the_quota_probe_nearest_its_pace_sharing_its_wake():
    """`lfs quota` wakes every OST import anyway: the `lfs df` that follows it within the 20 s
    of `idle_timeout` wakes none again."""
    roomy, tight, target = view(ost(0, 0.6)), view(ost(0, 0.1)), target_config()
    assert due_after_quota(target, roomy, None)  # none yet
    assert not due_after_quota(target, roomy, 3300.0)  # the next quota probe is nearer the hour
    assert due_after_quota(target, roomy, 3460.0)
    assert not due_after_quota(target, tight, 100.0)  # the one that just ran
    assert due_after_quota(target, tight, 290.0)  # every quota probe while tight
    assert (lfs_df_timer(target, roomy), lfs_df_timer(target, tight)) == (3900.0, 600.0)


def test_an_lfs_df_asked_more_often_than_quota_keeps_its_own_timer():
    quick = target_config(intervals={**target_config().intervals, "lfs_df": 60.0})
    assert not due_after_quota(quick, view(ost(0, 0.6)), 1e6)
    assert lfs_df_timer(quick, view(ost(0, 0.6))) == 60.0
