"""A real node_exporter (Debian's `prometheus-node-exporter`) serving a textfile directory.

Only its textfile collector runs: what Prometheus scrapes from it in textfile mode is
fsprobe.prom's series and `node_textfile_mtime_seconds`, the file's age.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.capability import need_command
from tests.support.server import LocalServer


class NodeExporter(LocalServer):
    """node_exporter with only its textfile collector, serving the `.prom` files of
    `directory`."""

    name = "node_exporter"
    ready_path = "/metrics"  # it has no /-/ready

    def __init__(self, home: Path, directory: Path) -> None:
        super().__init__(home)
        self.binary = need_command("prometheus-node-exporter", "prometheus-node-exporter")
        self.directory = directory
        self._start()

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={self.directory}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
