"""A real `fsprobe run` in a subprocess, for the daemon's end-to-end tests.

It listens on port 0 (the kernel picks a free port) and the test learns the address from the
daemon's own ``event=started`` log line, so there is no race for a port. Stopping never hangs:
SIGTERM, then SIGKILL if the daemon is still there after a few seconds.

Every wait here polls for its condition and returns as soon as it holds; the default deadlines
(`PATIENCE`) only bound a hang, and are long because a loaded CI machine may take many seconds
for what takes milliseconds alone. A test that must see something *not* happen says so with
its own means, never by a deadline running out.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Seconds any wait or request of a test's daemon may take before the test fails.
PATIENCE = 60.0


#: A daemon that probes often and never runs ``lfs quota``: its state file comes within a second.
FAST_DEFAULTS = """
[defaults]
statvfs_interval = 0.2
write_interval = 0.5
tmpdir_interval = 0.5
write_bytes = "4K"
quota_probe = "never"
"""


def fast_config(path: Path, *targets: Path, top: str = "") -> Path:
    """Write the config file `path`: `top` (top-level keys), `FAST_DEFAULTS`, the targets."""
    path.write_text(
        top + FAST_DEFAULTS + "".join(f'\n[[targets]]\npath = "{target}"\n' for target in targets)
    )
    return path


def free_port() -> int:
    """A port that was free a moment ago (for servers that cannot report theirs, Prometheus)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_environment(**extra: str) -> dict[str, str]:
    """The test process's environment without any FSPROBE_* or job variables leaking in."""
    environ = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FSPROBE_", "SLURM_")) and key not in ("LOCAL_RANK",)
    }
    environ.update(extra)
    return environ


class DaemonProcess:
    """`fsprobe run ARGS...` with its state in `home/state` and its log in `home/daemon.log`."""

    def __init__(
        self,
        home: Path,
        *args: str,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        program: tuple[str, ...] = ("-m", "fsprobe"),
    ) -> None:
        self.home = home
        self.python = python  # another one where other users must run it too (SharedPython)
        self.program = program  # what runs `run ARGS...` (tests.support.sabotage plants a bug)
        self.state_dir = home / "state"
        self.log_path = home / "daemon.log"
        self.args = ["--listen", "127.0.0.1:0", "--state-dir", str(self.state_dir), *args]
        self.env = env if env is not None else clean_environment()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = PATIENCE) -> DaemonProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.python, *self.program, "run", *self.args],
                cwd=REPO_ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        line = self.wait_for_log("event=started", timeout=timeout)
        self.url = re.search(r"metrics=\"?([^\"\s]+)", line)[1]
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = PATIENCE, count: int = 1) -> str:
        """Wait until `text` appears `count` times in the log; returns the last such line."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.log().splitlines() if text in line]
            if len(lines) >= count:
                return lines[count - 1]
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"fsprobe run exited ({self.proc.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the log after {timeout} s:\n{self.log()}")
            time.sleep(0.02)

    def get(
        self,
        path: str = "/metrics",
        headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None,
        timeout: float = PATIENCE,
    ) -> tuple[int, bytes]:
        base = self.url.rsplit("/metrics", 1)[0]
        request = urllib.request.Request(base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def metrics(self) -> dict[str, dict[frozenset, float]]:
        """{sample name: {frozenset(labels): value}} of one scrape."""
        status, body = self.get()
        assert status == 200, body
        found: dict[str, dict[frozenset, float]] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
        return found

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample `name` with these labels, None when absent."""
        matches = [
            value
            for key, value in self.metrics().get(name, {}).items()
            if all((k, v) in key for k, v in labels.items())
        ]
        assert len(matches) <= 1, (name, labels, matches)
        return matches[0] if matches else None

    def wait_for_value(self, name: str, expected, timeout: float = PATIENCE, **labels: str):
        """Wait until `name{labels}` equals `expected` (None: absent); returns it."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.value(name, **labels)
            if value == expected:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{name}{labels} is {value}, not {expected}:\n{self.log()}")
            time.sleep(0.05)

    def workers(self) -> list[psutil.Process]:
        """The daemon's child processes: its probe worker."""
        return psutil.Process(self.pid).children(recursive=True)

    def wait_for_present(self, name: str, timeout: float = PATIENCE) -> None:
        """Wait until at least one sample named `name` is exported."""
        deadline = time.monotonic() + timeout
        while name not in self.metrics():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {name} after {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def threads(self) -> int:
        """Threads of the daemon and of its probe worker together."""
        return sum(process.num_threads() for process in [psutil.Process(self.pid), *self.workers()])

    def send(self, number: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(number)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def run_fsprobe(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0):
    """`fsprobe ARGS...` to completion: (exit status, stdout, stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", *args],
        cwd=REPO_ROOT,
        env=env if env is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr
