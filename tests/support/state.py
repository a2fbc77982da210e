"""The daemon's state file, as tests need it: real reports, judged by the real policy.

A test that needs the daemon to have seen a read-only mount, a hard quota or a hung `statfs`
takes a real probe of a real directory, puts the one fact it needs in place of what was seen,
and lets the policy judge it: the reasons, their severity, whether waiting helps and what a
write would fail with are the policy's, never written by hand. The file is written by the
daemon's own writer (`fsprobe.state.write_state`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping

import fsprobe
from fsprobe.model import (
    TIMEOUT,
    LustreImport,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Snapshot,
    WriteProbeResult,
)
from fsprobe.policy import Policy, evaluate
from fsprobe.report import Report, TargetState
from fsprobe.state import Writer, write_state

#: A `fsprobe.check` of statvfs and $TMPDIR only: no test write, no quota.
STATVFS_ONLY = fsprobe.ProbeSettings(
    write_probe=False, server_probes=fsprobe.ServerProbeSettings(provider="none")
)
INTERVALS = {"statvfs": 15.0, "tmpdir": 60.0, "write": 60.0, "quota": 300.0}


def quota_entry(state: QuotaState, kind: str = "group", ident: int = 4242) -> QuotaEntry:
    """A quota whose space is at `state` (hard limit reached, grace expired, ...)."""
    gib = 1 << 30
    space = QuotaUsage(used=20 * gib, soft=10 * gib, hard=20 * gib, state=state)
    return QuotaEntry(kind, ident, "proj", space, QuotaUsage(used=10))


def daemon_view(
    path: str,
    *,
    age: float = 0.0,
    readonly: bool = False,
    avail_bytes: int | None = None,
    stuck: bool = False,
    write_seconds: float | None = None,
    quota: tuple[QuotaEntry, ...] | None = None,
    imports: tuple[LustreImport, ...] | None = None,
    policy: Policy | None = None,
) -> TargetState:
    """`path` as a daemon would publish it `age` seconds ago, with these facts seen.

    The statvfs and $TMPDIR results are a real probe of `path`; `readonly` and `avail_bytes`
    change what statvfs saw, `stuck` makes it hang, `write_seconds` adds a test write that
    took that long, `quota` a quota probe that read these entries, `imports` this node's
    connections to the Lustre targets.
    """
    at = time.time() - age
    probed = fsprobe.check(path, STATVFS_ONLY).snapshot.results
    fs = dataclasses.replace(probed["statvfs"].value, readonly=readonly)
    if avail_bytes is not None:
        fs = dataclasses.replace(fs, avail_bytes=avail_bytes, size_bytes=2 * avail_bytes)
    results = {
        "statvfs": _result("statvfs", at, fs),
        "tmpdir": _result("tmpdir", at, probed["tmpdir"].value),
    }
    if stuck:
        results["statvfs"] = ProbeResult(
            "statvfs", at - 10.0, 10.0, error=TIMEOUT, message="statfs has not returned", stuck=True
        )
    if write_seconds is not None:
        write = WriteProbeResult(True, 1 << 20, {"write": write_seconds, "total": write_seconds})
        results["write"] = _result("write", at, write)
    if quota is not None:
        results["quota"] = _result("quota", at, QuotaReport("lfs", quota))
    if imports is not None:
        results["imports"] = _result("imports", at, imports)
    snapshot = Snapshot(path, results, (None,) if write_seconds is not None else ())
    verdict = evaluate(snapshot, policy or Policy(intervals=INTERVALS), at)
    return TargetState(Report(path, snapshot, verdict), INTERVALS, at)


def _result(probe: str, at: float, value: object) -> ProbeResult:
    return ProbeResult(probe, at - 0.01, 0.01, value)


def publish(
    state_dir: str,
    targets: Mapping[str, TargetState],
    *,
    host: str = "node1",
    pid: int = 1,
    generated_at: float | None = None,
    once: bool = False,
    stopped_at: float | None = None,
) -> None:
    """Write the state file with these targets, as the daemon's writer does."""
    write_state(
        state_dir,
        time.time() if generated_at is None else generated_at,
        Writer(host, pid, fsprobe.__version__, once, stopped_at),
        {path: json.dumps(target.to_dict()) for path, target in targets.items()},
    )
