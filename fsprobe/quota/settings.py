"""How the probes that ask the filesystem's servers (quota, `lfs df`) run, and whether at all."""

from __future__ import annotations

from dataclasses import dataclass

#: The values of --quota-provider: "auto" picks the provider for the target's filesystem.
PROVIDER_CHOICES = ("auto", "lfs", "none")

#: The share of the quota interval an answer is kept: the next round comes at least 90 % of
#: the interval later (the schedule's jitter is 10 %), and then asks again.
CACHE_SHARE = 0.8


def cache_seconds_for(quota_interval: float) -> float:
    """How long a daemon reuses a server answer: shared by every target of one filesystem
    (and one directory, for its layout) within a round, renewed every round."""
    return CACHE_SHARE * quota_interval


@dataclass(frozen=True)
class ServerProbeSettings:
    """Server probe settings of one target (docs/design.md §4); the defaults need no configuration.

    `provider` chooses the quota provider, and with it whether `lfs df` runs (on Lustre, or
    anywhere with ``lfs``). `timeout` bounds one probe: every `lfs` call it makes shares that
    deadline, and a call still running at the deadline is killed with its process group.
    `cache_seconds` lets several targets on one filesystem (and the daemon's next round) reuse a
    result instead of asking the metadata server again.
    """

    provider: str = "auto"  # auto | lfs | none ; auto = lfs iff fstype == "lustre"
    lfs: str | None = None  # binary; else $FSPROBE_LFS; else "lfs" on PATH
    lctl: str | None = None  # binary; else $FSPROBE_LCTL; else "lctl" on PATH
    user: int | None = None  # replace the derived IDs (--user/--group/--project)
    group: int | None = None
    project: int | None = None
    timeout: float = 30.0
    cache_seconds: float = 0.0
