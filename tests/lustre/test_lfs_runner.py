"""Running `lfs`: argv only, the C locale, and a deadline that kills the whole process group."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.runner import ENV_LFS, lfs_binary, run_lfs, status_error_name
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for, is_fake_process

#: Generous: the deadline plus the kill, on a loaded two-core machine.
SLACK = 3.0


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def wait_gone(pids: list[int], seconds: float = 60.0) -> list[int]:
    """The pids still running (not dead, not zombie) after waiting up to `seconds`."""
    deadline = time.monotonic() + seconds
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if is_fake_process(pid)]
        time.sleep(0.05)
    return alive


def test_hung_lfs_is_killed_with_its_child_at_the_deadline(fake_lfs: FakeLfs):
    fake_lfs.configure(fail="hang")
    started = time.monotonic()
    with pytest.raises(ProbeFailure) as failure:
        run_lfs(("quota", "-u", "1000", "/x"), binary=lfs_binary(), timeout=2.0)
    elapsed = time.monotonic() - started
    assert failure.value.error == "TIMEOUT"
    assert "process group" in failure.value.message
    assert 2.0 <= elapsed < 2.0 + SLACK
    pids = fake_lfs.pids()
    assert len(pids) == 2, "the fake and its child both started"
    assert wait_gone(pids) == []


def test_run_returns_output_status_and_timing(fake_lfs: FakeLfs):
    fake_lfs.configure(state={"mountpoint": "/mnt/lustre"})
    run = run_lfs(("quota", "-u", "1000", "/mnt/lustre"), binary=lfs_binary(), timeout=20)
    assert run.status == 0
    assert run.stdout.startswith("Disk quotas for usr 1000 (uid 1000):\n")
    assert run.argv == (str(fake_lfs.path), "quota", "-u", "1000", "/mnt/lustre")
    assert run.duration > 0 and run.started_at <= time.time()
    fake_lfs.configure(state={"mountpoint": "/mnt/lustre"}, fail="eperm")
    run = run_lfs(("quota", "-u", "1001", "/mnt/lustre"), binary=lfs_binary(), timeout=20)
    assert (run.status, run.stderr) == (errno.EPERM, "Permission denied.\n")


def test_no_time_left_starts_nothing(fake_lfs: FakeLfs):
    fake_lfs.configure()
    with pytest.raises(ProbeFailure) as failure:
        run_lfs(("df",), binary=lfs_binary(), timeout=0)
    assert failure.value.error == "TIMEOUT"
    assert fake_lfs.calls() == []


def test_missing_lfs_says_how_to_name_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(OSError) as failure:
        run_lfs(("df",), binary="lfs", timeout=5)
    assert failure.value.errno == errno.ENOENT
    for hint in ("--lfs", "FSPROBE_LFS", "PATH"):
        assert hint in str(failure.value)
    with pytest.raises(OSError) as failure:
        run_lfs(("df",), binary=str(tmp_path / "nowhere" / "lfs"), timeout=5)
    assert failure.value.errno == errno.ENOENT
    assert "--lfs" in str(failure.value)


def test_lfs_that_cannot_be_executed(tmp_path: Path):
    binary = tmp_path / "lfs"
    binary.write_text("not a program\n")
    binary.chmod(0o644)
    with pytest.raises(PermissionError) as failure:
        run_lfs(("df",), binary=str(binary), timeout=5)
    assert "--lfs" in str(failure.value)


def test_binary_choice(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_LFS, raising=False)
    assert lfs_binary() == "lfs"
    monkeypatch.setenv(ENV_LFS, "/opt/lustre/bin/lfs")
    assert lfs_binary() == "/opt/lustre/bin/lfs"
    assert lfs_binary("/usr/local/bin/lfs") == "/usr/local/bin/lfs"


@pytest.mark.parametrize(
    ("status", "name"),
    [(1, "EPERM"), (3, "ESRCH"), (5, "EIO"), (19, "ENODEV"), (4, "EINVAL"),
     (-signal.SIGKILL, "SIGKILL"), (-200, "SIG200")],
)  # fmt: skip
def test_exit_status_names(status: int, name: str):
    assert status_error_name(status) == name


def test_lfs_runs_in_the_c_locale(fake_lfs: FakeLfs, monkeypatch: pytest.MonkeyPatch):
    """lfs messages are parsed, so they must not be translated."""
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    fake_lfs.configure()
    run_lfs(("df",), binary=lfs_binary(), timeout=20)
    assert [call["lc_all"] for call in fake_lfs.calls()] == ["C"]
    assert os.environ["LC_ALL"] == "de_DE.UTF-8", "only the child's environment changes"
