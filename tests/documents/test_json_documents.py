"""The JSON documents, byte for byte: `check --json`, a state file, `sync --json`'s entries and
failures, a manifest line (docs/reference.md). The expected bytes in tests/fixtures/json/ were
written by the hand-written encoders that `fsprobe.codec` replaced; a change to them is a change
of contract. Reading them back gives the same bytes, and reading checks every value."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fsprobe.codec import FormatError
from fsprobe.model import (
    LastSave,
    LustreImport,
    LustreTarget,
    QuotaEntry,
    QuotaReport,
    QuotaState,
    QuotaUsage,
    Reason,
    Severity,
    Snapshot,
    Status,
    TmpdirInfo,
    WriteProbeResult,
)
from fsprobe.policy import Headroom, Verdict, save_answer
from fsprobe.redirect.areas import Area
from fsprobe.redirect.manifest import Entry
from fsprobe.redirect.sync import SyncOutcome, UnsyncedUser
from fsprobe.report import Report, TargetState
from fsprobe.state import StateReader, Writer, write_state
from tests.support.policy import NOW, filesystem_info, probe

EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "json"
GiB = 1 << 30


def every_probe() -> Report:
    """A report with every probe and every optional part: a target not there yet, quotas with
    a pool, a note, an error, storage targets in and out of the layout, an import lost by an
    eviction, a failed test write, a $TMPDIR elsewhere with its free room."""
    fs = filesystem_info(5 * GiB, 100 * GiB, 1000, 400, readonly=False)
    usage = QuotaUsage(90 * GiB, 80 * GiB, 100 * GiB, NOW + 3600, QuotaState.SOFT_EXCEEDED, True)
    quota = QuotaReport(
        "lfs",
        (
            QuotaEntry("user", 1000, "alice", usage, QuotaUsage(10, None, 100)),
            QuotaEntry("project", 42, None, QuotaUsage(1), QuotaUsage(2), pool="flash"),
        ),
        inaccurate=True,
        errors=("group 1000: lfs quota: Unexpected quotactl error",),
        notes=("project 42 but not its inherit flag",),
    )
    targets = (
        LustreTarget("lustre-MDT0000", "MDT", 0, 10 * GiB, 9 * GiB, 5000, 100, flags=""),
        LustreTarget("lustre-OST0001", "OST", 1, 50 * GiB, 0, None, None, True, "D", ("flash",)),
        LustreTarget("lustre-OST0002", "OST", 2, None, None, None, None, False, in_layout=False),
    )
    imports = (
        LustreImport("lustre-MDT0000", "MDT", 0, "FULL"),
        LustreImport("lustre-OST0001", "OST", 1, "EVICTED", NOW - 60, NOW - 60),
    )
    write = WriteProbeResult(False, 1 << 20, {"create": 0.001, "write": 0.5}, "fsync", "EIO", "x")
    snapshot = Snapshot(
        "/ckpt/run",
        {
            "statvfs": probe("statvfs", dataclasses.replace(fs, target_exists=False)),
            "quota": probe("quota", quota),
            "lfs_df": probe("lfs_df", targets),
            "imports": probe("imports", imports),
            "write": probe("write", write, error="EIO"),
            "tmpdir": probe("tmpdir", TmpdirInfo("/tmp", False, 3 * GiB)),
        },
        ("EIO",),
    )
    reasons = (
        Reason(
            "write_failed", Severity.UNHEALTHY, "the test write failed at fsync: EIO", True, "EIO"
        ),
        Reason("quota_note", Severity.NOTICE, "project 42 but not its inherit flag"),
    )
    headroom = Headroom(5 * GiB, 100, 0.05, 0.1, "filesystem", "quota:user")
    verdict = Verdict(Status.UNHEALTHY, reasons, headroom, fits=False, fresh_until=NOW + 15)
    return Report("/ckpt/run", snapshot, verdict, 6 * GiB, 2)


SAVE = LastSave(NOW, "retried", 1.5, 1 << 20, "/ckpt/run/a.pt", "/ckpt/run/a.pt", 1000, 7, "n1",
                2, (("EIO", "write"), ("ESTALE", "fsync")))  # fmt: skip
AREA = Area("/fb", "/fb/uid-1000", 1000)
ENTRY = Entry(AREA, "/ckpt/run/a.pt", "/fb/uid-1000/ckpt/run/a.pt", 10, "ab" * 32, NOW, "n1", 7)


def documents(state_dir: Path) -> dict[str, str]:
    report = every_probe()
    target = TargetState(report, {"statvfs": 15.0, "write": 60.0}, NOW, SAVE, "rank 0 asks")
    writer = Writer("n1", 7, "0.3", once=True, stopped_at=NOW, failure="stalled")
    write_state(str(state_dir), NOW, writer, {"/ckpt/run": json.dumps(target.to_dict())})
    return {
        "check.json": json.dumps(report.to_dict(), indent=2),
        "state.json": (state_dir / "state.json").read_text(),
        "sync.json": json.dumps(
            {
                "entries": [SyncOutcome(ENTRY, "synced", "synced back").to_dict()],
                "failures": [UnsyncedUser(1001, "/fb", "cannot run").to_dict()],
            },
            indent=2,
        ),
        "manifest.jsonl": ENTRY.to_line().decode(),
    }


@pytest.mark.parametrize("name", ["check.json", "state.json", "sync.json", "manifest.jsonl"])
def test_every_document_is_the_contracts_byte_for_byte(tmp_path, name):
    assert documents(tmp_path)[name] == (EXPECTED / name).read_text()


def test_what_is_written_reads_back_to_the_same_bytes(tmp_path):
    written = documents(tmp_path)
    check = json.loads(written["check.json"])
    assert Report.from_dict(check).to_dict() == check
    state = StateReader(str(tmp_path)).read()
    assert state is not None
    assert (state.writer, state.generated_at) == (Writer("n1", 7, "0.3", True, NOW, "stalled"), NOW)
    target = json.loads(written["state.json"])["targets"]["/ckpt/run"]
    assert TargetState.read(state, "/ckpt/run").to_dict() == target
    assert TargetState.read(state, "/ckpt/run").last_save == SAVE
    # The save's answer is the policy's, from the report's verdict, and reads back whole.
    report = every_probe()
    assert state.answer("/ckpt/run") == save_answer(report.verdict, report.exists)
    (outcome,) = json.loads(written["sync.json"])["entries"]
    assert SyncOutcome.from_dict(outcome, "/fb", 1000) == SyncOutcome(
        ENTRY, "synced", "synced back"
    )
    assert Entry.from_line(AREA, written["manifest.jsonl"].encode()) == ENTRY


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("bytes", "10", "bytes: expected an integer, not a string"),  # no longer int("10")
        ("bytes", True, "bytes: expected an integer, not a boolean"),
        ("requested", 5, "requested: expected a string, not an integer"),  # no longer str(5)
        ("time", None, "time: expected a number, not null"),
    ],
)
def test_a_manifest_line_of_the_wrong_types_is_refused_not_coerced(key, value, message):
    line = {**json.loads(ENTRY.to_line()), key: value}
    with pytest.raises(FormatError, match=message):
        Entry.from_fields(AREA, line)


def test_a_line_of_an_early_version_without_host_and_pid_reads():
    line = {k: v for k, v in json.loads(ENTRY.to_line()).items() if k not in ("host", "pid")}
    assert Entry.from_fields(AREA, line) == Entry(AREA, *list(line.values()))


def test_an_action_sync_does_not_know_is_refused():
    outcome = {**SyncOutcome(ENTRY, "synced", "ok").to_dict(), "action": "deleted"}
    with pytest.raises(FormatError, match="action: 'deleted' is not one of"):
        SyncOutcome.from_dict(outcome, "/fb", 1000)
