"""`fsprobe check` on ordinary directories: the JSON contract, exit codes and usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import fsprobe
from fsprobe.cli import main

CHECK_KEYS = {
    "path",
    "status",
    "reasons",
    "filesystem",
    "quota",
    "lustre_targets",
    "headroom",
    "write_probe",
    "tmpdir",
    "fits",
    "probed_at",
    "fresh_until",
    "need",
    "probes",
    "quota_provider",
    "quota_errors",
}


def run(*args, env=None):
    return CliRunner().invoke(main, ["check", *args], env=env)


@pytest.fixture
def same_fs_tmpdir(tmp_path, monkeypatch):
    """$TMPDIR on the target's filesystem, so the verdict is not degraded for that alone."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def test_json_has_every_documented_key(same_fs_tmpdir):
    result = run(str(same_fs_tmpdir), "--json", "--need", "1M")
    report = json.loads(result.output)
    assert set(report) >= CHECK_KEYS
    assert report["status"] == "ok" and result.exit_code == 0
    statvfs = os.statvfs(same_fs_tmpdir)
    assert report["filesystem"]["files"] == statvfs.f_files
    assert set(report["filesystem"]) >= {
        "mountpoint",
        "fstype",
        "size_bytes",
        "avail_bytes",
        "files",
        "files_free",
        "readonly",
    }
    assert report["headroom"]["limited_by"] == "filesystem"
    assert report["fits"] is True
    assert report["quota"] is None and report["lustre_targets"] is None
    assert report["write_probe"]["ok"] is True
    assert set(report["write_probe"]["latency_seconds"]) >= {"create", "write", "fsync", "total"}
    # On the target's filesystem its room is the target's (statvfs), not measured again.
    expected = {"path": str(same_fs_tmpdir), "same_device": True, "free_bytes": None}
    assert report["tmpdir"] == expected


def test_need_that_cannot_fit_exits_unhealthy(same_fs_tmpdir):
    result = run(str(same_fs_tmpdir), "--need", "1000PiB", "--json")
    report = json.loads(result.output)
    assert result.exit_code == 2
    assert report["fits"] is False
    assert report["reasons"][0]["code"] == "space_headroom_low"
    assert "needs 1000 PiB" in report["reasons"][0]["message"]


def test_human_output_is_short_and_says_the_status_first(same_fs_tmpdir):
    result = run(str(same_fs_tmpdir), "--need", "1M")
    lines = result.output.splitlines()
    assert "OK" in lines[0] and str(same_fs_tmpdir) in lines[0]
    assert any(line.strip().startswith("space") for line in lines)
    assert any("atomic save in" in line for line in lines)
    assert any("fits" in line for line in lines)
    assert len(lines) < 12


def test_no_write_probe_writes_nothing(same_fs_tmpdir):
    report = json.loads(run(str(same_fs_tmpdir), "--json", "--no-write-probe").output)
    assert report["write_probe"] is None
    assert os.listdir(same_fs_tmpdir) == []


def test_tmpdir_on_another_filesystem_is_a_notice_and_the_check_passes(tmpfs, tmp_path):
    """The usual cluster layout: node-local $TMPDIR, checkpoints elsewhere (docs/design.md §5)."""
    target = tmpfs(size="16M").path
    assert os.stat(target).st_dev != os.stat(tmp_path).st_dev
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def check(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "fsprobe", "check", str(target), "--need", "1M", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    as_json = check("--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["status"] == "ok" and report["tmpdir"]["same_device"] is False
    (notice,) = report["reasons"]
    assert (notice["code"], notice["severity"]) == ("tmpdir_cross_device", "notice")
    assert str(tmp_path) in notice["message"] and "never stage there" in notice["message"]
    human = check()
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert " OK " in lines[0]
    assert any("notice" in line and "tmpdir_cross_device" in line for line in lines)


def test_every_reason_says_what_it_means_for_a_save(same_fs_tmpdir):
    report = json.loads(run(str(same_fs_tmpdir), "--json", "--need", "1000PiB").output)
    (reason,) = report["reasons"]
    assert reason == {
        "code": "space_headroom_low",
        "severity": "unhealthy",
        "message": reason["message"],
        "transient": False,  # waiting will not make room
        "errno": "ENOSPC",  # what the write would get
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--need", "12 apples"],
        ["--timeout", "-1"],
        ["--timeout", "nan"],
        ["--timeout", "inf"],
        ["--timeout", "1e9"],
        ["--quota-provider", "gpfs"],
        ["--bogus"],
        [],
    ],
)
def test_usage_errors_exit_64(args, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", *([str(tmp_path)] if args else []), *args],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 64, result.stderr
    assert "Error" in result.stderr


def test_a_path_that_is_a_file_is_reported_not_probed(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    result = run(str(regular), "--json")
    report = json.loads(result.output)
    assert result.exit_code == 2  # nothing can be written under a file: unhealthy
    assert report["probes"]["statvfs"]["error"] == "ENOTDIR"
    assert report["write_probe"]["errno"] == "ENOTDIR"
    assert regular.read_text() == "x"


def test_help_explains_exit_codes():
    result = CliRunner().invoke(main, ["check", "--help"])
    assert result.exit_code == 0
    assert "0 ok, 1 degraded, 2 unhealthy, 3 unknown" in result.output


def test_a_need_that_fits_the_target_but_not_tmpdir_says_which_framework_fails(tmpfs):
    """Lightning's TorchCheckpointIO stages each checkpoint in $TMPDIR (fsspec's transaction):
    a 3 MiB checkpoint fits a target with 16 MiB, not a $TMPDIR with 2 MiB."""
    target, tmpdir = tmpfs(size="16M").path, tmpfs(size="2M").path
    env = {**os.environ, "TMPDIR": str(tmpdir)}

    def check(need: str, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "fsprobe", "check", str(target), "--need", need, *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    report = json.loads(check("3M", "--json").stdout)
    assert report["fits"] is True  # the target's own answer
    assert report["tmpdir"]["free_bytes"] <= 2 * 1024 * 1024
    codes = {reason["code"]: reason for reason in report["reasons"]}
    too_small = codes["tmpdir_too_small"]
    assert too_small["severity"] == "notice"
    assert str(tmpdir) in too_small["message"] and "TorchCheckpointIO" in too_small["message"]
    human = check("3M").stdout
    assert "tmpdir_too_small" in human and "MiB free" in human
    small = json.loads(check("1M", "--json").stdout)
    assert "tmpdir_too_small" not in {reason["code"] for reason in small["reasons"]}


def test_the_python_check_takes_its_settings_as_one_value(tmp_path):
    """`fsprobe.check(path, settings)` as the saves take `options`: what the daemon's
    configuration gives a target, one value; the old keywords, and a need where the settings
    go, are refused."""
    settings = fsprobe.ProbeSettings(write_probe=False)
    report = fsprobe.check(tmp_path, settings, need_bytes=1, context=fsprobe.SaveContext())
    assert (report.to_dict()["write_probe"], report.need_bytes, report.need_inodes) == (None, 1, 1)
    assert fsprobe.check(tmp_path).to_dict()["write_probe"]["ok"] is True
    with pytest.raises(TypeError, match=r"settings takes a fsprobe\.ProbeSettings, not 1024"):
        fsprobe.check(tmp_path, 1024)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="quota_provider"):
        fsprobe.check(tmp_path, quota_provider="none")  # type: ignore[call-arg]
