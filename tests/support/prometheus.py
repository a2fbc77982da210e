"""A real Prometheus server (Debian's `prometheus`) for end-to-end tests, and its agent mode.

It scrapes one target (or several) every second, optionally loads rule files (evaluated every
second), and is queried through its HTTP API, exactly as Grafana or Alertmanager would see it.
"""

from __future__ import annotations

import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.capability import require
from tests.support.server import LocalServer

PROMETHEUS = shutil.which("prometheus")


def prometheus_problem() -> str | None:
    if PROMETHEUS is None:
        return "the prometheus server is not installed (apt-get install prometheus)"
    return None


class Prometheus(LocalServer):
    name = "prometheus"

    def __init__(
        self,
        home: Path,
        scrape_target: str | Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        *,
        jobs: Mapping[str, Sequence[str]] | None = None,
        flags: Sequence[str] = (),
    ) -> None:
        """`scrape_target` ("127.0.0.1:PORT", or several: one instance each); `alertmanager`
        ("127.0.0.1:PORT"): where to send the alerts, at once (no resend delay beyond a
        second). `jobs` ({job: [address, ...]}) replaces the one job "fsprobe" scraping
        `scrape_target`; `flags` go on the command line."""
        require(prometheus_problem())
        super().__init__(home)
        self.alertmanager = alertmanager
        self.flags = list(flags)
        targets = [scrape_target] if isinstance(scrape_target, str) else list(scrape_target)
        scraped = jobs if jobs is not None else {"fsprobe": targets}
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
            + "".join(
                f"  - job_name: {job}\n    static_configs:\n      - targets: {list(addresses)}\n"
                for job, addresses in scraped.items()
            )
        )
        self.config = config
        self._start()

    def command(self, port: int) -> list[str]:
        assert PROMETHEUS is not None
        return [
            PROMETHEUS,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.home / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *(["--rules.alert.resend-delay=1s"] if self.alertmanager else []),
            *self.flags,
        ]

    def api(self, path: str) -> dict:
        reply = super().api(path)
        assert isinstance(reply, dict)
        return reply

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


class PrometheusAgent(LocalServer):
    """Prometheus in agent mode (``--enable-feature=agent``): scrapes and remote-writes,
    as `config` (a prometheus.yml) says; it answers no queries."""

    name = "prometheus-agent"

    def __init__(self, home: Path, config: str) -> None:
        require(prometheus_problem())
        super().__init__(home)
        self.config = home / "agent.yml"
        self.config.write_text(config)
        self._start()

    def command(self, port: int) -> list[str]:
        assert PROMETHEUS is not None
        return [
            PROMETHEUS,
            "--enable-feature=agent",
            f"--config.file={self.config}",
            f"--storage.agent.path={self.home / 'wal'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
