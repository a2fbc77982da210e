"""What a real save says about writing into its target, in the write probe's terms.

What counts as evidence and what does not: docs/design.md §13, "Passive evidence".
"""

from __future__ import annotations

import os

from fsprobe.events.event import SaveEvent
from fsprobe.model import TIMEOUT, ProbeResult, WriteProbeResult

#: The errnos by which a filesystem says it cannot take a write now, whoever writes: an I/O
#: error, a stale handle, no room or quota, a read-only mount, a save's deadline, a lost
#: server (a Lustre client that was evicted says ESHUTDOWN, one cut off ENOTCONN/ETIMEDOUT).
FILESYSTEM_ERRNOS = frozenset(
    {"EIO", "ESTALE", "ENOSPC", "EDQUOT", "EROFS", TIMEOUT, "ETIMEDOUT", "ENOTCONN", "ESHUTDOWN"}
)
#: Steps of a failed attempt that say nothing about the filesystem of the target.
NOT_FILESYSTEM_STEPS = frozenset({"preflight", "collective"})
#: The `message` of a write result that a real save stands for.
BY_SAVE = "a real save"


def in_directory(save: SaveEvent, target: str) -> bool:
    """Whether `save` was asked for in the directory `target` itself (where the write probe
    writes), not in a subdirectory of it."""
    requested = os.path.abspath(save.requested)
    return os.path.dirname(requested) == os.path.abspath(target)


def write_evidence(save: SaveEvent, target: str, now: float, stands_in: bool) -> list[ProbeResult]:
    """The write results that `save` (heard of at `now`) stands for in `target`, oldest
    first; its landing only if it `stands_in` for the write probe (the store says when)."""
    if not in_directory(save, target):
        return []
    started = now - save.seconds
    results: list[ProbeResult] = [
        ProbeResult(
            "write",
            started,
            0.0,
            value=WriteProbeResult(False, 0, {}, step=f.step, errno=f.errno, message=BY_SAVE),
            error=f.errno,
            message=f"a real save of {save.requested} failed at {f.step} with {f.errno}",
        )
        for f in save.failures
        if not f.in_fallback and f.step not in NOT_FILESYSTEM_STEPS and f.errno in FILESYSTEM_ERRNOS
    ]
    if stands_in and save.outcome in ("ok", "retried"):
        written = WriteProbeResult(True, save.bytes, {}, message=BY_SAVE)
        results.append(ProbeResult("write", started, save.seconds, value=written))
    return results
