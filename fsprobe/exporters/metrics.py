"""The Prometheus metrics, as plain data built from target views.

`FAMILIES` is the metric contract (docs/reference.md); why some series are left out rather
than zeroed, "inodes" and one histogram per target: docs/design.md §8, "The exporters".
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.utils import floatToGoString

from fsprobe.errors import NOT_AS_ROOT
from fsprobe.events.event import OUTCOMES
from fsprobe.exporters.contained import STAGES
from fsprobe.exporters.view import SaveStats, TargetView
from fsprobe.model import (
    PROBE_KINDS,
    FilesystemInfo,
    LustreImport,
    LustreTarget,
    QuotaReport,
    QuotaState,
    TmpdirInfo,
)
from fsprobe.policy import Headroom
from fsprobe.posix.paths import escaped

CACHED = "Cached from fsprobe's background probes; a scrape never probes."


@dataclass(frozen=True)
class Family:
    """One metric family: what a dashboard or an alert refers to by `name`."""

    name: str
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...]


class Sample(NamedTuple):
    """One series: its full name (with ``_total``, ``_bucket``... where the type adds one)."""

    name: str
    labels: Mapping[str, str]
    value: float


_FILESYSTEM = ("path", "mountpoint", "fstype", "device")
_QUOTA = ("path", "type", "id")

#: What `fsprobe_redirect_problems_total` counts, by its `problem` label.
REDIRECT_PROBLEMS = ("sync_as_user_failed", "area_squatted", "fallback_crowded")

#: Every per-target family, in exposition order.
FAMILIES: tuple[Family, ...] = (
    Family(
        "fsprobe_health_status",
        "gauge",
        "Health verdict of the target: 0 ok, 1 degraded, 2 unhealthy, 3 unknown.",
        ("path",),
    ),
    Family(
        "fsprobe_probe_success",
        "gauge",
        "1 if the last run of the probe succeeded.",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_duration_seconds",
        "gauge",
        "Duration of the last run of the probe.",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_last_success_timestamp_seconds",
        "gauge",
        "Unix time at which the probe last succeeded.",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_last_run_timestamp_seconds",
        "gauge",
        "Unix time at which the last run of the probe ended, whatever its outcome.",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_interval_seconds",
        "gauge",
        "Configured interval of the probe (each run is jittered by up to 10 %).",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_stale_after_seconds",
        "gauge",
        "Age of the probe's last run past which the daemon judges its result stale "
        "(stale_after_intervals of its interval; for the write probe while real saves stand in "
        "for it, of the save-widened interval, at most 10 of its own): the one deadline of "
        "FsprobeProbeStale.",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_probe_errors",
        "counter",
        "Failed probe runs by error: an errno name, TIMEOUT (deadline) or PARSE.",
        ("path", "probe", "errno"),
    ),
    Family(
        "fsprobe_probe_skipped",
        "counter",
        "Runs of the probe left out because a real save into the target within its interval "
        "stood for it (the write probe while saves flow; its success and last-success series "
        "then come from the saves), or because root may not run it there (the write probe of "
        "a root-owned directory that others may rename in: reason write_probe_refused).",
        ("path", "probe"),
    ),
    Family(
        "fsprobe_mount_stuck",
        "gauge",
        "1 while a probe of the target has overrun its deadline (a hung mount).",
        ("path",),
    ),
    Family(
        "fsprobe_filesystem_size_bytes",
        "gauge",
        "Size of the filesystem holding the target.",
        _FILESYSTEM,
    ),
    Family(
        "fsprobe_filesystem_avail_bytes",
        "gauge",
        "Bytes an unprivileged writer can still use (f_bavail).",
        _FILESYSTEM,
    ),
    Family(
        "fsprobe_filesystem_inodes",
        "gauge",
        "Inodes of the filesystem holding the target.",
        _FILESYSTEM,
    ),
    Family(
        "fsprobe_filesystem_inodes_free",
        "gauge",
        "Inodes an unprivileged writer can still use (f_favail).",
        _FILESYSTEM,
    ),
    Family(
        "fsprobe_filesystem_readonly",
        "gauge",
        "1 if the filesystem is mounted read-only.",
        _FILESYSTEM,
    ),
    *(
        Family(
            f"fsprobe_quota_{name}",
            "gauge",
            f"{text} of the quota a new file in the target is charged to "
            "(label pool: a Lustre pool quota).",
            _QUOTA,
        )
        for name, text in (
            ("used_bytes", "Bytes used"),
            ("soft_limit_bytes", "Soft limit in bytes (absent when unlimited)"),
            ("hard_limit_bytes", "Hard limit in bytes (absent when unlimited)"),
            ("used_inodes", "Inodes used"),
            ("soft_limit_inodes", "Soft limit in inodes (absent when unlimited)"),
            ("hard_limit_inodes", "Hard limit in inodes (absent when unlimited)"),
        )
    ),
    Family(
        "fsprobe_quota_grace_expiry_timestamp_seconds",
        "gauge",
        "Unix time at which the running grace period of a soft limit ends.",
        (*_QUOTA, "resource"),
    ),
    Family(
        "fsprobe_quota_grace_expired",
        "gauge",
        "For a soft limit: 1 once its grace period has run out while usage is still over it "
        "(the soft limit now acts as a hard one), until usage is back under it; else 0.",
        (*_QUOTA, "resource"),
    ),
    Family(
        "fsprobe_quota_exceeded",
        "gauge",
        "1 when usage is over a quota limit (soft exceeded, grace expired or hard reached).",
        (*_QUOTA, "resource"),
    ),
    Family(
        "fsprobe_lustre_target_avail_bytes",
        "gauge",
        "Available bytes of one Lustre OST/MDT (label pool: its layout pools).",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_size_bytes",
        "gauge",
        "Size of one Lustre OST/MDT (label pool: its layout pools).",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_inodes_free",
        "gauge",
        "Free inodes of one Lustre OST/MDT (label pool: its layout pools).",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_inodes",
        "gauge",
        "Inodes of one Lustre OST/MDT (label pool: its layout pools).",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_in_layout",
        "gauge",
        "1 when a new file in the path can meet this Lustre target (every MDT; an OST the "
        "layout's pools hold, every OST when it names none or cannot be read), 0 when not.",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_connected",
        "gauge",
        "1 when this node has a connection to a Lustre target of the path's mount (import FULL, "
        "IDLE, the brief CONNECTING of an idle cycle, or in recovery), 0 when it is lost "
        "(DISCONN, CONNECTING that lasts, EVICTED, ...); lctl get_param.",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_recovering",
        "gauge",
        "1 while this node's import of a Lustre target is in recovery (REPLAY, REPLAY_LOCKS, "
        "REPLAY_WAIT, RECOVER): connected, its requests waiting for the recovery to end.",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_active",
        "gauge",
        "0 for an OST the admin deactivated on this node (osc.*.active=0: no new object "
        "there, never reconnected), 1 otherwise.",
        ("path", "target"),
    ),
    Family(
        "fsprobe_lustre_target_last_eviction_timestamp_seconds",
        "gauge",
        "Unix time of the latest eviction of this node by that target in its import's state "
        "history or seen by the daemon within 24 h (absent when none).",
        ("path", "target"),
    ),
    Family(
        "fsprobe_headroom_bytes",
        "gauge",
        "Bytes a new file in the target can still take (filesystem and quota).",
        ("path",),
    ),
    Family(
        "fsprobe_headroom_inodes",
        "gauge",
        "Inodes that can still be created in the target (filesystem and quota).",
        ("path",),
    ),
    Family(
        "fsprobe_headroom_ratio",
        "gauge",
        "Headroom divided by the capacity of the limit that binds it.",
        ("path", "resource"),
    ),
    Family(
        "fsprobe_headroom_limit",
        "gauge",
        "1 for the limit that binds the headroom of each resource: limit filesystem, or the "
        "quota type (user, group, project) with its id (label pool: a Lustre pool quota).",
        ("path", "resource", "limit", "id"),
    ),
    Family(
        "fsprobe_write_latency_seconds",
        "histogram",
        "Time the write probe's whole atomic test save took.",
        ("path",),
    ),
    Family(
        "fsprobe_write_step_seconds",
        "gauge",
        "Time each step of the last write probe took (create, write, fsync, rename, fsync_dir, "
        "unlink; a failed run stops at the failing step).",
        ("path", "op"),
    ),
    Family(
        "fsprobe_tmpdir_same_device",
        "gauge",
        "1 if $TMPDIR is on the filesystem of the target (a staged checkpoint can be renamed).",
        ("path",),
    ),
    Family(
        "fsprobe_redirected_pending_bytes",
        "gauge",
        "Bytes of checkpoints saved to a fallback directory and not yet synced back.",
        ("path",),
    ),
    Family(
        "fsprobe_redirect_problems",
        "counter",
        "Problems in the target's fallback directories: sync_as_user_failed (root could not "
        "sync a user's checkpoints as that user), area_squatted (a user's area was found made "
        "by someone else).",
        ("path", "problem"),
    ),
    Family(
        "fsprobe_saves",
        "counter",
        "Real saves into the target reported by fsprobe's save hook, by outcome (ok, retried, "
        "redirected, failed).",
        ("path", "outcome"),
    ),
    Family(
        "fsprobe_save_failed_attempts",
        "counter",
        "Failed attempts of real saves into the target, by errno name.",
        ("path", "errno"),
    ),
    Family(
        "fsprobe_save_duration_seconds",
        "histogram",
        "Time real saves into the target took, all attempts included.",
        ("path",),
    ),
    Family("fsprobe_save_bytes", "counter", "Bytes written by real saves.", ("path",)),
    Family(
        "fsprobe_last_save_timestamp_seconds",
        "gauge",
        "Unix time the daemon heard of the last real save into the target, whatever its outcome.",
        ("path",),
    ),
    Family(
        "fsprobe_last_successful_save_timestamp_seconds",
        "gauge",
        "Unix time the daemon heard of the last real save that landed (in the target or a "
        "fallback).",
        ("path",),
    ),
    Family(
        "fsprobe_save_interval_seconds",
        "gauge",
        "The target's regular save interval: the median gap between its last successful saves "
        "(from the third on); a checkpoint is overdue after three of them. Absent again once "
        "no process that saved is left (the job ended).",
        ("path",),
    ),
    Family(
        "fsprobe_savers",
        "gauge",
        "Processes that reported saves into the target and are expected to save again: neither "
        "gone nor said goodbye at a clean exit.",
        ("path",),
    ),
    Family(
        "fsprobe_last_save_problem_timestamp_seconds",
        "gauge",
        "Unix time the daemon heard of the latest save of each outcome other than ok (one "
        "series per outcome): the file asked for (below the target, in plain characters), the "
        "uid, the errno and step that kept it from the target, fallback none, tried (it failed "
        "there too) or landed (label landed: the fallback directory, in plain characters), and "
        "reason: the code of the policy's reason when the preflight kept it from the target "
        "(step preflight), else none.",
        ("path", "outcome", "file", "uid", "errno", "step", "fallback", "reason"),
    ),
)

#: Save events the daemon did not count, by reason (daemon-wide: no path label).
SAVE_EVENTS_DROPPED = Family(
    "fsprobe_save_events_dropped",
    "counter",
    "Save events the daemon did not count: unwatched (no watched target holds the path), "
    "not_permitted (the sender could not write there), unverified (no admission check "
    "answered in time), rate_limited, too_large, malformed, no_credentials, internal_error.",
    ("reason",),
)

BUILD_INFO = Family("fsprobe_build_info", "gauge", "fsprobe's version.", ("version",))

#: The last reload of the configuration (SIGHUP), as Prometheus and Alertmanager export theirs.
CONFIG_RELOAD_SUCCESSFUL = Family(
    "fsprobe_config_last_reload_successful",
    "gauge",
    "1 if the last reload of the configuration succeeded (or none was asked for), 0 if it was "
    "refused and the running configuration kept.",
    (),
)
CONFIG_RELOAD_TIMESTAMP = Family(
    "fsprobe_config_last_reload_success_timestamp_seconds",
    "gauge",
    "Unix time the configuration was last loaded successfully (at start, or a reload).",
    (),
)

#: Counted beside the target families, not from a view: a bug may keep a view from rendering.
INTERNAL_ERRORS = Family(
    "fsprobe_internal_errors",
    "counter",
    "Bugs of fsprobe caught at the target's boundary (the target reads unknown with reason "
    "internal_error meanwhile); stage = probe | judge | publish.",
    ("path", "stage"),
)

#: The probes that decide themselves whether they apply: a successful run without a value is
#: "nothing to ask here" (no quota provider for this filesystem), not a probe that ran.
_SELF_SELECTING = frozenset({"quota", "lfs_df", "imports"})


#: What a label made of a sender's words keeps: letters, digits, ``_``, ``-`` and ``/``; any
#: run of other characters (a dot, ``<``, ``@``, ``[``, a backtick, a space, ``|``, ``:``) is one
#: ``_``, so no chat markup, mention, link (a bare domain needs its dot) or command survives.
_NOT_PLAIN = re.compile(r"[^A-Za-z0-9_/-]+")
#: At most this many plain characters of a sender's words, then ``~`` and 8 hex digits.
MAX_PLAIN_CHARS = 64


def plain_label(text: str, base: str | None = None) -> str:
    """A sender's path as a label an alert may show (docs/security.md, "Save events"): its
    part below `base` (the target, which the admin named and `path` shows), in plain
    characters, cut to `MAX_PLAIN_CHARS`; when that is not the text itself, ``~`` and the
    first 8 hex digits of the full path's SHA-256 follow (different paths stay apart, and the
    full path in `fsprobe status` can be matched). Never the sender's words as sent."""
    shown = os.path.relpath(text, base) if base is not None else text
    plain = _NOT_PLAIN.sub("_", shown)[:MAX_PLAIN_CHARS]
    if plain == shown:
        return plain
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{plain}~{digest}"


def _label(text: str) -> str:
    """A label value that encodes as UTF-8 even for a path with undecodable bytes, and stays
    distinct for paths that differ only in them (see `fsprobe.posix.paths.escaped`)."""
    return escaped(text)


class _Samples:
    """Collects a target's samples per family, in `FAMILIES` order once sorted."""

    def __init__(self, path: str) -> None:
        self.path = _label(path)
        self.by_family: dict[str, list[Sample]] = {}

    def add(self, family: str, value: float, **labels: str) -> None:
        self.by_family.setdefault(family, []).append(
            Sample(family, {"path": self.path, **labels}, float(value))
        )

    def add_counter(self, family: str, value: float, **labels: str) -> None:
        self.by_family.setdefault(family, []).append(
            Sample(f"{family}_total", {"path": self.path, **labels}, float(value))
        )

    def add_histogram(self, family: str, buckets: list[tuple[float, int]], total: float) -> None:
        samples = self.by_family.setdefault(family, [])
        for bound, count in buckets:
            labels = {"path": self.path, "le": floatToGoString(bound)}
            samples.append(Sample(f"{family}_bucket", labels, float(count)))
        samples.append(Sample(f"{family}_count", {"path": self.path}, float(buckets[-1][1])))
        samples.append(Sample(f"{family}_sum", {"path": self.path}, total))


def unrendered_samples(path: str) -> dict[str, list[Sample]]:
    """What a target whose view could not be rendered (a bug) still exports: status unknown."""
    samples = _Samples(path)
    samples.add("fsprobe_health_status", 3.0)
    return samples.by_family


def internal_error_samples(
    paths: Iterable[str], counts: Mapping[tuple[str, str], int]
) -> list[Sample]:
    """`fsprobe_internal_errors_total` of every watched target and stage, zeros included (so
    that `increase()` sees the first one)."""
    return [
        Sample(
            f"{INTERNAL_ERRORS.name}_total",
            {"path": _label(path), "stage": stage},
            float(counts.get((path, stage), 0)),
        )
        for path in paths
        for stage in STAGES
    ]


def probes_run(view: TargetView) -> list[str]:
    """The probes of `view` that actually ran on the target, in `PROBE_KINDS` order."""
    results = view.snapshot.results
    return [
        probe
        for probe in PROBE_KINDS
        if probe in results
        and not (probe in _SELF_SELECTING and results[probe].ok and results[probe].value is None)
        and results[probe].error != NOT_AS_ROOT  # refused: counted as skipped, not failed
    ]


def target_samples(view: TargetView) -> dict[str, list[Sample]]:
    """The samples of one target by family name; families without samples are left out."""
    samples = _Samples(view.path)
    samples.add("fsprobe_health_status", view.verdict.status)
    _add_probes(samples, view)
    samples.add("fsprobe_mount_stuck", 1.0 if view.mount_stuck else 0.0)

    if view.values_trusted:
        snapshot = view.snapshot
        _add_filesystem(samples, snapshot.value("statvfs"))
        quota: QuotaReport | None = snapshot.value("quota")
        if quota is not None:
            _add_quota(samples, quota, view.updated_at)
        _add_lustre(samples, snapshot.value("lfs_df") or ())
        _add_imports(samples, snapshot.value("imports") or ())
        _add_headroom(samples, view)
        _add_headroom_limits(samples, view.verdict.headroom, quota)
        tmpdir: TmpdirInfo | None = snapshot.value("tmpdir")
        if tmpdir is not None:
            samples.add("fsprobe_tmpdir_same_device", float(tmpdir.same_device))
    if view.write_latency.count:
        samples.add_histogram(
            "fsprobe_write_latency_seconds",
            view.write_latency.cumulative(),
            view.write_latency.total,
        )
    for op, seconds in view.write_steps.items():
        samples.add("fsprobe_write_step_seconds", seconds, op=op)
    if view.redirected_pending_bytes is not None:  # fallback directories are watched
        samples.add("fsprobe_redirected_pending_bytes", view.redirected_pending_bytes)
        for problem in REDIRECT_PROBLEMS:  # from 0: an alert on their increase sees the first
            count = view.redirect_problems.get(problem, 0)
            samples.add_counter("fsprobe_redirect_problems", count, problem=problem)
    _add_saves(samples, view.saves, view.path)
    return samples.by_family


def _add_saves(samples: _Samples, saves: SaveStats, path: str) -> None:
    """Every outcome's counter from the start (zero until seen: an alert on its increase
    sees the first one); the rest once a save was heard of."""
    for outcome in OUTCOMES:
        samples.add_counter("fsprobe_saves", saves.outcomes.get(outcome, 0), outcome=outcome)
    if saves.last is None:
        return
    for errno, count in sorted(saves.failed_attempts.items()):
        samples.add_counter("fsprobe_save_failed_attempts", count, errno=errno)
    samples.add_histogram(
        "fsprobe_save_duration_seconds", saves.duration.cumulative(), saves.duration.total
    )
    samples.add_counter("fsprobe_save_bytes", saves.bytes)
    samples.add("fsprobe_last_save_timestamp_seconds", saves.last.at)
    if saves.last_success_at is not None:
        samples.add("fsprobe_last_successful_save_timestamp_seconds", saves.last_success_at)
    if saves.interval is not None:
        samples.add("fsprobe_save_interval_seconds", saves.interval)
    samples.add("fsprobe_savers", saves.savers)
    for outcome, problem in sorted(saves.problems.items()):
        labels = {
            "outcome": outcome,
            "file": plain_label(problem.file, path),
            "uid": str(problem.uid),
            "errno": problem.errno,
            "step": problem.step,
            "fallback": problem.fallback,
            "reason": problem.reason,
        }
        if problem.landed is not None:
            labels["landed"] = plain_label(problem.landed)
        samples.add("fsprobe_last_save_problem_timestamp_seconds", problem.at, **labels)


def dropped_samples(counts: Mapping[str, int]) -> list[Sample]:
    """The daemon-wide counter of dropped save events."""
    name = f"{SAVE_EVENTS_DROPPED.name}_total"
    return [Sample(name, {"reason": reason}, float(n)) for reason, n in sorted(counts.items())]


def _add_probes(samples: _Samples, view: TargetView) -> None:
    results = view.snapshot.results
    ran = probes_run(view)
    for probe in ran:
        samples.add("fsprobe_probe_success", float(results[probe].ok), probe=probe)
        samples.add("fsprobe_probe_duration_seconds", results[probe].duration, probe=probe)
    for probe in ran:
        if probe in view.last_success:
            samples.add(
                "fsprobe_probe_last_success_timestamp_seconds",
                view.last_success[probe],
                probe=probe,
            )
    for probe in ran:
        samples.add(
            "fsprobe_probe_last_run_timestamp_seconds", results[probe].finished_at, probe=probe
        )
    for probe in ran:
        if probe in view.intervals:
            samples.add("fsprobe_probe_interval_seconds", view.intervals[probe], probe=probe)
    for probe in ran:
        if probe in view.stale_after:
            samples.add("fsprobe_probe_stale_after_seconds", view.stale_after[probe], probe=probe)
    for (probe, errno), count in sorted(view.errors.items()):
        samples.add_counter("fsprobe_probe_errors", count, probe=probe, errno=errno)
    for probe, count in sorted(view.skipped.items()):
        samples.add_counter("fsprobe_probe_skipped", count, probe=probe)


def _add_filesystem(samples: _Samples, fs: FilesystemInfo) -> None:
    labels = {
        "mountpoint": _label(fs.mountpoint),
        "fstype": _label(fs.fstype),
        "device": _label(fs.device),
    }
    for family, value in (
        ("fsprobe_filesystem_size_bytes", fs.size_bytes),
        ("fsprobe_filesystem_avail_bytes", fs.avail_bytes),
        ("fsprobe_filesystem_inodes", fs.files),
        ("fsprobe_filesystem_inodes_free", fs.files_free),
        ("fsprobe_filesystem_readonly", float(fs.readonly)),
    ):
        samples.add(family, value, **labels)


def _add_quota(samples: _Samples, quota: QuotaReport, now: float) -> None:
    """Every quota entry; a grace is judged expired as of `now` (when the view was made: a
    timer read a while ago may have run out since)."""
    for entry in quota.entries:
        labels = {"type": entry.type, "id": str(entry.id)}
        if entry.pool:
            labels["pool"] = _label(entry.pool)
        for resource in ("bytes", "inodes"):
            usage = getattr(entry, resource)
            samples.add(f"fsprobe_quota_used_{resource}", usage.used, **labels)
            for limit in ("soft", "hard"):
                value = getattr(usage, limit)
                if value is not None:
                    samples.add(f"fsprobe_quota_{limit}_limit_{resource}", value, **labels)
            if usage.grace_expires_at is not None:
                samples.add(
                    "fsprobe_quota_grace_expiry_timestamp_seconds",
                    usage.grace_expires_at,
                    resource=resource,
                    **labels,
                )
            if usage.soft is not None:
                expired = usage.state_at(now) is QuotaState.GRACE_EXPIRED
                samples.add(
                    "fsprobe_quota_grace_expired", float(expired), resource=resource, **labels
                )
            exceeded = usage.state is not QuotaState.OK
            samples.add("fsprobe_quota_exceeded", float(exceeded), resource=resource, **labels)


def _add_lustre(samples: _Samples, targets: tuple[LustreTarget, ...]) -> None:
    for target in targets:
        labels = {"target": _label(target.name)}
        if target.pools:
            labels["pool"] = _label(",".join(target.pools))
        for family, value in (
            ("fsprobe_lustre_target_avail_bytes", target.avail_bytes),
            ("fsprobe_lustre_target_size_bytes", target.size_bytes),
            ("fsprobe_lustre_target_inodes_free", target.files_free),
            ("fsprobe_lustre_target_inodes", target.files),
        ):
            if value is not None:
                samples.add(family, value, **labels)
        samples.add("fsprobe_lustre_target_in_layout", float(target.in_layout), **labels)


def _add_headroom_limits(samples: _Samples, headroom: Headroom, quota: QuotaReport | None) -> None:
    """Which limit binds each resource's headroom (what an alert tells the admin to raise)."""
    entries = {entry.source: entry for entry in (quota.entries if quota is not None else ())}
    for resource, source in (
        ("bytes", headroom.bytes_limited_by),
        ("inodes", headroom.inodes_limited_by),
    ):
        entry = entries.get(source or "")
        if source == "filesystem":
            samples.add("fsprobe_headroom_limit", 1.0, resource=resource, limit="filesystem", id="")
        elif entry is not None:
            labels = {"resource": resource, "limit": entry.type, "id": str(entry.id)}
            if entry.pool:
                labels["pool"] = _label(entry.pool)
            samples.add("fsprobe_headroom_limit", 1.0, **labels)


def _add_imports(samples: _Samples, imports: tuple[LustreImport, ...]) -> None:
    for target in imports:
        labels = {"target": _label(target.name)}
        samples.add("fsprobe_lustre_target_connected", float(target.connected), **labels)
        samples.add("fsprobe_lustre_target_recovering", float(target.recovering), **labels)
        samples.add("fsprobe_lustre_target_active", float(target.active), **labels)
        if target.last_eviction is not None:
            family = "fsprobe_lustre_target_last_eviction_timestamp_seconds"
            samples.add(family, target.last_eviction, **labels)


def _add_headroom(samples: _Samples, view: TargetView) -> None:
    headroom = view.verdict.headroom
    if headroom.bytes is not None:
        samples.add("fsprobe_headroom_bytes", headroom.bytes)
    if headroom.inodes is not None:
        samples.add("fsprobe_headroom_inodes", headroom.inodes)
    for resource, ratio in (("bytes", headroom.bytes_ratio), ("inodes", headroom.inodes_ratio)):
        if ratio is not None:
            samples.add("fsprobe_headroom_ratio", ratio, resource=resource)
