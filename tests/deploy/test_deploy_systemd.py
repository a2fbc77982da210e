"""The systemd unit and the node config: systemd accepts the unit, its hardening holds, it
reloads on SIGHUP, and the example config is accepted by the daemon's config loader."""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fsprobe.daemon import config
from tests.support.capability import need_command

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "fsprobe.service"
CONFIG = REPO / "deploy" / "systemd" / "fsprobe.toml"
VENV = "/opt/fsprobe"
BINARY = f"{VENV}/bin/fsprobe"


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


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fsprobe installed as docs/deployment.md says, into a venv of its own: the wheel of this
    checkout (built without network), its dependencies reached from the test's environment."""
    home = tmp_path_factory.mktemp("opt-fsprobe")
    wheels, venv = home / "wheels", home / "fsprobe"
    quiet = {"capture_output": True, "text": True, "timeout": 600, "check": True}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(wheels), str(REPO)],
        **quiet,
    )  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(venv)], **quiet)
    (wheel,) = wheels.glob("fsprobe-*.whl")
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--no-deps", "--no-index", str(wheel)], **quiet
    )
    purelib = sysconfig.get_paths()["purelib"]
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "dependencies.pth").write_text(purelib + "\n")  # after the venv's own fsprobe
    return venv


def _installed_copy(tmp_path: Path, venv: Path) -> Path:
    """The unit as shipped, with the venv it names built here: systemd-analyze refuses a unit
    whose binary is missing, and the one it names is what `pip install` put there."""
    text = UNIT.read_text(encoding="utf-8")
    assert BINARY in text
    unit = tmp_path / "fsprobe.service"
    unit.write_text(text.replace(VENV + "/", f"{venv}/"))
    return unit


def test_the_venv_binary_the_unit_names_runs(venv: Path) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "fsprobe"), "--version"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("fsprobe, version"), done.stderr
    located = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fsprobe; print(fsprobe.__file__)"],
        capture_output=True, text=True, timeout=60, check=True, cwd="/",
    )  # fmt: skip
    assert located.stdout.startswith(str(venv)), located.stdout  # the installed copy


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path, venv: Path) -> None:
    analyze = need_command("systemd-analyze", "systemd")
    unit = _installed_copy(tmp_path, venv)
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


def test_hardening_exposure_is_rated_ok(tmp_path: Path, venv: Path) -> None:
    analyze = need_command("systemd-analyze", "systemd")
    unit = _installed_copy(tmp_path, venv)
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


def test_the_state_dir_and_the_daemons_memory_outlive_a_restart(
    service: dict[str, list[str]],
) -> None:
    """Issue 35.1: systemd removes a RuntimeDirectory when the unit stops, memory.json with
    it, and a restarted daemon forgot every saver (a hung trainer's overdue page resolved for
    good). Held beside tests/daemon/test_daemon_memory.py (the daemon restarted for real)."""
    assert service["RuntimeDirectory"] == ["fsprobe"]
    assert service["RuntimeDirectoryPreserve"] == ["yes"]


def test_the_unit_sees_the_processes_that_send_it_saves(service: dict[str, list[str]]) -> None:
    """Issue 35.9: the saver and admission promises need the sender's /proc/<pid>: its start
    time (a killed trainer is no longer expected at once) and its groups (a team member's
    events are admitted). ProtectProc=invisible or noaccess hides other users' processes, a
    private pid namespace every sender (the kernel then names them pid 0: held by
    tests/events/test_senders_outside_the_pid_namespace.py)."""
    assert service.get("ProtectProc", ["default"]) == ["default"]
    assert service.get("ProcSubset", ["all"]) == ["all"]
    assert service.get("PrivatePIDs", ["no"]) == ["no"]
    (command,) = service["ExecStart"]
    assert "--state-dir /run/fsprobe" in command


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


def _node_exporter_exclusion(text: str) -> re.Pattern[str]:
    (regex,) = re.findall(r"--collector\.filesystem\.fs-types-exclude=(\S+?)'", text)
    return re.compile(regex)


@pytest.mark.parametrize("where", [CONFIG, REPO / "docs" / "deployment.md"], ids=lambda p: p.name)
def test_textfile_mode_keeps_node_exporters_filesystem_collector_off_shared_mounts(where) -> None:
    """A hung Lustre or NFS mount hangs node_exporter's filesystem collector, and fsprobe's
    textfile series vanish with its scrape: the flags given keep it off them, and off nothing
    local."""
    exclude = _node_exporter_exclusion(where.read_text())
    for shared in ("lustre", "nfs", "nfs4", "gpfs", "beegfs", "cifs", "ceph", "fuse.sshfs"):
        assert exclude.fullmatch(shared), shared
    for local in ("ext4", "xfs", "btrfs", "tmpfs", "zfs", "vfat"):
        assert not exclude.fullmatch(local), local


def test_textfile_mode_is_never_also_scraped_directly() -> None:
    """Textfile and a direct scrape together would make every alert fire twice: the shipped
    configuration writes the textfile and listens on the loopback only."""
    loaded = config.load(
        config.Overrides(config_file=str(CONFIG), state_dir="/run/fsprobe"), environ={}
    )
    assert loaded.textfile_dir
    assert loaded.listen_address[0] in ("127.0.0.1", "::1")


def test_the_runbooks_commands_find_the_units_state_dir() -> None:
    """`fsprobe status` alone reads the caller's own default state dir, not the unit's: the
    runbook and the alerts' actions name the unit's."""
    (state_dir,) = re.findall(r"--state-dir (\S+)", UNIT.read_text())
    runbook = (REPO / "docs" / "runbook.md").read_text()
    rules = (REPO / "deploy" / "prometheus" / "fsprobe.rules.yml").read_text()
    assert f"fsprobe status --state-dir {state_dir}" in runbook
    for text in (runbook, rules):
        kept = (line.strip() for line in text.splitlines() if not line.startswith("#"))
        commands = " ".join(kept)  # a command folded across lines too
        bare = re.findall(r"fsprobe status(?! --state-dir)[`\s]", commands)
        assert bare == [], "a `fsprobe status` that would not find the unit's state dir"
