"""The daemon and redirected checkpoints: counted in a metric, copied back with --sync-redirected.

A save that `fsprobe.save` redirected to a fallback directory is recorded in that directory's
manifest; the daemon, given the fallback, exports how many bytes wait to go back to each target
(`fsprobe_redirected_pending_bytes`, alert `FsprobeRedirectedCheckpointsPending`) and, when
asked, copies them back once the target can take them. Both are tasks of the daemon, not
probes: however long a copy takes, the target's verdict is the probes' alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil

import fsprobe
from fsprobe.daemon.config import TargetConfig
from fsprobe.daemon.tasks import SYNC_DEADLINE, planned_tasks
from fsprobe.exporters.view import TargetView
from fsprobe.model import Snapshot
from fsprobe.policy import Policy, evaluate
from fsprobe.posix.atomic import parse_temp_name
from fsprobe.probing.plan import ProbeSettings
from fsprobe.redirect.areas import fallback_of, prepare_directory, redirect_path
from fsprobe.redirect.manifest import MAX_AREA_ENTRIES, new_entry, pending, record
from fsprobe.redirect.sync import fair_order
from tests.support.crash import a_while_ago, killed_mid_save, leftovers
from tests.support.daemon_process import DaemonProcess, clean_environment, run_fsprobe


def redirected_save(target: Path, fallback: Path, payload: bytes) -> Path:
    """Save into `target` while it is mounted read-only, so that the save lands in `fallback`."""
    subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)], check=True)
    try:
        result = fsprobe.atomic_write(
            str(target / "last.ckpt"), lambda f: f.write(payload), fallback_dirs=[str(fallback)]
        )
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert result.redirected, result
    return Path(result.path)


def daemon_config(tmp_path: Path, target: Path, *fallbacks: Path) -> Path:
    config = tmp_path / "fsprobe.toml"
    dirs = json.dumps([str(fallback) for fallback in fallbacks])
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.5\nwrite_probe = false\n"
        'quota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\nfallback_dirs = {dirs}\n'
    )
    return config


def state_of(daemon: DaemonProcess, target: Path) -> dict:
    return json.loads((daemon.state_dir / "state.json").read_text())["targets"][str(target)]


def test_pending_bytes_are_exported_and_synced_back_on_request(tmp_path, tmpfs):
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    payload = os.urandom(300_000)
    landed = redirected_save(target, fallback, payload)
    assert landed.is_relative_to(fallback) and landed.read_bytes() == payload
    assert [entry.bytes for entry in pending([str(fallback)])] == [len(payload)]

    config = daemon_config(tmp_path, target, fallback)
    env = clean_environment(TMPDIR=str(target))
    home = tmp_path / "counting"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        daemon.wait_for_value(
            "fsprobe_redirected_pending_bytes", float(len(payload)), path=str(target)
        )
        # Counting is a task of the daemon, not a probe of the target: no probe series for it,
        # nothing in the target's probes or verdict (the import states, Lustre only, are).
        probes = {dict(labels)["probe"] for labels in daemon.metrics()["fsprobe_probe_success"]}
        assert "statvfs" in probes and probes <= {"statvfs", "tmpdir", "imports"}
        assert set(state_of(daemon, target)["probes"]) <= {"statvfs", "tmpdir", "write", "imports"}
    assert not (target / "last.ckpt").exists()  # counting alone never copies

    home = tmp_path / "syncing"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), "--sync-redirected", env=env) as daemon:
        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 0.0, path=str(target))
        line = daemon.wait_for_log("event=sync ")
        assert "action=synced" in line and f"requested={target / 'last.ckpt'}" in line
    assert (target / "last.ckpt").read_bytes() == payload
    assert not landed.exists()
    assert pending([str(fallback)]) == []


def test_a_sync_back_slower_than_three_probe_intervals_leaves_the_target_ok(faultfs, tmp_path):
    """Issue 10: as a probe, a long copy made the target stale (degraded) while it ran."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    fallback, later_fallback = tmp_path / "fallback", tmp_path / "fallback-2"
    fallback.mkdir()
    later_fallback.mkdir()
    payload = os.urandom(3 * 2**20)
    faultfs.ctl.set_readonly(True)
    try:
        result = fsprobe.atomic_write(
            str(target / "last.ckpt"), lambda f: f.write(payload), fallback_dirs=[str(fallback)]
        )
    finally:
        faultfs.ctl.set_readonly(False)
    assert result.redirected
    # Every write of the copy back into the target is slow; the probes' own calls are not.
    slow = faultfs.ctl.delay("write", 1.0, path="*last.ckpt*")

    config = daemon_config(tmp_path, target, fallback, later_fallback)
    env = clean_environment(TMPDIR=str(target))
    with DaemonProcess(tmp_path, "--config", str(config), "--sync-redirected", env=env) as daemon:
        daemon.wait_for_value(
            "fsprobe_redirected_pending_bytes", float(len(payload)), path=str(target)
        )
        faultfs.ctl.wait_blocked(slow, timeout=15)  # the copy back has begun
        started = time.monotonic()
        first_statvfs = daemon.value(
            "fsprobe_probe_last_success_timestamp_seconds", path=str(target), probe="statvfs"
        )

        # Meanwhile another checkpoint is redirected: the count, a task of its own, sees it.
        later = Path(redirect_path(str(later_fallback), str(target / "later.ckpt")))
        prepare_directory(str(later_fallback), str(later))  # where a redirected save puts it
        later.write_bytes(b"x" * 1000)
        record(
            new_entry(
                str(later_fallback),
                str(target / "later.ckpt"),
                str(later),
                1000,
                hashlib.sha256(later.read_bytes()).hexdigest(),
            )
        )
        daemon.wait_for_value(
            "fsprobe_redirected_pending_bytes", float(len(payload) + 1000), path=str(target)
        )

        statuses, reasons = set(), set()
        while not (target / "last.ckpt").exists():
            assert time.monotonic() - started < 60, daemon.log()
            statuses.add(daemon.value("fsprobe_health_status", path=str(target)))
            reasons.update(r["code"] for r in state_of(daemon, target)["reasons"])
            time.sleep(0.1)
        copying = time.monotonic() - started
        assert copying > 3 * 0.5, copying  # longer than three statvfs intervals
        assert statuses == {0.0}, daemon.log()
        assert not reasons & {"probe_stale", "mount_stuck"}
        assert (
            daemon.value(
                "fsprobe_probe_last_success_timestamp_seconds", path=str(target), probe="statvfs"
            )
            > first_statvfs
        )  # the probes went on beside the copy, in the same worker

        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 0.0, path=str(target))
        assert daemon.value("fsprobe_health_status", path=str(target)) == 0.0
    assert (target / "last.ckpt").read_bytes() == payload
    assert (target / "later.ckpt").read_bytes() == b"x" * 1000
    assert pending([str(fallback), str(later_fallback)]) == []


def test_once_counts_and_syncs_back_after_probing(tmp_path, tmpfs):
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    payload = os.urandom(200_000)
    redirected_save(target, fallback, payload)
    config = daemon_config(tmp_path, target, fallback)
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    env = clean_environment(TMPDIR=str(target))
    pending_line = f'fsprobe_redirected_pending_bytes{{path="{target}"}}'

    def once(*args: str) -> str:
        code, _out, err = run_fsprobe(
            "run", "--once", "--config", str(config), "--state-dir", str(tmp_path / "state"),
            "--textfile-dir", str(textfiles), *args, env=env,
        )  # fmt: skip
        assert code == 0, err
        return (textfiles / "fsprobe.prom").read_text()

    assert f"{pending_line} {float(len(payload))}" in once()
    assert not (target / "last.ckpt").exists()
    assert f"{pending_line} 0.0" in once("--sync-redirected")  # judged by the probes just run
    assert (target / "last.ckpt").read_bytes() == payload


def test_a_hung_fallback_delays_the_count_never_the_target_or_the_daemon(tmp_path, faultfs):
    """The count reads the fallback's manifest in the worker; a hung fallback mount blocks that
    one call there, is reported once, and neither the verdict nor SIGTERM waits for it."""
    target = tmp_path / "ckpt"
    target.mkdir()
    fallback = faultfs.mountpoint / "fallback"
    fallback.mkdir()
    config = daemon_config(tmp_path, target, fallback)
    config.write_text(config.read_text().replace("[defaults]\n", "[defaults]\ndeadline = 1.0\n"))
    env = clean_environment(TMPDIR=str(target))
    daemon = DaemonProcess(tmp_path, "--config", str(config), env=env).start()
    rule = faultfs.ctl.block("*", path="/fallback*")
    try:
        line = daemon.wait_for_log("event=task_overdue")
        assert f"target={target} task=count errno=TIMEOUT" in line
        assert faultfs.ctl.rule(rule)["waiting"] >= 1
        before = psutil.Process(daemon.pid).cpu_times()
        time.sleep(6 * 0.5)  # six intervals: the task is not started again while it hangs
        after = psutil.Process(daemon.pid).cpu_times()
        # ... and the scheduler sleeps meanwhile (an overdue run is no reason to wake up).
        assert (after.user + after.system) - (before.user + before.system) < 0.3
        assert daemon.log().count("event=task_overdue") == 1, daemon.log()
        assert faultfs.ctl.rule(rule)["waiting"] == 1
        assert daemon.value("fsprobe_health_status", path=str(target)) == 0.0
        daemon.send(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, daemon.log()
        assert faultfs.ctl.rule(rule)["waiting"] == 1  # exited while the count still hangs
    finally:
        faultfs.ctl.remove(rule)
        daemon.stop()


def test_a_superseded_copy_is_reported_once_and_is_not_pending(tmp_path, tmpfs):
    """A redirected copy whose original was saved again since is kept (by design), yet it was
    counted in fsprobe_redirected_pending_bytes, so FsprobeRedirectedCheckpointsPending never
    cleared, and the daemon logged "superseded ... kept both" every round (177 lines in 15
    minutes of a soak)."""
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    landed = redirected_save(target, fallback, os.urandom(300_000))
    time.sleep(0.05)
    (target / "last.ckpt").write_bytes(b"a newer save")  # the trainer saved again since
    config = daemon_config(tmp_path, target, fallback)
    env = clean_environment(TMPDIR=str(target))
    with DaemonProcess(tmp_path, "--config", str(config), "--sync-redirected", env=env) as daemon:
        daemon.wait_for_log("event=redirect_superseded", timeout=30)
        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 0.0, path=str(target))
        time.sleep(2.0)  # four more rounds of sync and count
        assert daemon.value("fsprobe_redirected_pending_bytes", path=str(target)) == 0.0
        log = daemon.log()
    [line] = [line for line in log.splitlines() if "event=redirect_superseded" in line]
    assert f"copy={landed}" in line, line
    assert "action=superseded" not in log  # not as a sync outcome every round either
    assert landed.exists()  # kept, as documented (--prune-superseded removes it)
    assert (target / "last.ckpt").read_bytes() == b"a newer save"


_KILLED_IN_THE_FALLBACK = """
import os, sys, time, fsprobe
def write(staging):
    with open(os.path.join(staging, "shard-0.pt"), "wb") as shard:
        shard.write(os.urandom(100_000))
    print("shard 0", flush=True)
    time.sleep(120)  # killed here
fsprobe.save_dir(sys.argv[1], write, fallback_dirs=[sys.argv[2]])
"""


def test_a_killed_directory_save_in_a_fallback_is_cleaned_by_the_next_sync(tmp_path, tmpfs):
    """A save_dir redirected to a fallback and killed there left its staging directory in the
    user's area, where no later save (they go to the target again) or sync removed it."""
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    landed = redirected_save(target, fallback, os.urandom(1000))  # an entry of that directory
    subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)], check=True)
    try:
        with killed_mid_save(_KILLED_IN_THE_FALLBACK, str(target / "ckpt-7"), str(fallback)) as (
            saver
        ):
            assert saver.stdout.readline().split() == ["shard", "0"]
    finally:
        subprocess.run(["umount", str(target)], check=True)
    [staging] = leftovers(landed.parent)
    assert parse_temp_name(staging).pid == saver.pid
    a_while_ago(landed.parent / staging)

    done = run_fsprobe("sync", "--fallback-dir", str(fallback), env=clean_environment())
    assert done[0] == 0, done
    assert (target / "last.ckpt").exists()  # the entry went home
    assert not landed.parent.exists()  # the staging directory went, and so its directory


def test_each_sync_round_of_the_daemon_starts_with_another_user():
    """The daemon's sync rounds are numbered per target, so that root's sync starts each round
    with another user's run (`fair_order`), and they share the task's deadline: the round that
    the worker runs is given its number, the cap on entries and the deadline as real values."""
    target = TargetConfig(
        "/ckpt", ProbeSettings(), {}, fallback_dirs=("/scratch",), sync_redirected=True
    )
    snapshot = Snapshot("/ckpt")
    view = TargetView("/ckpt", snapshot, evaluate(snapshot, Policy(), time.time(), None, None))
    work = planned_tasks(target)["sync"].work
    rounds = [work(view).keywords for _ in range(3)]
    assert [round_["rotation"] for round_ in rounds] == [0, 1, 2]
    assert {round_["round_seconds"] for round_ in rounds} == {SYNC_DEADLINE}
    assert {round_["max_entries"] for round_ in rounds} == {MAX_AREA_ENTRIES}
    runs = [("/scratch", 1001), ("/scratch", 1002), ("/scratch", 1003)]
    firsts = [fair_order(runs, round_["rotation"])[0][1] for round_ in rounds]
    assert firsts == [1001, 1002, 1003]


def test_a_redirect_its_save_event_reports_is_counted_without_configuring_the_fallback(
    tmp_path, tmpfs, monkeypatch
):
    """The trainer's own fallback (the admin never configured it): its redirected save's event
    says where it landed, and the daemon counts that fallback for the target from then on."""
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "trainer-fallback"
    fallback.mkdir()
    config = daemon_config(tmp_path, target)  # no fallback_dirs
    home = tmp_path / "daemon"
    home.mkdir()
    env = clean_environment(TMPDIR=str(target))
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        assert daemon.value("fsprobe_redirected_pending_bytes", path=str(target)) is None
        monkeypatch.setenv("FSPROBE_STATE_DIR", str(daemon.state_dir))
        payload = os.urandom(200_000)
        redirected_save(target, fallback, payload)
        daemon.wait_for_value(
            "fsprobe_redirected_pending_bytes", float(len(payload)), path=str(target)
        )


def test_root_syncs_only_the_fallbacks_the_admin_configured():
    """A fallback seen in save events is counted, never synced by root (`sync_redirected`
    covers the configured ones alone: a trainer's own fallback is hers to sync)."""
    seen = {"/ckpt": ("/home/alice/fallback",)}
    opted_in = TargetConfig("/ckpt", ProbeSettings(), {}, sync_redirected=True)
    snapshot = Snapshot("/ckpt")
    view = TargetView("/ckpt", snapshot, evaluate(snapshot, Policy(), time.time(), None, None))
    tasks = planned_tasks(opted_in, lambda path: seen.get(path, ()))
    assert set(tasks) == {"count"}
    count = tasks["count"].work(view)
    assert count is not None and count.args[0] == ("/home/alice/fallback",)
    assert planned_tasks(opted_in)["count"].work(view) is None  # nothing seen: nothing to do
    configured = TargetConfig(
        "/ckpt", ProbeSettings(), {}, fallback_dirs=("/scratch",), sync_redirected=True
    )
    tasks = planned_tasks(configured, lambda path: seen.get(path, ()))
    assert tasks["sync"].work(view).args[0] == ("/scratch",)
    assert tasks["count"].work(view).args[0] == ("/scratch", "/home/alice/fallback")


def test_a_save_event_names_its_fallback_only_through_an_area_of_its_sender():
    requested = "/lustre/ckpt/step-1.pt"
    assert fallback_of(requested, "/scratch/fb/uid-1000/lustre/ckpt/step-1.pt", 1000) == (
        "/scratch/fb"
    )
    private = "/scratch/fb/uid-1000.0123456789abcdef/lustre/ckpt/step-1.pt"
    assert fallback_of(requested, private, 1000) == "/scratch/fb"
    for landed, uid in (
        ("/scratch/fb/uid-1000/lustre/ckpt/step-1.pt", 1001),  # someone else's area
        ("/scratch/fb/other/lustre/ckpt/step-1.pt", 1000),  # not an area
        ("/scratch/fb/uid-1000/lustre/ckpt/step-2.pt", 1000),  # not this save's copy
        ("/uid-1000/lustre/ckpt/step-1.pt", 1000),  # no fallback above the area
        ("/scratch/../fb/uid-1000/lustre/ckpt/step-1.pt", 1000),  # not normal
    ):
        assert fallback_of(requested, landed, uid) is None, landed


def test_a_fallback_that_does_not_exist_is_named_once_in_the_log(tmp_path):
    """A configured fallback that is missing (a typo, scratch not mounted on this node) cannot be
    synced back from: the daemon says so once, not every round, and keeps the rest going."""
    target, there, missing = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "scratch"
    target.mkdir()
    there.mkdir()
    config = daemon_config(tmp_path, target, missing, there)
    with DaemonProcess(tmp_path, "--config", str(config), "--sync-redirected") as daemon:
        daemon.wait_for_log("event=fallback_missing", timeout=30)
        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 0.0, path=str(target))
        time.sleep(2.0)  # four more rounds of sync and count
        log = daemon.log()
    [line] = [line for line in log.splitlines() if "event=fallback_missing" in line]
    assert "level=warning" in line and f"target={target}" in line, line
    assert f"fallback={missing}" in line and "does not exist" in line, line
