"""Probes run in abandonable workers: the caller gets an answer by the deadline, always."""

from __future__ import annotations

import errno
import functools
import os
import threading
import time
from pathlib import Path

import psutil

from fsprobe.errors import ProbeFailure
from fsprobe.model import TIMEOUT
from fsprobe.probing.runner import ProbeRunner, timed_call
from fsprobe.probing.threads import ThreadExecutor
from fsprobe.probing.worker import ProcessExecutor


def test_timed_call_turns_outcomes_into_results():
    assert timed_call("statvfs", lambda: 42).value == 42

    def fails():
        raise OSError(errno.ESTALE, "Stale file handle")

    stale = timed_call("statvfs", fails)
    assert (stale.ok, stale.error, stale.message) == (
        False,
        "ESTALE",
        "[Errno 116] Stale file handle",
    )

    def parse_error():
        raise ProbeFailure("PARSE", "line 3: ???", value="partial")

    parsed = timed_call("quota", parse_error)
    assert (parsed.error, parsed.value, parsed.message) == ("PARSE", "partial", "line 3: ???")

    def bug():
        raise KeyError("oops")

    crashed = timed_call("write", bug)  # a bug, not a fact about the filesystem
    assert (crashed.error, crashed.message) == ("INTERNAL", "KeyError: 'oops'")
    assert 'raise KeyError("oops")' in crashed.detail  # its traceback, for the daemon's log


def test_a_blocked_probe_returns_stuck_at_its_deadline_and_blocks_its_target():
    release = threading.Event()
    runner = ProbeRunner(ThreadExecutor())
    start = time.monotonic()
    run = runner.submit("/hung", "statvfs", release.wait, deadline=0.3)
    stuck = run.result()
    waited = time.monotonic() - start
    assert stuck.stuck and stuck.error == TIMEOUT
    assert "has not returned" in stuck.message
    assert 0.25 < waited < 2.0

    # No second worker on a target that is blocked: the write probe is refused at once.
    refused = runner.submit("/hung", "write", lambda: "never runs", deadline=5).result()
    assert refused.stuck and "statvfs probe of this target has been blocked" in refused.message
    # The same probe is not started twice either: the run in flight is returned.
    assert runner.submit("/hung", "statvfs", lambda: "never runs", deadline=5) is run
    # Other targets are not affected.
    assert runner.submit("/fine", "statvfs", lambda: "ok", deadline=5).result().value == "ok"

    release.set()
    assert run.future.result(timeout=5).value is True  # the late answer is still delivered
    recovered = runner.submit("/hung", "write", lambda: "written", deadline=5).result()
    assert recovered.value == "written"


def test_threads_stay_bounded_while_a_target_is_hung():
    release = threading.Event()
    runner = ProbeRunner(ThreadExecutor())
    before = threading.active_count()
    for _ in range(50):
        for probe in ("statvfs", "write", "tmpdir"):
            runner.submit("/hung", probe, release.wait, deadline=0.01).result()
    assert threading.active_count() - before <= 3
    release.set()


def test_process_executor_keeps_this_process_free_of_stuck_calls():
    executor = ProcessExecutor()
    runner = ProbeRunner(executor)
    stuck = runner.submit("/hung", "statvfs", functools.partial(time.sleep, 60), 0.3).result()
    assert stuck.stuck
    assert threading.active_count() < 10  # the sleeping thread is in the worker, not here
    answered = runner.submit("/fine", "statvfs", functools.partial(os.getpid), 5).result()
    assert answered.ok and answered.value == executor.pid != os.getpid()


def test_a_dead_worker_fails_its_probes_and_is_replaced():
    executor = ProcessExecutor()
    runner = ProbeRunner(executor)
    first_pid = runner.submit("/a", "statvfs", functools.partial(os.getpid), 5).result().value
    lost = runner.submit("/a", "statvfs", functools.partial(os._exit, 3), 5).result()
    assert lost.error == "EUNKNOWN" and "exited unexpectedly" in lost.message
    again = runner.submit("/a", "statvfs", functools.partial(os.getpid), 5).result()
    assert again.ok and again.value != first_pid


def test_an_unpicklable_probe_is_an_error_not_a_crash():
    runner = ProbeRunner(ProcessExecutor())
    result = runner.submit("/a", "statvfs", lambda: 1, 5).result()
    assert result.error == "EUNKNOWN" and "cannot hand the probe to the worker" in result.message


def readers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "fsprobe-worker-reader"}


def test_an_idle_worker_and_its_reader_end_and_the_next_probe_starts_them_again():
    """A training job probes at a save, then trains for hours: no process, no thread left."""
    before = readers()
    executor = ProcessExecutor(idle_seconds=0.5)
    runner = ProbeRunner(executor)
    first = runner.submit("/a", "statvfs", functools.partial(os.getpid), 5).result().value
    (reader,) = readers() - before
    reader.join(timeout=15)
    assert not reader.is_alive()
    assert executor.pid is None
    assert not psutil.pid_exists(first)  # exited and reaped
    again = runner.submit("/a", "statvfs", functools.partial(os.getpid), 5).result()
    assert again.ok and again.value != first and again.value == executor.pid
    (reader,) = readers() - before
    reader.join(timeout=15)
    assert not reader.is_alive() and not psutil.pid_exists(again.value)


def test_a_worker_that_still_owes_an_answer_is_not_let_go(tmp_path):
    before = readers()
    executor = ProcessExecutor(idle_seconds=0.2)
    runner = ProbeRunner(executor)
    # The call hangs until the test lets it go (it opens a FIFO nobody writes yet): a sleep
    # of 2 s could end during the test's own sleep on a loaded machine.
    hang = tmp_path / "hang"
    os.mkfifo(hang)
    stuck = runner.submit("/hung", "statvfs", functools.partial(Path.read_bytes, hang), 0.1)
    assert stuck.result().stuck
    (reader,) = readers() - before
    time.sleep(1.0)  # five idle periods, with the call still running in the worker
    assert reader.is_alive() and executor.pid is not None
    pid = executor.pid
    assert runner.submit("/b", "statvfs", os.getpid, 5).result().value == pid
    release = os.open(hang, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO if the worker is not in it
    os.close(release)  # the worker reads to the end: b""
    reader.join(timeout=60)  # answered at last, then idle: let go
    assert not reader.is_alive() and not psutil.pid_exists(pid)


def test_the_reader_thread_stops_when_asked_and_the_next_probe_starts_a_worker_again():
    """A host that stops leftover daemon threads (Lightning's tests) calls `stop()`, then
    checks that the thread is gone at once."""
    before = readers()
    runner = ProbeRunner(ProcessExecutor())
    first = runner.submit("/a", "statvfs", os.getpid, 5).result().value
    (reader,) = readers() - before
    reader.stop()
    assert not reader.is_alive()
    again = runner.submit("/a", "statvfs", os.getpid, 5).result()
    assert again.ok and again.value != first
