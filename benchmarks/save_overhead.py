"""`fsprobe.save` against a hand-written durable save and against plain `torch.save`.

docs/design.md §10: the retrying save must cost no more than doing it right by hand (goal: median
ratio at most 1.03x). "By hand" is what a careful trainer writes: `torch.save` to a file object
on a temp file in the same directory, flush, fsync, `os.replace`, fsync the directory. Plain
`torch.save(obj, path)` (no temp file, no fsync: neither atomic nor durable) is shown too, for
an honest view of what durability itself costs. The three are run interleaved, in a rotating
order, so that all see the same page cache and disk, and every save starts with nothing dirty
(an untimed `sync` after each); each overwrites its own file, as a trainer saving `last.pt`
does. `fsprobe.save` runs twice: without a daemon (its preflight probes inline, reused for
15 s) and with a daemon's fresh state file answering (republished, untimed, before each run:
the usual case on a node that runs `fsprobe run`). Medians and minimums are both shown.

    python benchmarks/save_overhead.py [--dir DIR] [--sizes 64M,512M] [--runs 7] [--json]
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
from collections.abc import Callable

import torch

import fsprobe
from fsprobe.report import TargetState
from fsprobe.state import Writer, write_state
from fsprobe.units import format_bytes, parse_size


def hand_written(obj: object, path: str) -> None:
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp")
    with open(temporary, "wb") as stream:
        torch.save(obj, stream)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def plain(obj: object, path: str) -> None:
    torch.save(obj, path)


def with_fsprobe(obj: object, path: str) -> None:
    fsprobe.save(obj, path)


#: The state dir a daemon would publish for the benchmark's directory (set by `measure`).
STATE_DIR: list[str] = []


def with_fsprobe_and_daemon(obj: object, path: str) -> None:
    fsprobe.save(obj, path, state_dir=STATE_DIR[0])


METHODS: dict[str, Callable[[object, str], None]] = {
    "fsprobe.save": with_fsprobe,
    "fsprobe.save+state": with_fsprobe_and_daemon,
    "hand-written durable": hand_written,
    "plain torch.save": plain,
}


def publish(state_dir: str, target: str) -> None:
    """A fresh state file for `target`, as the daemon writes it (`fsprobe run`)."""
    report = fsprobe.check(
        target,
        fsprobe.ProbeSettings(
            write_probe=False, server_probes=fsprobe.ServerProbeSettings(provider="none")
        ),
    )
    entry = TargetState(report, {"statvfs": 15.0, "tmpdir": 60.0}, time.time())
    writer = Writer(socket.gethostname(), os.getpid(), fsprobe.__version__)
    write_state(state_dir, time.time(), writer, {target: json.dumps(entry.to_dict())})


def state_of_size(size: int, tensors: int = 16) -> dict[str, torch.Tensor]:
    """A state_dict of `tensors` float32 tensors of random (incompressible) values."""
    torch.manual_seed(0)
    per_tensor = size // 4 // tensors
    return {f"layer{i}.weight": torch.randn(per_tensor) for i in range(tensors)}


def measure(size: int, runs: int, directory: str) -> dict[str, object]:
    obj = state_of_size(size)
    names = list(METHODS)
    times: dict[str, list[float]] = {name: [] for name in names}
    STATE_DIR[:] = [os.path.join(directory, "state")]
    for run in range(runs + 1):  # run 0 warms up the page cache and the files, not counted
        order = names[run % len(names) :] + names[: run % len(names)]
        publish(STATE_DIR[0], os.path.abspath(directory))
        for name in order:
            path = os.path.join(directory, f"{name.split()[0].replace('.', '_')}.pt")
            start = time.perf_counter()
            METHODS[name](obj, path)
            if run:
                times[name].append(time.perf_counter() - start)
            # Untimed: write back what plain torch.save left dirty, or the next method's fsync
            # would pay for it (and which method comes next depends on the rotation).
            os.sync()
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    minimums = {name: min(samples) for name, samples in times.items()}
    paired = [
        ours / hand for ours, hand in zip(times["fsprobe.save"], times["hand-written durable"])
    ]
    hand, state = "hand-written durable", "fsprobe.save+state"
    return {
        "size_bytes": size,
        "runs": runs,
        "median_seconds": medians,
        "min_seconds": minimums,
        "ratio_vs_hand_written": medians["fsprobe.save"] / medians[hand],
        "paired_ratio_median": statistics.median(paired),
        "ratio_vs_plain_torch_save": medians["fsprobe.save"] / medians["plain torch.save"],
        "min_ratio_vs_hand_written": minimums["fsprobe.save"] / minimums[hand],
        "state_ratio_vs_hand_written": medians[state] / medians[hand],
        "state_min_ratio_vs_hand_written": minimums[state] / minimums[hand],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to save (default: a new temp dir in the cwd)")
    parser.add_argument("--sizes", default="64M,512M")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    sizes = [parse_size(text) for text in options.sizes.split(",")]

    with tempfile.TemporaryDirectory(prefix="fsprobe-bench-", dir=options.dir or ".") as scratch:
        results = [measure(size, options.runs, scratch) for size in sizes]
    if options.json:
        print(json.dumps(results, indent=2))
        return 0
    for result in results:
        print(f"{format_bytes(result['size_bytes'])}, median of {result['runs']} interleaved runs")
        for name, seconds in result["median_seconds"].items():
            least = result["min_seconds"][name]
            print(f"  {name:<22} {seconds * 1e3:9.1f} ms  (min {least * 1e3:.1f} ms)")
        print(
            f"  fsprobe / hand-written  {result['ratio_vs_hand_written']:.3f}x"
            f"  (paired median {result['paired_ratio_median']:.3f}x, minimums"
            f" {result['min_ratio_vs_hand_written']:.3f}x; goal <= 1.03x)"
        )
        print(
            f"  with the state file     {result['state_ratio_vs_hand_written']:.3f}x"
            f"  (minimums {result['state_min_ratio_vs_hand_written']:.3f}x)"
        )
        print(f"  fsprobe / plain torch.save  {result['ratio_vs_plain_torch_save']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
