"""Run a test scenario in real processes joined by `torch.distributed` (gloo, CPU).

::

    ranks = start_ranks("tests.saving.test_save_distributed:two_shards", 2, tmp_path, target=str(t))
    results = finish(ranks)          # [RankResult(rank=0, ...), RankResult(rank=1, ...)]

Each rank runs ``python -m tests.support.ranks MODULE:FUNCTION RANK WORLD RENDEZVOUS TIMEOUT
ARGS``: it joins the group through a file rendezvous (no port to choose, none to collide),
calls ``FUNCTION(rank, world_size, **args)`` and prints what it returned (or the exception it
raised) as one JSON line, the last of its stdout. The group's collective timeout is TIMEOUT
seconds, so that a test about a dead rank waits for it, not for torch's default 30 minutes.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_RESULT = "RANK-RESULT "
#: The exit status of a rank that a scenario kills before the collective decision (``os._exit``,
#: as an OOM kill or a lost node would end it: no exception, no goodbye to the others).
DIED = 3


@dataclass
class RankResult:
    """How one rank ended: its exit status, what it returned or raised, what it printed."""

    rank: int
    returncode: int
    value: Any
    raised: dict[str, Any] | None
    output: str
    errors: str


def start_ranks(
    scenario: str,
    world_size: int,
    workdir: Path,
    *,
    collective_timeout: float = 30.0,
    first_on_path: Path | None = None,
    **args: Any,
) -> list[subprocess.Popen]:
    """Start `world_size` processes running `scenario` (``module:function``) with `args`;
    `first_on_path` goes before everything on their module path (a module to hide one)."""
    rendezvous = workdir / f"rendezvous-{os.urandom(4).hex()}"
    path = str(REPO) if first_on_path is None else f"{first_on_path}{os.pathsep}{REPO}"
    environment = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "PYTHONPATH": path}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.ranks",
                scenario,
                str(rank),
                str(world_size),
                str(rendezvous),
                str(collective_timeout),
                json.dumps(args),
            ],
            cwd=REPO,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]


def finish(ranks: list[subprocess.Popen], timeout: float = 90.0) -> list[RankResult]:
    """Wait for every rank (killing the rest once `timeout` passed) and collect results."""
    results = []
    for rank, process in enumerate(ranks):
        try:
            output, errors = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            output, errors = process.communicate()
        lines = [line for line in output.splitlines() if line.startswith(_RESULT)]
        report = json.loads(lines[-1][len(_RESULT) :]) if lines else {}
        results.append(
            RankResult(
                rank=rank,
                returncode=process.returncode,
                value=report.get("value"),
                raised=report.get("raised"),
                output=output,
                errors=errors,
            )
        )
    return results


def assert_a_dead_rank_fails_the_save(
    scenario: str, workdir: Path, *, collective_timeout: float = 20.0, **args: Any
) -> None:
    """Run `scenario` on two ranks with ``die_in_write=True``: rank 1 dies (`DIED`) while
    writing, and rank 0 must raise the collective's `SaveError` (``ECONNABORTED``, saying that
    another rank died or hung) within the collective timeout plus the start of two processes."""
    started = time.monotonic()
    ranks = start_ranks(
        scenario, 2, workdir, collective_timeout=collective_timeout, die_in_write=True, **args
    )
    rank0, rank1 = finish(ranks, timeout=60)
    elapsed = time.monotonic() - started
    assert rank1.returncode == DIED
    assert rank0.returncode == 1 and rank0.raised["type"] == "SaveError"
    assert rank0.raised["attempts"][0][:2] == ["ECONNABORTED", "collective"]
    assert "another rank may have died or hung" in rank0.raised["message"]
    assert elapsed < collective_timeout + 30


def run_ranks(scenario: str, world_size: int, workdir: Path, **args: Any) -> list[RankResult]:
    """`start_ranks` and `finish`; every rank must have exited normally."""
    results = finish(start_ranks(scenario, world_size, workdir, **args))
    for result in results:
        assert result.returncode == 0, f"rank {result.rank} failed:\n{result.errors[-4000:]}"
    return results


def _main(argv: list[str]) -> None:
    scenario_name, rank, world_size, rendezvous, timeout, args = argv
    import torch.distributed as dist  # only in the rank processes

    dist.init_process_group(
        "gloo",
        init_method=f"file://{rendezvous}",
        rank=int(rank),
        world_size=int(world_size),
        timeout=datetime.timedelta(seconds=float(timeout)),
    )
    module, function = scenario_name.split(":")
    scenario = getattr(importlib.import_module(module), function)
    try:
        report: dict[str, Any] = {"value": scenario(int(rank), int(world_size), **json.loads(args))}
        status = 0
    except Exception as error:
        traceback.print_exc()
        report = {
            "raised": {
                "type": type(error).__name__,
                "message": str(error),
                "errno": getattr(error, "errno", None),
                "attempts": [list(a.args) for a in getattr(error, "attempts", [])],
            }
        }
        status = 1
    print(_RESULT + json.dumps(report), flush=True)
    for thread in threading.enumerate():  # as the interpreter's exit would, but bounded
        if not thread.daemon and thread is not threading.current_thread():
            thread.join(timeout=30)
    sys.stderr.flush()
    # No destroy_process_group: after a peer died it can block; the process ends here anyway.
    os._exit(status)


if __name__ == "__main__":
    _main(sys.argv[1:])
