"""Which probes run on a target, with what deadline: shared by `fsprobe check` and the daemon."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsprobe.model import ProbeResult, Snapshot
from fsprobe.policy import Policy
from fsprobe.probing.runner import ProbeCall, ProbeRunner, Run, Work
from fsprobe.probing.target import OWNER
from fsprobe.quota import ServerProbeSettings

#: Time the quota probes get beyond `lfs`'s own deadline, so that the process-group kill and
#: its clean TIMEOUT report happen before the caller gives up on the worker.
LFS_KILL_SLACK = 2.0
#: The size of the write probe's test file.
DEFAULT_WRITE_BYTES = 1024 * 1024
#: Where the tmpdir probe looks for $TMPDIR, in the order `tempfile` does.
TMPDIR_VARIABLES = ("TMPDIR", "TEMP", "TMP")


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
    work: Work
    deadline: float


def _tmpdir_environment() -> dict[str, str]:
    """This process's $TMPDIR and friends, for a probe that may run in an older worker."""
    return {name: os.environ[name] for name in TMPDIR_VARIABLES if name in os.environ}


def plan(target: str, settings: ProbeSettings) -> dict[str, PlannedProbe]:
    """The probes of `target` by kind, named (`fsprobe.probing.probes`). Quota and `lfs df`
    decide themselves whether they apply."""
    who = settings.probe_as
    probes = {
        "statvfs": PlannedProbe(ProbeCall("statvfs", (target, who)), settings.deadline),
        "tmpdir": PlannedProbe(
            ProbeCall("tmpdir", (target, _tmpdir_environment(), who)), settings.deadline
        ),
    }
    if settings.write_probe:
        probes["write"] = PlannedProbe(
            ProbeCall("write", (target, settings.write_bytes, who)), settings.deadline
        )
    if settings.server_probes.provider != "none":
        lfs_deadline = settings.server_probes.timeout + LFS_KILL_SLACK
        server = settings.server_probes
        probes["quota"] = PlannedProbe(ProbeCall("quota", (target, server, who)), lfs_deadline)
        probes["lfs_df"] = PlannedProbe(ProbeCall("lfs_df", (target, server)), lfs_deadline)
        probes["imports"] = PlannedProbe(ProbeCall("imports", (target, server)), lfs_deadline)
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
            kind: runner.submit(target, kind, probe.work, probe.deadline)
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
            runs[target]["write"] = runner.submit(target, "write", write.work, write.deadline)
    return {
        target: {kind: run.result() for kind, run in by_kind.items()}
        for target, by_kind in runs.items()
    }


def probe_once(target: str, settings: ProbeSettings, runner: ProbeRunner) -> Snapshot:
    """Run every planned probe of `target` once (see `run_plans`) and take the snapshot."""
    results = run_plans({target: plan(target, settings)}, runner)[target]
    written = results.get("write")
    return Snapshot(
        target=target,
        results=results,
        recent_write_errors=(written.error,) if written is not None else (),
    )
