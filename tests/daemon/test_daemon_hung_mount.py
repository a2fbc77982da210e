"""A hung mount (FUSE `statfs` blocked until released) against a running `fsprobe run`.

The daemon must keep answering scrapes while the call hangs, mark the target stuck (and leave
its value series out), hold its thread count, stop if asked without waiting for the call, and
recover by itself when the mount comes back. How fast it answers and stops meanwhile, against
the healthy mount in the same run, is benchmarks/hung_mount.py's to measure.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fsprobe.model import Status
from fsprobe.report import TargetState
from fsprobe.state import StateReader
from tests.support.daemon_process import DaemonProcess, clean_environment, run_fsprobe

#: Threads beside the probes' own: the daemon's main, scheduler, HTTP server and worker reader
#: threads, a connection thread or two while a scrape is served, the worker's main thread.
CONSTANT_THREADS = 7
KINDS = 3  # statvfs, write, tmpdir (quota and lfs df are off)


def start_daemon(tmp_path: Path, target: Path) -> DaemonProcess:
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\n"
        "statvfs_interval = 0.3\n"
        "write_interval = 0.5\n"
        "tmpdir_interval = 0.5\n"
        "deadline = 1\n"
        'write_bytes = "4K"\n'
        'quota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\n'
    )
    daemon = DaemonProcess(
        tmp_path, "--config", str(config), env=clean_environment(TMPDIR=str(target))
    )
    daemon.start()
    path = str(target)
    daemon.wait_for_value("fsprobe_health_status", 0.0, path=path)
    daemon.wait_for_value("fsprobe_probe_success", 1.0, path=path, probe="write")
    assert daemon.value("fsprobe_filesystem_inodes_free", path=path) is not None
    return daemon


#: The value series that must be left out (not zeroed) while the mount is stuck.
VALUE_SERIES = (
    "fsprobe_filesystem_",
    "fsprobe_headroom_",
    "fsprobe_quota_",
    "fsprobe_lustre_",
    "fsprobe_tmpdir_",
)


def sample_names(body: bytes) -> set[str]:
    return {
        sample.name
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def scrape(daemon: DaemonProcess) -> bytes:
    status, body = daemon.get()
    assert status == 200
    return body


def test_a_hung_mount_blocks_one_worker_never_the_daemon_and_recovers(tmp_path, faultfs):
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    path = str(target)
    daemon = start_daemon(tmp_path, target)
    try:
        rule = faultfs.ctl.block("statfs")
        daemon.wait_for_value("fsprobe_mount_stuck", 1.0, path=path)
        assert daemon.value("fsprobe_health_status", path=path) == 2.0
        assert daemon.value("fsprobe_probe_success", path=path, probe="statvfs") == 0.0

        threads = []
        watch_until = time.monotonic() + 4.0  # 13 statvfs intervals, 8 of the others
        while time.monotonic() < watch_until:
            body = scrape(daemon)  # answered while the call stays blocked (checked below)
            threads.append(daemon.threads())
            values = sample_names(body)
            assert "fsprobe_mount_stuck" in values and "fsprobe_health_status" in values
            hidden = {name for name in values if name.startswith(VALUE_SERIES)}
            assert not hidden, f"value series of a stuck mount are exported: {hidden}"
            time.sleep(0.1)
        assert max(threads) <= KINDS + CONSTANT_THREADS, threads
        assert threads[-1] <= threads[0] + 1, threads  # not growing interval after interval
        assert faultfs.ctl.rule(rule)["waiting"] == 1  # one blocked worker, not one per interval

        code, out, _err = run_fsprobe("status", "--state-dir", str(daemon.state_dir))
        assert code == 2 and "unhealthy" in out and "mount_stuck" in out

        faultfs.ctl.remove(rule)
        daemon.wait_for_value("fsprobe_mount_stuck", 0.0, path=path)
        daemon.wait_for_value("fsprobe_health_status", 0.0, path=path)
        assert daemon.value("fsprobe_filesystem_inodes_free", path=path) is not None
        assert daemon.value("fsprobe_headroom_inodes", path=path) is not None
        log = daemon.log()
        assert log.count("event=mount_stuck") == 1, log  # published once, not every interval
        assert f"event=mount_stuck target={path} probe=statvfs errno=TIMEOUT" in log
        assert "event=probe_returned" in log
        errors = daemon.value(
            "fsprobe_probe_errors_total", path=path, probe="statvfs", errno="TIMEOUT"
        )
        assert errors is not None and errors >= 1
    finally:
        daemon.stop()


def test_sigterm_while_a_probe_hangs_stops_the_daemon_without_waiting_for_the_call(
    tmp_path, faultfs
):
    """The probe stuck in `statfs` is a thread of the probe worker process, never of the
    daemon: the daemon exits while the call still hangs, the worker when the kernel lets go
    of that thread."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    daemon = start_daemon(tmp_path, target)
    rule = faultfs.ctl.block("statfs")
    try:
        faultfs.ctl.wait_blocked(rule, timeout=60)
        daemon.wait_for_value("fsprobe_mount_stuck", 1.0, path=str(target))
        (worker,) = daemon.workers()
        daemon.send(signal.SIGTERM)
        code = daemon.wait(timeout=60)  # the call hangs until the test releases it
        assert faultfs.ctl.rule(rule)["waiting"] == 1  # so the daemon did not wait for it
        assert worker.is_running()  # still in the kernel, left behind
    finally:
        faultfs.ctl.remove(rule)
    assert code == 0, daemon.log()
    worker.wait(timeout=60)  # the released call returns, the worker sees us gone and exits
    state = StateReader(str(daemon.state_dir)).read()
    report = TargetState.read(state, str(target)).report
    assert report.status is Status.UNHEALTHY
    assert "mount_stuck" in [reason.code for reason in report.reasons]
    assert report.snapshot.get("statvfs").stuck is True
