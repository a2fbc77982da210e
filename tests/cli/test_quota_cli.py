"""`fsprobe quota PATH`: the table, the JSON contract, the exit codes and the error messages."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsprobe.cli import main
from fsprobe.probing.quota import locate
from tests.support.cli import cli_runner
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for

pytestmark = pytest.mark.slow  # the CLI and the fake lfs as processes: the full run only

NOW = 1_700_000_000
GIB = 2**30
JSON_KEYS = {"path", "mountpoint", "provider", "quota", "inaccurate", "errors", "notes"}


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def state(mountpoint: Path, **quota) -> dict:
    """User and group far from their limits; the project at 79 % of its space quota and 93 % of
    its inode quota (the incident of docs/design.md §1). `quota` changes the project's numbers."""
    bytes_ = {"used": 79 * GIB, "soft": 90 * GIB, "hard": 100 * GIB, "grace": 604800}
    inodes = {"used": 930_000, "soft": 950_000, "hard": 1_000_000, "grace": 604800}
    bytes_.update(quota.get("bytes", {}))
    inodes.update(quota.get("inodes", {}))
    light = {
        "bytes": {"used": GIB, "soft": None, "hard": 500 * GIB, "grace": 604800},
        "inodes": {"used": 1000, "soft": None, "hard": 5_000_000, "grace": 604800},
    }
    return {
        "now": NOW,
        "mountpoint": str(mountpoint),
        "quota": light,
        "ids": {"project:4242": {"bytes": bytes_, "inodes": inodes}},
    }


def run(*args: str):
    return cli_runner().invoke(main, ["quota", *args])


IDS = ("--user", "1000", "--group", "1000", "--project", "4242")


def test_table_names_the_closest_limit(tmp_path: Path, fake_lfs: FakeLfs):
    fake_lfs.configure(state=state(tmp_path))
    result = run(str(tmp_path / "ckpt"), "--quota-provider", "lfs", *IDS)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"Quota for new files in {tmp_path / 'ckpt'} (")
    assert lines[2].split() == ["QUOTA", "USED", "SOFT", "HARD", "USE", "STATE"]
    project = [line for line in lines if line.startswith("project 4242 ")]
    assert len(project) == 1 and project[0].split()[2:] == [
        "space", "79", "GiB", "90", "GiB", "100", "GiB", "79", "%", "ok",
    ]  # fmt: skip
    assert lines[-1] == (
        "Closest limit: project 4242 inodes, 70k left (93 % of the hard limit used)."
    )
    assert result.stderr == ""


def test_grace_and_hard_limits_are_said_in_words(tmp_path: Path, fake_lfs: FakeLfs):
    # 4 days and 30 minutes of grace left when lfs answers, so that the seconds the three
    # lfs calls and the rendering take cannot carry it below the 4 days the words name
    # (exactly 4 days read as "3 days 23 hours" once the rendering came 0.5 s after lfs).
    grace_start = NOW - 3 * 86400 + 1800
    over_soft = state(tmp_path, bytes={"used": 95 * GIB, "grace_start": grace_start})
    fake_lfs.configure(state=over_soft)
    result = run(str(tmp_path), "--quota-provider", "lfs", *IDS)
    assert result.exit_code == 0
    assert "over soft limit, grace expires in 4 days" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(
        "Writes fail when the grace period ends: project 4242 space is over its soft limit "
        "(90 GiB); grace expires in 4 days"
    )
    full = state(tmp_path, inodes={"used": 1_000_000, "grace_start": NOW - 60})
    fake_lfs.configure(state=full, version="2.12")
    result = run(str(tmp_path), "--quota-provider", "lfs", *IDS)
    assert "hard limit reached" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("Writes fail now: ")
    assert result.stdout.splitlines()[-1] == (
        "Writes fail now: project 4242 inodes reached its hard limit (1M)."
    )


def test_json_contract(tmp_path: Path, fake_lfs: FakeLfs):
    fake_lfs.configure(state=state(tmp_path))
    result = run(str(tmp_path), "--quota-provider", "lfs", "--json", *IDS)
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert set(document) == JSON_KEYS
    assert document["provider"] == "lfs"
    assert document["path"] == str(tmp_path)
    assert document["mountpoint"] == locate(str(tmp_path))[1].mountpoint
    assert (document["inaccurate"], document["errors"]) == (False, [])
    project = document["quota"][2]
    assert (project["type"], project["id"]) == ("project", 4242)
    assert project["inodes"] == {
        "used": 930_000,
        "soft": 950_000,
        "hard": 1_000_000,
        "grace_expires_at": None,
        "state": "ok",
        "inaccurate": False,
    }
    assert project["bytes"]["hard"] == 100 * GIB


def test_partial_result_exits_0_with_warnings(tmp_path: Path, fake_lfs: FakeLfs):
    fake_lfs.configure(state=state(tmp_path), fail="inaccurate", version="2.16")
    result = run(str(tmp_path), "--quota-provider", "lfs", "--user", "1000", "--group", "1000")
    assert result.exit_code == 0
    assert "(inaccurate)" in result.stdout
    assert "Note: values marked inaccurate" in result.stdout
    assert "warning: user 1000:" in result.stderr and "EIO" in result.stderr


def test_not_lustre_is_said_plainly(tmp_path: Path, fake_lfs: FakeLfs):
    fstype = locate(str(tmp_path))[1].fstype
    result = run(str(tmp_path / "ckpt"))
    assert result.exit_code == 3
    assert result.stderr == (
        f"fsprobe quota: {tmp_path / 'ckpt'} is on {fstype}, not Lustre: no lfs quota; "
        "use --quota-provider lfs to force\n"
    )
    assert result.stdout == ""
    assert fake_lfs.calls() == []
    as_json = json.loads(run(str(tmp_path), "--json").stdout)
    assert (as_json["provider"], as_json["quota"]) == (None, None)
    assert "not Lustre" in as_json["errors"][0]


def test_provider_none(tmp_path: Path, fake_lfs: FakeLfs):
    result = run(str(tmp_path), "--quota-provider", "none")
    assert result.exit_code == 3
    assert "quota provider is 'none'" in result.stderr


def test_read_failures_exit_3_with_the_reason(tmp_path: Path, fake_lfs: FakeLfs):
    fake_lfs.configure(state=state(tmp_path), fail="eperm")
    result = run(str(tmp_path), "--quota-provider", "lfs", "--user", "1001", "--group", "1001")
    assert result.exit_code == 3
    assert result.stderr.startswith(f"fsprobe quota: cannot read the quota of {tmp_path}: EPERM")
    assert "Permission denied" in result.stderr
    as_json = run(str(tmp_path), "--quota-provider", "lfs", "--json", "--user", "1001")
    assert as_json.exit_code == 3
    document = json.loads(as_json.stdout)
    assert document["quota"] is None and "EPERM" in document["errors"][0]


def test_a_217_client_reads_as_a_216_client(tmp_path: Path, fake_lfs: FakeLfs):
    documents = []
    for version in ("2.16", "2.17"):
        fake_lfs.configure(version=version, state=state(tmp_path))
        result = run(str(tmp_path), "--quota-provider", "lfs", "--json", *IDS)
        assert result.exit_code == 0, result.output
        documents.append(json.loads(result.stdout))
    assert documents[0] == documents[1]
    assert documents[1]["errors"] == [] and documents[1]["notes"] == []


def test_an_lfs_before_210_is_called_too_old(tmp_path: Path, fake_lfs: FakeLfs):
    fake_lfs.configure(version="2.9", state=state(tmp_path))
    result = run(str(tmp_path), "--quota-provider", "lfs", *IDS)
    assert result.exit_code == 3
    assert "EOPNOTSUPP" in result.stderr and "lfs 2.9.0 is older than fsprobe supports" in (
        result.stderr
    )
    assert "lfs 2.10 and later" in result.stderr


def test_missing_lfs_says_how_to_fix_it(tmp_path: Path, fake_lfs: FakeLfs):
    missing = str(tmp_path / "bin" / "lfs")
    result = run(str(tmp_path), "--quota-provider", "lfs", "--lfs", missing, *IDS)
    assert result.exit_code == 3
    assert "ENOENT" in result.stderr and "--lfs" in result.stderr
    assert "FSPROBE_LFS" in result.stderr


@pytest.mark.parametrize(
    "args",
    [("--user", "alice"), ("--quota-provider", "gpfs"), ("--bogus",), ()],
)
def test_usage_errors_exit_64(tmp_path: Path, args: tuple[str, ...]):
    path = (str(tmp_path),) if args else ()
    result = run(*path, *args)
    assert result.exit_code == 64


def test_a_hung_mount_is_reported_by_the_deadline(faultfs):
    """Finding the mount and the directory's IDs stats PATH: on a hung mount that must not hang
    the command (it runs in a worker process; this one exits)."""
    blocked = faultfs.ctl.block("*")
    try:
        start = time.monotonic()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "fsprobe",
                "quota",
                str(faultfs.mountpoint / "ckpt"),
                "--timeout",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        elapsed = time.monotonic() - start
    finally:
        faultfs.ctl.remove(blocked)
    assert done.returncode == 3
    assert "TIMEOUT" in done.stderr and "hung" in done.stderr
    assert elapsed < 10, f"took {elapsed:.1f} s with --timeout 1"


def test_user_and_group_take_names_and_lfs_is_asked_by_number(tmp_path: Path, fake_lfs):
    fake_lfs.configure(state=state(tmp_path))
    result = run(str(tmp_path), "--quota-provider", "lfs", "--user", "root", "--group", "root")
    assert result.exit_code == 0, result.output
    asked = [call["argv"][1:3] for call in fake_lfs.calls() if call["argv"][0] == "quota"]
    assert ["-u", "0"] in asked and ["-g", "0"] in asked
    shown = [line.split()[:2] for line in result.stdout.splitlines()]
    assert ["user", "root"] in shown and ["group", "root"] in shown


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--user", "no-such-user-harden", "no user named 'no-such-user-harden'"),
        ("--group", "no-such-group-harden", "no group named 'no-such-group-harden'"),
        ("--project", "alice", "projects are numbers"),
        ("--user", "4294967295", "not a user ID"),
    ],
)
def test_a_name_that_does_not_resolve_is_a_usage_error_naming_it(tmp_path, option, value, said):
    for command in ("quota", "check"):
        result = subprocess.run(
            [sys.executable, "-m", "fsprobe", command, str(tmp_path), option, value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 64, result.stderr
        assert said in result.stderr
