"""Run a job module under `torchrun` (``torch.distributed.run``): a real job of two ranks on
this machine, gloo over loopback, with a free port of its own (``--standalone``).

A job module (`tests.support.trainer_job`, `tests.support.lightning_job`) prints on every
rank, as its last line, its `result` prefix and a JSON report that names the rank. Each rank's
stdout goes to a file of its own (``--redirects``): ranks sharing one pipe interleave any write
above PIPE_BUF, and a report line of one rank was once cut by the other's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def torchrun_job(
    module: str, result: str, *args: str, environment: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run ``python -m module ARGS`` on two ranks; every rank's report, by rank. The job must
    succeed (its stderr's end is the failure's message)."""
    with tempfile.TemporaryDirectory(prefix="fsprobe-torchrun-") as logs:
        finished = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",  # a free port of its own
                "--nproc-per-node",
                "2",
                "--log-dir",
                logs,
                "--redirects",
                "1",  # stdout of every rank into its own file; stderr stays ours
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
        outputs = sorted(Path(logs).glob("**/stdout.log"))
        assert len(outputs) == 2, f"one stdout file per rank expected, found {outputs}"
        reports = [
            json.loads(line[len(result) :])
            for output in outputs
            for line in output.read_text().splitlines()
            if line.startswith(result)
        ]
    assert len(reports) == 2, f"one report per rank expected, found {len(reports)}"
    return sorted(reports, key=lambda report: report["rank"])
