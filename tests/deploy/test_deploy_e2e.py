"""The shipped alert rules, loaded by a real Prometheus, scraping a real `fsprobe run`.

promtool's unit tests (tests/deploy/test_deploy_prometheus.py) check the rules against made-up
series; this checks them against the series the daemon really exports: running low on inodes on
a tmpfs makes `FsprobeInodeHeadroomLow` appear in Prometheus' alerts API, freeing them clears it;
a nearly full OST outside a path's layout pools (the fake `lfs`) raises no
`FsprobeLustreTargetAlmostFull` for that path.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess, clean_environment
from tests.support.fakes.fake_lfs import FAKE_LCTL, FAKE_LFS
from tests.support.prometheus import Prometheus
from tests.support.tmpfs import fill_inodes

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "fsprobe.rules.yml"


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


def test_lustre_target_alert_only_for_the_osts_a_new_file_can_meet(tmp_path, prometheus_for):
    """The fake `lfs` plays five OSTs; pool ``flash`` holds OST0000 and OST0001, and OST0001 and
    OST0004 are nearly full. `pooled` has a layout naming pool flash, `plain` one naming none,
    `unknown` one whose pool lfs cannot list. Prometheus, scraping the daemon with the shipped
    rules, holds FsprobeLustreTargetAlmostFull for OST0001 in every path, and for OST0004 in
    `plain` and, since no OST can be ruled out, in `unknown`: never in `pooled`, no byte of
    which can land on OST0004."""
    pooled, plain, unknown = paths = [tmp_path / name for name in ("pooled", "plain", "unknown")]
    for path in paths:
        path.mkdir()
    kib = 1 << 20  # a GiB in the KiB that lfs df counts in
    targets = [{"kind": "MDT", "index": 0, "blocks": kib, "bfree": kib // 2, "bavail": kib // 2,
                "files": 1 << 20, "ffree": 1 << 19}] + [
        {"kind": "OST", "index": index, "blocks": 100 * kib, "bfree": free * kib,
         "bavail": free * kib, "files": 1 << 20, "ffree": 1 << 19}
        for index, free in enumerate((60, 1, 60, 60, 1))
    ]  # fmt: skip
    state = tmp_path / "fake-lfs-state.json"
    state.write_text(json.dumps({
        "mountpoint": str(tmp_path), "targets": targets, "pools": {"flash": [0, 1]},
        "layout": {}, "layouts": {str(pooled): {"pool": "flash"}, str(unknown): {"pool": "gone"}},
        "quota": {"bytes": {"used": 1 << 30, "soft": None, "hard": None},
                  "inodes": {"used": 10, "soft": None, "hard": None}},
    }))  # fmt: skip
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\nlfs_df_interval = 0.5\nquota_interval = 0.5\nstatvfs_interval = 0.5\n"
        'write_probe = false\nquota_probe = "always"\nquota_provider = "lfs"\n'
        + "".join(f'[[targets]]\npath = "{path}"\n' for path in paths)
    )
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LFS_STATE=str(state),
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        TMPDIR=str(tmp_path),
    )
    home = tmp_path / "daemon"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        for path, value in ((pooled, 0.0), (plain, 1.0), (unknown, 1.0)):  # before any scrape
            daemon.wait_for_value(
                "fsprobe_lustre_target_in_layout", value, path=str(path), target="lustre-OST0004"
            )
        address = daemon.url.split("//")[1].split("/")[0]
        prometheus = prometheus_for(address, rule_files=[RULES])

        def almost_full() -> set[tuple[str, str]]:
            return {
                (alert["labels"]["path"], alert["labels"]["target"])
                for alert in prometheus.alerts()
                if alert["labels"]["alertname"] == "FsprobeLustreTargetAlmostFull"
            }

        # The alerts of one rule evaluation over one scrape: all of them or none.
        held = wait_until(almost_full, 30, "FsprobeLustreTargetAlmostFull")
    assert held == {
        (str(pooled), "lustre-OST0001"),
        (str(plain), "lustre-OST0001"),
        (str(plain), "lustre-OST0004"),
        (str(unknown), "lustre-OST0001"),
        (str(unknown), "lustre-OST0004"),
    }
