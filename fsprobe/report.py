"""A judged snapshot and its JSON, both ways: `check --json`, and a target in the state file.

`Report.to_dict` writes the documented object (docs/design.md §6); `Report.from_dict` reads it back
into the same typed values (`to_dict(from_dict(x)) == x`), checking every field on the way, so that
the save hook, `fsprobe status` and the human rendering work on a `Report` and none of them walks
raw dicts. A document that does not read raises `ReportFormatError` naming the field
(``reasons[0].severity: 'bad' is not one of notice, degraded, unhealthy``), never a KeyError.

Every model value has its pair of functions here, side by side, so that the two directions
cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from fsprobe.model import (
    PROBE_KINDS,
    QUOTA_TYPES,
    FilesystemInfo,
    LastSave,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Snapshot,
    Status,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.policy import Headroom, Reason, Severity, Verdict

T = TypeVar("T")


class ReportFormatError(ValueError):
    """A report document that does not read: the message says which field and why."""


class _Fields:
    """One JSON object being read, and where it sits in the document (for error messages)."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ReportFormatError(f"{where or 'report'}: expected an object, not {_kind(value)}")
        self._value = value
        self._where = where

    def at(self, key: str) -> str:
        return f"{self._where}.{key}" if self._where else key

    def has(self, key: str) -> bool:
        """Whether `key` is there: keys added since schema 1 began may be absent."""
        return key in self._value

    def _typed(self, key: str, types: tuple[type, ...], noun: str, optional: bool) -> Any:
        if key not in self._value:
            raise ReportFormatError(f"{self.at(key)}: missing")
        value = self._value[key]
        if value is None and optional:
            return None
        # bool is an int to Python, never to a reader of JSON.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ReportFormatError(f"{self.at(key)}: expected {noun}, not {_kind(value)}")
        return value

    def text(self, key: str) -> str:
        return cast("str", self._typed(key, (str,), "a string", False))

    def optional_text(self, key: str) -> str | None:
        return cast("str | None", self._typed(key, (str,), "a string or null", True))

    def integer(self, key: str) -> int:
        return cast("int", self._typed(key, (int,), "an integer", False))

    def optional_integer(self, key: str) -> int | None:
        return cast("int | None", self._typed(key, (int,), "an integer or null", True))

    def number(self, key: str) -> float:
        return float(self._typed(key, (int, float), "a number", False))

    def optional_number(self, key: str) -> float | None:
        value = self._typed(key, (int, float), "a number or null", True)
        return float(value) if value is not None else None

    def flag(self, key: str) -> bool:
        return cast("bool", self._typed(key, (bool,), "true or false", False))

    def optional_flag(self, key: str) -> bool | None:
        return cast("bool | None", self._typed(key, (bool,), "true, false or null", True))

    def child(self, key: str) -> _Fields:
        return _Fields(self._typed(key, (dict,), "an object", False), self.at(key))

    def names(self) -> list[str]:
        """The keys of this object."""
        return list(self._value)

    def value(self, key: str, read: Callable[[Any, str], T]) -> T:
        """The value under `key`, read by `read(value, where)`."""
        return read(self._typed(key, (dict,), "an object", False), self.at(key))

    def optional_value(self, key: str, read: Callable[[Any, str], T]) -> T | None:
        value = self._typed(key, (dict,), "an object or null", True)
        return read(value, self.at(key)) if value is not None else None

    def items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...]:
        values = self._typed(key, (list,), "a list", False)
        return tuple(read(value, f"{self.at(key)}[{index}]") for index, value in enumerate(values))

    def optional_items(self, key: str, read: Callable[[Any, str], T]) -> tuple[T, ...] | None:
        if self._typed(key, (list,), "a list or null", True) is None:
            return None
        return self.items(key, read)

    def choice(self, key: str, parse: Callable[[str], T]) -> T:
        label = self.text(key)
        try:
            return parse(label)
        except ValueError as error:
            raise ReportFormatError(f"{self.at(key)}: {error}") from None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return kinds.get(type(value), type(value).__name__)


def _texts(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ReportFormatError(f"{where}: expected a string, not {_kind(value)}")
    return value


# -- model values, each both ways ----------------------------------------------------------------


def last_save_to_dict(save: LastSave) -> dict[str, Any]:
    return {
        "at": save.at,
        "outcome": save.outcome,
        "seconds": save.seconds,
        "bytes": save.bytes,
        "requested": save.requested,
        "landed": save.landed,
        "uid": save.uid,
        "pid": save.pid,
        "host": save.host,
        "ranks": save.ranks,
        "failures": [{"errno": errno, "step": step} for errno, step in save.failures],
    }


def last_save_from_dict(value: Any, where: str = "last_save") -> LastSave:
    fields = _Fields(value, where)

    def failure(item: Any, at: str) -> tuple[str, str]:
        entry = _Fields(item, at)
        return entry.text("errno"), entry.text("step")

    return LastSave(
        at=fields.number("at"),
        outcome=fields.text("outcome"),
        seconds=fields.number("seconds"),
        bytes=fields.integer("bytes"),
        requested=fields.text("requested"),
        landed=fields.optional_text("landed"),
        uid=fields.integer("uid"),
        pid=fields.integer("pid"),
        host=fields.text("host"),
        ranks=fields.integer("ranks"),
        failures=fields.items("failures", failure),
    )


def _files_aliases(inodes: int | None, inodes_free: int | None) -> dict[str, int | None]:
    """``files``/``files_free``: the old names of ``inodes``/``inodes_free``, written beside
    them for one release (0.2) so that scripts reading them keep working; then dropped."""
    return {"files": inodes, "files_free": inodes_free}


def _inodes_key(fields: _Fields, key: str) -> str:
    """`key` (``inodes``...), or its old name in a document written before it (``files``...)."""
    return key if fields.has(key) else key.replace("inodes", "files")


def filesystem_to_dict(fs: FilesystemInfo) -> dict[str, Any]:
    return {
        "probed_path": fs.probed_path,
        "mountpoint": fs.mountpoint,
        "fstype": fs.fstype,
        "device": fs.device,
        "size_bytes": fs.size_bytes,
        "avail_bytes": fs.avail_bytes,
        "inodes": fs.files,
        "inodes_free": fs.files_free,
        **_files_aliases(fs.files, fs.files_free),
        "readonly": fs.readonly,
        "st_dev": fs.st_dev,
    }


def _with_existence(fs: FilesystemInfo | None, exists: bool | None) -> FilesystemInfo | None:
    """The filesystem read back, with whether the target existed (the report's `exists`;
    absent from documents of earlier versions: taken as existing)."""
    if fs is None or exists is None or exists == fs.target_exists:
        return fs
    return dataclasses.replace(fs, target_exists=exists)


def filesystem_from_dict(value: Any, where: str = "filesystem") -> FilesystemInfo:
    fields = _Fields(value, where)
    return FilesystemInfo(
        probed_path=fields.text("probed_path"),
        mountpoint=fields.text("mountpoint"),
        fstype=fields.text("fstype"),
        device=fields.text("device"),
        size_bytes=fields.integer("size_bytes"),
        avail_bytes=fields.integer("avail_bytes"),
        files=fields.integer(_inodes_key(fields, "inodes")),
        files_free=fields.integer(_inodes_key(fields, "inodes_free")),
        readonly=fields.flag("readonly"),
        st_dev=fields.integer("st_dev"),
    )


def usage_to_dict(usage: QuotaUsage) -> dict[str, Any]:
    return {
        "used": usage.used,
        "soft": usage.soft,
        "hard": usage.hard,
        "grace_expires_at": usage.grace_expires_at,
        "state": usage.state.value,
        "inaccurate": usage.inaccurate,
    }


def usage_from_dict(value: Any, where: str) -> QuotaUsage:
    fields = _Fields(value, where)
    return QuotaUsage(
        used=fields.integer("used"),
        soft=fields.optional_integer("soft"),
        hard=fields.optional_integer("hard"),
        grace_expires_at=fields.optional_number("grace_expires_at"),
        state=fields.choice("state", _quota_state),
        inaccurate=fields.flag("inaccurate"),
    )


def _quota_state(label: str) -> QuotaState:
    try:
        return QuotaState(label)
    except ValueError:
        raise ValueError(
            f"{label!r} is not one of {', '.join(s.value for s in QuotaState)}"
        ) from None


def quota_entry_to_dict(entry: QuotaEntry) -> dict[str, Any]:
    return {
        "type": entry.type,
        "id": entry.id,
        "name": entry.name,
        "bytes": usage_to_dict(entry.bytes),
        "inodes": usage_to_dict(entry.inodes),
        "pool": entry.pool,
    }


def quota_entry_from_dict(value: Any, where: str) -> QuotaEntry:
    fields = _Fields(value, where)
    kind = fields.text("type")
    if kind not in QUOTA_TYPES:
        raise ReportFormatError(f"{fields.at('type')}: {kind!r} is not one of {QUOTA_TYPES}")
    return QuotaEntry(
        type=kind,
        id=fields.integer("id"),
        name=fields.optional_text("name"),
        bytes=fields.value("bytes", usage_from_dict),
        inodes=fields.value("inodes", usage_from_dict),
        pool=fields.optional_text("pool") if fields.has("pool") else None,
    )


def lustre_target_to_dict(target: LustreTarget) -> dict[str, Any]:
    return {
        "name": target.name,
        "kind": target.kind,
        "index": target.index,
        "size_bytes": target.size_bytes,
        "avail_bytes": target.avail_bytes,
        "inodes": target.files,
        "inodes_free": target.files_free,
        **_files_aliases(target.files, target.files_free),
        "active": target.active,
        "flags": target.flags,
        "pools": list(target.pools),
        "in_layout": target.in_layout,
    }


def lustre_target_from_dict(value: Any, where: str) -> LustreTarget:
    fields = _Fields(value, where)
    return LustreTarget(
        name=fields.text("name"),
        kind=fields.text("kind"),
        index=fields.integer("index"),
        size_bytes=fields.optional_integer("size_bytes"),
        avail_bytes=fields.optional_integer("avail_bytes"),
        files=fields.optional_integer(_inodes_key(fields, "inodes")),
        files_free=fields.optional_integer(_inodes_key(fields, "inodes_free")),
        active=fields.flag("active"),
        flags=fields.text("flags"),
        pools=fields.items("pools", _texts) if fields.has("pools") else (),
        in_layout=fields.flag("in_layout") if fields.has("in_layout") else True,
    )


def write_probe_to_dict(probe: WriteProbeResult) -> dict[str, Any]:
    return {
        "ok": probe.ok,
        "bytes": probe.bytes,
        "latency_seconds": dict(probe.latency_seconds),
        "step": probe.step,
        "errno": probe.errno,
        "message": probe.message,
    }


def write_probe_from_dict(value: Any, where: str = "write_probe") -> WriteProbeResult:
    fields = _Fields(value, where)
    latency = fields.child("latency_seconds")
    return WriteProbeResult(
        ok=fields.flag("ok"),
        bytes=fields.integer("bytes"),
        latency_seconds={step: latency.number(step) for step in latency.names()},
        step=fields.optional_text("step"),
        errno=fields.optional_text("errno"),
        message=fields.text("message"),
    )


def tmpdir_to_dict(tmpdir: TmpdirInfo) -> dict[str, Any]:
    return {"path": tmpdir.path, "same_device": tmpdir.same_device}


def tmpdir_from_dict(value: Any, where: str = "tmpdir") -> TmpdirInfo:
    fields = _Fields(value, where)
    return TmpdirInfo(path=fields.text("path"), same_device=fields.flag("same_device"))


def reason_to_dict(reason: Reason) -> dict[str, Any]:
    return {
        "code": reason.code,
        "severity": reason.severity.label,
        "message": reason.message,
        "transient": reason.transient,
        "errno": reason.errno,
    }


def reason_from_dict(value: Any, where: str) -> Reason:
    fields = _Fields(value, where)
    return Reason(
        code=fields.text("code"),
        severity=fields.choice("severity", Severity.from_label),
        message=fields.text("message"),
        transient=fields.flag("transient"),
        errno=fields.optional_text("errno"),
    )


def headroom_to_dict(headroom: Headroom) -> dict[str, Any]:
    return {
        "bytes": headroom.bytes,
        "inodes": headroom.inodes,
        "bytes_ratio": headroom.bytes_ratio,
        "inodes_ratio": headroom.inodes_ratio,
        "limited_by": headroom.limited_by,
        "bytes_limited_by": headroom.bytes_limited_by,
        "inodes_limited_by": headroom.inodes_limited_by,
    }


def headroom_from_dict(value: Any, where: str = "headroom") -> Headroom:
    fields = _Fields(value, where)  # "limited_by" is derived from the others
    return Headroom(
        bytes=fields.optional_integer("bytes"),
        inodes=fields.optional_integer("inodes"),
        bytes_ratio=fields.optional_number("bytes_ratio"),
        inodes_ratio=fields.optional_number("inodes_ratio"),
        bytes_limited_by=fields.optional_text("bytes_limited_by"),
        inodes_limited_by=fields.optional_text("inodes_limited_by"),
    )


def _probe_to_dict(result: ProbeResult[Any]) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "error": result.error,
        "message": result.message,
        "stuck": result.stuck,
        "started_at": result.started_at,
        "duration_seconds": result.duration,
    }


def _probe_from_dict(kind: str, value: Any, where: str, *, probe_value: object) -> ProbeResult[Any]:
    fields = _Fields(value, where)  # "ok" is derived from error and stuck
    return ProbeResult(
        probe=kind,
        started_at=fields.number("started_at"),
        duration=fields.number("duration_seconds"),
        value=probe_value,
        error=fields.optional_text("error"),
        message=fields.text("message"),
        stuck=fields.flag("stuck"),
    )


# -- the report -------------------------------------------------------------------------------


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
        """The documented `check --json` object (docs/design.md §6), plus per-probe details."""
        snapshot, verdict = self.snapshot, self.verdict
        fs: FilesystemInfo | None = snapshot.value("statvfs")
        quota: QuotaReport | None = snapshot.value("quota")
        targets: tuple[LustreTarget, ...] | None = snapshot.value("lfs_df")
        tmpdir: TmpdirInfo | None = snapshot.value("tmpdir")
        write = snapshot.get("write")
        return {
            "path": self.path,
            "exists": fs.target_exists if fs is not None else None,
            "judged_path": fs.probed_path if fs is not None else None,
            "status": verdict.status.label,
            "reasons": [reason_to_dict(reason) for reason in verdict.reasons],
            "filesystem": filesystem_to_dict(fs) if fs is not None else None,
            "quota": (
                [quota_entry_to_dict(e) for e in quota.entries] if quota is not None else None
            ),
            "quota_provider": quota.provider if quota is not None else None,
            "quota_errors": list(quota.errors) if quota is not None else [],
            "quota_notes": list(quota.notes) if quota is not None else [],
            "lustre_targets": (
                [lustre_target_to_dict(t) for t in targets] if targets is not None else None
            ),
            "headroom": headroom_to_dict(verdict.headroom),
            "write_probe": (
                write_probe_to_dict(write.value)
                if write is not None and write.value is not None
                else None
            ),
            "tmpdir": tmpdir_to_dict(tmpdir) if tmpdir is not None else None,
            "need": {"bytes": self.need_bytes, "inodes": self.need_inodes},
            "fits": verdict.fits,
            "probed_at": snapshot.probed_at,
            "fresh_until": verdict.fresh_until,
            "probes": {
                kind: _probe_to_dict(snapshot.results[kind])
                for kind in PROBE_KINDS
                if kind in snapshot.results
            },
        }

    @classmethod
    def from_dict(cls, document: Any, where: str = "") -> Report:
        """The report that `to_dict` wrote; `ReportFormatError` if `document` is not one.

        Keys it does not know are ignored (the state file adds its own beside them). The JSON
        does not hold the write-error history behind a verdict, only the verdict, so the
        snapshot read back has an empty `recent_write_errors`.
        """
        fields = _Fields(document, where)
        probes = fields.child("probes")
        need = fields.child("need")
        values = _probe_values(fields)
        results = {}
        for kind in probes.names():
            if kind not in PROBE_KINDS:
                raise ReportFormatError(f"{probes.at(kind)}: not one of {', '.join(PROBE_KINDS)}")
            results[kind] = probes.value(
                kind, functools.partial(_probe_from_dict, kind, probe_value=values.get(kind))
            )
        verdict = Verdict(
            status=fields.choice("status", Status.from_label),
            reasons=fields.items("reasons", reason_from_dict),
            headroom=fields.value("headroom", headroom_from_dict),
            fits=fields.optional_flag("fits"),
            fresh_until=fields.optional_number("fresh_until"),
        )
        path = fields.text("path")
        return cls(
            path=path,
            snapshot=Snapshot(path, results),
            verdict=verdict,
            need_bytes=need.optional_integer("bytes"),
            need_inodes=need.optional_integer("inodes"),
        )


def _probe_values(fields: _Fields) -> Mapping[str, object]:
    """The value of each probe, from the keys of the document that hold them."""
    values: dict[str, object] = {
        "statvfs": _with_existence(
            fields.optional_value("filesystem", filesystem_from_dict),
            fields.optional_flag("exists") if "exists" in fields.names() else None,
        ),
        "write": fields.optional_value("write_probe", write_probe_from_dict),
        "tmpdir": fields.optional_value("tmpdir", tmpdir_from_dict),
        "lfs_df": fields.optional_items("lustre_targets", lustre_target_from_dict),
    }
    entries = fields.optional_items("quota", quota_entry_from_dict)
    provider = fields.optional_text("quota_provider")
    if provider is not None:
        values["quota"] = QuotaReport(
            provider=provider,
            entries=entries or (),
            inaccurate=any(e.bytes.inaccurate or e.inodes.inaccurate for e in entries or ()),
            errors=fields.items("quota_errors", _texts),
            notes=fields.items("quota_notes", _texts) if fields.has("quota_notes") else (),
        )
    return values
