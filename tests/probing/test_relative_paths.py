"""Path options given relative are taken against the working directory at start (issue 17.7).

The probe worker (and a child acting for a user) works in ``/``: on main `--lfs ./bin/lfs`
was reported as "does not exist" although it did, for `check`, `quota` and `run` alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon_process import REPO_ROOT, clean_environment


def relative_lfs(tmp_path: Path) -> Path:
    """``bin/lfs`` under `tmp_path`: notes that it ran (and how), then fails like an lfs
    that finds no Lustre."""
    lfs = tmp_path / "bin" / "lfs"
    lfs.parent.mkdir()
    lfs.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        "pathlib.Path(__file__).with_name('ran').write_text(' '.join(sys.argv[1:]))\n"
        "print('lfs: not a Lustre filesystem', file=sys.stderr)\n"
        "sys.exit(22)\n"
    )
    lfs.chmod(0o755)
    return lfs


def fsprobe(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = clean_environment(PYTHONPATH=str(REPO_ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "fsprobe", *args],
        cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


IDS = ("--user", "0", "--group", "0")


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_relative_lfs_is_found_by_check_and_quota(tmp_path, how):
    lfs = relative_lfs(tmp_path)
    given = ("--lfs", "bin/lfs") if how == "option" else ()
    env = {"FSPROBE_LFS": "bin/lfs"} if how == "environment" else {}
    done = fsprobe(tmp_path, "quota", ".", "--quota-provider", "lfs", "--json", *given, *IDS, **env)
    errors = " ".join(json.loads(done.stdout)["errors"])
    assert "does not exist" not in errors, errors
    assert (lfs.parent / "ran").read_text().startswith("quota"), done.stderr
    (lfs.parent / "ran").unlink()
    done = fsprobe(
        tmp_path, "check", ".", "--json", "--no-write-probe", "--quota-provider", "lfs",
        *given, *IDS, **env,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert "does not exist" not in json.dumps(report["reasons"]), report["reasons"]
    assert (lfs.parent / "ran").exists()


def test_a_relative_lfs_and_state_dir_are_found_by_run_once(tmp_path):
    lfs = relative_lfs(tmp_path)
    (tmp_path / "ckpt").mkdir()
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nquota_provider = "lfs"\nquota_probe = "always"\n'
        '[[targets]]\npath = "ckpt"\nuser = 0\ngroup = 0\n'
    )
    done = fsprobe(
        tmp_path, "run", "--once", "--config", "fsprobe.toml", "--lfs", "./bin/lfs",
        "--state-dir", "state",
    )  # fmt: skip
    assert "does not exist" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert (lfs.parent / "ran").exists(), done.stderr
    assert (tmp_path / "state" / "state.json").exists()
    assert os.path.join(str(tmp_path), "ckpt") in done.stdout
