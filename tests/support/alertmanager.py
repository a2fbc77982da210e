"""A real Alertmanager (Debian's `prometheus-alertmanager`) and the person it notifies.

`Webhook` is that person: a local HTTP server that keeps every notification Alertmanager
posts, by receiver (its URL path). `Alertmanager` runs the shipped configuration with its
receivers pointed at the webhook and its timers compressed, and answers its API.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.support.capability import need_command
from tests.support.server import LocalServer


class Webhook:
    """Keeps what Alertmanager posts: ``(receiver, notification)`` in arrival order."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        received, lock = self.received, self._lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(min(length, 1 << 20)))
                with lock:
                    received.append((self.path.strip("/"), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def notifications(self) -> list[tuple[str, dict]]:
        with self._lock:
            return list(self.received)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def pointed_at(shipped: Path, webhook: Webhook) -> dict:
    """The configuration `shipped` with every receiver posting to `webhook` (path: the
    receiver's name); the rest as shipped."""
    config = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        if "webhook_configs" in receiver:
            receiver["webhook_configs"] = [
                {"url": f"{webhook.url}/{receiver['name']}", "send_resolved": True}
            ]
    return config


def compressed_config(shipped: Path, webhook: Webhook) -> str:
    """The shipped configuration `pointed_at` the webhook, its timers compressed from minutes
    to a second (a sub-route's own timers 60 times shorter, as the rules' `for:`); the inhibit
    rules and the route tree as shipped."""
    config = pointed_at(shipped, webhook)
    config["route"].update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    for route in config["route"].get("routes", ()):
        for timer in ("group_wait", "group_interval"):
            if timer in route:  # its own timers, 60 times shorter as the rules' `for:`
                route[timer] = f"{_seconds(route[timer]) / 60:g}s"
    return yaml.safe_dump(config)


def _seconds(duration: str) -> float:
    """``"2m"`` -> 120.0: an Alertmanager duration of one unit (s, m or h)."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


class Alertmanager(LocalServer):
    name = "alertmanager"

    def __init__(self, home: Path, config: str) -> None:
        super().__init__(home)
        self.binary = need_command("prometheus-alertmanager", "prometheus-alertmanager")
        self.config = home / "alertmanager.yml"
        self.config.write_text(config)
        self._start()

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # alone: no gossip port to find
            "--log.level=warn",
        ]

    def alerts(self) -> list[dict]:
        """Every alert Alertmanager holds, with its status (active, or suppressed and by what)."""
        reply = self.api("/api/v2/alerts")
        assert isinstance(reply, list)
        return reply
