"""The package a distribution would take (issue 11.7): built here, then opened and checked.

The sdist and the wheel are built with `python -m build` from a copy of the source tree (the
wheel from the sdist, as build does by default), without build isolation so that no network is
needed. The wheel must carry the licence, the typing marker and the metadata a reviewer looks
for; the sdist must carry the tests with everything they run on, and those tests must collect
and run from the unpacked sdist alone.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION_DIR = "fsprobe-0.1.0"

#: What a source tree may hold that is not source.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".ruff_cache", ".hypothesis", "*.pyc",
)  # fmt: skip

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel), built once for the module."""
    home = tmp_path_factory.mktemp("packaging")
    source = home / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCE)
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(home / "dist"), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = (home / "dist").glob("*.tar.gz")
    (wheel,) = (home / "dist").glob("*.whl")
    return sdist, wheel


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_wheel_carries_the_licence_the_typing_marker_and_the_package_only(built) -> None:
    _sdist, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"Apache License" in archive.read(licence)
    assert "fsprobe/py.typed" in names
    assert "fsprobe/daemon/tasks.py" in names and "fsprobe/exporters/exposition.py" in names
    assert not [n for n in names if n.startswith(("tests/", "deploy/", "benchmarks/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_metadata_is_what_a_reviewer_looks_for(built) -> None:
    metadata = _metadata(built[1])
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License"] is None  # the deprecated free-text form is gone
    classifiers = metadata.get_all("Classifier")
    for expected in (
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3.9",
        "Topic :: System :: Filesystems",
        "Topic :: System :: Monitoring",
        "Typing :: Typed",
    ):
        assert expected in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # the SPDX string says it
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert {"Homepage", "Source", "Issues", "Documentation", "Runbook"} <= set(urls)
    assert urls["Runbook"].endswith("/docs/runbook.md")
    assert metadata["Requires-Python"] == ">=3.9"


def test_the_sdist_carries_what_its_tests_need(built) -> None:
    sdist, _wheel = built
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        ".yamllint",
        "tests/conftest.py",
        "tests/support/daemon_process.py",
        "tests/support/faultfs.py",
        "tests/support/tmpfs.py",
        "tests/support/fakes/fake_lfs.py",
        "tests/support/fakes/lfs",
        "tests/fixtures/lfs/README.md",
        "deploy/prometheus/fsprobe.rules.yml",
        "deploy/prometheus/generate.py",
        "deploy/grafana/fsprobe.json",
        "docs/runbook.md",
        "benchmarks/daemon_footprint.py",
        "fsprobe/py.typed",
    ):
        assert needed in names, needed
    assert {name for name in names if name.startswith("tests/fixtures/lfs/quota/")}
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_the_tests_of_the_sdist_collect_and_run_from_it_alone(built, tmp_path: Path) -> None:
    sdist, _wheel = built
    with tarfile.open(sdist) as archive:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.9.17: refuse links out, devices...
            archive.extractall(tmp_path, filter="data")
        else:  # pragma: no cover - an sdist we just built ourselves
            archive.extractall(tmp_path)
    unpacked = tmp_path / VERSION_DIR

    def pytest_in_sdist(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
            cwd=unpacked,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    collected = pytest_in_sdist("--collect-only")
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert "error" not in collected.stdout.lower().splitlines()[-1], collected.stdout[-500:]
    ran = pytest_in_sdist(
        f"--basetemp={tmp_path / 'run'}",
        "tests/package/test_units.py",
        "tests/lustre/test_lfs_fake.py",
        "tests/deploy/test_deploy_prometheus.py::test_the_shipped_rules_are_generated_from_the_template",
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    # pytest puts the sdist's directory first on sys.path (pyproject: pythonpath = ["."]), so
    # its tests import its own package, not this checkout's.
    where = "import sys; sys.path.insert(0, ''); import fsprobe; print(fsprobe.__file__)"
    imported = subprocess.run(
        [sys.executable, "-c", where], cwd=unpacked, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(imported).parent == unpacked / "fsprobe"
