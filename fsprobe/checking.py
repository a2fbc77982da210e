"""`fsprobe.check()`: probe a directory once and judge it, as `fsprobe check` does."""

from __future__ import annotations

import dataclasses
import os
import time

from fsprobe.model import NEED_INODES
from fsprobe.policy import evaluate
from fsprobe.probing.plan import ProbeSettings, probe_once
from fsprobe.report import Report
from fsprobe.saving.context import SaveContext, default_context

_DEFAULT_SETTINGS = ProbeSettings()


def check(
    path: str | os.PathLike[str],
    settings: ProbeSettings | None = None,
    *,
    need_bytes: int | None = None,
    need_inodes: int | None = None,
    timeout: float | None = None,
    context: SaveContext | None = None,
) -> Report:
    """Probe `path` now (statvfs, quota, `lfs df`, a test write, $TMPDIR) and judge it.

    `settings` (a `fsprobe.ProbeSettings`: the probes, who runs them, the server probes'
    `ServerProbeSettings` and the thresholds, as the daemon's configuration gives them) are the
    defaults unless given. Every probe runs in parallel, in `context`'s probe worker (so that a
    stuck probe never keeps this process from exiting), and is bounded by its deadline;
    `timeout` caps all of them, so on a hung mount this returns after about `timeout` seconds
    with a `mount_stuck` reason. `need_inodes` defaults to one file when `need_bytes` is
    given (what a save needs, as in `preflight`).
    """
    if settings is not None and not isinstance(settings, ProbeSettings):  # need_bytes was 2nd
        raise TypeError(f"settings takes a fsprobe.ProbeSettings, not {settings!r}")
    if need_inodes is None and need_bytes is not None:
        need_inodes = NEED_INODES
    effective = settings or _DEFAULT_SETTINGS
    if timeout:
        server = effective.server_probes
        effective = dataclasses.replace(
            effective,
            deadline=min(effective.deadline, timeout),
            server_probes=dataclasses.replace(server, timeout=min(server.timeout, timeout)),
        )
    runner = (context or default_context()).runner()
    snapshot = probe_once(os.path.abspath(path), effective, runner)
    verdict = evaluate(snapshot, effective.policy, time.time(), need_bytes, need_inodes)
    return Report(os.fspath(path), snapshot, verdict, need_bytes, need_inodes)
