"""Judging is total (issue 17.1): any numbers a statvfs, `lfs` or probe answer can hold give a
verdict, and every output of that verdict (the check JSON and its reading back, the terminal,
the metrics) works.

Hypothesis draws every field of a snapshot: zero sizes and inode counts, free above size,
values far beyond any real filesystem, any errno name, any quota state, stuck and stale
results. The property: `evaluate` returns a verdict whose ratios are shares (within [0, 1]),
a resource whose capacity is reported as zero is `capacity_unknown` and never judged by that
zero, and nothing downstream raises.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsprobe.cli.render import render_report
from fsprobe.exporters.metrics import target_samples
from fsprobe.exporters.view import TargetView
from fsprobe.model import (
    PROBE_KINDS,
    QUOTA_TYPES,
    TIMEOUT,
    FilesystemInfo,
    LustreImport,
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
from fsprobe.policy import Policy, evaluate
from fsprobe.report import Report
from tests.support.policy import NOW, WRITE_STEPS

#: Amounts as statvfs (u64 blocks times a block size), `lfs` and quotas can report them: the
#: edges, and anything up to far beyond 2**64.
amounts = st.one_of(
    st.just(0),
    st.just(-1),  # what a total of 2**64 - 1 can read as, or a parser's garbage
    st.just(1),
    st.integers(min_value=0, max_value=2**20),
    st.integers(min_value=0, max_value=2**96),
    st.sampled_from([2**32 - 1, 2**63 - 1, 2**64 - 1, (2**64 - 1) * 2**20]),
)
optional_amounts = st.none() | amounts
moments = st.floats(min_value=0.0, max_value=2 * NOW, allow_nan=False)
seconds = st.one_of(
    st.just(0.0), st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
)
texts = st.text(max_size=40)
errnos = (
    st.sampled_from(
        ["EIO", "ENOSPC", "EDQUOT", "EROFS", "EACCES", "ESTALE", TIMEOUT, "EUNKNOWN", "ENOENT"]
    )
    | texts
)

filesystems = st.builds(
    FilesystemInfo,
    probed_path=texts,
    mountpoint=texts,
    fstype=texts,
    device=texts,
    size_bytes=amounts,
    avail_bytes=amounts,
    files=amounts,
    files_free=amounts,
    readonly=st.booleans(),
    st_dev=amounts,
)
usages = st.builds(
    QuotaUsage,
    used=amounts,
    soft=optional_amounts,
    hard=optional_amounts,
    grace_expires_at=st.none() | moments,
    state=st.sampled_from(QuotaState),
    inaccurate=st.booleans(),
)
quota_reports = st.builds(
    QuotaReport,
    provider=texts,
    entries=st.lists(
        st.builds(
            QuotaEntry,
            type=st.sampled_from(QUOTA_TYPES),
            id=amounts,
            name=st.none() | texts,
            bytes=usages,
            inodes=usages,
        ),
        max_size=3,
    ).map(tuple),
    inaccurate=st.booleans(),
    errors=st.lists(texts, max_size=2).map(tuple),
)
lustre_targets = st.lists(
    st.builds(
        LustreTarget,
        name=texts,
        kind=st.sampled_from(["MDT", "OST"]),
        index=amounts,
        size_bytes=optional_amounts,
        avail_bytes=optional_amounts,
        files=optional_amounts,
        files_free=optional_amounts,
        active=st.booleans(),
        flags=texts,
    ),
    max_size=4,
).map(tuple)
lustre_imports = st.lists(
    st.builds(
        LustreImport,
        name=texts,
        kind=st.sampled_from(["MDT", "OST"]),
        index=amounts,
        state=st.sampled_from(["FULL", "IDLE", "DISCONN", "EVICTED", "<UNKNOWN>"]) | texts,
        lost_at=st.none() | moments,
        last_eviction=st.none() | moments,
    ),
    max_size=4,
).map(tuple)
write_probes = st.builds(
    WriteProbeResult,
    ok=st.booleans(),
    bytes=amounts,
    latency_seconds=st.dictionaries(st.sampled_from([*WRITE_STEPS, "total"]), seconds),
    step=st.none() | st.sampled_from(WRITE_STEPS),
    errno=st.none() | errnos,
    message=texts,
)
tmpdirs = st.builds(TmpdirInfo, path=texts, same_device=st.booleans())
VALUES = {
    "statvfs": filesystems,
    "quota": st.none() | quota_reports,
    "lfs_df": st.none() | lustre_targets,
    "imports": st.none() | lustre_imports,
    "write": write_probes,
    "tmpdir": tmpdirs,
}


@st.composite
def probe_results(draw: st.DrawFn, kind: str) -> ProbeResult:
    error = draw(st.none() | errnos)
    # A probe that answers has its value (quota and lfs df: None where they do not apply);
    # a failed one may carry what it saw (the write probe's failing step).
    always = error is None and kind in ("statvfs", "write", "tmpdir")
    value = draw(VALUES[kind] if always else st.none() | VALUES[kind])
    return ProbeResult(
        kind,
        started_at=draw(moments),
        duration=draw(seconds),
        value=value,
        error=error,
        message=draw(texts),
        stuck=draw(st.booleans()) if error is not None else False,
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    kinds = draw(st.lists(st.sampled_from(PROBE_KINDS), unique=True))
    results = {kind: draw(probe_results(kind)) for kind in kinds}
    recent = draw(st.lists(st.none() | errnos, max_size=5).map(tuple))
    return Snapshot("/ckpt", results, recent)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(), need_bytes=optional_amounts, need_inodes=optional_amounts)
def test_any_snapshot_is_judged_and_every_output_of_it_works(
    snapshot: Snapshot, need_bytes: int | None, need_inodes: int | None
) -> None:
    verdict = evaluate(snapshot, Policy(), NOW, need_bytes, need_inodes)

    assert verdict.status in Status
    for ratio in (verdict.headroom.bytes_ratio, verdict.headroom.inodes_ratio):
        assert ratio is None or 0.0 <= ratio <= 1.0
    report = Report("/ckpt", snapshot, verdict, need_bytes, need_inodes)
    document = report.to_dict()
    assert Report.from_dict(json.loads(json.dumps(document))).to_dict() == document
    assert render_report(report, NOW)
    view = TargetView("/ckpt", snapshot, verdict, intervals={"statvfs": 15.0})
    assert target_samples(view)["fsprobe_health_status"][0].value == int(verdict.status)


@settings(max_examples=300, deadline=None)
@given(fs=filesystems, at=st.floats(min_value=NOW - 10, max_value=NOW, allow_nan=False))
def test_a_capacity_reported_as_zero_is_unknown_never_judged_by_the_zero(
    fs: FilesystemInfo, at: float
) -> None:
    statvfs = ProbeResult("statvfs", at, 0.0, fs)
    verdict = evaluate(Snapshot("/ckpt", {"statvfs": statvfs}), Policy(), NOW)

    unknown = [r for r in verdict.reasons if r.code == "capacity_unknown"]
    assert len(unknown) == (fs.size_bytes <= 0) + (fs.files <= 0)
    if fs.size_bytes <= 0:
        assert verdict.headroom.bytes is None and verdict.headroom.bytes_ratio is None
        assert not any(r.code == "space_headroom_low" for r in verdict.reasons)
    if fs.files <= 0:
        assert verdict.headroom.inodes is None and verdict.headroom.inodes_ratio is None
        assert not any(r.code == "inode_headroom_low" for r in verdict.reasons)
    if fs.size_bytes <= 0 and fs.files <= 0 and not fs.readonly:
        # statvfs measured nothing: nothing was measured that could read as healthy
        assert verdict.status is Status.UNKNOWN
    if fs.size_bytes > 0 and fs.avail_bytes >= fs.size_bytes:
        assert verdict.headroom.bytes_ratio == 1.0  # free above size: all of it, no more
