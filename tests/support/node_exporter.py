"""A real node_exporter (Debian's `prometheus-node-exporter`) serving a textfile directory.

Only its textfile collector runs: what Prometheus scrapes from it in textfile mode is
fsprobe.prom's series and `node_textfile_mtime_seconds`, the file's age.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from tests.support.capability import need_command
from tests.support.server import LocalServer


class NodeExporter(LocalServer):
    name = "node_exporter"

    def __init__(self, home: Path, textfile_dir: Path) -> None:
        super().__init__(home)
        self.binary = need_command("prometheus-node-exporter", "prometheus-node-exporter")
        self.textfile_dir = textfile_dir
        self._start()

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={self.textfile_dir}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    def wait_ready(self, timeout: float = 60.0) -> None:
        """node_exporter has no /-/ready: ready once it serves /metrics."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text()
                    raise AssertionError(f"node_exporter did not start:\n{log}") from None
                time.sleep(0.1)
