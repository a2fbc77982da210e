"""A hung mount against a running daemon: how fast it still answers scrapes and stops.

The tests (tests/daemon/test_daemon_hung_mount.py) hold the properties: scrapes are answered and
SIGTERM ends the daemon while a `statfs` stays blocked in the kernel. This measures how fast,
against the same daemon on the same FUSE fault filesystem while the mount is healthy, in one run:

- `/metrics` latency (p50, max over `--scrapes` scrapes) healthy vs while `statfs` hangs;
- SIGTERM to exit, healthy vs while `statfs` hangs, `--stops` daemons each.

    .venv/bin/python benchmarks/hung_mount.py                 # ~1 minute
    .venv/bin/python benchmarks/hung_mount.py --scrapes 1000 --stops 10

Goals (docs/design.md, §8 of the shared design): scrapes under a hung mount as fast as healthy
ones (< 100 ms); SIGTERM stops the daemon within a second, hung mount or not.
Needs root and /dev/fuse (the fault filesystem of the tests).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from live_daemon import Daemon, clean_environment, running_daemon  # beside this script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.faultmount import FaultFS  # noqa: E402  (the harness of the tests)

CONFIG = """\
[defaults]
statvfs_interval = 0.3
write_interval = 0.5
tmpdir_interval = 0.5
deadline = 1
write_bytes = "4K"
quota_probe = "never"
"""


def value(daemon: Daemon, name: str) -> float | None:
    for line in urllib.request.urlopen(daemon.url, timeout=30).read().decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_for(daemon: Daemon, name: str, wanted: float) -> None:
    deadline = time.monotonic() + 60
    while value(daemon, name) != wanted:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name} never became {wanted}:\n{daemon.log.read_text()}")
        time.sleep(0.05)


def scrape_seconds(daemon: Daemon, scrapes: int) -> list[float]:
    times = []
    for _ in range(scrapes):
        start = time.perf_counter()
        urllib.request.urlopen(daemon.url, timeout=30).read()
        times.append(time.perf_counter() - start)
    return times


def measure(fs: FaultFS, home: Path, target: Path, hung: bool, scrapes: int) -> tuple[list, float]:
    """(scrape seconds, SIGTERM-to-exit seconds) of one daemon, the mount hung or not."""
    config = home / "fsprobe.toml"
    config.write_text(CONFIG + f'[[targets]]\npath = "{target}"\n')
    environment = clean_environment(TMPDIR=str(target))
    rule = None
    try:
        with running_daemon(home, "--config", str(config), environment=environment) as daemon:
            wait_for(daemon, "fsprobe_health_status", 0.0)
            if hung:
                rule = fs.ctl.block("statfs")
                fs.ctl.wait_blocked(rule, timeout=60)
                wait_for(daemon, "fsprobe_mount_stuck", 1.0)
            times = scrape_seconds(daemon, scrapes)
            start = time.perf_counter()
            daemon.process.send_signal(signal.SIGTERM)
            daemon.process.wait(60)
            stopped = time.perf_counter() - start
    finally:
        if rule is not None:
            fs.ctl.remove(rule)
    return times, stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes per daemon")
    parser.add_argument("--stops", type=int, default=5, help="daemons started and stopped per case")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fsprobe-bench-hung-"))
    (scratch / "backing").mkdir()
    (scratch / "mnt").mkdir()
    fs = FaultFS(scratch / "backing", scratch / "mnt").start()
    results: dict[str, tuple[list[float], list[float]]] = {"healthy": ([], []), "hung": ([], [])}
    try:
        for run in range(args.stops):
            for case in ("healthy", "hung"):  # interleaved: the machine's noise hits both
                home = scratch / f"{case}-{run}"
                target = fs.mountpoint / f"{case}-{run}"
                home.mkdir()
                target.mkdir()
                times, stopped = measure(fs, home, target, case == "hung", args.scrapes)
                results[case][0].extend(times)
                results[case][1].append(stopped)
    finally:
        fs.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{args.stops} daemons per case, {args.scrapes} scrapes each; "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")  # fmt: skip
    base_scrape = statistics.median(results["healthy"][0])
    base_stop = statistics.median(results["healthy"][1])
    for case, (times, stops) in results.items():
        print(
            f"{case:<8} /metrics p50 {statistics.median(times) * 1000:6.2f} ms "
            f"({statistics.median(times) / base_scrape:.2f}x), max {max(times) * 1000:6.1f} ms; "
            f"SIGTERM to exit median {statistics.median(stops) * 1000:6.0f} ms "
            f"({statistics.median(stops) / base_stop:.2f}x), max {max(stops) * 1000:6.0f} ms"
        )
    print("Goals: scrapes under a hung mount < 100 ms; every stop within a second.")


if __name__ == "__main__":
    main()
