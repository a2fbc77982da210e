"""What a real save says about writing into its target, in the write probe's terms.

What counts as evidence and what does not: docs/design.md §13, "Passive evidence".
"""

from __future__ import annotations

from fsprobe.events.event import SaveEvent
from fsprobe.model import ProbeResult, WriteProbeResult

#: Steps of a failed attempt that say nothing about the filesystem of the target.
NOT_FILESYSTEM_STEPS = frozenset({"preflight", "collective"})
#: The `message` of a write result that a real save stands for.
BY_SAVE = "a real save"


def write_evidence(save: SaveEvent, now: float) -> list[ProbeResult]:
    """The write results that `save` (heard of at `now`) stands for, oldest first."""
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
        if not f.in_fallback and f.step not in NOT_FILESYSTEM_STEPS
    ]
    if save.outcome in ("ok", "retried"):
        written = WriteProbeResult(True, save.bytes, {}, message=BY_SAVE)
        results.append(ProbeResult("write", started, save.seconds, value=written))
    return results
