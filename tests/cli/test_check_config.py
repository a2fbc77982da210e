"""`fsprobe check --config FILE`: a one-off check judges by the daemon's configuration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.daemon_process import clean_environment


def check(*args: str, tmpdir: Path) -> tuple[int, dict, str]:
    result = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_environment(TMPDIR=str(tmpdir)),
    )
    return result.returncode, json.loads(result.stdout) if result.stdout else {}, result.stderr


def test_defaults_apply_to_any_path_and_a_listed_target_keeps_its_overrides(tmp_path):
    plain, listed = tmp_path / "plain", tmp_path / "listed"
    plain.mkdir()
    listed.mkdir()
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        # Any real filesystem has less than 99.99 % free: the defaults make it degraded.
        '[defaults]\nquota_provider = "none"\n'
        "[defaults.thresholds]\nheadroom_degraded_ratio = 0.9999\n"
        '[[targets]]\npath = "listed"\nwrite_probe = false\n'
        "[targets.thresholds]\nheadroom_degraded_ratio = 0.0\nheadroom_unhealthy_ratio = 0.0\n"
    )
    status, report, _ = check(str(plain), "--config", str(config), tmpdir=tmp_path)
    assert (status, report["status"]) == (1, "degraded")
    assert "space_headroom_low" in [reason["code"] for reason in report["reasons"]]
    assert report["write_probe"]["ok"] is True
    assert report["quota"] is None and "quota" not in report["probes"]

    status, report, _ = check(str(listed), "--config", str(config), tmpdir=tmp_path)
    assert (status, report["status"]) == (0, "ok")
    assert report["write_probe"] is None  # the target's own write_probe = false

    status, report, _ = check(str(plain), tmpdir=tmp_path)  # without the file: the defaults
    assert report["status"] == "ok"


def test_command_line_options_refine_the_file(tmp_path):
    config = tmp_path / "fsprobe.toml"
    config.write_text('[defaults]\nquota_provider = "none"\n')
    status, report, _ = check(
        str(tmp_path), "--config", str(config), "--no-write-probe", tmpdir=tmp_path
    )
    assert status == 0 and report["write_probe"] is None


def test_a_bad_config_is_a_usage_error_with_file_and_line(tmp_path):
    config = tmp_path / "fsprobe.toml"
    config.write_text("[defaults]\ndeadline = inf\n")
    status, _report, stderr = check(str(tmp_path), "--config", str(config), tmpdir=tmp_path)
    assert status == 64
    assert (
        f"{config}:2: defaults.deadline: expected a number of seconds from 0.1 to 3600, got inf"
        in stderr
    )
