"""A real Prometheus server scrapes a running `fsprobe run` on a tmpfs (DESIGN §9).

Queried through Prometheus' HTTP API, the inode headroom equals what `os.statvfs` says and
follows the files the test creates: the whole path from statvfs to a stored time series.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess, clean_environment, free_port

pytestmark = pytest.mark.prometheus

PROMETHEUS = shutil.which("prometheus")


class Prometheus:
    def __init__(self, home: Path, scrape_target: str) -> None:
        self.port = free_port()
        config = home / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: fsprobe\n"
            "    static_configs:\n"
            f"      - targets: ['{scrape_target}']\n"
        )
        self.log = home / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={home / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=1
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def query(self, expression: str) -> list[dict]:
        reply = self.api("/api/v1/query?query=" + urllib.parse.quote(expression))
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def value(self, expression: str) -> float | None:
        result = self.query(expression)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait_for(self, expression: str, expected: float, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while (value := self.value(expression)) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression} = {value}, expected {expected}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator:
    if PROMETHEUS is None:
        pytest.skip("the prometheus server is not installed (apt-get install prometheus)")
    started: list[Prometheus] = []

    def start(scrape_target: str) -> Prometheus:
        home = tmp_path / "prometheus"
        home.mkdir()
        server = Prometheus(home, scrape_target)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


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
        assert prometheus.value(f"fsprobe_filesystem_files_free{selector}") == before
        assert prometheus.value(f"fsprobe_health_status{selector}") == 0.0

        created = []
        for index in range(25):
            name = target / f"file-{index}"
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
            created.append(name)
        after = os.statvfs(target).f_favail
        assert after == before - 25
        prometheus.wait_for(f"fsprobe_headroom_inodes{selector}", float(after))
        prometheus.wait_for(f"fsprobe_filesystem_files_free{selector}", float(after))
        ratio = prometheus.value('fsprobe_headroom_ratio{job="fsprobe",resource="inodes"}')
        assert ratio == pytest.approx(after / os.statvfs(target).f_files)
        for name in created:
            name.unlink()
