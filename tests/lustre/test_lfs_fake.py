"""The fake `lfs` prints, byte for byte, the samples it was used to draft (tests/fixtures/lfs).

The fixtures were reviewed against the reference by hand; this keeps the fake that later tests
rely on (and that `fsprobe check` tests drive through the fault filesystem) in those layouts.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakes.fake_lfs import FAKE_LFS, load_fixtures

CASES = [
    (name, case)
    for kind in ("quota", "df", "layout")
    for name, case in load_fixtures(kind)
    if "state" in case
]


def run_fake(command: str, case: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess:
    state = tmp_path / "state.json"
    state.write_text(json.dumps(case["state"]))
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAKE_LFS_")}
    env.update(case["env"])
    env.update(
        FAKE_LFS_VERSION=case["version"],
        FAKE_LFS_STATE=str(state),
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    argv = shlex.split(command)[1:]
    return subprocess.run(
        [str(FAKE_LFS), *argv], capture_output=True, text=True, env=env, timeout=30
    )


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_fake_reproduces_fixture(name: str, case: dict[str, Any], tmp_path: Path):
    result = run_fake(case["command"], case, tmp_path)
    assert result.stdout.splitlines() == case["stdout"], case["command"]
    assert result.stderr.splitlines() == case["stderr"], case["command"]
    assert result.returncode == case["status"], case["command"]


def test_fake_rejects_an_unknown_version(tmp_path: Path):
    case = {"state": {}, "env": {}, "version": "2.99"}
    result = run_fake("lfs quota -u 1 /x", case, tmp_path)
    assert result.returncode == 4
    assert "FAKE_LFS_VERSION" in result.stderr


def test_fake_prints_the_project_of_a_directory(tmp_path: Path):
    case = {"state": {"project": 4242}, "env": {}, "version": "2.16"}
    result = run_fake(f"lfs project -d {tmp_path}", case, tmp_path)
    assert result.stdout == f" 4242 P {tmp_path}\n"
