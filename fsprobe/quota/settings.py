"""How quota is read for a target: which provider, which `lfs`, which IDs, how long to wait."""

from __future__ import annotations

from dataclasses import dataclass

#: The values of --quota-provider: "auto" picks the provider for the target's filesystem.
PROVIDER_CHOICES = ("auto", "lfs", "none")


@dataclass(frozen=True)
class QuotaSettings:
    """Quota settings of one target (DESIGN §4); the defaults need no configuration at all.

    `timeout` bounds one probe: every `lfs` call it makes shares that deadline, and a call still
    running at the deadline is killed with its process group. `cache_seconds` lets several targets
    on one filesystem (and the daemon's next round) reuse a result instead of asking the metadata
    server again.
    """

    provider: str = "auto"  # auto | lfs | none ; auto = lfs iff fstype == "lustre"
    lfs: str | None = None  # binary; else $FSPROBE_LFS; else "lfs" on PATH
    user: int | None = None  # replace the derived IDs (--user/--group/--project)
    group: int | None = None
    project: int | None = None
    timeout: float = 30.0
    cache_seconds: float = 0.0
