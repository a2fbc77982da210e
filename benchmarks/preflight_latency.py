"""Preflight latency with a fresh state file, against a bare `os.statvfs` of the same directory.

docs/design.md §10: the hook a trainer calls before every save must cost about what a statvfs costs
(goal: median within 8x), also with a fallback directory given, as docs/saving.md shows it: a
healthy target's fallbacks are never looked at. All are timed call by call, interleaved in
rounds so that all see the same machine; the medians and their ratios are printed.

    python benchmarks/preflight_latency.py [--dir DIR] [--calls 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import fsprobe
from fsprobe.report import TargetState
from fsprobe.state import Writer, write_state


def publish_fresh_state(state_dir: str, target: str) -> None:
    """A state file as the daemon writes it, for `target`, just updated."""
    report = fsprobe.check(
        target,
        fsprobe.ProbeSettings(
            write_probe=False, server_probes=fsprobe.ServerProbeSettings(provider="none")
        ),
    )
    entry = TargetState(report, {"statvfs": 15.0, "tmpdir": 60.0}, time.time())
    writer = Writer(socket.gethostname(), os.getpid(), fsprobe.__version__)
    write_state(state_dir, time.time(), writer, {target: json.dumps(entry.to_dict())})


def timed(function, calls: int) -> list[float]:
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        start = clock()
        function()
        samples.append((clock() - start) / 1e3)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="target directory (default: a new temp dir)")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fsprobe-bench-") as scratch:
        target = os.path.abspath(options.dir or os.path.join(scratch, "ckpt"))
        os.makedirs(target, exist_ok=True)
        state_dir = os.path.join(scratch, "state")
        publish_fresh_state(state_dir, target)
        path = os.path.join(target, "model.pt")
        fallback = os.path.join(scratch, "fallback")
        os.mkdir(fallback)

        def hook() -> fsprobe.Decision:
            return fsprobe.preflight(path, need_bytes=1 << 30, state_dir=state_dir)

        def hook_with_fallback() -> fsprobe.Decision:
            return fsprobe.preflight(
                path, need_bytes=1 << 30, state_dir=state_dir, fallback_dirs=[fallback]
            )

        for decision in (hook(), hook_with_fallback()):
            if (decision.source, decision.action) != ("state", "proceed"):
                print(f"the state file did not answer: {decision}", file=sys.stderr)
                return 1

        per_round = max(1, options.calls // options.rounds)
        samples: dict[str, list[float]] = {"statvfs": [], "preflight": [], "fallback": []}
        for _ in range(options.rounds):
            samples["statvfs"] += timed(lambda: os.statvfs(target), per_round)
            samples["preflight"] += timed(hook, per_round)
            samples["fallback"] += timed(hook_with_fallback, per_round)
    result: dict[str, float] = {"calls": len(samples["preflight"])}
    for name, series in samples.items():
        result[f"{name}_median_us"] = statistics.median(series)
        result[f"{name}_p99_us"] = statistics.quantiles(series, n=100)[98]
    result["median_ratio"] = result["preflight_median_us"] / result["statvfs_median_us"]
    result["fallback_median_ratio"] = result["fallback_median_us"] / result["statvfs_median_us"]
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['calls']} calls each, interleaved in {options.rounds} rounds")
        print(
            f"os.statvfs          median {result['statvfs_median_us']:8.2f} us"
            f"   p99 {result['statvfs_p99_us']:8.2f} us"
        )
        print(
            f"fsprobe.preflight   median {result['preflight_median_us']:8.2f} us"
            f"   p99 {result['preflight_p99_us']:8.2f} us"
        )
        print(
            f"  with a fallback   median {result['fallback_median_us']:8.2f} us"
            f"   p99 {result['fallback_p99_us']:8.2f} us"
        )
        print(f"median ratio        {result['median_ratio']:.2f}x  (goal: within 8x)")
        print(f"  with a fallback   {result['fallback_median_ratio']:.2f}x  (goal: within 8x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
