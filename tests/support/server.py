"""A server of the Prometheus family (Prometheus, Alertmanager, node_exporter) run for a test: on
a free port, ready when ``/-/ready`` (or its `ready_path`) answers, started again on another port
if that one was taken meanwhile; `restart` keeps its port and its data."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support.daemon_process import free_port

#: Times a server is started on another port when the one that was free a moment ago
#: has been taken since (an outgoing connection's ephemeral port, say) before it could bind.
PORT_ATTEMPTS = 5


class LocalServer:
    """`command(port)` is the server's command line; its output goes to ``<home>/<name>.log``."""

    name = "server"
    ready_path = "/-/ready"

    def __init__(self, home: Path) -> None:
        self.home = home
        self.log = home / f"{self.name}.log"

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _start(self) -> None:
        self.port = free_port()
        self._run()

    def _run(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(self.port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def api(self, path: str) -> object:
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=60) as response:
            return json.loads(response.read())

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        attempts = 1
        while True:
            try:
                url = f"http://{self.address}{self.ready_path}"
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            exited = self.proc.poll() is not None
            taken = exited and "address already in use" in self.log.read_text()
            if taken and attempts < PORT_ATTEMPTS:
                attempts += 1
                self._start()
                continue
            if exited or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start:\n{self.log.read_text()}")
            time.sleep(0.1)

    def restart(self) -> None:
        """Stop the server and start it again on the same port, with the same data."""
        self.stop()
        self._run()
        self.wait_ready()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
