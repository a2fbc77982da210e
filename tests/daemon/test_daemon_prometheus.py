"""A real Prometheus server scrapes a running `fsprobe run` on a tmpfs (docs/design.md §9).

Queried through Prometheus' HTTP API, the inode headroom equals what `os.statvfs` says and
follows the files the test creates: the whole path from statvfs to a stored time series.
"""

from __future__ import annotations

import os

import pytest

from tests.support.daemon_process import DaemonProcess, clean_environment

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def test_prometheus_scrapes_inode_headroom_that_matches_statvfs(tmp_path, tmpfs, prometheus_for):
    target = tmpfs(size="4M", nr_inodes=200).path
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\n"
        "statvfs_interval = 0.5\n"
        "write_probe = false\n"  # its test file would come and go between the two readings
        'quota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\n'
    )
    home = tmp_path / "daemon"
    home.mkdir()
    env = clean_environment(TMPDIR=str(target))
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        address = daemon.url.split("//")[1].split("/")[0]
        prometheus = prometheus_for(address)
        selector = f'{{job="fsprobe",path="{target}"}}'

        prometheus.wait_for('up{job="fsprobe"}', 1.0)
        before = os.statvfs(target).f_favail
        prometheus.wait_for(f"fsprobe_headroom_inodes{selector}", float(before))
        assert prometheus.value(f"fsprobe_filesystem_inodes_free{selector}") == before
        assert prometheus.value(f"fsprobe_health_status{selector}") == 0.0

        created = []
        for index in range(25):
            name = target / f"file-{index}"
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
            created.append(name)
        after = os.statvfs(target).f_favail
        assert after == before - 25
        prometheus.wait_for(f"fsprobe_headroom_inodes{selector}", float(after))
        prometheus.wait_for(f"fsprobe_filesystem_inodes_free{selector}", float(after))
        ratio = prometheus.value('fsprobe_headroom_ratio{job="fsprobe",resource="inodes"}')
        assert ratio == pytest.approx(after / os.statvfs(target).f_files)
        for name in created:
            name.unlink()
