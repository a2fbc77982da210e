"""`fsprobe.save` against a hand-written durable save and against plain `torch.save`.

docs/design.md §10: the retrying save must cost no more than doing it right by hand (goal: median
ratio at most 1.03x). "By hand" is what a careful trainer writes: `torch.save` to a file object
on a temp file in the same directory, flush, fsync, `os.replace`, fsync the directory. Plain
`torch.save(obj, path)` (no temp file, no fsync: neither atomic nor durable) is shown too, for
an honest view of what durability itself costs. The three are run interleaved, in a rotating
order, so that all see the same page cache and disk, and every save starts with nothing dirty
(an untimed `sync` after each); each overwrites its own file, as a trainer saving `last.pt`
does.

    python benchmarks/save_overhead.py [--dir DIR] [--sizes 64M,512M] [--runs 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

import fsprobe
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


METHODS: dict[str, Callable[[object, str], None]] = {
    "fsprobe.save": with_fsprobe,
    "hand-written durable": hand_written,
    "plain torch.save": plain,
}


def state_of_size(size: int, tensors: int = 16) -> dict[str, torch.Tensor]:
    """A state_dict of `tensors` float32 tensors of random (incompressible) values."""
    torch.manual_seed(0)
    per_tensor = size // 4 // tensors
    return {f"layer{i}.weight": torch.randn(per_tensor) for i in range(tensors)}


def measure(size: int, runs: int, directory: str) -> dict[str, object]:
    obj = state_of_size(size)
    names = list(METHODS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs + 1):  # run 0 warms up the page cache and the files, not counted
        order = names[run % len(names) :] + names[: run % len(names)]
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
    paired = [
        ours / hand for ours, hand in zip(times["fsprobe.save"], times["hand-written durable"])
    ]
    return {
        "size_bytes": size,
        "runs": runs,
        "median_seconds": medians,
        "ratio_vs_hand_written": medians["fsprobe.save"] / medians["hand-written durable"],
        "paired_ratio_median": statistics.median(paired),
        "ratio_vs_plain_torch_save": medians["fsprobe.save"] / medians["plain torch.save"],
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
            print(f"  {name:<22} {seconds * 1e3:9.1f} ms")
        print(
            f"  fsprobe / hand-written  {result['ratio_vs_hand_written']:.3f}x"
            f"  (paired median {result['paired_ratio_median']:.3f}x; goal <= 1.03x)"
        )
        print(f"  fsprobe / plain torch.save  {result['ratio_vs_plain_torch_save']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
