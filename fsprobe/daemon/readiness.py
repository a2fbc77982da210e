"""Whether a target can take a redirected checkpoint back, from the daemon's own verdict.

Shipped to the probe worker with the sync task, so this module stays small (docs/design.md §8).
"""

from __future__ import annotations

from dataclasses import dataclass

from fsprobe.model import Status
from fsprobe.policy import Verdict, judge_need
from fsprobe.redirect.manifest import Entry


@dataclass(frozen=True)
class VerdictReadiness:
    """A `fsprobe.redirect.sync.Readiness`: ready when the verdict, judged for the entry's size,
    can take a save (the policy's `can_take_save`: nothing refuses it, nothing unhealthy is in
    the way).

    Degraded is good enough: the copy retries transient errors like any save. A target not
    judged yet (unknown) waits for its first probes.
    """

    verdict: Verdict

    def __call__(self, entry: Entry) -> str | None:
        if self.verdict.status is Status.UNKNOWN:
            return "the target has not been probed yet"
        judged = judge_need(self.verdict, entry.bytes, 1)
        if judged.can_take_save:
            return None
        why = (judged.refusing or judged.concerns)[0]
        return f"the target is {judged.status.label}: {why.message}"
