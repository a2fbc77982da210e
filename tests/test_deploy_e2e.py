"""The shipped alert rules, loaded by a real Prometheus, scraping a real `fsprobe run`.

promtool's unit tests (tests/test_deploy_prometheus.py) check the rules against made-up series;
this checks them against the series the daemon really exports: running low on inodes on a tmpfs
makes `FsprobeInodeHeadroomLow` appear in Prometheus' alerts API, freeing them clears it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.daemon_process import DaemonProcess, clean_environment
from tests.support.prometheus import Prometheus
from tests.support.tmpfs import fill_inodes

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "fsprobe.rules.yml"


def inode_alerts(prometheus: Prometheus, path: str) -> list[dict]:
    return [
        alert
        for alert in prometheus.alerts()
        if alert["labels"]["alertname"] == "FsprobeInodeHeadroomLow"
        and alert["labels"].get("path") == path
    ]


def wait_until(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)
    return result


def test_inode_headroom_alert_follows_the_filesystem(tmp_path, tmpfs, prometheus_for):
    target = tmpfs(size="4M", nr_inodes=200).path
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nstatvfs_interval = 0.5\nwrite_probe = false\nquota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\n'
    )
    home = tmp_path / "daemon"
    home.mkdir()
    env = clean_environment(TMPDIR=str(target))
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        address = daemon.url.split("//")[1].split("/")[0]
        prometheus = prometheus_for(address, rule_files=[RULES])
        loaded = prometheus.api("/api/v1/rules")["data"]["groups"]
        assert {group["name"] for group in loaded} >= {"fsprobe.recording", "fsprobe.alerts"}
        selector = f'{{job="fsprobe",path="{target}",resource="inodes"}}'
        prometheus.wait_for(f"fsprobe_headroom_ratio{selector} > bool 0.10", 1.0)
        time.sleep(3)  # several evaluations with plenty of headroom: no alert
        assert inode_alerts(prometheus, str(target)) == []

        created = fill_inodes(target, 0.93)
        alerts = wait_until(
            lambda: inode_alerts(prometheus, str(target)), 30, "FsprobeInodeHeadroomLow"
        )
        (warning,) = [a for a in alerts if a["labels"]["severity"] == "warning"]
        assert warning["state"] in ("pending", "firing")
        assert float(warning["value"]) < 0.10
        assert str(target) in warning["annotations"]["summary"]
        assert warning["annotations"]["runbook_url"].endswith("#fsprobeinodeheadroomlow")

        for name in created:
            os.unlink(name)
        wait_until(lambda: inode_alerts(prometheus, str(target)) == [], 30, "the alert to clear")
