"""The policy's inputs built by hand, for the tests of the pure policy (docs/design.md §5).

`fsprobe.policy.evaluate` is a pure function of a snapshot, a policy and a moment, so its tests
give it plain values: what statvfs saw of ``/ckpt``, and probe results that finished a second
before `NOW`. What a test is about (a quota, a slow write, a full storage target) it builds
where it says it.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsprobe.model import FilesystemInfo, ProbeResult, Snapshot
from fsprobe.policy import Policy, Verdict, evaluate

#: The steps of the write probe (`fsprobe.probing.write`), each timed in `latency_seconds`.
WRITE_STEPS = ("create", "write", "fsync", "rename", "fsync_dir", "unlink")

NOW = 1_800_000_000.0


def filesystem_info(
    avail: int,
    size: int,
    files: int,
    files_free: int,
    *,
    readonly: bool = False,
    mountpoint: str = "/ckpt",
) -> FilesystemInfo:
    """What statvfs saw of ``/ckpt``: these amounts; of the mount, the policy reads only
    whether it is read-only and names its mount point."""
    return FilesystemInfo(
        probed_path="/ckpt",
        mountpoint=mountpoint,
        fstype="lustre",
        device="mgs@tcp:/proj",
        size_bytes=size,
        avail_bytes=avail,
        files=files,
        files_free=files_free,
        readonly=readonly,
        st_dev=1,
    )


def probe(
    kind: str, value: object = None, error: str | None = None, finished_at: float = NOW - 1
) -> ProbeResult:
    """A run of the probe `kind` that took no time and finished at `finished_at`."""
    return ProbeResult(kind, finished_at, 0.0, value, error, "", False)


def judge(
    *results: ProbeResult,
    recent: Iterable[str | None] = (),
    policy: Policy | None = None,
    **need: int | None,
) -> Verdict:
    """The verdict on ``/ckpt`` at `NOW` from these results (one per probe), the errno names
    of the `recent` write probes (newest last) and the `need_bytes`/`need_inodes` asked."""
    snapshot = Snapshot("/ckpt", {r.probe: r for r in results}, tuple(recent))
    return evaluate(snapshot, policy or Policy(), NOW, **need)
