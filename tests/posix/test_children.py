"""The supervisor of fsprobe's children (`fsprobe.posix.children`)."""

from __future__ import annotations

import subprocess
import sys

ENDING = """
import errno
from fsprobe.posix import children
children.kill_runs()
try:
    children.start(["true"])
except OSError as error:
    print(errno.errorcode[error.errno], error.strerror)
else:
    print("started")
"""


def test_no_run_starts_once_the_runs_were_killed():
    """A probe thread that reaches `lfs` while the worker ends (in the up to a second it waits
    for its killed runs) starts nothing: what it started would outlive the worker."""
    ran = subprocess.run(
        [sys.executable, "-c", ENDING], capture_output=True, text=True, timeout=60, check=True
    )
    assert ran.stdout.strip() == "ECANCELED not starting true: the process is ending", ran
