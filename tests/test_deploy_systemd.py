"""The systemd unit and the node config: systemd accepts the unit, its hardening holds, it
reloads on SIGHUP, and the example config is accepted by the daemon's config loader."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fsprobe.daemon import config
from tests.support.capability import need_command

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "deploy" / "systemd" / "fsprobe.service"
CONFIG = REPO / "deploy" / "systemd" / "fsprobe.toml"
BINARY = "/usr/local/bin/fsprobe"


def _directives(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (a key may be repeated, as systemd allows)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = sections.setdefault("", {})
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


@pytest.fixture(scope="module")
def service() -> dict[str, list[str]]:
    return _directives(UNIT.read_text(encoding="utf-8"))["Service"]


def _installed_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at an executable that exists here.

    systemd-analyze refuses a unit whose binary is missing; fsprobe is not installed at
    /usr/local/bin on a test machine, so a stand-in takes its place and everything else is
    checked as shipped.
    """
    stand_in = tmp_path / "fsprobe"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    text = UNIT.read_text(encoding="utf-8")
    assert BINARY in text
    unit = tmp_path / "fsprobe.service"
    unit.write_text(text.replace(BINARY, str(stand_in)))
    return unit


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = need_command("systemd-analyze", "systemd")
    unit = _installed_copy(tmp_path)
    result = subprocess.run(
        [analyze, "verify", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Unknown or misspelt keys are only warnings (exit 0): any message about the unit fails.
    complaints = [line for line in result.stderr.splitlines() if unit.name in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


def test_hardening_exposure_is_rated_ok(tmp_path: Path) -> None:
    analyze = need_command("systemd-analyze", "systemd")
    unit = _installed_copy(tmp_path)
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=40", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_hardening_directives(service: dict[str, list[str]]) -> None:
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["ProtectSystem"] in (["full"], ["strict"])
    assert service["ProtectHome"] == ["read-only"]
    assert service["PrivateTmp"] == ["no"]
    text = UNIT.read_text(encoding="utf-8")
    explanation = text.split("PrivateTmp=no", 1)[0].rsplit("\n\n", 1)[-1]
    assert "tmpdir check" in explanation, "PrivateTmp=no must say why"


def test_restart_and_reload_on_sighup(service: dict[str, list[str]]) -> None:
    assert service["Restart"] == ["on-failure"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


def test_runs_the_daemon_with_the_config_and_a_runtime_state_dir(
    service: dict[str, list[str]],
) -> None:
    (command,) = service["ExecStart"]
    args = command.split()
    assert args[:2] == [BINARY, "run"]
    assert args[args.index("--config") + 1] == "/etc/fsprobe/fsprobe.toml"
    assert args[args.index("--state-dir") + 1] == "/run/" + service["RuntimeDirectory"][0]


def test_example_config_is_accepted_by_the_config_loader() -> None:
    loaded = config.load(
        config.Overrides(config_file=str(CONFIG), state_dir="/run/fsprobe"), environ={}
    )
    assert loaded.state_dir == "/run/fsprobe"
    assert loaded.textfile_dir == "/var/lib/prometheus/node-exporter"
    assert loaded.listen_address == ("127.0.0.1", 9731)
    assert len(loaded.targets) == 3
    assert all(target.quota_enabled for target in loaded.targets)
    assert [target.settings.write_probe for target in loaded.targets] == [True, True, False]
