"""The Prometheus metrics of fsprobe (DESIGN §6), built from target views, never from a probe.

`target_families` turns views into metric families, every family always present (empty when no
target has a sample for it) and in a fixed order, so that the same views always give the same
exposition. `FsprobeCollector` is the custom collector that registers them in a registry of our
own. Series of a target whose statvfs failed, or whose mount is stuck, are left out rather than
zeroed: a zero would read as "the filesystem is full" in every dashboard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fsprobe.exporters.view import TargetView
from fsprobe.model import (
    PROBE_KINDS,
    FilesystemInfo,
    LustreTarget,
    QuotaReport,
    QuotaState,
    TmpdirInfo,
)
from fsprobe.paths import escaped
from fsprobe.version import __version__

CACHED = "Cached from fsprobe's background probes; a scrape never probes."

#: Metric name, kind, help and label names of every per-target family, in exposition order.
_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    (
        "fsprobe_health_status",
        "gauge",
        "Health verdict of the target: 0 ok, 1 degraded, 2 unhealthy, 3 unknown.",
        ("path",),
    ),
    (
        "fsprobe_probe_success",
        "gauge",
        "1 if the last run of the probe succeeded.",
        ("path", "probe"),
    ),
    (
        "fsprobe_probe_duration_seconds",
        "gauge",
        "Duration of the last run of the probe.",
        ("path", "probe"),
    ),
    (
        "fsprobe_probe_last_success_timestamp_seconds",
        "gauge",
        "Unix time at which the probe last succeeded.",
        ("path", "probe"),
    ),
    (
        "fsprobe_probe_interval_seconds",
        "gauge",
        "Configured interval of the probe (each run is jittered by up to 10 %).",
        ("path", "probe"),
    ),
    (
        "fsprobe_probe_errors",
        "counter",
        "Failed probe runs by error: an errno name, TIMEOUT (deadline) or PARSE.",
        ("path", "probe", "errno"),
    ),
    (
        "fsprobe_mount_stuck",
        "gauge",
        "1 while a probe of the target has overrun its deadline (a hung mount).",
        ("path",),
    ),
    (
        "fsprobe_filesystem_size_bytes",
        "gauge",
        "Size of the filesystem holding the target.",
        ("path", "mountpoint", "fstype"),
    ),
    (
        "fsprobe_filesystem_avail_bytes",
        "gauge",
        "Bytes an unprivileged writer can still use (f_bavail).",
        ("path", "mountpoint", "fstype"),
    ),
    (
        "fsprobe_filesystem_files",
        "gauge",
        "Inodes of the filesystem holding the target.",
        ("path", "mountpoint", "fstype"),
    ),
    (
        "fsprobe_filesystem_files_free",
        "gauge",
        "Inodes an unprivileged writer can still use (f_favail).",
        ("path", "mountpoint", "fstype"),
    ),
    (
        "fsprobe_filesystem_readonly",
        "gauge",
        "1 if the filesystem is mounted read-only.",
        ("path", "mountpoint", "fstype"),
    ),
    *(
        (
            f"fsprobe_quota_{name}",
            "gauge",
            f"{text} of the quota a new file in the target is charged to.",
            ("path", "type", "id"),
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
    (
        "fsprobe_quota_grace_expiry_timestamp_seconds",
        "gauge",
        "Unix time at which the running grace period of a soft limit ends.",
        ("path", "type", "id", "resource"),
    ),
    (
        "fsprobe_quota_exceeded",
        "gauge",
        "1 when usage is over a quota limit (soft exceeded, grace expired or hard reached).",
        ("path", "type", "id", "resource"),
    ),
    (
        "fsprobe_lustre_target_avail_bytes",
        "gauge",
        "Available bytes of one Lustre OST/MDT.",
        ("path", "target"),
    ),
    (
        "fsprobe_lustre_target_size_bytes",
        "gauge",
        "Size of one Lustre OST/MDT.",
        ("path", "target"),
    ),
    (
        "fsprobe_lustre_target_files_free",
        "gauge",
        "Free inodes of one Lustre OST/MDT.",
        ("path", "target"),
    ),
    ("fsprobe_lustre_target_files", "gauge", "Inodes of one Lustre OST/MDT.", ("path", "target")),
    (
        "fsprobe_headroom_bytes",
        "gauge",
        "Bytes a new file in the target can still take (filesystem and quota).",
        ("path",),
    ),
    (
        "fsprobe_headroom_inodes",
        "gauge",
        "Inodes that can still be created in the target (filesystem and quota).",
        ("path",),
    ),
    (
        "fsprobe_headroom_ratio",
        "gauge",
        "Headroom divided by the capacity of the limit that binds it.",
        ("path", "resource"),
    ),
    (
        "fsprobe_write_latency_seconds",
        "histogram",
        "Latency of each step of the write probe's atomic test save, and of all of it (total).",
        ("path", "op"),
    ),
    (
        "fsprobe_tmpdir_same_device",
        "gauge",
        "1 if $TMPDIR is on the filesystem of the target (a staged checkpoint can be renamed).",
        ("path",),
    ),
    (
        "fsprobe_redirected_pending_bytes",
        "gauge",
        "Bytes of checkpoints saved to a fallback directory and not yet synced back.",
        ("path",),
    ),
)

FAMILY_NAMES = tuple(name for name, _kind, _help, _labels in _FAMILIES)
_FAMILY_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


def _label(text: str) -> str:
    """A label value that encodes as UTF-8 even for a path with undecodable bytes, and stays
    distinct for paths that differ only in them (see `fsprobe.paths.escaped`)."""
    return escaped(text)


def empty_families() -> dict[str, Metric]:
    """Every per-target family, without samples, in exposition order."""
    families: dict[str, Metric] = {}
    for name, kind, text, labels in _FAMILIES:
        documentation = f"{text} {CACHED}"
        if kind == "histogram":
            families[name] = HistogramMetricFamily(name, documentation, labels=labels)
        else:
            families[name] = _FAMILY_TYPES[kind](name, documentation, labels=labels)
    return families


def build_info() -> Metric:
    family = GaugeMetricFamily("fsprobe_build_info", "fsprobe's version.", labels=("version",))
    family.add_metric([__version__], 1.0)
    return family


def target_families(views: Iterable[TargetView]) -> list[Metric]:
    """The per-target families of DESIGN §6 for `views`, in a fixed order."""
    families = empty_families()
    for view in views:
        add_values(families, view)
        add_latency(families, view)
    return list(families.values())


def add_values(families: dict[str, Metric], view: TargetView) -> None:
    """Every sample of `view` except the write-latency histogram."""
    path = _label(view.path)
    families["fsprobe_health_status"].add_metric([path], float(view.verdict.status))
    _add_probes(families, view, path)
    families["fsprobe_mount_stuck"].add_metric([path], 1.0 if view.mount_stuck else 0.0)

    if view.values_trusted:
        snapshot = view.snapshot
        fs: FilesystemInfo = snapshot.value("statvfs")
        _add_filesystem(families, path, fs)
        quota: QuotaReport | None = snapshot.value("quota")
        if quota is not None:
            _add_quota(families, path, quota)
        _add_lustre(families, path, snapshot.value("lfs_df") or ())
        _add_headroom(families, view, path)
        tmpdir: TmpdirInfo | None = snapshot.value("tmpdir")
        if tmpdir is not None:
            families["fsprobe_tmpdir_same_device"].add_metric([path], float(tmpdir.same_device))

    if view.redirected_pending_bytes is not None:
        families["fsprobe_redirected_pending_bytes"].add_metric(
            [path], float(view.redirected_pending_bytes)
        )


def add_latency(families: dict[str, Metric], view: TargetView) -> None:
    """The write-latency histogram of `view`: most of its lines, and it changes only when a
    write probe ends, so renderers can keep it apart from the rest."""
    path = _label(view.path)
    for op, histogram in view.write_latency.items():
        buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
        families["fsprobe_write_latency_seconds"].add_metric([path, op], buckets, histogram.total)


def _add_probes(families: dict[str, Metric], view: TargetView, path: str) -> None:
    results = view.snapshot.results
    for probe in PROBE_KINDS:
        result = results.get(probe)
        if result is not None:
            families["fsprobe_probe_success"].add_metric([path, probe], float(result.ok))
            families["fsprobe_probe_duration_seconds"].add_metric([path, probe], result.duration)
        if probe in view.last_success:
            families["fsprobe_probe_last_success_timestamp_seconds"].add_metric(
                [path, probe], view.last_success[probe]
            )
        if probe in view.intervals:
            families["fsprobe_probe_interval_seconds"].add_metric(
                [path, probe], view.intervals[probe]
            )
    for (probe, errno), count in sorted(view.errors.items()):
        families["fsprobe_probe_errors"].add_metric([path, probe, errno], float(count))


def _add_filesystem(families: dict[str, Metric], path: str, fs: FilesystemInfo) -> None:
    labels = [path, _label(fs.mountpoint), _label(fs.fstype)]
    for suffix, value in (
        ("size_bytes", fs.size_bytes),
        ("avail_bytes", fs.avail_bytes),
        ("files", fs.files),
        ("files_free", fs.files_free),
        ("readonly", float(fs.readonly)),
    ):
        families[f"fsprobe_filesystem_{suffix}"].add_metric(labels, float(value))


def _add_quota(families: dict[str, Metric], path: str, quota: QuotaReport) -> None:
    for entry in quota.entries:
        labels = [path, entry.type, str(entry.id)]
        for resource in ("bytes", "inodes"):
            usage = getattr(entry, resource)
            families[f"fsprobe_quota_used_{resource}"].add_metric(labels, float(usage.used))
            for limit in ("soft", "hard"):
                value = getattr(usage, limit)
                if value is not None:
                    families[f"fsprobe_quota_{limit}_limit_{resource}"].add_metric(
                        labels, float(value)
                    )
            if usage.grace_expires_at is not None:
                families["fsprobe_quota_grace_expiry_timestamp_seconds"].add_metric(
                    [*labels, resource], usage.grace_expires_at
                )
            exceeded = usage.state is not QuotaState.OK
            families["fsprobe_quota_exceeded"].add_metric([*labels, resource], float(exceeded))


def _add_lustre(families: dict[str, Metric], path: str, targets: Sequence[LustreTarget]) -> None:
    for target in targets:
        labels = [path, _label(target.name)]
        for suffix, value in (
            ("avail_bytes", target.avail_bytes),
            ("size_bytes", target.size_bytes),
            ("files_free", target.files_free),
            ("files", target.files),
        ):
            if value is not None:
                families[f"fsprobe_lustre_target_{suffix}"].add_metric(labels, float(value))


def _add_headroom(families: dict[str, Metric], view: TargetView, path: str) -> None:
    headroom = view.verdict.headroom
    if headroom.bytes is not None:
        families["fsprobe_headroom_bytes"].add_metric([path], float(headroom.bytes))
    if headroom.inodes is not None:
        families["fsprobe_headroom_inodes"].add_metric([path], float(headroom.inodes))
    for resource, ratio in (("bytes", headroom.bytes_ratio), ("inodes", headroom.inodes_ratio)):
        if ratio is not None:
            families["fsprobe_headroom_ratio"].add_metric([path, resource], ratio)


class FsprobeCollector(Collector):
    """The custom collector: builds every family from the latest views on each `collect()`."""

    def __init__(self, views: Callable[[], Sequence[TargetView]]) -> None:
        self._views = views

    def collect(self) -> Iterator[Metric]:
        yield build_info()
        yield from target_families(self._views())
