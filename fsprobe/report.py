"""A judged snapshot: what `fsprobe check --json` prints and the state file holds per target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsprobe.model import PROBE_KINDS, ProbeResult, Snapshot, Status
from fsprobe.policy import Reason, Verdict
from fsprobe.serialize import plain


def reason_to_dict(reason: Reason) -> dict[str, str]:
    return {"code": reason.code, "severity": reason.severity.label, "message": reason.message}


def _probe_to_dict(result: ProbeResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "error": result.error,
        "message": result.message,
        "stuck": result.stuck,
        "started_at": result.started_at,
        "duration_seconds": result.duration,
    }


@dataclass(frozen=True)
class Report:
    """The answer for one target: the snapshot, the verdict and what was asked of it."""

    path: str
    snapshot: Snapshot
    verdict: Verdict
    need_bytes: int | None = None
    need_inodes: int | None = None

    @property
    def status(self) -> Status:
        return self.verdict.status

    @property
    def reasons(self) -> tuple[Reason, ...]:
        return self.verdict.reasons

    @property
    def fits(self) -> bool | None:
        return self.verdict.fits

    def to_dict(self) -> dict[str, Any]:
        """The documented `check --json` object (DESIGN §6), plus per-probe details."""
        snapshot, headroom = self.snapshot, self.verdict.headroom
        write = snapshot.get("write")
        return {
            "path": self.path,
            "status": self.status.label,
            "reasons": [reason_to_dict(reason) for reason in self.reasons],
            "filesystem": plain(snapshot.value("statvfs")),
            "quota": _quota_entries(snapshot),
            "lustre_targets": plain(snapshot.value("lfs_df")),
            "headroom": {
                "bytes": headroom.bytes,
                "inodes": headroom.inodes,
                "bytes_ratio": headroom.bytes_ratio,
                "inodes_ratio": headroom.inodes_ratio,
                "limited_by": headroom.limited_by,
                "bytes_limited_by": headroom.bytes_limited_by,
                "inodes_limited_by": headroom.inodes_limited_by,
            },
            "write_probe": plain(write.value) if write is not None else None,
            "tmpdir": plain(snapshot.value("tmpdir")),
            "need": {"bytes": self.need_bytes, "inodes": self.need_inodes},
            "fits": self.fits,
            "probed_at": snapshot.probed_at,
            "probes": {
                kind: _probe_to_dict(snapshot.results[kind])
                for kind in PROBE_KINDS
                if kind in snapshot.results
            },
        }


def _quota_entries(snapshot: Snapshot) -> list[dict[str, Any]] | None:
    quota = snapshot.value("quota")
    return plain(list(quota.entries)) if quota is not None else None
