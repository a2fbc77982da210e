"""Which probes run on a target, with what deadline: shared by `fsprobe check` and the daemon."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fsprobe.model import ProbeResult, Snapshot
from fsprobe.policy import Policy
from fsprobe.probing.imports import probe_imports
from fsprobe.probing.lfs_df import probe_lfs_df
from fsprobe.probing.quota import probe_quota
from fsprobe.probing.runner import ProbeRunner, Run
from fsprobe.probing.statvfs import probe_statvfs
from fsprobe.probing.target import OWNER
from fsprobe.probing.tmpdir import TMPDIR_VARIABLES, probe_tmpdir
from fsprobe.probing.write import DEFAULT_WRITE_BYTES, probe_write
from fsprobe.quota import ServerProbeSettings

#: Time the quota probes get beyond `lfs`'s own deadline, so that the process-group kill and
#: its clean TIMEOUT report happen before the caller gives up on the worker.
LFS_KILL_SLACK = 2.0


@dataclass(frozen=True)
class ProbeSettings:
    """How one target is probed and judged (docs/design.md §4-§5); every field is configurable."""

    deadline: float = 10.0
    write_probe: bool = True
    write_bytes: int = DEFAULT_WRITE_BYTES
    probe_as: str = OWNER  # who probes: "owner", "root" or an account (fsprobe.probing.target)
    server_probes: ServerProbeSettings = field(default_factory=ServerProbeSettings)
    policy: Policy = field(default_factory=Policy)


@dataclass(frozen=True)
class PlannedProbe:
    function: Callable[[], object]
    deadline: float


def _tmpdir_environment() -> dict[str, str]:
    """This process's $TMPDIR and friends, for a probe that may run in an older worker."""
    return {name: os.environ[name] for name in TMPDIR_VARIABLES if name in os.environ}


def plan(target: str, settings: ProbeSettings) -> dict[str, PlannedProbe]:
    """The probes of `target` by kind. Quota and `lfs df` decide themselves whether they apply."""
    who = settings.probe_as
    probes = {
        "statvfs": PlannedProbe(functools.partial(probe_statvfs, target, who), settings.deadline),
        "tmpdir": PlannedProbe(
            functools.partial(probe_tmpdir, target, _tmpdir_environment(), who), settings.deadline
        ),
    }
    if settings.write_probe:
        probes["write"] = PlannedProbe(
            functools.partial(probe_write, target, settings.write_bytes, who), settings.deadline
        )
    if settings.server_probes.provider != "none":
        lfs_deadline = settings.server_probes.timeout + LFS_KILL_SLACK
        probes["quota"] = PlannedProbe(
            functools.partial(probe_quota, target, settings.server_probes, who), lfs_deadline
        )
        probes["lfs_df"] = PlannedProbe(
            functools.partial(probe_lfs_df, target, settings.server_probes), lfs_deadline
        )
        probes["imports"] = PlannedProbe(
            functools.partial(probe_imports, target, settings.server_probes), lfs_deadline
        )
    return probes


def run_plans(
    plans: Mapping[str, Mapping[str, PlannedProbe]], runner: ProbeRunner
) -> dict[str, dict[str, ProbeResult]]:
    """Run every planned probe of every target once, each bounded by its deadline.

    All run in parallel except each target's write probe, which starts once that target's
    statvfs has answered: its test file would otherwise be counted in the space and inodes
    that statvfs reports.
    """
    runs: dict[str, dict[str, Run]] = {
        target: {
            kind: runner.submit(target, kind, probe.function, probe.deadline)
            for kind, probe in probes.items()
            if kind != "write"
        }
        for target, probes in plans.items()
    }
    for target, probes in plans.items():
        write = probes.get("write")
        if write is not None:
            if "statvfs" in runs[target]:
                runs[target]["statvfs"].result()
            runs[target]["write"] = runner.submit(target, "write", write.function, write.deadline)
    return {
        target: {kind: run.result() for kind, run in by_kind.items()}
        for target, by_kind in runs.items()
    }


def probe_once(target: str, settings: ProbeSettings, runner: ProbeRunner | None = None) -> Snapshot:
    """Run every planned probe of `target` once (see `run_plans`) and take the snapshot."""
    results = run_plans({target: plan(target, settings)}, runner or ProbeRunner())[target]
    written = results.get("write")
    return Snapshot(
        target=target,
        results=results,
        recent_write_errors=(written.error,) if written is not None else (),
    )
