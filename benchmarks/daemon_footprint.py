"""Footprint of `fsprobe run`: RSS and CPU with 1, 10 and 100 targets, and /metrics latency.

Each run starts a real daemon (a subprocess) on N fresh directories at the default intervals
(statvfs 15 s, write and $TMPDIR 60 s, quota and lfs df 300 s), lets it settle, then measures
the CPU time and peak RSS of the daemon and its probe worker process together over
`--duration` seconds without disturbing them, and finally scrapes /metrics `--scrapes` times
one after the other for the latency percentiles.

    .venv/bin/python benchmarks/daemon_footprint.py                 # 2 minutes per size
    .venv/bin/python benchmarks/daemon_footprint.py --duration 30 --targets 1 10

Goals (docs/design.md §10, issue 4): /metrics p99 under 5 ms at 100 targets, RSS under 45 MB at 10.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from live_daemon import clean_environment, cpu_seconds, family, running_daemon  # beside this script


@dataclass
class Measurement:
    targets: int
    daemon_rss_mib: float  # peak
    worker_rss_mib: float  # peak
    pss_mib: float  # peak of both, shared pages (libpython, ...) counted once
    cpu_percent: float
    threads: int
    p50_ms: float
    p99_ms: float
    body_kib: float


def write_config(home: Path, targets: int) -> Path:
    config = home / "fsprobe.toml"
    lines = []
    for index in range(targets):
        target = home / "targets" / f"job{index:03d}" / "checkpoints"
        target.mkdir(parents=True)
        lines.append(f'[[targets]]\npath = "{target}"\n')
    config.write_text("\n".join(lines))
    return config


def scrape(host: str, port: int) -> tuple[float, int]:
    start = time.perf_counter()
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    elapsed = time.perf_counter() - start
    assert response.status == 200, response.status
    return elapsed, len(body)


def measure(targets: int, duration: float, settle: float, scrapes: int) -> Measurement:
    home = Path(tempfile.mkdtemp(prefix=f"fsprobe-bench-{targets}-"))
    config = write_config(home, targets)
    environment = clean_environment(TMPDIR=str(home))
    try:
        with running_daemon(home, "--config", str(config), environment=environment) as daemon:
            process = psutil.Process(daemon.process.pid)
            time.sleep(settle)  # the first round of every probe, and the imports, are behind us
            cpu_start = cpu_seconds(family(process))
            daemon_rss, worker_rss, pss = [0], [0], [0]
            end = time.monotonic() + duration
            while True:
                processes = family(process)
                daemon_rss.append(processes[0].memory_info().rss)
                worker_rss.append(sum(p.memory_info().rss for p in processes[1:]))
                pss.append(sum(p.memory_full_info().pss for p in processes))
                if time.monotonic() >= end:
                    break
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            cpu_end = cpu_seconds(family(process))
            cpu = sum(cpu_end[pid] - cpu_start.get(pid, 0.0) for pid in cpu_end) / duration * 100
            threads = sum(p.num_threads() for p in family(process))
            latencies, size = [], 0
            for _ in range(scrapes):
                elapsed, size = scrape(daemon.host, daemon.port)
                latencies.append(elapsed)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    latencies.sort()
    return Measurement(
        targets=targets,
        daemon_rss_mib=max(daemon_rss) / 2**20,
        worker_rss_mib=max(worker_rss) / 2**20,
        pss_mib=max(pss) / 2**20,
        cpu_percent=cpu,
        threads=threads,
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        body_kib=size / 1024,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured per size")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--scrapes", type=int, default=1000, help="scrapes for the percentiles")
    args = parser.parse_args()

    print(f"fsprobe run at default intervals, {args.duration:g} s per size, "
          f"{args.scrapes} sequential scrapes; {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}")  # fmt: skip
    header = (
        f"{'targets':>7}  {'daemon RSS':>10}  {'worker RSS':>10}  {'PSS both':>9}  {'CPU':>7}  "
        f"{'threads':>7}  {'/metrics p50':>12}  {'p99':>8}  {'body':>9}"
    )
    print(header)
    print("-" * len(header))
    for targets in args.targets:
        m = measure(targets, args.duration, args.settle, args.scrapes)
        print(
            f"{m.targets:>7}  {m.daemon_rss_mib:>6.1f} MiB  {m.worker_rss_mib:>6.1f} MiB  "
            f"{m.pss_mib:>5.1f} MiB  {m.cpu_percent:>5.2f} %  {m.threads:>7}  {m.p50_ms:>9.2f} ms  "
            f"{m.p99_ms:>5.2f} ms  {m.body_kib:>5.0f} KiB",
            flush=True,
        )
    print(
        "\nRSS and PSS are peaks over the run; CPU and threads are of the daemon and its probe"
        "\nworker together. Goals: p99 < 5 ms at 100 targets; RSS < 45 MB (42.9 MiB) at 10."
    )


if __name__ == "__main__":
    main()
