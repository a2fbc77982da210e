"""The probe worker's channel, attacked from the worker's side (issue 13).

Every process of fsprobe has a probe worker: its child, of the same user, that makes the
filesystem calls and sends back the results, pickled, over a socket pair nobody else holds.
One case makes that worker hostile: a run of ``fsprobe sync`` that root started as a user
(`fsprobe.redirect.delegate`) gave up root itself, so its user cannot trace it; its worker,
started with ``exec``, is the user's own process, which they can trace and make send anything.
Whatever the worker sends must therefore be nothing more than data to the process it serves.
"""

from __future__ import annotations

import io
import os
import pickle
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fsprobe.model import QuotaReport, QuotaState
from fsprobe.probing.worker import NotAResult, ResultUnpickler
from tests.support.users import REPO


class _Runs:
    """What a hostile worker sends: unpickling it runs ``touch <marker>``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def forge_a_result(marker: str) -> None:
    """Run in the worker (as a probe): write a result of one's own making into its channel,
    as a user who traces their worker would; then wait to be answered like a probe."""
    channel = socket.socket(fileno=os.dup(int(sys.argv[2])))  # the worker's end of the pair
    payload = pickle.dumps((0, _Runs(marker)))
    channel.sendall(struct.pack("!I", len(payload)) + payload)
    channel.detach()


#: The process that the worker serves: it asks one probe, which forges its answer.
SERVED = """
import functools, sys
from fsprobe.probing.worker import ProcessExecutor
from tests.attacks.test_attack_worker import forge_a_result
executor = ProcessExecutor()
result = executor.submit("forge", functools.partial(forge_a_result, sys.argv[1])).result(60)
print(result.error, result.message)
"""


def test_a_result_the_worker_forges_runs_nothing_in_the_process_it_serves(tmp_path: Path):
    marker = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-c", SERVED, str(marker)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not marker.exists()  # os.system never ran in the served process
    assert done.returncode == 0, done.stderr
    error, _, message = done.stdout.partition(" ")
    assert error == "EUNKNOWN" and "probe worker" in message, done.stdout


class _ByName:
    """Pickles as ``getattr(cls, name)``: how Python 3.11.2 pickles an enum member."""

    def __init__(self, cls: object, name: str) -> None:
        self.cls, self.name = cls, name

    def __reduce__(self):
        return (getattr, (self.cls, self.name))


def test_an_enum_member_pickled_by_name_is_read_and_getattr_gives_nothing_else():
    """A worker on Python 3.11.2 pickles QuotaState.OK as getattr(QuotaState, "OK"): every
    quota result was refused as "builtins.getattr, which no probe returns" (fsprobe quota from
    the system's Python 3.11 printed no quota). That getattr gives enum members only."""

    def load(value: object) -> object:
        return ResultUnpickler(io.BytesIO(pickle.dumps(value))).load()

    assert load(_ByName(QuotaState, "OK")) is QuotaState.OK
    for hostile in (_ByName(QuotaState, "__class__"), _ByName(QuotaReport, "__init__")):
        with pytest.raises(NotAResult):
            load(hostile)
