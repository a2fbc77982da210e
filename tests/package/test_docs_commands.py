"""The README's "Run it" commands work as written (issue 17.8, part).

The first block installs into `.venv` and starts the daemon; the second, "in a second
terminal", asks it. Both are taken from README.md verbatim and run with bash in a directory of
their own, where `.venv` is this test environment (the install itself, `pip install -e .`, is
what the packaging tests and CI's own fresh clone hold): only the part of the first command
after the install runs here, as written. The metrics port is the README's own, 9731, so the
test skips when something else listens there.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.capability import require

REPO = Path(__file__).resolve().parents[2]


def run_it_blocks() -> tuple[str, str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Run it\n") :]
    first, second = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)[:2]
    return first.strip(), second.strip()


def metrics() -> str:
    with urllib.request.urlopen("http://127.0.0.1:9731/metrics", timeout=5) as response:
        return response.read().decode()


def port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_the_run_it_commands_of_the_readme_work_as_written(tmp_path: Path) -> None:
    first, second = run_it_blocks()
    install, _, start = first.partition(" && .venv/bin/pip install -e . && ")
    assert install == "python3 -m venv .venv" and start, first  # the README still says this
    require("port 9731, the README's, is taken on this machine" if port_in_use(9731) else None)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    environ = {**os.environ, "FSPROBE_STATE_DIR": str(tmp_path / "state")}
    daemon = subprocess.Popen(
        ["bash", "-c", start],
        cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state" / "state.json").exists():
            assert daemon.poll() is None, daemon.communicate()[0]
            assert time.monotonic() < deadline, "the daemon wrote no state in 30 s"
            time.sleep(0.1)
        # "In a second terminal": a moment later, once its first probes have answered.
        healthy = f'fsprobe_health_status{{path="{tmp_path / "checkpoints"}"}} 0.0'
        while healthy not in metrics():
            assert daemon.poll() is None, daemon.communicate()[0]
            assert time.monotonic() < deadline, metrics()
            time.sleep(0.2)
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", second],
            cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        log = daemon.communicate(timeout=15)[0]
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    checkpoints = str(tmp_path / "checkpoints")
    assert f'fsprobe_health_status{{path="{checkpoints}"}} 0.0' in lines, done.stdout
    assert any(line.startswith("ok") and checkpoints in line for line in lines), done.stdout
    assert any(line.startswith(" OK ") and "checkpoints" in line for line in lines), done.stdout
    assert "event=stopped" in log, log  # SIGTERM to the session: a clean stop


#: Shell blocks of docs/ that cannot run on a test machine, by their first words, and why.
#: Every other ```sh block of every page runs below; an entry that no block starts with fails.
NOT_HERE = {
    "python3 -m venv /opt/fsprobe": "an install into /opt; tests/deploy/test_deploy_systemd.py "
    "builds that venv from the wheel and verifies the unit against it",
    "pip install torch==2.13.0 '.[torch]' --extra-index-url": "PyTorch's CPU index is not "
    "reachable from the test machines",
}
#: Absolute places the blocks name (a site's /etc, a user's scratch and Lustre directories),
#: made inside the test's own directory so that running a block changes nothing outside it.
SANDBOXED = ("/etc/", "/scratch/", "/lustre/")


def docs_shell_blocks() -> list[tuple[str, str]]:
    """(page, block) for every ```sh block of docs/*.md, as written."""
    return [
        (page.name, block.strip())
        for page in sorted((REPO / "docs").glob("*.md"))
        for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.DOTALL)
    ]


def runnable_blocks() -> list[tuple[str, str]]:
    return [
        (page, block)
        for page, block in docs_shell_blocks()
        if not any(block.startswith(start) for start in NOT_HERE)
    ]


def test_every_block_left_out_is_still_in_the_docs() -> None:
    blocks = [block for _page, block in docs_shell_blocks()]
    for start in NOT_HERE:
        assert any(block.startswith(start) for block in blocks), f"no block starts {start!r}"


@pytest.mark.parametrize(
    ("page", "block"), runnable_blocks(), ids=lambda value: value.split("\n")[0][:40]
)
def test_every_shell_block_of_the_docs_runs_as_written(page: str, block: str, tmp_path: Path):
    """Each block in bash -e, in a checkout-shaped directory of its own (deploy/ as the
    repository has it), with this environment's fsprobe and python first on PATH, a fresh
    HOME, and the absolute places it names made inside the test's directory."""
    root, home, work = tmp_path / "root", tmp_path / "home", tmp_path / "checkout"
    for directory in (home, work):
        directory.mkdir()
    (work / "deploy").symlink_to(REPO / "deploy")
    script = block
    for place in SANDBOXED:
        script = script.replace(place, f"{root}{place}")
        for named in re.findall(rf"{re.escape(str(root) + place)}\S*", script):
            if "fallback" in named:  # a fallback directory is there before anyone syncs it
                Path(named).mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    environ = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FSPROBE_STATE_DIR": str(tmp_path / "state"),
    }
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=work, env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"{page}:\n{script}\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    for written in re.findall(r"> (\S+)", script):  # every file a block writes has content
        path = Path(written.replace("~", str(home), 1))
        assert path.stat().st_size > 0, f"{page}: {written} is empty"
    for directory in re.findall(r"--(?:output|kubernetes)-dir (\S+)", script):
        produced = list((work / directory).rglob("*.y*ml"))
        assert produced, f"{page}: nothing written into {directory}"
