"""The probe worker runs none of the code that a user can plant in the working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from fsprobe.probing.runner import ProbeRunner
from fsprobe.probing.worker import ProcessExecutor

FSPROBE = Path(sys.executable).with_name("fsprobe")


def plant(directory: Path, marker: Path) -> None:
    """A package named fsprobe that leaves `marker` behind when anything imports it."""
    package = directory / "fsprobe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    (package / "probing").mkdir()
    (package / "probing" / "__init__.py").write_text("")
    (package / "probing" / "worker.py").write_text(
        f"open({str(marker)!r}, 'w').write('planted worker ran')\n"
    )


def test_check_run_from_a_directory_with_a_planted_package_never_runs_it(tmp_path):
    shared = tmp_path / "shared"
    marker = tmp_path / "marker"
    plant(shared, marker)
    os.chmod(shared, 0o1777)  # a scratch directory every user can write
    target = tmp_path / "ckpt"
    target.mkdir()
    result = subprocess.run(
        [str(FSPROBE), "check", str(target), "--json", "--no-quota"],
        cwd=shared,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert not marker.exists(), marker.read_text()
    report = json.loads(result.stdout)
    assert report["write_probe"]["ok"] is True, report  # the worker did probe
    assert report["probes"]["statvfs"]["ok"] is True
    assert result.returncode == 0, result.stderr


def test_the_worker_starts_isolated_in_the_root_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    executor = ProcessExecutor()
    try:
        runner = ProbeRunner(executor)
        assert runner.submit("/", "statvfs", os.getpid, 10).result().ok
        worker = psutil.Process(executor.pid)
        assert worker.cwd() == "/"
        assert "-I" in worker.cmdline()[1:3]
    finally:
        executor.close()
