"""DCP save through `FsprobeWriter` (`fsprobe.integrations.dcp.save`) vs plain `FileSystemWriter`.

docs/design.md §10: committing a DCP checkpoint whole (staging directory, per-file retry, the
preflight in the global plan, `.metadata` fsynced for real, one rename, the old checkpoint
removed) must cost little more than DCP's own save of the same state: goal, median ratio at
most 1.05x. Two ranks (gloo, CPU), 256 MiB in all (each rank 128 MiB of its own tensors). Two
layouts: a new directory per save (``step-N``, DCP's usual one; the previous step removed
untimed, as a retention policy would) and each method saving over its own previous checkpoint
(``last``: here `FsprobeWriter` keeps the old one until the new one is complete, then removes
it, inside the save). The methods run interleaved in a rotating order with an untimed `sync`
between saves, so both see the same page cache and disk; a save is timed on rank 0 from a
barrier before to a barrier after.

    python benchmarks/dcp_writer.py [--dir DIR] [--size 256M] [--runs 7] [--layout both] [--json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as torch_dcp

from fsprobe.integrations import dcp
from fsprobe.units import format_bytes, parse_size

WORLD_SIZE = 2


def plain(state: dict[str, torch.Tensor], path: str) -> None:
    torch_dcp.save(state, storage_writer=torch_dcp.FileSystemWriter(path, overwrite=True))


def with_fsprobe(state: dict[str, torch.Tensor], path: str) -> None:
    dcp.save(state, path)


METHODS: dict[str, Callable[[dict[str, torch.Tensor], str], None]] = {
    "FsprobeWriter (dcp.save)": with_fsprobe,
    "plain FileSystemWriter": plain,
}


def rank_state(rank: int, size: int, tensors: int = 8) -> dict[str, torch.Tensor]:
    """This rank's share of `size` bytes: float32 tensors of random (incompressible) values."""
    torch.manual_seed(rank)
    per_tensor = size // WORLD_SIZE // 4 // tensors
    return {f"rank{rank}.layer{i}": torch.randn(per_tensor) for i in range(tensors)}


def run_rank(rank: int, rendezvous: str, directory: str, size: int, runs: int, layout: str) -> None:
    """One rank: every method `runs` times (after one warm-up), timings printed on rank 0.

    `layout` ``replace``: each method saves over its own previous checkpoint (``last``);
    ``new``: each save is a new directory (``step-N``), the previous one removed untimed.
    """
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(minutes=10),
    )
    # DCP warns on every save over an existing checkpoint, which is what this measures.
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    state = rank_state(rank, size)
    names = list(METHODS)
    times: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs + 1):  # run 0 warms up the page cache and the files, not counted
        order = names[run % len(names) :] + names[: run % len(names)]
        for name in order:
            method = name.split()[0]
            path = os.path.join(directory, method if layout == "replace" else f"{method}-{run}")
            dist.barrier()
            start = time.perf_counter()
            METHODS[name](state, path)
            dist.barrier()
            elapsed = time.perf_counter() - start
            if run:
                times[name].append(elapsed)
            if layout == "new" and rank == 0 and run:  # untimed: the trainer's retention
                shutil.rmtree(os.path.join(directory, f"{method}-{run - 1}"))
            os.sync()  # untimed: the next save starts with nothing dirty
    if rank == 0:
        print(json.dumps(times), flush=True)
    dist.destroy_process_group()


def measure(directory: str, size: int, runs: int, layout: str) -> dict[str, object]:
    rendezvous = os.path.join(directory, "rendezvous")
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, "--rank", str(rank), "--rendezvous", rendezvous),
                *("--dir", directory, "--size", str(size), "--runs", str(runs)),
                *("--layout", layout),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for rank in range(WORLD_SIZE)
    ]
    outputs = [rank.communicate()[0] for rank in ranks]
    if any(rank.returncode for rank in ranks):
        raise SystemExit("a rank failed")
    times: dict[str, list[float]] = json.loads(outputs[0].strip().splitlines()[-1])
    ours, theirs = times["FsprobeWriter (dcp.save)"], times["plain FileSystemWriter"]
    paired = [a / b for a, b in zip(ours, theirs)]
    return {
        "layout": layout,
        "bytes": size,
        "ranks": WORLD_SIZE,
        "runs": runs,
        "median_seconds": {name: statistics.median(values) for name, values in times.items()},
        "median_ratio": statistics.median(ours) / statistics.median(theirs),
        "paired_ratio_median": statistics.median(paired),
        "paired_ratios": paired,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where to save (default: a temp dir)")
    parser.add_argument("--size", default="256M", help="bytes in all, over both ranks")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--layout",
        choices=("new", "replace", "both"),
        default="both",
        help="a new directory per save (step-N), or over the previous one (last)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = parse_size(str(args.size))
    if args.rank is not None:
        run_rank(args.rank, args.rendezvous, args.dir, size, args.runs, args.layout)
        return 0
    layouts = ("new", "replace") if args.layout == "both" else (args.layout,)
    results = []
    for layout in layouts:
        with tempfile.TemporaryDirectory(dir=args.dir) as directory:
            results.append(measure(directory, size, args.runs, layout))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for result in results:
        print(
            f"DCP save of {format_bytes(size)} by {WORLD_SIZE} ranks, {args.runs} runs each, "
            + ("a new directory per save" if result["layout"] == "new" else "over the last one")
        )
        for name, seconds in result["median_seconds"].items():
            print(f"  {name:28} median {seconds:.3f} s")
        print(
            f"  ratio of medians {result['median_ratio']:.3f}x, "
            f"median of paired ratios {result['paired_ratio_median']:.3f}x (goal <= 1.05x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
