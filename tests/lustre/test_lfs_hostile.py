"""A hostile `lfs` (or wrapper) cannot make fsprobe use unbounded memory, wait, or leak processes.

The fake `lfs` acts it out: it floods stdout or stderr with 100 MB, or starts a helper that
leaves its process group or its session and holds the pipes open forever.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.runner import DRAIN_GRACE, MAX_STDERR, MAX_STDOUT, lfs_binary, run_lfs
from fsprobe.probing.runner import ProbeRunner
from fsprobe.probing.worker import ProcessExecutor
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for, is_fake_process

FSPROBE = Path(sys.executable).with_name("fsprobe")
#: Generous bound for "answered without waiting for the deadline" on a loaded two-core machine.
PROMPT = 10.0


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


@pytest.fixture
def worker():
    """A probe worker process of this test's own, as `fsprobe check` and the daemon use."""
    executor = ProcessExecutor()
    yield ProbeRunner(executor), executor
    executor.close()


def wait_gone(pid: int, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while is_fake_process(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not is_fake_process(pid)


@pytest.mark.parametrize(
    ("mode", "stream", "cap"),
    [("flood", "stdout", MAX_STDOUT), ("flood_stderr", "stderr", MAX_STDERR)],
)
def test_a_flood_is_cut_at_the_cap_and_reported_as_e2big(fake_lfs: FakeLfs, mode, stream, cap):
    fake_lfs.configure(fail=mode)
    started = time.monotonic()
    with pytest.raises(ProbeFailure) as failure:
        run_lfs(("df", "-v", "/mnt/lustre"), binary=lfs_binary(), timeout=60)
    assert failure.value.error == "E2BIG"
    assert f"more than {cap // 1024} KiB on {stream}" in failure.value.message
    assert time.monotonic() - started < PROMPT  # stopped at the cap, not at the end or deadline
    (call,) = fake_lfs.calls()
    assert wait_gone(call["pid"])


def test_a_100_mb_flood_leaves_the_worker_small(fake_lfs: FakeLfs, worker):
    fake_lfs.configure(fail="flood")
    runner, executor = worker
    assert runner.submit("/", "statvfs", time.time, 10).result().ok  # the worker is up
    baseline = psutil.Process(executor.pid).memory_info().rss
    probe = functools.partial(run_lfs, ("df", "-v", "/mnt/lustre"), binary=lfs_binary(), timeout=60)
    result = runner.submit("/mnt/lustre", "lfs_df", probe, 70).result()
    assert result.error == "E2BIG", result.message
    grown = psutil.Process(executor.pid).memory_info().rss - baseline
    assert grown < 4 * MAX_STDOUT, f"the worker grew by {grown / 2**20:.0f} MiB"


@pytest.mark.parametrize("leave", ["group", "session"])
def test_a_helper_that_escapes_is_reaped_and_does_not_hold_the_answer(fake_lfs, worker, leave):
    fake_lfs.configure(fail=f"escape_{leave}", state={"mountpoint": "/mnt/lustre"})
    runner, _executor = worker
    helpers = []
    for _ in range(3):
        probe = functools.partial(
            run_lfs, ("quota", "-u", "1000", "/mnt/lustre"), binary=lfs_binary(), timeout=60
        )
        started = time.monotonic()
        result = runner.submit("/mnt/lustre", "quota", probe, 70).result()
        assert time.monotonic() - started < DRAIN_GRACE + PROMPT  # not the 60 s deadline
        assert result.ok and result.value.status == 0, result.message
        assert result.value.stdout.startswith("Disk quotas for usr 1000")
        (helper,) = fake_lfs.pids()
        helpers.append(helper)
    assert [pid for pid in helpers if not wait_gone(pid)] == []  # none leaked, run after run


@pytest.mark.parametrize("mode", ["hang", "escape_group_hang", "escape_session_hang"])
def test_an_lfs_still_running_when_the_worker_ends_ends_with_it(fake_lfs: FakeLfs, worker, mode):
    """The daemon stops (its worker is let go) while an `lfs` hangs far from its deadline: the
    `lfs` and its child are killed as the worker exits, not left to run out the deadline, even
    a child that left the `lfs`'s process group or session (the group kill misses it: the
    worker, its reaper, kills it once the `lfs` has died)."""
    fake_lfs.configure(fail=mode)
    runner, executor = worker
    probe = functools.partial(
        run_lfs, ("quota", "-u", "1000", "/mnt/lustre"), binary=lfs_binary(), timeout=3600
    )
    pending = runner.submit("/mnt/lustre", "quota", probe, 60)  # the wait for its answer
    deadline = time.monotonic() + 60
    while len(fake_lfs.pids()) < 2:  # the hanging fake and its child both run
        assert time.monotonic() < deadline, "the fake lfs never started"
        time.sleep(0.05)
    process = psutil.Process(executor.pid)
    executor.close()
    assert pending.result().error is not None  # reported lost
    process.wait(timeout=60)
    assert [pid for pid in fake_lfs.pids() if not wait_gone(pid)] == []


def test_fsprobe_quota_reports_a_flood_and_exits_3(fake_lfs: FakeLfs, tmp_path: Path):
    fake_lfs.configure(fail="flood")
    result = subprocess.run(
        [str(FSPROBE), "quota", str(tmp_path), "--quota-provider", "lfs", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3, result.stderr
    assert "E2BIG" in json.loads(result.stdout)["errors"][0]
    assert "Traceback" not in result.stderr
