"""The metric contract (docs/design.md §6): names, labels, values, what is left out, fast path."""

from __future__ import annotations

import os
import stat

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from fsprobe import __version__
from fsprobe.daemon.store import Store, TargetSpec
from fsprobe.events.admission import Sender
from fsprobe.events.event import Failure, SaveEvent
from fsprobe.exporters.exposition import Exposition
from fsprobe.exporters.metrics import (
    BUILD_INFO,
    CACHED,
    FAMILIES,
    INTERNAL_ERRORS,
    MAX_PLAIN_CHARS,
    plain_label,
    target_samples,
)
from fsprobe.exporters.textfile import TEXTFILE_NAME, open_textfile_dir, write_textfile
from fsprobe.model import (
    FilesystemInfo,
    LustreImport,
    LustreTarget,
    ProbeResult,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.policy import Policy

NOW = 1_700_000_000.0
GRACE_END = NOW + 3 * 86400

#: The contract, as the alert rules and the dashboard use it: family name -> label names.
CONTRACT = {
    "fsprobe_build_info": {"version"},
    "fsprobe_health_status": {"path"},
    "fsprobe_probe_success": {"path", "probe"},
    "fsprobe_probe_duration_seconds": {"path", "probe"},
    "fsprobe_probe_last_success_timestamp_seconds": {"path", "probe"},
    "fsprobe_probe_interval_seconds": {"path", "probe"},
    "fsprobe_probe_last_run_timestamp_seconds": {"path", "probe"},
    "fsprobe_probe_stale_after_seconds": {"path", "probe"},
    "fsprobe_probe_errors": {"path", "probe", "errno"},
    "fsprobe_probe_skipped": {"path", "probe"},
    "fsprobe_mount_stuck": {"path"},
    **{
        f"fsprobe_filesystem_{suffix}": {"path", "mountpoint", "fstype", "device"}
        for suffix in ("size_bytes", "avail_bytes", "inodes", "inodes_free", "readonly")
    },
    **{
        f"fsprobe_quota_{suffix}": {"path", "type", "id"}
        for suffix in (
            "used_bytes",
            "soft_limit_bytes",
            "hard_limit_bytes",
            "used_inodes",
            "soft_limit_inodes",
            "hard_limit_inodes",
        )
    },
    "fsprobe_quota_grace_expiry_timestamp_seconds": {"path", "type", "id", "resource"},
    "fsprobe_quota_grace_expired": {"path", "type", "id", "resource"},
    "fsprobe_quota_exceeded": {"path", "type", "id", "resource"},
    **{
        f"fsprobe_lustre_target_{suffix}": {"path", "target"}
        for suffix in (
            "avail_bytes",
            "size_bytes",
            "inodes_free",
            "inodes",
            "in_layout",
            "connected",
            "recovering",
            "active",
            "last_eviction_timestamp_seconds",
        )
    },
    "fsprobe_headroom_bytes": {"path"},
    "fsprobe_headroom_inodes": {"path"},
    "fsprobe_headroom_ratio": {"path", "resource"},
    "fsprobe_headroom_limit": {"path", "resource", "limit", "id"},
    "fsprobe_write_latency_seconds": {"path"},
    "fsprobe_write_step_seconds": {"path", "op"},
    "fsprobe_tmpdir_same_device": {"path"},
    "fsprobe_redirected_pending_bytes": {"path"},
    "fsprobe_redirect_problems": {"path", "problem"},
    "fsprobe_saves": {"path", "outcome"},
    "fsprobe_save_failed_attempts": {"path", "errno"},
    "fsprobe_save_duration_seconds": {"path"},
    "fsprobe_save_bytes": {"path"},
    "fsprobe_last_save_timestamp_seconds": {"path"},
    "fsprobe_last_successful_save_timestamp_seconds": {"path"},
    "fsprobe_save_interval_seconds": {"path"},
    "fsprobe_savers": {"path"},
    "fsprobe_last_save_problem_timestamp_seconds": {
        "path",
        "outcome",
        "file",
        "uid",
        "errno",
        "step",
        "fallback",
        "reason",
    },
    "fsprobe_internal_errors": {"path", "stage"},
}

FS = FilesystemInfo(
    probed_path="/lustre/ckpt",
    mountpoint="/lustre",
    fstype="lustre",
    device="10.0.0.1@tcp:/scratch",
    size_bytes=10 * 2**40,
    avail_bytes=4 * 2**40,
    files=1_000_000,
    files_free=600_000,
    readonly=False,
    st_dev=42,
)
QUOTA = QuotaReport(
    provider="lfs",
    entries=(
        QuotaEntry(
            "user", 1000, "alice", QuotaUsage(used=5 * 2**30), QuotaUsage(used=1200)
        ),  # no limits at all
        QuotaEntry(
            "project",
            4242,
            None,
            QuotaUsage(used=79 * 2**30, soft=90 * 2**30, hard=100 * 2**30),
            QuotaUsage(
                used=93_000,
                soft=90_000,
                hard=100_000,
                grace_expires_at=GRACE_END,
                state=QuotaState.SOFT_EXCEEDED,
            ),
        ),
    ),
)
OSTS = (
    LustreTarget("scratch-MDT0000", "MDT", 0, 2**40, 2**39, 1_000_000, 600_000),
    LustreTarget("scratch-OST0001", "OST", 1, 5 * 2**40, 3 * 2**40, None, None),
)
IMPORTS = (
    LustreImport("scratch-MDT0000", "MDT", 0, "FULL"),
    LustreImport("scratch-OST0001", "OST", 1, "FULL", last_eviction=NOW - 600),
)
WRITE = WriteProbeResult(
    ok=True,
    bytes=1 << 20,
    latency_seconds={
        "create": 0.002,
        "write": 0.003,
        "fsync": 0.2,
        "rename": 0.001,
        "fsync_dir": 0.01,
        "unlink": 0.001,
        "total": 0.217,
    },
)


def result(probe: str, value=None, error: str | None = None, stuck: bool = False):
    return ProbeResult(probe, NOW, 0.5, value=value, error=error, stuck=stuck)


def full_store(path: str = "/lustre/ckpt") -> Store:
    store = Store(clock=lambda: NOW + 1)
    intervals = {
        "statvfs": 15.0,
        "quota": 300.0,
        "lfs_df": 300.0,
        "imports": 15.0,
        "write": 60.0,
        "tmpdir": 60.0,
    }
    store.configure([TargetSpec(path, Policy(intervals=intervals), intervals)])
    for failures in ((), (Failure("EIO", "write"),), ()):  # real saves, before the probes
        saved = SaveEvent(f"{path}/a.pt", f"{path}/a.pt", 100, 2.0, 1, failures, NOW, "h", 1)
        store.record_save(Sender(0, 0, 1), saved)
    store.record(path, result("statvfs", FS))
    store.record(path, result("quota", QUOTA))
    store.record(path, result("lfs_df", OSTS))
    store.record(path, result("imports", IMPORTS))
    store.record(path, result("write", error="EIO"))
    store.record(path, result("write", WRITE))
    store.record(path, result("tmpdir", TmpdirInfo("/tmp", same_device=False)))
    store.skip_write_probe(path)  # the last save stands for the next write probe
    return store


def parse(text: bytes) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text.decode())}


def samples(families: dict, name: str) -> dict:
    """{frozenset(labels): value} of the samples called `name`, in whichever family."""
    return {
        frozenset(sample.labels.items()): sample.value
        for family in families.values()
        for sample in family.samples
        if sample.name == name
    }


def one(families: dict, name: str, **labels) -> float:
    matches = [
        value
        for key, value in samples(families, name).items()
        if all((k, v) in key for k, v in labels.items())
    ]
    assert len(matches) == 1, (name, labels, samples(families, name))
    return matches[0]


def test_every_family_of_the_contract_is_there_with_its_labels():
    exposition = Exposition(full_store().views, process_metrics=False)
    families = parse(exposition.fsprobe_text())
    assert set(families) == set(CONTRACT)
    for name, family in families.items():
        assert "Cached from fsprobe's background probes" in family.documentation or name == (
            "fsprobe_build_info"
        )
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == CONTRACT[name], sample
    assert families["fsprobe_probe_errors"].type == "counter"
    assert families["fsprobe_write_latency_seconds"].type == "histogram"


#: The families whose series carry a `pool` label where they have one (a pool quota, an OST
#: in the target directory's layout pools): one series per pool, nothing added elsewhere.
POOLED = {
    name
    for name in CONTRACT
    if name.startswith(("fsprobe_quota_", "fsprobe_lustre_", "fsprobe_headroom_limit"))
}


def test_pool_quotas_and_pooled_osts_carry_a_pool_label():
    path = "/lustre/ckpt"
    pooled = QuotaEntry(
        "user", 1000, "alice", QuotaUsage(used=2 * 2**30, hard=4 * 2**30), QuotaUsage(10),
        pool="flash",
    )  # fmt: skip
    quota = QuotaReport("lfs", (*QUOTA.entries, pooled))
    targets = (
        OSTS[0],
        LustreTarget("scratch-OST0000", "OST", 0, 2**40, 2**39, None, None, pools=("flash",)),
        LustreTarget("scratch-OST0003", "OST", 3, 2**40, 2**30, None, None, in_layout=False),
    )
    store = Store(clock=lambda: NOW + 1)
    intervals = {"statvfs": 15.0, "quota": 300.0, "lfs_df": 300.0}
    store.configure([TargetSpec(path, Policy(intervals=intervals), intervals)])
    for probe, value in (("statvfs", FS), ("quota", quota), ("lfs_df", targets)):
        store.record(path, result(probe, value))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    hard = samples(families, "fsprobe_quota_hard_limit_bytes")
    flash = frozenset({"path": path, "type": "user", "id": "1000", "pool": "flash"}.items())
    assert hard[flash] == 4 * 2**30
    assert [dict(labels)["type"] for labels in hard if "pool" not in dict(labels)] == ["project"]
    used = samples(families, "fsprobe_quota_used_bytes")
    assert {dict(labels).get("pool") for labels in used} == {None, "flash"}
    avail = {
        dict(labels)["target"]: dict(labels)
        for labels in samples(families, "fsprobe_lustre_target_avail_bytes")
    }
    assert avail["scratch-OST0000"]["pool"] == "flash"
    assert "pool" not in avail["scratch-OST0003"] and "pool" not in avail["scratch-MDT0000"]
    binding = {
        dict(labels)["resource"]: dict(labels)
        for labels in samples(families, "fsprobe_headroom_limit")
    }
    # the pool quota's 2 GiB left bind the bytes (what the headroom alert tells to raise)
    assert binding["bytes"] == {
        "path": path,
        "resource": "bytes",
        "limit": "user",
        "id": "1000",
        "pool": "flash",
    }
    for name, family in families.items():
        for sample in family.samples:
            extra = {"pool"} if name in POOLED else set()
            assert set(sample.labels) - {"le"} - extra == CONTRACT[name], sample


def test_each_lustre_target_says_whether_a_new_file_can_meet_it():
    """`in_layout` as a gauge the alert rules join on (path, target): 1 for every MDT and each
    OST of the layout's pools, 0 for an OST outside them, also when it has no other series."""
    path = "/lustre/ckpt"
    targets = (
        LustreTarget("scratch-MDT0000", "MDT", 0, 2**40, 2**39, 10**6, 10**5),
        LustreTarget("scratch-OST0000", "OST", 0, 2**40, 2**30, None, None, pools=("flash",)),
        LustreTarget("scratch-OST0001", "OST", 1, 2**40, 2**30, None, None, pools=("flash", "ssd")),
        LustreTarget("scratch-OST0003", "OST", 3, 2**40, 2**30, None, None, in_layout=False),
        LustreTarget("scratch-OST0004", "OST", 4, None, None, None, None, in_layout=False),
    )
    store = Store(clock=lambda: NOW + 1)
    intervals = {"statvfs": 15.0, "lfs_df": 300.0}
    store.configure([TargetSpec(path, Policy(intervals=intervals), intervals)])
    for probe, value in (("statvfs", FS), ("lfs_df", targets)):
        store.record(path, result(probe, value))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    assert families["fsprobe_lustre_target_in_layout"].type == "gauge"
    in_layout = {
        tuple(sorted(labels)): value
        for labels, value in samples(families, "fsprobe_lustre_target_in_layout").items()
    }
    assert in_layout == {
        (("path", path), ("target", "scratch-MDT0000")): 1.0,
        (("path", path), ("pool", "flash"), ("target", "scratch-OST0000")): 1.0,
        (("path", path), ("pool", "flash,ssd"), ("target", "scratch-OST0001")): 1.0,
        (("path", path), ("target", "scratch-OST0003")): 0.0,
        (("path", path), ("target", "scratch-OST0004")): 0.0,
    }


def test_values_of_a_fully_probed_lustre_target():
    families = parse(Exposition(full_store().views, process_metrics=False).fsprobe_text())
    path = "/lustre/ckpt"
    assert one(families, "fsprobe_build_info", version=__version__) == 1
    assert one(families, "fsprobe_health_status", path=path) == 1  # degraded: soft, tmpdir
    for probe in ("statvfs", "quota", "lfs_df", "write", "tmpdir"):
        assert one(families, "fsprobe_probe_success", path=path, probe=probe) == 1
        assert one(families, "fsprobe_probe_duration_seconds", path=path, probe=probe) == 0.5
        assert one(
            families, "fsprobe_probe_last_success_timestamp_seconds", path=path, probe=probe
        ) == pytest.approx(NOW + 0.5)
    assert one(families, "fsprobe_probe_interval_seconds", probe="quota") == 300
    assert one(families, "fsprobe_probe_stale_after_seconds", probe="quota") == 3 * 300
    assert one(families, "fsprobe_probe_errors_total", probe="write", errno="EIO") == 1
    assert one(families, "fsprobe_mount_stuck", path=path) == 0

    fs_labels = {
        "path": path,
        "mountpoint": "/lustre",
        "fstype": "lustre",
        "device": "10.0.0.1@tcp:/scratch",
    }
    assert one(families, "fsprobe_filesystem_size_bytes", **fs_labels) == 10 * 2**40
    assert one(families, "fsprobe_filesystem_avail_bytes", **fs_labels) == 4 * 2**40
    assert one(families, "fsprobe_filesystem_inodes", **fs_labels) == 1_000_000
    assert one(families, "fsprobe_filesystem_inodes_free", **fs_labels) == 600_000
    assert one(families, "fsprobe_filesystem_readonly", **fs_labels) == 0

    project = {"path": path, "type": "project", "id": "4242"}
    assert one(families, "fsprobe_quota_used_bytes", **project) == 79 * 2**30
    assert one(families, "fsprobe_quota_soft_limit_bytes", **project) == 90 * 2**30
    assert one(families, "fsprobe_quota_hard_limit_inodes", **project) == 100_000
    assert one(families, "fsprobe_quota_used_inodes", type="user", id="1000") == 1200
    # Unlimited: no limit series at all for the user.
    assert not [
        k for k in samples(families, "fsprobe_quota_hard_limit_bytes") if ("id", "1000") in k
    ]
    assert one(
        families, "fsprobe_quota_grace_expiry_timestamp_seconds", resource="inodes"
    ) == pytest.approx(GRACE_END)
    assert len(samples(families, "fsprobe_quota_grace_expiry_timestamp_seconds")) == 1
    assert one(families, "fsprobe_quota_grace_expired", id="4242", resource="inodes") == 0
    assert one(families, "fsprobe_quota_grace_expired", id="4242", resource="bytes") == 0
    assert not [k for k in samples(families, "fsprobe_quota_grace_expired") if ("id", "1000") in k]
    assert one(families, "fsprobe_quota_exceeded", id="4242", resource="inodes") == 1
    assert one(families, "fsprobe_quota_exceeded", id="4242", resource="bytes") == 0
    assert one(families, "fsprobe_quota_exceeded", id="1000", resource="bytes") == 0

    assert one(families, "fsprobe_lustre_target_avail_bytes", target="scratch-OST0001") == 3 * 2**40
    assert one(families, "fsprobe_lustre_target_inodes", target="scratch-MDT0000") == 1_000_000
    assert not samples(families, "fsprobe_lustre_target_inodes_free").keys() - {
        frozenset({("path", path), ("target", "scratch-MDT0000")})
    }  # the OST has no inode numbers: no series, not a zero

    # Headroom: the project's inode quota binds (7 000 left of 100 000).
    assert one(families, "fsprobe_headroom_inodes", path=path) == 7_000
    assert one(families, "fsprobe_headroom_ratio", resource="inodes") == pytest.approx(0.07)
    assert one(families, "fsprobe_headroom_bytes", path=path) == 21 * 2**30
    assert one(families, "fsprobe_tmpdir_same_device", path=path) == 0
    assert samples(families, "fsprobe_redirected_pending_bytes") == {}


def test_write_latency_is_one_histogram_of_whole_probes_and_the_steps_are_gauges():
    families = parse(Exposition(full_store().views, process_metrics=False).fsprobe_text())
    buckets = {
        dict(key)["le"]: value
        for key, value in samples(families, "fsprobe_write_latency_seconds_bucket").items()
    }
    assert list(buckets) == [
        "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
        "1.0", "2.5", "5.0", "10.0", "30.0", "60.0", "+Inf",
    ]  # fmt: skip
    assert buckets["0.1"] == 0 and buckets["0.25"] == 1 and buckets["+Inf"] == 1
    assert one(families, "fsprobe_write_latency_seconds_count", path="/lustre/ckpt") == 1
    assert one(families, "fsprobe_write_latency_seconds_sum") == pytest.approx(0.217)
    steps = {
        dict(key)["op"]: value
        for key, value in samples(families, "fsprobe_write_step_seconds").items()
    }
    assert steps == {
        "create": 0.002, "write": 0.003, "fsync": 0.2, "rename": 0.001, "fsync_dir": 0.01,
        "unlink": 0.001,
    }  # fmt: skip


def test_a_failed_write_probe_shows_its_steps_up_to_the_failure():
    store = full_store()
    failed = WriteProbeResult(
        ok=False,
        bytes=1 << 20,
        latency_seconds={"create": 0.002, "write": 0.5, "total": 0.6},
        step="write",
        errno="EDQUOT",
    )
    store.record("/lustre/ckpt", result("write", failed, error="EDQUOT"))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    steps = {
        dict(key)["op"]: value
        for key, value in samples(families, "fsprobe_write_step_seconds").items()
    }
    assert steps == {"create": 0.002, "write": 0.5}
    assert one(families, "fsprobe_write_latency_seconds_count") == 2
    assert one(families, "fsprobe_probe_success", probe="write") == 0


def test_probes_that_did_not_apply_have_no_series():
    """On a filesystem without a quota provider, quota and lfs df answer "not here": no
    probe_success of 1 for a probe that never asked anything (issue 11.3)."""
    store = Store(clock=lambda: NOW + 1)
    intervals = {"statvfs": 15.0, "quota": 300.0, "lfs_df": 300.0, "write": 60.0, "tmpdir": 60.0}
    store.configure([TargetSpec("/ext4/ckpt", Policy(intervals=intervals), intervals)])
    store.record("/ext4/ckpt", result("statvfs", FS))
    store.record("/ext4/ckpt", result("quota", None))
    store.record("/ext4/ckpt", result("lfs_df", None))
    store.record("/ext4/ckpt", result("write", WRITE))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    for name in (
        "fsprobe_probe_success",
        "fsprobe_probe_duration_seconds",
        "fsprobe_probe_last_success_timestamp_seconds",
        "fsprobe_probe_interval_seconds",
    ):
        assert {dict(key)["probe"] for key in samples(families, name)} == {"statvfs", "write"}
    # A quota probe that tried and failed did run, and says so.
    store.record("/ext4/ckpt", result("quota", error="ENOENT"))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    assert one(families, "fsprobe_probe_success", probe="quota") == 0
    assert one(families, "fsprobe_probe_errors_total", probe="quota", errno="ENOENT") == 1


@pytest.mark.parametrize(
    "latest",
    [
        result("statvfs", error="EIO"),
        result("statvfs", error="TIMEOUT", stuck=True),
        result("write", error="TIMEOUT", stuck=True),
    ],
    ids=["statvfs-failed", "statvfs-stuck", "write-stuck"],
)
def test_value_series_are_left_out_not_zeroed_when_statvfs_fails_or_the_mount_hangs(latest):
    store = full_store()
    store.record("/lustre/ckpt", latest)
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    for name in CONTRACT:
        if (
            name.startswith(
                ("fsprobe_filesystem_", "fsprobe_quota_", "fsprobe_lustre_", "fsprobe_headroom_")
            )
            or name == "fsprobe_tmpdir_same_device"
        ):
            assert samples(families, name) == {}, name
    assert one(families, "fsprobe_probe_success", probe=latest.probe) == 0
    assert one(families, "fsprobe_mount_stuck", path="/lustre/ckpt") == float(latest.stuck)
    assert one(families, "fsprobe_health_status", path="/lustre/ckpt") >= 1
    # History stays: counters and the histogram do not vanish with the mount.
    assert one(families, "fsprobe_write_latency_seconds_count") == 1
    assert one(families, "fsprobe_probe_errors_total", probe=latest.probe, errno=latest.error) >= 1


def test_redirected_pending_bytes_only_where_set():
    store = full_store()
    store.configure(
        [TargetSpec("/lustre/ckpt"), TargetSpec("/other")]  # /lustre/ckpt keeps its history
    )
    store.set_redirected_pending_bytes("/other", 3 * 2**30)
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    assert samples(families, "fsprobe_redirected_pending_bytes") == {
        frozenset({("path", "/other")}): 3 * 2**30
    }


def test_redirect_problems_are_counted_from_zero_beside_the_pending_bytes():
    store = full_store()
    store.configure([TargetSpec("/lustre/ckpt"), TargetSpec("/other")])
    store.set_redirected_pending_bytes("/other", 0)
    store.count_redirect_problems("/other", "sync_as_user_failed", 2)
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    assert samples(families, "fsprobe_redirect_problems_total") == {
        frozenset({("path", "/other"), ("problem", "sync_as_user_failed")}): 2,
        frozenset({("path", "/other"), ("problem", "area_squatted")}): 0,
        frozenset({("path", "/other"), ("problem", "fallback_crowded")}): 0,
    }


def test_labels_survive_awkward_paths():
    path = '/data/we"ird\\name\nx # HELP y'
    store = Store(clock=lambda: NOW)
    store.configure([TargetSpec(path)])
    store.record(path, result("statvfs", FS))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    # As in the human output: the backslash doubled, the newline as \n (fsprobe.posix.paths).
    label = '/data/we"ird\\\\name\\nx # HELP y'
    assert one(families, "fsprobe_health_status", path=label) == 0
    assert one(families, "fsprobe_filesystem_inodes", path=label) == 1_000_000
    text = Exposition(store.views, process_metrics=False).fsprobe_text()
    # ... and that, once more, as the text format escapes a label value.
    assert rb'path="/data/we\"ird\\\\name\\nx # HELP y"' in text


def oracle(views) -> bytes:
    """The same samples encoded by prometheus_client: a second encoder to hold ours to."""
    families = [GaugeMetricFamily(BUILD_INFO.name, BUILD_INFO.help, labels=["version"])]
    families[0].add_metric([__version__], 1.0)
    per_target = [target_samples(view) for view in views]
    for family in FAMILIES:
        metric = Metric(family.name, f"{family.help} {CACHED}", family.kind)
        for by_family in per_target:
            for sample in by_family.get(family.name, ()):
                metric.add_sample(sample.name, dict(sample.labels), sample.value)
        families.append(metric)
    bugs = Metric(INTERNAL_ERRORS.name, f"{INTERNAL_ERRORS.help} {CACHED}", "counter")
    for view in views:
        for stage in ("probe", "judge", "publish"):
            bugs.add_sample(f"{INTERNAL_ERRORS.name}_total", {"path": view.path, "stage": stage}, 0)
    families.append(bugs)

    class Collector:
        def collect(self):
            return iter(families)

    return generate_latest(Collector())  # type: ignore[arg-type]


def test_the_cached_exposition_says_what_prometheus_client_would():
    store = full_store()
    store.configure([TargetSpec("/lustre/ckpt"), TargetSpec("/b"), TargetSpec("/a")])
    exposition = Exposition(store.views, process_metrics=False)

    def same() -> None:
        ours = exposition.fsprobe_text()
        theirs = oracle(store.views())
        assert list(text_string_to_metric_families(ours.decode())) == list(
            text_string_to_metric_families(theirs.decode())
        )
        assert ours.count(b"\n") == theirs.count(b"\n")

    same()
    store.record("/b", result("statvfs", FS))  # a change after the cache was filled
    exposition.warm(store.views())
    same()
    assert b'fsprobe_filesystem_inodes{device="10.0.0.1@tcp:/scratch",fstype="lustre",' in (
        exposition.fsprobe_text()
    )
    for latest in (result("write", WRITE), result("statvfs", FS), result("write", error="EIO")):
        exposition.warm([store.record("/a", latest)])
        same()
    assert b'fsprobe_write_latency_seconds_count{path="/a"} 1.0' in exposition.fsprobe_text()

    store.configure([TargetSpec("/a")])  # a target removed on reload
    exposition.warm(store.views())
    same()
    assert b"/lustre/ckpt" not in exposition.fsprobe_text()


def test_render_adds_process_metrics_in_front():
    exposition = Exposition(full_store().views)
    process, fsprobe = exposition.render()
    families = parse(process + fsprobe)
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "fsprobe_health_status" in families
    assert fsprobe == exposition.fsprobe_text()
    assert "fsprobe_health_status" not in parse(process)


def test_textfile_is_replaced_atomically_without_timestamps(tmp_path):
    exposition = Exposition(full_store().views, process_metrics=False)
    target = tmp_path / TEXTFILE_NAME
    target.write_text("old content\n")
    os.chmod(tmp_path, 0o755)
    with open_textfile_dir(str(tmp_path)) as directory:
        path = write_textfile(directory, exposition.fsprobe_text())
    assert path == str(target)
    assert target.read_bytes() == exposition.fsprobe_text()
    assert os.listdir(tmp_path) == [TEXTFILE_NAME]  # no temporary file left behind
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    for family in text_string_to_metric_families(target.read_text()):
        assert all(sample.timestamp is None for sample in family.samples)


def test_textfile_write_refuses_to_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.chmod(tmp_path, 0o755)
    directory = open_textfile_dir(str(tmp_path))
    write_textfile(directory, b"fsprobe_build_info 1\n")
    # The temporary name is random; whatever is at the final name is replaced, not written
    # through: a symlink there is replaced by the file, its target is untouched.
    (tmp_path / TEXTFILE_NAME).unlink()
    (tmp_path / TEXTFILE_NAME).symlink_to(victim)
    write_textfile(directory, b"fsprobe_build_info 1\n")
    directory.close()
    assert victim.read_text() == "precious"
    assert not (tmp_path / TEXTFILE_NAME).is_symlink()


def test_warming_one_changed_target_keeps_the_others_cached():
    store = Store(clock=lambda: NOW)
    store.configure([TargetSpec(f"/t{index}") for index in range(5)])
    exposition = Exposition(store.views, process_metrics=False)
    exposition.warm(store.views())
    cached = dict(exposition._cache)
    changed = store.record("/t3", result("statvfs", FS))
    exposition.warm([changed])
    assert {path: entry for path, entry in exposition._cache.items() if path != "/t3"} == {
        path: entry for path, entry in cached.items() if path != "/t3"
    }
    assert exposition._cache["/t3"].version == changed.version
    store.configure([TargetSpec("/t1")])
    exposition.warm([])
    assert set(exposition._cache) == {"/t1"}


def test_an_expired_grace_stays_exported_until_usage_is_back_under_the_soft_limit():
    """Issue 35: the expiry series was exported only while a timer ran, so the alert ended the
    moment enforcement began. Running, then run out (as of the view, before the next quota
    probe), then `lfs quota` printing the timer as expired, then usage under the soft limit."""
    now = [NOW]
    store = Store(clock=lambda: now[0])
    store.configure([TargetSpec("/lustre/ckpt", Policy(), {"statvfs": 15.0, "quota": 300.0})])
    store.record("/lustre/ckpt", result("statvfs", FS))

    def inodes(used: int, expires: float | None, state: QuotaState) -> tuple[float, float | None]:
        usage = QuotaUsage(used, soft=90_000, hard=100_000, grace_expires_at=expires, state=state)
        entry = QuotaEntry("project", 4242, None, QuotaUsage(used=1), usage)
        quota = ProbeResult("quota", now[0], 0.5, value=QuotaReport("lfs", (entry,)))
        store.record("/lustre/ckpt", quota)
        families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
        expiry = samples(families, "fsprobe_quota_grace_expiry_timestamp_seconds")
        return (
            one(families, "fsprobe_quota_grace_expired", resource="inodes"),
            next(iter(expiry.values()), None),
        )

    assert inodes(93_000, GRACE_END, QuotaState.SOFT_EXCEEDED) == (0.0, GRACE_END)
    now[0] = GRACE_END + 60  # the timer ran out since the last quota probe
    store.record("/lustre/ckpt", result("statvfs", FS))
    families = parse(Exposition(store.views, process_metrics=False).fsprobe_text())
    assert one(families, "fsprobe_quota_grace_expired", resource="inodes") == 1
    assert inodes(93_000, None, QuotaState.GRACE_EXPIRED) == (1.0, None)  # lfs: "expired"
    assert inodes(89_000, None, QuotaState.OK) == (0.0, None)


def test_a_senders_path_labels_a_series_only_in_plain_bounded_characters():
    assert plain_label("/ckpt/run-1/step_100", "/ckpt") == "run-1/step_100"  # plain already
    dotted = plain_label("/ckpt/evil.example", "/ckpt")  # a bare domain is a link in chat
    assert dotted.startswith("evil_example~") and len(dotted) == len("evil_example") + 9
    assert plain_label("/ckpt/a.pt", "/ckpt") != plain_label("/ckpt/a pt", "/ckpt")
    long = plain_label("/ckpt/" + "x" * 500, "/ckpt")
    assert long == "x" * MAX_PLAIN_CHARS + long[-9:] and long[-9] == "~"
    assert plain_label("/scratch/fallback") == "/scratch/fallback"
