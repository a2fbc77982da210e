"""`Report` and its JSON, both ways: real reports read back to the same JSON, bad JSON named."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from fsprobe.codec import FormatError
from fsprobe.model import QuotaReport, Severity, Status
from fsprobe.report import Report
from tests.support.fakes.fake_lfs import fake_lfs_for

AS_USER = ["--user", "1000", "--group", "1000"]


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def check_json(path, *args) -> dict:
    """What `fsprobe check --json` prints, from a real process."""
    completed = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(path), "--json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(path)},
        timeout=120,
    )
    assert completed.stdout, completed.stderr
    return json.loads(completed.stdout)


def assert_round_trip(document: dict) -> Report:
    report = Report.from_dict(copy.deepcopy(document))
    assert report.to_dict() == document
    assert json.loads(json.dumps(report.to_dict())) == document
    return report


def test_a_healthy_directory_with_a_test_write_and_a_need(tmp_path):
    document = check_json(tmp_path, "--need", "1M")
    report = assert_round_trip(document)
    assert report.status is Status.OK and report.fits is True
    assert report.need_bytes == 1 << 20 and report.need_inodes == 1
    assert report.snapshot.value("statvfs").files == os.statvfs(tmp_path).f_files
    assert report.snapshot.value("write").ok and report.snapshot.get("write").ok
    assert report.verdict.fresh_until > report.snapshot.probed_at


def test_quota_and_lustre_targets_from_a_forced_lustre_target(faultfs, fake_lfs):
    fake_lfs.configure(version="2.16", control=faultfs.ctl.socket_path, project=4242)
    faultfs.ctl.set_quota("inodes", hard=100)
    for index in range(95):
        (faultfs.mountpoint / f"shard-{index}").write_bytes(b"x")
    document = check_json(faultfs.mountpoint, "--quota-provider", "lfs", *AS_USER)
    assert document["quota"] and document["lustre_targets"]
    report = assert_round_trip(document)
    quota: QuotaReport = report.snapshot.value("quota")
    assert quota.provider == "lfs"
    assert {entry.type for entry in quota.entries} == {"user", "group", "project"}
    assert {target.kind for target in report.snapshot.value("lfs_df")} == {"MDT", "OST"}
    assert "inode_headroom_low" in {reason.code for reason in report.reasons}


def test_pools_pool_quotas_and_quota_notes_go_both_ways(faultfs, fake_lfs):
    state = {
        "mountpoint": str(faultfs.mountpoint),
        "layout": {"pool": "flash"},
        "pools": {"flash": [1]},
        "project": 42,
        "project_inherit": False,
        "pool_ids": {"flash": {"user:1000": {"bytes": {"used": 1, "hard": 2**30},
                                             "inodes": {"used": 1}}}},
    }  # fmt: skip
    fake_lfs.configure(state=state)  # the fault filesystem has no project ioctl: lfs project -d
    document = check_json(
        faultfs.mountpoint, "--quota-provider", "lfs", "--no-write-probe", *AS_USER
    )
    report = assert_round_trip(document)
    quota: QuotaReport = report.snapshot.value("quota")
    assert [entry.pool for entry in quota.entries] == [None, None, "flash"]
    assert len(quota.notes) == 1 and "project 42 but not its inherit flag" in quota.notes[0]
    marks = {t.name: (t.pools, t.in_layout) for t in report.snapshot.value("lfs_df")}
    assert marks["lustre-OST0001"] == (("flash",), True)
    assert marks["lustre-OST0000"] == ((), False)
    # A state file written before pools: no pool, pools, in_layout or quota_notes keys.
    for entry in document["quota"]:
        del entry["pool"]
    for target in document["lustre_targets"]:
        del target["pools"], target["in_layout"]
    del document["quota_notes"]
    older = Report.from_dict(document)
    assert all(t.in_layout and t.pools == () for t in older.snapshot.value("lfs_df"))
    assert older.snapshot.value("quota").notes == ()


def test_failed_probes_keep_their_errors_and_what_they_saw(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    report = assert_round_trip(check_json(regular))
    statvfs, write = report.snapshot.get("statvfs"), report.snapshot.get("write")
    assert (statvfs.ok, statvfs.error, statvfs.value) == (False, "ENOTDIR", None)
    assert write.error == "ENOTDIR" and write.value.errno == "ENOTDIR"
    (failed,) = [reason for reason in report.reasons if reason.code == "write_failed"]
    assert (failed.severity, failed.transient, failed.errno) == (
        Severity.UNHEALTHY,
        False,
        "ENOTDIR",
    )


def test_a_stuck_probe_on_a_hung_mount(faultfs):
    rule = faultfs.ctl.block("statfs")
    try:
        document = check_json(faultfs.mountpoint, "--timeout", "2")
    finally:
        faultfs.ctl.remove(rule)
    report = assert_round_trip(document)
    assert report.snapshot.get("statvfs").stuck
    (stuck,) = [reason for reason in report.reasons if reason.code == "mount_stuck"]
    assert stuck.transient and stuck.errno == "ETIMEDOUT"
    assert not report.verdict.can_take_save and report.verdict.worth_waiting


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> dict:
    return check_json(tmp_path_factory.mktemp("healthy"))


def _set(document: dict, path: tuple, value) -> dict:
    changed = copy.deepcopy(document)
    place = changed
    for key in path[:-1]:
        place = place[key]
    if value is KeyError:
        del place[path[-1]]
    else:
        place[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("status",), "fine", "status: 'fine' is not one of ok, degraded, unhealthy, unknown"),
        (("headroom",), KeyError, "headroom: missing"),
        (
            ("headroom", "bytes"),
            "lots",
            "headroom.bytes: expected an integer or null, not a string",
        ),
        (
            ("filesystem", "readonly"),
            0,
            "filesystem.readonly: expected true or false, not an integer",
        ),
        (
            ("filesystem", "size_bytes"),
            True,
            "filesystem.size_bytes: expected an integer, not a boolean",
        ),
        (("probes", "statvfs", "stuck"), KeyError, "probes.statvfs.stuck: missing"),
        (("probes", "gossip"), {}, "probes.gossip: not one of statvfs"),
        (("reasons",), {}, "reasons: expected a list, not an object"),
        (("reasons",), [5], "reasons[0]: expected an object, not an integer"),
        (("tmpdir",), [], "tmpdir: expected an object or null, not a list"),
        (("need",), None, "need: expected an object, not null"),
    ],
)
def test_a_document_that_does_not_read_is_named_never_a_key_error(healthy, path, value, message):
    with pytest.raises(FormatError) as raised:
        Report.from_dict(_set(healthy, path, value))
    assert message in str(raised.value)


def test_a_reason_with_an_unknown_severity_is_named(healthy):
    notice = {
        "code": "tmpdir_cross_device",
        "severity": "meh",
        "message": "x",
        "transient": False,
        "errno": None,
    }
    with pytest.raises(FormatError, match=r"reasons\[0\]\.severity: 'meh' is not one of"):
        Report.from_dict({**healthy, "reasons": [notice]})


@pytest.mark.parametrize("document", [None, [], "report", 3])
def test_something_that_is_no_object_at_all(document):
    with pytest.raises(FormatError, match="report: expected an object"):
        Report.from_dict(document)


def test_inodes_are_called_inodes_and_the_old_files_keys_still_read_for_one_release():
    """Issue 17.8: one word for inodes. `inodes`/`inodes_free` are written, `files`/
    `files_free` beside them for one release; a document with only the old names reads."""
    from fsprobe.report import FILESYSTEM
    from tests.support.policy import filesystem_info

    fs = filesystem_info(10, 100, 1000, 900)
    document = FILESYSTEM.encode(fs)
    assert (document["inodes"], document["inodes_free"]) == (1000, 900)
    assert (document["files"], document["files_free"]) == (1000, 900)
    old = {k: v for k, v in document.items() if k not in ("inodes", "inodes_free")}
    assert FILESYSTEM.decode(old) == FILESYSTEM.decode(document) == fs
