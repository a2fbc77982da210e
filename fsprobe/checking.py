"""`fsprobe.check()`: probe a directory once and judge it, as `fsprobe check` does."""

from __future__ import annotations

import dataclasses
import os
import time

from fsprobe.model import NEED_INODES
from fsprobe.policy import evaluate
from fsprobe.probing.plan import ProbeSettings, probe_once
from fsprobe.probing.runner import ProbeRunner
from fsprobe.report import Report
from fsprobe.saving.preflight import SaveContext, default_context


def check(
    path: str,
    need_bytes: int | None = None,
    need_inodes: int | None = None,
    *,
    timeout: float | None = None,
    write_probe: bool = True,
    quota_provider: str = "auto",
    lfs: str | None = None,
    lctl: str | None = None,
    user: int | None = None,
    group: int | None = None,
    project: int | None = None,
    probe_as: str | None = None,
    settings: ProbeSettings | None = None,
    runner: ProbeRunner | None = None,
    context: SaveContext | None = None,
) -> Report:
    """Probe `path` now (statvfs, quota, `lfs df`, a test write, $TMPDIR) and judge it.

    `lfs` and `lctl` name the Lustre tools (else $FSPROBE_LFS, $FSPROBE_LCTL, then PATH).
    Every probe runs in parallel and is bounded by its deadline; `timeout` caps all of them, so
    on a hung mount this returns after about `timeout` seconds with a `mount_stuck` reason.
    The probes run in a worker process, so a stuck probe never keeps this process from exiting.
    `probe_as` says who probes when this process is root ("owner", the default; "root"; an
    account name), see `fsprobe.probing.target.probing_identity`.
    `settings`, when given, is the base that the keyword arguments refine. `need_inodes`
    defaults to one file when `need_bytes` is given (what a save needs, as in `preflight`).
    `runner` is the probe runner: `context`'s (`fsprobe.default_context()` unless given).
    """
    if need_inodes is None and need_bytes is not None:
        need_inodes = NEED_INODES
    base = settings or ProbeSettings()
    quota = dataclasses.replace(
        base.server_probes,
        provider=quota_provider if quota_provider != "auto" else base.server_probes.provider,
        lfs=lfs or base.server_probes.lfs,
        lctl=lctl or base.server_probes.lctl,
        user=user if user is not None else base.server_probes.user,
        group=group if group is not None else base.server_probes.group,
        project=project if project is not None else base.server_probes.project,
        timeout=min(base.server_probes.timeout, timeout) if timeout else base.server_probes.timeout,
    )
    effective = dataclasses.replace(
        base,
        deadline=min(base.deadline, timeout) if timeout else base.deadline,
        write_probe=base.write_probe and write_probe,
        probe_as=probe_as or base.probe_as,
        server_probes=quota,
    )
    snapshot = probe_once(
        os.path.abspath(path), effective, runner or (context or default_context()).runner()
    )
    verdict = evaluate(snapshot, effective.policy, time.time(), need_bytes, need_inodes)
    return Report(path, snapshot, verdict, need_bytes, need_inodes)
