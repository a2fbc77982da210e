"""A save that crashed: a saver process killed mid-save (SIGKILL, as an OOM kill or a lost node
ends a trainer: no exception, no cleanup), and its leftovers as the next save finds them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from fsprobe.posix.atomic import parse_temp_name
from fsprobe.posix.swap import parse_retired_name
from fsprobe.saving.stale import MIN_AGE_SECONDS

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def killed_mid_save(
    code: str, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``python -c code ARGS``, killed with SIGKILL when the block ends: the block waits until
    the saver is where it should die (its stdout is a pipe, to say so). Reaped on every way
    out; it must have died of the SIGKILL, not finished first."""
    saver = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=None if env is None else dict(env),
    )
    try:
        yield saver
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
    finally:
        if saver.poll() is None:
            saver.kill()
            saver.wait()
    assert saver.returncode == -signal.SIGKILL


def a_while_ago(*paths: Path) -> None:
    """A crash's leftovers as the next save finds them: older than the minute a live writer
    may need between creating and locking (`fsprobe.saving.stale.MIN_AGE_SECONDS`)."""
    then = time.time() - 2 * MIN_AGE_SECONDS
    for path in paths:
        os.utime(path, (then, then))


def leftovers(directory: str | os.PathLike[str]) -> list[str]:
    """What fsprobe's saves would leave in `directory` had they not cleaned up: temp files,
    staging directories, checkpoints retired by a two-step replace."""
    return [n for n in os.listdir(directory) if parse_temp_name(n) or parse_retired_name(n)]
