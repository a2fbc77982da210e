"""Every metric the shipped rules and dashboard use is on a real `/metrics` page of `fsprobe run`.

Both sides are parsed: the PromQL of every rule and panel (recording rules resolved to their
sources) and the exposition of a daemon that watches a forced-Lustre target on the fault
filesystem — quota with a grace timer running, Lustre targets from the fake `lfs`, a write
probe that failed once, a fallback directory. Renaming a metric in the exporter, or using one in
`deploy/` that it does not emit, breaks this test.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.saving.options import Backoff
from tests.support import deploy_metrics
from tests.support.daemon_process import DaemonProcess, clean_environment
from tests.support.fakes.fake_lfs import FAKE_LCTL, FAKE_LFS

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "fsprobe.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "fsprobe.json"


def test_rules_and_dashboard_use_only_metrics_the_daemon_exports(tmp_path, faultfs):
    target = faultfs.mountpoint
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    faultfs.ctl.set_quota("inodes", soft=5, hard=1000, grace=86400)
    faultfs.ctl.set_quota("bytes", soft=1 << 30, hard=2 << 30)
    for index in range(10):  # over the soft limit: the grace timer starts
        (target / f"shard-{index}").write_bytes(b"x")
    faultfs.ctl.fail("write", "EIO")  # the first test write fails: an errors_total series
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\n"
        "statvfs_interval = 0.5\nwrite_interval = 0.5\nquota_interval = 0.5\n"
        "lfs_df_interval = 0.5\nredirect_interval = 0.5\ntmpdir_interval = 0.5\n"
        'quota_provider = "lfs"\nquota_probe = "always"\n'
        f'[[targets]]\npath = "{target}"\nuser = 1000\ngroup = 1000\n'
        f'fallback_dirs = ["{fallback}"]\n'
    )
    # OST0001 evicted this node an hour ago and took it back: the eviction's series.
    evicted = tmp_path / "lctl.json"
    hour_ago = int(time.time()) - 3600
    history = [[hour_ago - 60, "FULL"], [hour_ago, "EVICTED"], [hour_ago + 1, "FULL"]]
    evicted.write_text(json.dumps({"targets": {"OST0001": {"state": "FULL", "history": history}}}))
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LCTL_STATE=str(evicted),
        FAKE_LFS_VERSION="2.16",
        FAKE_LFS_CONTROL=str(faultfs.ctl.socket_path),
        FAKE_LFS_PROJECT="4242",
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    home = tmp_path / "daemon"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        for name in (
            "fsprobe_quota_grace_expiry_timestamp_seconds",
            "fsprobe_lustre_target_avail_bytes",
            "fsprobe_write_latency_seconds_count",
            "fsprobe_redirected_pending_bytes",
            "fsprobe_tmpdir_same_device",
            "fsprobe_quota_soft_limit_bytes",
            "fsprobe_lustre_target_last_eviction_timestamp_seconds",
        ):
            daemon.wait_for_present(name)
        daemon.wait_for_value("fsprobe_probe_errors_total", 1.0, probe="write", errno="EIO")
        # Real saves, one of them retried, and one outside the target: every save series.
        faultfs.ctl.fail("write", "EIO", path="*~ckpt.pt.tmp")
        for directory in (target, target, target, tmp_path):
            fsprobe.atomic_write(
                directory / "ckpt.pt",
                lambda f: f.write(b"x"),
                state_dir=str(daemon.state_dir),
                backoff=Backoff(sleep=lambda seconds: None),
            )
        while "fsprobe_probe_skipped_total" not in daemon.metrics():  # a save stood for a probe
            fsprobe.atomic_write(
                target / "ckpt.pt", lambda f: f.write(b"x"), state_dir=str(daemon.state_dir)
            )
        daemon.wait_for_present("fsprobe_write_step_seconds")  # an active probe again
        daemon.wait_for_present("fsprobe_save_interval_seconds")
        daemon.wait_for_present("fsprobe_save_events_dropped_total")
        daemon.wait_for_present("fsprobe_save_failed_attempts_total")
        status, body = daemon.get()
    assert status == 200
    exposed = deploy_metrics.exposed_metric_names(body.decode())

    recorded = deploy_metrics.recording_rules(deploy_metrics.load_rule_groups(RULES))
    in_rules = deploy_metrics.rules_metrics([RULES])
    in_dashboard = deploy_metrics.dashboard_metrics(DASHBOARD, recorded)
    assert in_rules, "no metric found in the rules: the extraction is broken"
    assert in_dashboard, "no metric found in the dashboard: the extraction is broken"
    assert in_rules - exposed - deploy_metrics.SCRAPE_METRICS == set(), (
        "rules use metrics the daemon does not export"
    )
    assert in_dashboard - exposed == set(), "the dashboard uses metrics the daemon does not export"
    # And the exporter keeps its documented contract, every family present.
    assert deploy_metrics.CONTRACT_METRICS - exposed == set()
