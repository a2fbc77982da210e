"""A real Prometheus server (Debian's `prometheus`) for end-to-end tests.

It scrapes one target every second, optionally loads rule files (evaluated every second), and
is queried through its HTTP API, exactly as Grafana or Alertmanager would see it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tests.daemon_process import free_port
from tests.support.capability import require

PROMETHEUS = shutil.which("prometheus")


def prometheus_problem() -> str | None:
    if PROMETHEUS is None:
        return "the prometheus server is not installed (apt-get install prometheus)"
    return None


#: Times a Prometheus is started on another port when the one that was free a moment ago
#: has been taken since (an outgoing connection's ephemeral port, say) before it could bind.
PORT_ATTEMPTS = 5


class Prometheus:
    def __init__(
        self,
        home: Path,
        scrape_target: str,
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
    ) -> None:
        """`alertmanager` ("127.0.0.1:PORT"): where to send the alerts, at once (no resend
        delay beyond a second)."""
        require(prometheus_problem())
        self.home = home
        self.alertmanager = alertmanager
        config = home / "prometheus.yml"
        rules = "".join(f"  - {path}\n" for path in rule_files)
        alerting = (
            "alerting:\n  alertmanagers:\n    - static_configs:\n"
            f"        - targets: ['{alertmanager}']\n"
            if alertmanager
            else ""
        )
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            + (f"rule_files:\n{rules}" if rule_files else "")
            + alerting
            + "scrape_configs:\n"
            "  - job_name: fsprobe\n"
            "    static_configs:\n"
            f"      - targets: ['{scrape_target}']\n"
        )
        self.config = config
        self.log = home / "prometheus.log"
        self._start()

    def _start(self) -> None:
        self.port = free_port()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.home / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                    *(["--rules.alert.resend-delay=1s"] if self.alertmanager else []),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def api(self, path: str) -> dict:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.loads(response.read())

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        attempts = 1
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/-/ready", timeout=1
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            exited = self.proc.poll() is not None
            if (
                exited
                and "address already in use" in self.log.read_text()
                and attempts < PORT_ATTEMPTS
            ):
                attempts += 1
                self._start()
                continue
            if exited or time.monotonic() > deadline:
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

    def wait_for(self, expression: str, expected: float, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (value := self.value(expression)) != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{expression} = {value}, expected {expected}")
            time.sleep(0.2)

    def alerts(self) -> list[dict]:
        """The alerts Prometheus holds now (pending and firing), as its API reports them."""
        reply = self.api("/api/v1/alerts")
        assert reply["status"] == "success", reply
        return reply["data"]["alerts"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
