"""The timetable of the scheduler: intervals, ±10 % jitter, the start window, recovery."""

from __future__ import annotations

import random
import statistics

import pytest

from fsprobe.daemon.schedule import JITTER, START_SPREAD, Key, Schedule

A_STATVFS = ("/a", "statvfs")
A_WRITE = ("/a", "write")
B_STATVFS = ("/b", "statvfs")


def next_due(schedule: Schedule, key: Key, horizon: float = 1e6) -> float:
    """When `key` falls due, to 1e-7 s, found through the public `due` alone."""
    low, high = 0.0, horizon
    assert key in schedule.due(high)
    while high - low > 1e-7:
        middle = (low + high) / 2
        low, high = (low, middle) if key in schedule.due(middle) else (middle, high)
    return high


def test_first_runs_come_within_the_start_window():
    schedule = Schedule(random.Random(1))
    schedule.add(A_STATVFS, 15.0, now=100.0)
    schedule.add(A_WRITE, 60.0, now=100.0)
    schedule.add(("/a", "fast"), 0.5, now=100.0)
    assert 100.0 <= next_due(schedule, A_STATVFS) <= 100.0 + 1.5  # a tenth of 15 s
    assert 100.0 <= next_due(schedule, A_WRITE) <= 100.0 + START_SPREAD
    assert 100.0 <= next_due(schedule, ("/a", "fast")) <= 100.05
    assert schedule.due(99.9) == []
    assert set(schedule.due(100.0 + START_SPREAD)) == {A_STATVFS, A_WRITE, ("/a", "fast")}


def test_due_lists_only_what_has_come_earliest_first():
    schedule = Schedule(random.Random(2))
    schedule.add(A_STATVFS, 15.0, now=0.0)
    schedule.add(B_STATVFS, 15.0, now=0.0)
    first, second = sorted((A_STATVFS, B_STATVFS), key=lambda key: next_due(schedule, key))
    assert schedule.due(schedule.earliest()) == [first]
    assert schedule.due(10.0) == [first, second]
    assert schedule.earliest() == pytest.approx(next_due(schedule, first))


def test_every_interval_is_jittered_within_ten_percent_and_centred():
    schedule = Schedule(random.Random(3))
    schedule.add(A_STATVFS, 15.0, now=0.0)
    gaps = []
    now = 0.0
    for _ in range(2000):
        nxt = schedule.advance(A_STATVFS, now)
        gaps.append(nxt - now)
        now = nxt
    assert min(gaps) >= 15.0 * (1 - JITTER) and max(gaps) <= 15.0 * (1 + JITTER)
    assert min(gaps) < 15.0 * (1 - JITTER / 2) and max(gaps) > 15.0 * (1 + JITTER / 2)
    assert abs(statistics.mean(gaps) - 15.0) < 0.1
    assert len({round(gap, 6) for gap in gaps}) > 1000  # not a fixed offset


def test_jitter_spreads_targets_that_start_in_lockstep():
    schedule = Schedule(random.Random(4))
    keys = [(f"/t{i}", "quota") for i in range(50)]
    for key in keys:
        schedule.add(key, 300.0, now=0.0)
    for key in keys:
        schedule.advance(key, now=0.0)
    times = sorted(next_due(schedule, key) for key in keys)
    assert times[0] >= 270.0 and times[-1] <= 330.0
    assert times[-1] - times[0] > 30.0


def test_a_shorter_interval_on_reload_takes_effect_at_once():
    schedule = Schedule(random.Random(5))
    schedule.add(A_WRITE, 600.0, now=0.0)
    schedule.advance(A_WRITE, now=0.0)
    assert next_due(schedule, A_WRITE) >= 540.0
    schedule.set_interval(A_WRITE, 10.0, now=1.0)
    assert 1.0 + 9.0 <= next_due(schedule, A_WRITE) <= 1.0 + 11.0
    schedule.set_interval(A_WRITE, 1000.0, now=2.0)  # a longer one waits for the next run
    assert next_due(schedule, A_WRITE) <= 12.0


def test_run_now_brings_a_probe_forward_but_never_back():
    schedule = Schedule(random.Random(6))
    schedule.add(A_STATVFS, 15.0, now=0.0)
    schedule.advance(A_STATVFS, now=0.0)
    schedule.run_now(A_STATVFS, now=3.0)
    assert schedule.due(3.0) == [A_STATVFS]
    schedule.run_now(A_STATVFS, now=5.0)
    assert next_due(schedule, A_STATVFS) == pytest.approx(3.0)
    schedule.run_now(("/gone", "statvfs"), now=5.0)  # unknown keys are ignored
    assert ("/gone", "statvfs") not in schedule


def test_retain_forgets_removed_targets():
    schedule = Schedule(random.Random(7))
    for key in (A_STATVFS, A_WRITE, B_STATVFS):
        schedule.add(key, 15.0, now=0.0)
    schedule.retain([B_STATVFS])
    assert A_STATVFS not in schedule and A_WRITE not in schedule
    assert schedule.due(100.0) == [B_STATVFS]
    schedule.retain([])
    assert schedule.earliest() is None


def test_rearm_counts_a_new_interval_from_the_last_start():
    schedule = Schedule(random.Random(5))
    schedule.add(A_STATVFS, 1.0, now=0.0)
    schedule.advance(A_STATVFS, now=10.0)
    schedule.rearm(A_STATVFS, 100.0, started=10.0)  # longer: the short due is dropped
    assert 10.0 + 90.0 <= next_due(schedule, A_STATVFS) <= 10.0 + 110.0
    assert schedule.interval(A_STATVFS) == 100.0
    schedule.rearm(A_STATVFS, 5.0, started=10.0)
    assert 10.0 + 4.5 <= next_due(schedule, A_STATVFS) <= 10.0 + 5.5
