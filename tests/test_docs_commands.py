"""The README's "Run it" commands work as written (issue 17.8, part).

The first block installs into `.venv` and starts the daemon; the second, "in a second
terminal", asks it. Both are taken from README.md verbatim and run with bash in a directory of
their own, where `.venv` is this test environment (the install itself, `pip install -e .`, is
what the packaging tests and CI's own fresh clone hold): only the part of the first command
after the install runs here, as written. The metrics port is the README's own, 9731, so the
test skips when something else listens there.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_it_blocks() -> tuple[str, str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Run it\n") :]
    first, second = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)[:2]
    return first.strip(), second.strip()


def metrics() -> str:
    with urllib.request.urlopen("http://127.0.0.1:9731/metrics", timeout=5) as response:
        return response.read().decode()


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_run_it_commands_of_the_readme_work_as_written(tmp_path: Path) -> None:
    first, second = run_it_blocks()
    install, _, start = first.partition(" && .venv/bin/pip install -e . && ")
    assert install == "python3 -m venv .venv" and start, first  # the README still says this
    if port_in_use(9731):
        pytest.skip("port 9731, the README's, is taken on this machine")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    environ = {**os.environ, "FSPROBE_STATE_DIR": str(tmp_path / "state")}
    daemon = subprocess.Popen(
        ["bash", "-c", start],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state" / "state.json").exists():
            assert daemon.poll() is None, daemon.communicate()[0]
            assert time.monotonic() < deadline, "the daemon wrote no state in 30 s"
            time.sleep(0.1)
        # "In a second terminal": a moment later, once its first probes have answered.
        healthy = f'fsprobe_health_status{{path="{tmp_path / "checkpoints"}"}} 0.0'
        while healthy not in metrics():
            assert daemon.poll() is None, daemon.communicate()[0]
            assert time.monotonic() < deadline, metrics()
            time.sleep(0.2)
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", second],
            cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        log = daemon.communicate(timeout=15)[0]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    checkpoints = str(tmp_path / "checkpoints")
    assert f'fsprobe_health_status{{path="{checkpoints}"}} 0.0' in lines, done.stdout
    assert any(line.startswith("ok") and checkpoints in line for line in lines), done.stdout
    assert any(line.startswith(" OK ") and "checkpoints" in line for line in lines), done.stdout
    assert "event=stopped" in log, log  # SIGTERM to the session: a clean stop
