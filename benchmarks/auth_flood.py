"""`/metrics` latency of a scraper that knows its password while 1,000 clients send wrong ones.

Starts a real `fsprobe run` with basic auth (bcrypt cost 12, as `htpasswd -B -C 12` makes),
scrapes once so that the scraper's credentials are known, then measures the scraper's latency
twice in the same run: alone (the baseline), and while a second process keeps `--clients`
connections busy on loopback, each sending a distinct wrong password again as soon as it is
answered. Every loop is bounded: it stops at `--duration` seconds, or after `--per-client`
requests per client, whichever comes first.

    .venv/bin/python benchmarks/auth_flood.py                       # this tree
    .venv/bin/python benchmarks/auth_flood.py --tree /work/main     # another tree, same venv

Goal (issue 18): p99 under 1 s during the flood (the scraper's timeout is Prometheus' 10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bcrypt
from live_daemon import clean_environment, running_daemon  # beside this script

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "s3cret"


def authorization(password: str) -> str:
    return "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()


def daemon_arguments(home: Path) -> list[str]:
    """A target and a web config whose one user's password is bcrypt-hashed at cost 12."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=12)).decode()
    web = home / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    target = home / "ckpt"
    target.mkdir()
    return [str(target), "--web-config", str(web)]


def scrape(host: str, port: int) -> tuple[float, int]:
    """(seconds, status) of one scrape; status 0 when it timed out or was cut."""
    start = time.perf_counter()
    try:
        connection = http.client.HTTPConnection(host, port, timeout=10)
        connection.request("GET", "/metrics", headers={"Authorization": authorization(PASSWORD)})
        response = connection.getresponse()
        response.read()
        connection.close()
        status = response.status
    except OSError:
        status = 0
    return time.perf_counter() - start, status


def scrape_for(host: str, port: int, duration: float, pause: float) -> list[tuple[float, int]]:
    results = []
    end = time.monotonic() + duration
    while time.monotonic() < end:
        results.append(scrape(host, port))
        time.sleep(pause)
    return results


async def flood(host: str, port: int, clients: int, duration: float, per_client: int) -> None:
    """The flood's own process: `clients` loops of wrong passwords, bounded in time and count."""
    end = time.monotonic() + duration
    statuses: collections.Counter[str] = collections.Counter()

    async def client(index: int) -> None:
        for attempt in range(per_client):
            left = end - time.monotonic()
            if left <= 0:
                return
            request = (
                f"GET /metrics HTTP/1.0\r\n"
                f"Authorization: {authorization(f'wrong-{index}-{attempt}')}\r\n\r\n"
            ).encode()
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), left)
                writer.write(request)
                answer = await asyncio.wait_for(reader.read(4096), max(0.1, end - time.monotonic()))
                writer.close()
                statuses[answer[9:12].decode(errors="replace") or "closed"] += 1
            except (OSError, asyncio.TimeoutError):
                statuses["no answer"] += 1

    await asyncio.gather(*(client(index) for index in range(clients)))
    print(" ".join(f"{status}={count}" for status, count in sorted(statuses.items())), flush=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def measure(tree: Path, clients: int, duration: float, per_client: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="fsprobe-bench-auth-"))
    environment = clean_environment(TMPDIR=str(home), PYTHONPATH=str(tree))
    try:
        with running_daemon(
            home, *daemon_arguments(home), tree=tree, environment=environment
        ) as daemon:
            host, port = daemon.host, daemon.port
            assert scrape(host, port)[1] == 200  # the scraper's credentials are now known
            alone = scrape_for(host, port, duration, 0.05)
            flooder = subprocess.Popen(
                [sys.executable, __file__, "--flood-only", host, str(port), str(clients),
                 str(duration), str(per_client)],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(1.0)  # the flood is in
            during = scrape_for(host, port, duration - 1.0, 0.05)
            flood_answers = flooder.communicate(timeout=duration + 30)[0].strip()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for name, results in (("alone", alone), (f"{clients} flooding", during)):
        latencies = [seconds for seconds, _ in results]
        failed = sum(1 for _, status in results if status != 200)
        print(
            f"{tree!s:<24} {name:<14} scrapes={len(results):<4} failed={failed:<3} "
            f"p50={percentile(latencies, 0.5) * 1000:8.1f} ms  "
            f"p99={percentile(latencies, 0.99) * 1000:8.1f} ms  "
            f"max={max(latencies) * 1000:8.1f} ms",
            flush=True,
        )
    p99_alone = percentile([s for s, _ in alone], 0.99)
    p99_during = percentile([s for s, _ in during], 0.99)
    print(f"{'':<24} p99 ratio flood/alone = {p99_during / p99_alone:.1f}; flood: {flood_answers}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--flood-only":
        host, port, clients, duration, per_client = sys.argv[2:7]
        asyncio.run(flood(host, int(port), int(clients), float(duration), int(per_client)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", help="source tree(s) to measure")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each phase")
    parser.add_argument("--per-client", type=int, default=1000, help="requests per client, at most")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, bcrypt cost 12")
    for tree in args.tree or [REPO]:
        measure(tree.resolve(), args.clients, args.duration, args.per_client)


if __name__ == "__main__":
    main()
