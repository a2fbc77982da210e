"""A judged snapshot and its JSON, both ways: `check --json`, and a target in the state file
(`TargetState`: the report, and the `SaveAnswer` the policy makes of it for the save).

The document's keys and the forms of the values in it are declared here (`fsprobe.codec`);
`Report.from_dict` reads what `Report.to_dict` wrote, `FormatError` naming a field that does
not read, so that the save hook, `fsprobe status` and the rendering never walk raw dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsprobe.codec import Form, FormatError
from fsprobe.model import (
    PROBE_KINDS,
    QUOTA_TYPES,
    FilesystemInfo,
    LastSave,
    LustreImport,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaUsage,
    Reason,
    Snapshot,
    Status,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.policy import Headroom, Verdict, save_answer
from fsprobe.state import ANSWER, ANSWER_KEY, StateFile

#: ``files``/``files_free``: the old names of ``inodes``/``inodes_free``, written beside them
#: for one release (0.2) so that scripts reading them keep working, and read where the new
#: names are absent (a document written before them).
_INODES = "inodes=files inodes_free=files_free files! files_free!"
_OLD_INODES = {"inodes": "files", "inodes_free": "files_free"}

LAST_SAVE = Form(
    LastSave,
    "at outcome seconds bytes requested landed uid pid host ranks failures",
    named={"failures": ("errno", "step")},
)
FILESYSTEM = Form(
    FilesystemInfo,
    f"probed_path mountpoint fstype device size_bytes avail_bytes {_INODES} readonly st_dev",
    renamed=_OLD_INODES,
)
QUOTA_USAGE = Form(QuotaUsage, "used soft hard grace_expires_at state inaccurate")
QUOTA_ENTRY = Form(QuotaEntry, "type id name bytes inodes pool?", choices={"type": QUOTA_TYPES})
LUSTRE_TARGET = Form(
    LustreTarget,
    f"name kind index size_bytes avail_bytes {_INODES} active flags pools? in_layout? "
    "unknown_state?",
    renamed=_OLD_INODES,
)
LUSTRE_IMPORT = Form(  # connected and recovering are derived from the state
    LustreImport,
    "name kind index state connected! recovering! lost_at lost_before? last_eviction active? "
    "idle_cycle? in_layout?",
)
WRITE_PROBE = Form(WriteProbeResult, "ok bytes latency_seconds step errno message")
TMPDIR = Form(TmpdirInfo, "path same_device free_bytes?")
HEADROOM = Form(  # limited_by is derived from the others
    Headroom,
    "bytes inodes bytes_ratio inodes_ratio limited_by! bytes_limited_by inodes_limited_by",
)
PROBE = Form(  # ok is derived from error and stuck; the value is in the document's other keys
    ProbeResult,
    "ok! error message stuck started_at duration_seconds=duration",
    keyed=("probe", PROBE_KINDS),
)


@dataclass(frozen=True)
class _Need:
    """What was asked of the target: a save of `bytes` and `inodes`."""

    bytes: int | None
    inodes: int | None


NEED = Form(_Need, "bytes inodes")


@dataclass(frozen=True)
class _Document:
    """The `check --json` object as its keys hold it (docs/reference.md)."""

    path: str
    status: Status
    reasons: tuple[Reason, ...]
    filesystem: FilesystemInfo | None
    quota: tuple[QuotaEntry, ...] | None
    quota_provider: str | None
    quota_errors: tuple[str, ...]
    lustre_targets: tuple[LustreTarget, ...] | None
    headroom: Headroom
    write_probe: WriteProbeResult | None
    tmpdir: TmpdirInfo | None
    need: _Need
    fits: bool | None
    fresh_until: float | None
    probes: Mapping[str, ProbeResult[Any]]
    exists: bool | None = None  # absent in earlier versions: taken as existing
    quota_notes: tuple[str, ...] = ()  # absent before pools
    lustre_imports: tuple[LustreImport, ...] | None = None  # absent before the imports probe

    @property
    def judged_path(self) -> str | None:
        return self.filesystem.probed_path if self.filesystem is not None else None

    @property
    def probed_at(self) -> float | None:
        return Snapshot(self.path, self.probes).probed_at


DOCUMENT = Form(
    _Document,
    "path exists? judged_path! status reasons filesystem quota quota_provider quota_errors"
    " quota_notes? lustre_targets lustre_imports? headroom write_probe tmpdir need fits"
    " probed_at! fresh_until probes",
    name="report",
)


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

    @property
    def exists(self) -> bool | None:
        """Whether the target directory itself exists (None: no statvfs says)."""
        fs: FilesystemInfo | None = self.snapshot.value("statvfs")
        return fs.target_exists if fs is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The documented `check --json` object (docs/reference.md), plus per-probe details."""
        snapshot, verdict = self.snapshot, self.verdict
        fs: FilesystemInfo | None = snapshot.value("statvfs")
        quota: QuotaReport | None = snapshot.value("quota")
        write = snapshot.get("write")
        document = _Document(
            path=self.path,
            exists=self.exists,
            status=verdict.status,
            reasons=verdict.reasons,
            filesystem=fs,
            quota=quota.entries if quota is not None else None,
            quota_provider=quota.provider if quota is not None else None,
            quota_errors=quota.errors if quota is not None else (),
            quota_notes=quota.notes if quota is not None else (),
            lustre_targets=snapshot.value("lfs_df"),
            lustre_imports=snapshot.value("imports"),
            headroom=verdict.headroom,
            write_probe=write.value if write is not None else None,
            tmpdir=snapshot.value("tmpdir"),
            need=_Need(self.need_bytes, self.need_inodes),
            fits=verdict.fits,
            fresh_until=verdict.fresh_until,
            probes={k: snapshot.results[k] for k in PROBE_KINDS if k in snapshot.results},
        )
        return DOCUMENT.encode(document)

    @classmethod
    def from_dict(cls, document: Any, where: str = "") -> Report:
        """The report that `to_dict` wrote; `FormatError` if `document` is not one.

        Keys it does not know are ignored (the state file adds its own beside them). The JSON
        does not hold the write-error history behind a verdict, only the verdict, so the
        snapshot read back has an empty `recent_write_errors`.
        """
        read = DOCUMENT.decode(document, where)
        values: dict[str, object] = {
            "statvfs": _with_existence(read.filesystem, read.exists),
            "write": read.write_probe,
            "tmpdir": read.tmpdir,
            "lfs_df": read.lustre_targets,
            "imports": read.lustre_imports,
        }
        if read.quota_provider is not None:
            entries = read.quota or ()
            values["quota"] = QuotaReport(
                provider=read.quota_provider,
                entries=entries,
                inaccurate=any(e.bytes.inaccurate or e.inodes.inaccurate for e in entries),
                errors=read.quota_errors,
                notes=read.quota_notes,
            )
        results = {
            kind: dataclasses.replace(result, value=values.get(kind))
            for kind, result in read.probes.items()
        }
        verdict = Verdict(read.status, read.reasons, read.headroom, read.fits, read.fresh_until)
        return cls(
            read.path, Snapshot(read.path, results), verdict, read.need.bytes, read.need.inodes
        )


def _with_existence(fs: FilesystemInfo | None, exists: bool | None) -> FilesystemInfo | None:
    """The filesystem read back, with whether the target existed (`exists`)."""
    if fs is None or exists is None or exists == fs.target_exists:
        return fs
    return dataclasses.replace(fs, target_exists=exists)


@dataclass(frozen=True)
class TargetState:
    """One target in the state file: the daemon's report, how often its probes run, and
    when the daemon last published it. Its entry also holds the report's `SaveAnswer`, the
    only part a save reads (`fsprobe.state.StateFile.answer`)."""

    report: Report
    intervals: Mapping[str, float]
    updated_at: float
    last_save: LastSave | None = None  # the latest real save the daemon heard of
    server_probes_elsewhere: str | None = None  # why quota and lfs df do not run here

    def to_dict(self) -> dict[str, Any]:
        answer = save_answer(self.report.verdict, self.report.exists)
        return {
            **self.report.to_dict(),
            **TARGET_STATE.encode(self),
            ANSWER_KEY: ANSWER.encode(answer),
        }

    @classmethod
    def from_dict(cls, document: Any, where: str) -> TargetState:
        """Raises `FormatError` naming the field that does not read (the answer is not read:
        it is the report's)."""
        return TARGET_STATE.decode(document, where, report=Report.from_dict(document, where))

    @classmethod
    def read(cls, state: StateFile, name: str) -> TargetState:
        """The watched target `name` of `state` (KeyError if it is not watched;
        `CorruptStateFile` if its entry does not read)."""
        try:
            return cls.from_dict(state.entry(name), f"targets[{name!r}]")
        except FormatError as error:
            raise state.corrupt(error) from None


#: Beside the report's keys; last_save and server_probes_elsewhere are absent in the state
#: files of earlier versions.
TARGET_STATE = Form(
    TargetState, "intervals updated_at last_save? server_probes_elsewhere?", name="target"
)
