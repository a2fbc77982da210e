"""A save's own probes, for when the daemon's state file cannot answer: cheap probes in the
context's probe runner. A `SaveContext` builds its `InlineProbes` on first use, so that a
preflight the state file answers loads neither the probe plan nor the worker (docs/design.md §3).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
import time
from collections.abc import Callable, Iterable

from fsprobe.model import SaveAnswer, Snapshot
from fsprobe.policy import evaluate, save_answer
from fsprobe.probing.plan import ProbeSettings, plan, run_plans
from fsprobe.probing.runner import ProbeRunner, Run
from fsprobe.probing.worker import shared_runner
from fsprobe.quota import ServerProbeSettings

#: What a save probes inline: no test write, no quota (a metadata-server RPC per save).
_CHEAP = ProbeSettings(write_probe=False, server_probes=ServerProbeSettings(provider="none"))


class InlineProbes:
    """The probe runner of a context (`fsprobe.probing.worker.shared_runner` unless given, started
    on first use) and the probes a save makes in it, each bounded by its deadline."""

    def __init__(self, runner: Callable[[], ProbeRunner] | None = None) -> None:
        self._runner = runner or shared_runner

    def runner(self) -> ProbeRunner:
        return self._runner()

    def settings(self, timeout: float) -> ProbeSettings:
        """Cheap probes only, within `timeout`: never a test write, nor quota."""
        return dataclasses.replace(_CHEAP, deadline=min(_CHEAP.deadline, timeout))

    def snapshots(self, directories: Iterable[str], settings: ProbeSettings) -> dict[str, Snapshot]:
        """A snapshot of each directory, probed now, in parallel."""
        plans = {directory: plan(directory, settings) for directory in directories}
        return {
            directory: Snapshot(directory, results)
            for directory, results in run_plans(plans, self.runner()).items()
        }

    def answer(self, snapshot: Snapshot, settings: ProbeSettings) -> SaveAnswer:
        """What `snapshot` answers a save, judged by the policy as the daemon's state file
        answers (`fsprobe.policy.save_answer`)."""
        verdict = evaluate(snapshot, settings.policy, time.time())
        fs = snapshot.value("statvfs")
        return save_answer(verdict, fs.target_exists if fs is not None else None)

    def room(self, directory: str, timeout: float) -> int | None:
        """The bytes a new file in `directory` has room for now (None: unknown)."""
        settings = self.settings(timeout)
        snapshot = self.snapshots([directory], settings)[directory]
        return evaluate(snapshot, settings.policy, time.time()).headroom.bytes

    def is_directory(self, path: str, deadline: float) -> Run:
        """Whether `path` is a directory, asked in the runner (a hung mount must not hang the
        caller)."""
        work = functools.partial(_is_directory, path)
        return self.runner().submit(path, "exists", work, deadline)


def _is_directory(path: str) -> bool:
    """False if `path` does not exist; any other error (EACCES: a fallback this user cannot
    reach) is raised, for the result to say."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
