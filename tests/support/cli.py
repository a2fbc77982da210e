"""Running `fsprobe` subcommands: in the test process, with stdout and stderr kept apart, or as
a process of its own (`check_json`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner


def cli_runner() -> CliRunner:
    """A CliRunner whose results have separate `stdout` and `stderr` on every click version.

    click < 8.2 (the last for Python 3.9) mixes stderr into stdout unless told not to; click
    >= 8.2 keeps them apart and no longer has the argument.
    """
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:
        return CliRunner()


def check_json(path: str | Path, *args: str, timeout: float = 60) -> tuple[int, Any]:
    """`fsprobe check PATH --json ARGS` in a process of its own, with $TMPDIR in PATH: its exit
    status and the document."""
    completed = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(path), "--json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(path)},
        timeout=timeout,
    )
    assert completed.stdout, completed.stderr
    return completed.returncode, json.loads(completed.stdout)
