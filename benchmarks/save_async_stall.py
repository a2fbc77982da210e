"""How long `fsprobe.save_async` holds up the training thread.

docs/design.md §10: the caller of a background save pays only for a consistent snapshot, so its
stall is compared with the physical floor of one, copying the same tensors (``{k: v.clone()}``;
goal: at most 1.5x), and with what it replaces, a synchronous `fsprobe.save` of the same object. The
three are measured interleaved, in a rotating order; after each `save_async` the benchmark waits
(untimed) for its write to finish and syncs, so that no measurement runs beside a background write
or starts with dirty pages, and every copy is freed before the next is made. The state is float32
tensors of random values, a model's ``state_dict`` in shape.

    python benchmarks/save_async_stall.py [--dir DIR] [--size 256M] [--tensors 32] [--runs 15]
"""

from __future__ import annotations

import argparse
import gc
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


def state_of_size(size: int, tensors: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {f"layer{i}.weight": torch.randn(size // 4 // tensors) for i in range(tensors)}


def measure(size: int, tensors: int, runs: int, directory: str) -> dict[str, object]:
    state = state_of_size(size, tensors)
    target = os.path.join(directory, "last.pt")

    def clone() -> None:
        copied = {key: value.clone() for key, value in state.items()}
        del copied

    def save_async() -> None:
        fsprobe.save_async(state, target)

    def save() -> None:
        fsprobe.save(state, target)

    methods: dict[str, Callable[[], None]] = {
        "save_async (caller's stall)": save_async,
        "clone() of the tensors": clone,
        "fsprobe.save (synchronous)": save,
    }
    names = list(methods)
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs + 1):  # run 0 warms up allocator, page cache and files: not counted
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            start = time.perf_counter()
            methods[name]()
            elapsed = time.perf_counter() - start
            if run:
                times[name].append(elapsed)
            fsprobe.wait_saves()  # untimed: the background write ends before the next method
            gc.collect()
            os.sync()
    stall, copy, synchronous = (times[name] for name in names)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    return {
        "size_bytes": size,
        "tensors": tensors,
        "runs": runs,
        "median_seconds": medians,
        "stall_vs_clone": medians[names[0]] / medians[names[1]],
        "stall_vs_clone_paired_median": statistics.median(s / c for s, c in zip(stall, copy)),
        "stall_vs_synchronous_save": medians[names[0]] / medians[names[2]],
        "stall_vs_synchronous_paired_median": statistics.median(
            s / c for s, c in zip(stall, synchronous)
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to save (default: a new temp dir in the cwd)")
    parser.add_argument("--size", default="256M")
    parser.add_argument("--tensors", type=int, default=32)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fsprobe-bench-", dir=options.dir or ".") as scratch:
        result = measure(parse_size(options.size), options.tensors, options.runs, scratch)
    if options.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{format_bytes(result['size_bytes'])} in {result['tensors']} tensors, "
        f"median of {result['runs']} interleaved runs"
    )
    for name, seconds in result["median_seconds"].items():
        print(f"  {name:<30} {seconds * 1e3:9.1f} ms")
    print(
        f"  stall / clone()           {result['stall_vs_clone']:.2f}x"
        f"  (paired median {result['stall_vs_clone_paired_median']:.2f}x; goal <= 1.5x)"
    )
    print(
        f"  stall / synchronous save  {result['stall_vs_synchronous_save']:.2f}x"
        f"  (paired median {result['stall_vs_synchronous_paired_median']:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
