"""A real `fsprobe run` for the benchmarks beside this script: started, found, measured, stopped.

``with running_daemon(home, "--config", str(config)) as daemon:`` starts the daemon of the
source tree `tree` (this repository unless told), with its state under `home`, metrics on a free
localhost port and the log in ``home/daemon.log``, and waits until the log names its address.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Daemon:
    process: subprocess.Popen
    log: Path
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without FSPROBE_* settings (a test's would change the run)."""
    inherited = {
        name: value for name, value in os.environ.items() if not name.startswith("FSPROBE_")
    }
    return {**inherited, **extra}


@contextlib.contextmanager
def running_daemon(
    home: Path,
    *arguments: str,
    tree: Path = REPO,
    environment: Mapping[str, str] | None = None,
    stop_timeout: float = 30.0,
) -> Iterator[Daemon]:
    """``fsprobe run ARGUMENTS`` until the block ends (then SIGTERM, waited for)."""
    log = home / "daemon.log"
    command = [sys.executable, "-m", "fsprobe", "run", *arguments,
               "--listen", "127.0.0.1:0", "--state-dir", str(home / "state")]  # fmt: skip
    with open(log, "wb") as stream:
        process = subprocess.Popen(
            command,
            cwd=tree,
            env=dict(environment if environment is not None else clean_environment()),
            stdin=subprocess.DEVNULL,
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
    try:
        host, port = wait_for_address(process, log)
        yield Daemon(process, log, host, port)
    finally:
        process.terminate()
        process.wait(stop_timeout)


def wait_for_address(process: subprocess.Popen, log: Path) -> tuple[str, int]:
    """The address a starting daemon says it listens on, in its log (exits if it did not)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        match = re.search(r"metrics=\"?http://([^/\"]+)/metrics", log.read_text())
        if match:
            host, port = match[1].rsplit(":", 1)
            return host, int(port)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    process.kill()
    raise SystemExit(f"fsprobe run did not start:\n{log.read_text()}")


def family(process: psutil.Process) -> list[psutil.Process]:
    """The daemon and its children (the probe worker)."""
    return [process, *process.children(recursive=True)]


def cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    """User + system CPU seconds so far, by pid."""
    return {p.pid: sum(p.cpu_times()[:2]) for p in processes}
