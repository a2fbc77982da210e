"""The exposition's own cost at N targets, in-process: what the daemon pays after each probe
result, what a scrape pays, against prometheus_client encoding the same series in the same run.

`daemon_footprint.py` measures a real daemon end to end, scrape latency included, and on a
busy machine that latency is mostly the scheduler's. This script times only the exposition's
work, in one process, in interleaved rounds, so that two source trees can be compared on the
same machine at the same time (run it from each tree):

    .venv/bin/python benchmarks/daemon_exposition.py [--targets 100] [--rounds 30] [--scrapes 1000]

Every target is a fully probed Lustre target (statvfs, two quota entries, 8 OSTs and an MDT,
write probes with every step timed, $TMPDIR, a pending redirect), as on a busy node.

- change: one target's view changes (a probe result), the daemon re-renders it and joins the
  text that scrapes will send (`Exposition.warm`);
- scrape: the bytes a scrape sends (`Exposition.render`, process metrics left out);
- percentiles: p50 and p99 of `--scrapes` single scrapes, one change (also timed alone)
  before every tenth, as scrapes meet results in the daemon;
- baseline: prometheus_client's `generate_latest` encoding the same series from scratch, which
  is what an exporter without the cache would pay on every scrape.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.exporters.exposition import Exposition
from fsprobe.model import (
    FilesystemInfo,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    TmpdirInfo,
    WriteProbeResult,
)

NOW = time.time()
FS = FilesystemInfo(
    probed_path="/lustre/ckpt",
    mountpoint="/lustre",
    fstype="lustre",
    device="10.0.0.1@o2ib:/scratch",
    size_bytes=10 * 2**40,
    avail_bytes=4 * 2**40,
    files=10**9,
    files_free=6 * 10**8,
    readonly=False,
    st_dev=42,
)
QUOTA = QuotaReport(
    provider="lfs",
    entries=(
        QuotaEntry("user", 1000, "alice", QuotaUsage(used=5 * 2**30), QuotaUsage(used=1200)),
        QuotaEntry(
            "project",
            4242,
            None,
            QuotaUsage(used=79 * 2**30, soft=90 * 2**30, hard=100 * 2**30),
            QuotaUsage(
                used=93_000,
                soft=90_000,
                hard=100_000,
                grace_expires_at=NOW + 86400,
                state=QuotaState.SOFT_EXCEEDED,
            ),
        ),
    ),
)
LUSTRE = (
    LustreTarget("scratch-MDT0000", "MDT", 0, 2**40, 2**39, 10**9, 6 * 10**8),
    *(
        LustreTarget(f"scratch-OST{index:04x}", "OST", index, 5 * 2**40, 3 * 2**40, 10**8, 10**7)
        for index in range(8)
    ),
)


def write(total: float) -> WriteProbeResult:
    steps = {"create": 0.002, "write": 0.003, "fsync": total - 0.016, "rename": 0.001}
    steps.update({"fsync_dir": 0.009, "unlink": 0.001, "total": total})
    return WriteProbeResult(ok=True, bytes=1 << 20, latency_seconds=steps)


def fill(store: Store, path: str, seed: int) -> None:
    for probe, value in (
        ("statvfs", FS),
        ("quota", QUOTA),
        ("lfs_df", LUSTRE),
        ("tmpdir", TmpdirInfo("/tmp", same_device=False)),
    ):
        store.record(path, ProbeResult(probe, NOW, 0.01, value=value))
    for index in range(50):  # a histogram with observations spread over its buckets
        total = 0.02 * (1 + (seed + index) % 40)
        store.record(path, ProbeResult("write", NOW, total, value=write(total)))
    store.set_redirected_pending_bytes(path, 3 * 2**30)


def median_seconds(action: Callable[[], object], repeat: int) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=1000, help="single scrapes for p50/p99")
    args = parser.parse_args()

    store = Store()
    paths = [f"/lustre/scratch/job{index:03d}/checkpoints" for index in range(args.targets)]
    store.configure(TargetSpec(path) for path in paths)
    for seed, path in enumerate(paths):
        fill(store, path, seed)
    exposition = Exposition(store.views, process_metrics=False)
    exposition.warm(store.views())
    text = exposition.fsprobe_text()
    families = list(text_string_to_metric_families(text.decode()))

    class Parsed:
        def collect(self):
            return iter(families)

    changes = iter(range(10**9))

    def change() -> None:
        step = next(changes)
        path = paths[step % len(paths)]
        view = store.record(path, ProbeResult("statvfs", NOW + step, 0.01, value=FS))
        exposition.warm([view])

    rows = {"change": [], "scrape": [], "baseline": []}
    for _ in range(args.rounds):  # interleaved, so that a busy moment hits all three alike
        rows["change"].append(median_seconds(change, 20))
        rows["scrape"].append(median_seconds(exposition.render, 20))
        rows["baseline"].append(median_seconds(lambda: generate_latest(Parsed()), 3))
    singles: dict[str, list[float]] = {"change": [], "scrape": []}
    for index in range(args.scrapes):
        if index % 10 == 0:
            singles["change"].append(median_seconds(change, 1))
        singles["scrape"].append(median_seconds(exposition.render, 1))
    lines = text.count(b"\n")
    print(f"{args.targets} targets: {lines} lines, {len(text) / 1024:.0f} KiB of fsprobe metrics")
    for name, values in rows.items():
        print(f"  {name:<9} median {statistics.median(values) * 1000:8.3f} ms")
    for name, values in singles.items():
        values.sort()
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
        print(
            f"  {name:<9} p50 {statistics.median(values) * 1000:8.3f} ms  p99 {p99 * 1000:8.3f} ms"
            f"  ({len(values)} single)"
        )
    baseline = statistics.median(rows["baseline"])
    print(
        f"  a change costs {statistics.median(rows['change']) / baseline:.2f}x, a scrape "
        f"{statistics.median(rows['scrape']) / baseline:.4f}x what generate_latest pays per scrape"
    )


if __name__ == "__main__":
    main()
