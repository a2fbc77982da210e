"""The daemon's store: latest results, error counters, write history, histograms, verdicts."""

from __future__ import annotations

import subprocess
import sys
import threading

from fsprobe.daemon.memory import Remembered
from fsprobe.daemon.savers import Saver
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.events.admission import Sender
from fsprobe.events.event import Goodbye, SaveEvent
from fsprobe.exporters.view import LATENCY_BUCKETS, Histogram
from fsprobe.model import (
    FilesystemInfo,
    ProbeResult,
    Status,
    WriteProbeResult,
)
from fsprobe.policy import Policy

NOW = 1_700_000_000.0


def fs(avail_ratio: float = 0.5, files_free_ratio: float = 0.5) -> FilesystemInfo:
    return FilesystemInfo(
        probed_path="/ckpt",
        mountpoint="/",
        fstype="ext4",
        device="/dev/vda",
        size_bytes=1000 * 4096,
        avail_bytes=int(1000 * 4096 * avail_ratio),
        files=1000,
        files_free=int(1000 * files_free_ratio),
        readonly=False,
        st_dev=1,
    )


def statvfs_ok(at: float = NOW, **kwargs) -> ProbeResult:
    return ProbeResult("statvfs", at, 0.001, value=fs(**kwargs))


def write_result(at: float, error: str | None = None, total: float = 0.004) -> ProbeResult:
    latency = {"create": 0.0005, "write": 0.001, "fsync": total - 0.002, "total": total}
    value = WriteProbeResult(
        ok=error is None,
        bytes=1024,
        latency_seconds=latency,
        step="fsync" if error else None,
        errno=error,
    )
    return ProbeResult("write", at, total, value=value, error=error, message=error or "")


def stuck(probe: str, at: float = NOW) -> ProbeResult:
    return ProbeResult(probe, at, 10.0, error="TIMEOUT", message="hung", stuck=True)


def store_with(*paths: str) -> Store:
    store = Store(clock=lambda: NOW + 1)
    store.configure(TargetSpec(path, Policy(), {"statvfs": 15.0, "write": 60.0}) for path in paths)
    return store


def test_a_new_target_is_unknown_until_probed():
    store = store_with("/ckpt")
    (view,) = store.views()
    assert view.verdict.status is Status.UNKNOWN
    assert view.intervals == {"statvfs": 15.0, "write": 60.0}
    view = store.record("/ckpt", statvfs_ok())
    assert view.verdict.status is Status.OK
    assert view.last_success == {"statvfs": NOW + 0.001}
    assert view.values_trusted and not view.mount_stuck
    assert store.view("/ckpt") is view and store.views() == (view,)


def test_the_verdict_follows_each_result():
    store = store_with("/ckpt")
    view = store.record("/ckpt", statvfs_ok(avail_ratio=0.05))
    assert view.verdict.status is Status.DEGRADED
    assert [reason.code for reason in view.verdict.reasons] == ["space_headroom_low"]
    view = store.record("/ckpt", statvfs_ok(avail_ratio=0.01))
    assert view.verdict.status is Status.UNHEALTHY


def test_errors_are_counted_per_probe_and_errno():
    store = store_with("/ckpt")
    for error in ("EIO", "EIO", "ENOSPC", None):
        store.record("/ckpt", write_result(NOW, error))
    store.record("/ckpt", stuck("statvfs"))
    view = store.view("/ckpt")
    assert view.errors == {("write", "EIO"): 2, ("write", "ENOSPC"): 1, ("statvfs", "TIMEOUT"): 1}


def test_recent_write_errors_keep_the_last_three_completed_probes():
    store = store_with("/ckpt")
    for error in ("EIO", None, "ESTALE", None):
        store.record("/ckpt", write_result(NOW, error))
    store.record("/ckpt", stuck("write"))  # a hung probe is not a completed one
    view = store.view("/ckpt")
    assert view.snapshot.recent_write_errors == (None, "ESTALE", None)
    store.record("/ckpt", statvfs_ok())
    store.record("/ckpt", write_result(NOW, None))
    view = store.view("/ckpt")
    assert view.verdict.status is Status.DEGRADED  # ESTALE is still in the window
    assert any(reason.code == "write_failed" for reason in view.verdict.reasons)


def test_write_latency_histogram_accumulates_whole_write_probes():
    store = store_with("/ckpt")
    store.record("/ckpt", write_result(NOW, total=0.004))
    store.record("/ckpt", write_result(NOW, total=0.3))
    store.record("/ckpt", write_result(NOW, error="EIO", total=45.0))
    store.record("/ckpt", stuck("write"))  # no timing: not observed
    histogram = store.view("/ckpt").write_latency
    assert histogram.count == 3
    assert abs(histogram.total - 45.304) < 1e-9
    cumulative = dict(histogram.cumulative())
    assert cumulative[0.0025] == 0 and cumulative[0.005] == 1
    assert cumulative[0.25] == 1 and cumulative[0.5] == 2
    assert cumulative[30.0] == 2 and cumulative[60.0] == 3 and cumulative[float("inf")] == 3


def test_histogram_bounds_are_inclusive_and_overflow_goes_to_inf():
    histogram = Histogram().observe(0.001).observe(60.0).observe(61.0)
    cumulative = histogram.cumulative()
    assert [bound for bound, _count in cumulative] == [*LATENCY_BUCKETS, float("inf")]
    assert cumulative[0] == (0.001, 1)
    assert cumulative[-2] == (60.0, 2) and cumulative[-1] == (float("inf"), 3)


def test_a_stuck_probe_hides_values_until_the_real_result_comes():
    store = store_with("/ckpt")
    store.record("/ckpt", statvfs_ok())
    view = store.record("/ckpt", stuck("statvfs"))
    assert view.mount_stuck and not view.values_trusted
    assert view.verdict.status is Status.UNHEALTHY
    assert view.last_success["statvfs"] == NOW + 0.001  # still the last real success
    view = store.record("/ckpt", statvfs_ok(at=NOW + 30))
    assert not view.mount_stuck and view.values_trusted
    assert view.verdict.status is Status.OK


def test_reconfigure_keeps_history_and_drops_removed_targets():
    store = store_with("/a", "/b")
    store.record("/a", write_result(NOW, "EIO"))
    store.configure([TargetSpec("/a", Policy(), {"write": 30.0}), TargetSpec("/c")])
    assert [view.path for view in store.views()] == ["/a", "/c"]
    view = store.view("/a")
    assert view.errors == {("write", "EIO"): 1} and view.intervals == {"write": 30.0}
    assert store.record("/b", statvfs_ok()) is None


def test_redirected_pending_bytes_sit_beside_the_snapshot_and_never_judge():
    store = store_with("/a")
    assert store.view("/a").redirected_pending_bytes is None
    before = store.record("/a", statvfs_ok())
    view = store.set_redirected_pending_bytes("/a", 123)
    assert view is store.view("/a") and view.redirected_pending_bytes == 123
    assert view.version > before.version
    assert view.snapshot == before.snapshot and view.verdict == before.verdict
    assert store.set_redirected_pending_bytes("/a", 123) is None  # unchanged: nothing new
    assert store.set_redirected_pending_bytes("/unknown", 5) is None
    assert store.view("/unknown") is None


def test_views_are_consistent_while_another_thread_records():
    store = store_with("/a", "/b")
    stop = threading.Event()

    def writer() -> None:
        at = NOW
        while not stop.is_set():
            at += 1
            store.record("/a", statvfs_ok(at=at))
            store.record("/b", write_result(at, "EIO"))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(2000):
            views = store.views()
            assert [view.path for view in views] == ["/a", "/b"]
            errors = views[1].errors.get(("write", "EIO"), 0)
            assert views[1].write_latency.count == errors
    finally:
        stop.set()
        thread.join()


def test_a_write_probe_that_saves_stand_in_for_is_never_late_by_the_exported_deadline():
    """Saves every 8-10 minutes, a write probe every minute (issue 35): the probe is skipped
    while landed saves stand in, so its last run is up to 10 minutes old. The deadline the
    view exports (`fsprobe_probe_stale_after_seconds`) is the policy's own: that age never
    passes it, though it passes 3 of the probe's configured intervals (the old rule fired)."""
    now = [NOW]
    store = Store(clock=lambda: now[0])
    intervals = {"statvfs": 15.0, "write": 60.0}
    store.configure([TargetSpec("/ckpt", Policy(intervals=intervals), intervals)])
    store.record("/ckpt", write_result(now[0]))
    gaps = [480.0, 600.0, 540.0, 510.0, 590.0] * 4  # 8 to 10 minutes
    next_save, next_probe, oldest = now[0] + gaps[0], now[0] + 60.0, 0.0
    while gaps:
        now[0] += 1.0
        if now[0] >= next_save:
            save = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 1.0, 1, (), now[0], "h", 1)
            store.record_save(Sender(0, 0, 0), save)
            next_save = now[0] + gaps.pop()
        if now[0] >= next_probe:
            if store.skip_write_probe("/ckpt") is None:
                store.record("/ckpt", write_result(now[0]))
            next_probe = now[0] + 60.0 * (1.1 if int(now[0]) % 2 else 0.9)  # jittered
        view = store.view("/ckpt")
        assert view is not None
        age = now[0] - view.snapshot.results["write"].finished_at
        assert age <= view.stale_after["write"], (age, view.stale_after)
        assert "probe_stale" not in {reason.code for reason in view.verdict.reasons}
        oldest = max(oldest, age)
    assert oldest > 3 * 60.0  # what the rule's nominal interval would have called stale
    assert store.view("/ckpt").stale_after == {"statvfs": 45.0, "write": 3 * 600.0}


def test_the_steps_of_the_last_write_probe_stay_while_a_save_stands_in_and_go_when_it_hangs():
    """`fsprobe_write_step_seconds` is the last probe's: a landed save standing in for the
    probe has no steps of its own and leaves them (the series do not come and go with the
    saves); a probe that hangs has none to show."""
    now = [NOW]
    store = Store(clock=lambda: now[0])
    intervals = {"statvfs": 15.0, "write": 60.0}
    store.configure([TargetSpec("/ckpt", Policy(intervals=intervals), intervals)])
    store.record("/ckpt", write_result(now[0], total=0.004))
    probed = {"create": 0.0005, "write": 0.001, "fsync": 0.002}
    assert store.view("/ckpt").write_steps == probed
    now[0] += 30.0
    save = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 1.0, 1, (), now[0], "h", 1)
    store.record_save(Sender(0, 0, 0), save)
    now[0] += 30.0
    assert store.skip_write_probe("/ckpt") is not None  # the save stood in
    view = store.view("/ckpt")
    assert view.snapshot.results["write"].value.latency_seconds == {}  # the save's: no steps
    assert view.write_steps == probed
    store.record("/ckpt", stuck("write", now[0]))
    assert store.view("/ckpt").write_steps == {}


def test_the_exported_deadline_follows_the_policys_stale_after_intervals():
    store = Store(clock=lambda: NOW)
    intervals = {"statvfs": 15.0, "write": 60.0}
    policy = Policy(intervals=intervals, stale_after_intervals=5.0)
    store.configure([TargetSpec("/ckpt", policy, intervals)])
    assert store.view("/ckpt").stale_after == {"statvfs": 75.0, "write": 300.0}


def test_a_recalled_saver_is_kept_only_while_its_pid_holds_the_same_process_in_this_boot():
    """What an earlier daemon knew (`daemon.memory`): a saver whose pid still holds the
    process it was is expected at once, with the save interval; one whose pid is gone or
    reused is not; after a reboot none whose pid can be looked up is."""
    remembered = Remembered(
        savers=(Saver(1000, "h", 41, 500, NOW), Saver(1000, "h", 42, 600, NOW)),
        save_times=(NOW - 600, NOW - 300, NOW),
    )
    for same_boot, starts, expected in (
        (True, {41: 500, 42: 601}, 1),  # 42 now holds another process
        (True, {}, 0),
        (False, {41: 500, 42: 600}, 0),
    ):
        store = Store(clock=lambda: NOW, started=starts.get)
        store.recall({"/ckpt": remembered, "/elsewhere": remembered}, same_boot)
        store.configure([TargetSpec("/ckpt")])
        saves = store.view("/ckpt").saves
        assert saves.savers == expected
        assert saves.interval == (300.0 if expected else None)
        version, memory = store.memory()
        assert version > 0 and set(memory or ()) == ({"/ckpt"} if expected else set())
        assert store.memory(version) == (version, None)  # unchanged: nothing built


def test_a_saver_outside_our_pid_namespace_is_its_uids_alone_and_forgotten_when_long_silent():
    """The kernel gives pid 0 for a sender in another pid namespace (the DaemonSet without
    hostPID): its claim of a host and pid is keyed by its uid too, so a neighbour's save and
    goodbye under the same claim never replace or end it; and since its end cannot be seen,
    it is forgotten after 10 save intervals of silence (a SIGKILLed trainer), not kept."""
    now = [NOW]
    store = Store(clock=lambda: now[0], started=lambda pid: None)
    store.configure([TargetSpec("/ckpt")])
    alice, mallory = Sender(1000, 1000, 0), Sender(1001, 1001, 0)
    for _ in range(4):
        save = SaveEvent("/ckpt/a.pt", "/ckpt/a.pt", 1, 0.1, 1, (), now[0], "node1", 77)
        store.record_save(alice, save)
        now[0] += 60.0
    store.record_save(mallory, SaveEvent("/ckpt/m.pt", None, 0, 0.1, 1, (), NOW, "node1", 77))
    assert store.view("/ckpt").saves.savers == 2
    (view,) = store.goodbye(mallory, Goodbye("node1", 77))
    assert view.saves.savers == 1 and view.saves.interval == 60.0  # Alice's stays
    now[0] += 9 * 60.0
    assert store.forget_gone_savers() == []  # 10 intervals after her last save: not yet
    now[0] += 60.0 + 1
    (view,) = store.forget_gone_savers()
    assert (view.saves.savers, view.saves.interval) == (0, None)


#: In a fresh interpreter that loads nothing else: a memory with a last save, written, read.
ROUND_TRIP = """
import sys
from fsprobe.daemon.memory import Remembered, read_memory, write_memory
from fsprobe.model import LastSave
from fsprobe.state import open_state_dir
last = LastSave(2.0, "ok", 0.5, 1, "/ckpt/a.pt", "/ckpt/a.pt", 0, 7, "h", 1, ())
with open_state_dir(sys.argv[1]) as directory:
    write_memory(directory, {"/ckpt": Remembered(last=last)}, "boot")
    print(read_memory(directory, 1)[1]["/ckpt"].last == last)
"""


def test_the_memory_file_holds_a_last_save_whatever_else_was_loaded(tmp_path):
    """The form of a last save is `fsprobe.report`'s: the memory module loads it itself (it
    raised KeyError on its first write in a process where nothing else had loaded it)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    done = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, str(state)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
