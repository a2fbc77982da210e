"""Run a job module under `torchrun` (``torch.distributed.run``): a real job of two ranks on
this machine, gloo over loopback, with a free port of its own (``--standalone``).

A job module (`tests.support.trainer_job`, `tests.support.lightning_job`) prints on every
rank, as its last line, its `result` prefix and a JSON report that names the rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def torchrun_job(
    module: str, result: str, *args: str, environment: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run ``python -m module ARGS`` on two ranks; every rank's report, by rank. The job must
    succeed (its stderr's end is the failure's message)."""
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a free port of its own
            "--nproc-per-node",
            "2",
            "-m",
            module,
            *args,
        ],
        cwd=REPO,
        env={
            **os.environ,
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": str(REPO),
            **(environment or {}),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    reports = [
        json.loads(line[len(result) :])
        for line in finished.stdout.splitlines()
        if line.startswith(result)
    ]
    return sorted(reports, key=lambda report: report["rank"])
