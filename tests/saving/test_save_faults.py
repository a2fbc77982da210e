"""`fsprobe.save` of a real model on a filesystem that fails for real (FUSE fault filesystem,
tmpfs): transient write errors, a dead filesystem, a saver killed mid-write, $TMPDIR elsewhere."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

import pytest
import torch

import fsprobe
from fsprobe.posix.atomic import parse_temp_name
from fsprobe.saving.context import SaveContext
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import (
    FailedAttempt,
    deciding,
    first_os_error,
)
from fsprobe.units import format_seconds
from tests.support.crash import a_while_ago, killed_mid_save, leftovers
from tests.support.durability import assert_file_saved


def model_state(seed: int = 0, width: int = 512) -> dict[str, torch.Tensor]:
    """A real model's state_dict: a few MiB, so torch.save makes many writes."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    )
    return model.state_dict()


def assert_same_state(loaded, original) -> None:
    assert loaded.keys() == original.keys()
    for key in original:
        assert torch.equal(loaded[key], original[key]), key


@pytest.mark.parametrize("code", ["EIO", "ESTALE"])
def test_second_write_failing_is_retried_and_the_checkpoint_loads(faultfs, code):
    target = faultfs.mountpoint / "model.pt"
    state = model_state()
    # The 2nd write of the temp file fails, and its handle stays broken (as after a real EIO).
    rule = faultfs.ctl.fail("write", code, path="*.tmp", after=1, sticky=True)
    sleeps: list[float] = []
    result = fsprobe.save(state, target, backoff=Backoff(sleep=sleeps.append))
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert result.attempts == 2 and result.errors == (code,)
    assert len(sleeps) == 1
    assert_same_state(torch.load(target), state)
    assert_file_saved(faultfs, target)
    assert leftovers(faultfs.mountpoint) == []
    assert leftovers(faultfs.backing) == []


def test_every_write_failing_raises_and_keeps_the_previous_checkpoint(faultfs):
    target = faultfs.mountpoint / "model.pt"
    previous = model_state(seed=1)
    fsprobe.save(previous, target)
    faultfs.ctl.fail("write", "EIO", path="*.tmp", times=None, sticky=True)
    sleeps: list[float] = []
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.save(model_state(seed=2), target, attempts=3, backoff=Backoff(sleep=sleeps.append))
    assert raised.value.errno == errno.EIO
    assert [a.errno for a in raised.value.attempts] == ["EIO"] * 3
    assert len(sleeps) == 2
    faultfs.ctl.clear()
    assert_same_state(torch.load(target), previous)
    assert leftovers(faultfs.mountpoint) == []


def test_failing_rename_keeps_the_previous_checkpoint(faultfs):
    target = faultfs.mountpoint / "model.pt"
    previous = model_state(seed=1)
    fsprobe.save(previous, target)
    faultfs.ctl.fail("rename", "EIO", times=None)
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.save(model_state(seed=2), target, attempts=2, backoff=Backoff(sleep=[].append))
    assert {(a.errno, a.step) for a in raised.value.attempts} == {("EIO", "rename")}
    faultfs.ctl.clear()
    assert_same_state(torch.load(target), previous)
    assert leftovers(faultfs.mountpoint) == []


def test_real_enospc_on_a_full_tmpfs_without_fallback_fails_cleanly(tmpfs):
    fs = tmpfs(size="256k")
    target = fs.path / "model.pt"
    fsprobe.save({"small": torch.zeros(10)}, target)
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.save(model_state(), target, attempts=2, backoff=Backoff(sleep=[].append))
    assert {a.errno for a in raised.value.attempts} == {"ENOSPC"}
    assert torch.equal(torch.load(target)["small"], torch.zeros(10))
    assert sorted(os.listdir(fs.path)) == ["model.pt"]


_SAVER = """
import sys, torch, fsprobe
torch.manual_seed(2)
big = {"weights": torch.randn(4 * 1024 * 1024)}  # 16 MiB
print("saving", flush=True)
fsprobe.save(big, sys.argv[1])
print("saved", flush=True)
"""


def test_saver_killed_mid_write_leaves_the_previous_checkpoint_and_its_temp_is_cleaned(faultfs):
    target = faultfs.mountpoint / "model.pt"
    previous = model_state(seed=1)
    fsprobe.save(previous, target)
    faultfs.ctl.delay("write", 0.05, path="*.tmp")  # a slow server: the save takes seconds
    environment = {**os.environ, "FSPROBE_STATE_DIR": os.environ["FSPROBE_STATE_DIR"]}
    with killed_mid_save(_SAVER, str(target), env=environment) as saver:
        deadline = time.monotonic() + 60
        while True:  # wait until the temp file holds part of the checkpoint
            names = leftovers(faultfs.backing)
            if names and os.path.getsize(faultfs.backing / names[0]) > 256 * 1024:
                break
            assert saver.poll() is None, "the saver finished before it could be killed"
            assert time.monotonic() < deadline, "the saver never started writing"
            time.sleep(0.05)
    faultfs.ctl.clear()
    leftover = leftovers(faultfs.mountpoint)
    assert len(leftover) == 1 and parse_temp_name(leftover[0]).pid == saver.pid
    assert_same_state(torch.load(target), previous)

    a_while_ago(faultfs.mountpoint / leftover[0])  # a younger one may still be being created
    newer = model_state(seed=3)
    fsprobe.save(newer, target, context=SaveContext())  # the job restarted
    assert leftovers(faultfs.mountpoint) == []
    assert_same_state(torch.load(target), newer)


def test_temp_file_is_in_the_target_directory_even_with_tmpdir_elsewhere(
    tmpfs, tmp_path, monkeypatch
):
    staging = tmpfs(size="64M")  # $TMPDIR on another filesystem, as with node-local /tmp
    monkeypatch.setenv("TMPDIR", str(staging.path))
    target_dir = tmp_path / "ckpt"
    target_dir.mkdir()
    assert os.stat(staging.path).st_dev != os.stat(target_dir).st_dev
    state = model_state()
    seen = {}

    def write(stream):
        seen["temp"] = stream.name
        seen["in_target"] = leftovers(target_dir)
        seen["in_tmpdir"] = os.listdir(staging.path)
        torch.save(state, stream)
        seen["size_during"] = os.path.getsize(stream.name)

    fsprobe.atomic_write(target_dir / "model.pt", write)
    assert os.path.dirname(seen["temp"]) == str(target_dir)
    assert seen["in_target"] == [os.path.basename(seen["temp"])]
    assert seen["in_tmpdir"] == []
    assert seen["size_during"] > 0
    assert_same_state(torch.load(target_dir / "model.pt"), state)
    assert os.listdir(staging.path) == []


def test_a_brief_quota_bounce_is_ridden_out_by_the_retry(faultfs):
    target = faultfs.mountpoint / "model.pt"
    state = model_state()
    used = faultfs.ctl.quota()["bytes"]["used"]
    faultfs.ctl.set_quota("bytes", hard=used + 64 * 1024)  # a sibling job filled the quota

    def sleep(seconds: float) -> None:  # ... and cleaned up while this save backed off
        sleeps.append(seconds)
        faultfs.ctl.lift_quota()

    sleeps: list[float] = []
    result = fsprobe.save(state, target, backoff=Backoff(sleep=sleep))
    assert result.errors == ("EDQUOT",) and result.attempts == 2 and not result.redirected
    assert len(sleeps) == 1
    assert_same_state(torch.load(target), state)
    assert_file_saved(faultfs, target)
    assert leftovers(faultfs.mountpoint) == []


def test_a_hung_mount_is_waited_out_and_the_save_completes(faultfs, caplog):
    target_dir = faultfs.mountpoint / "ckpt"
    target_dir.mkdir()
    state = model_state()
    rule = faultfs.ctl.block("*")  # every call hangs, as on a Lustre server failover
    release = threading.Timer(2.5, faultfs.ctl.remove, args=(rule,))
    release.start()
    try:
        with caplog.at_level(logging.INFO, logger="fsprobe"):
            result = fsprobe.save(state, target_dir / "model.pt", max_wait=30, timeout=1.0)
    finally:
        release.cancel()
    assert result.attempts == 1 and result.errors == ()
    assert_same_state(torch.load(target_dir / "model.pt"), state)
    assert_file_saved(faultfs, target_dir / "model.pt")
    assert "mount_stuck" in caplog.text and "waiting up to 30.0 s" in caplog.text
    assert "delay (target" in caplog.text


# -- what the retry loop says and decides (mutation survivors, issue 12.6) --------------------


def test_every_failed_attempt_is_one_log_line_saying_what_comes_next(faultfs, tmpfs, caplog):
    """The README's log line, for a retry in place and for a redirect."""
    flaky = faultfs.mountpoint / "model.pt"
    faultfs.ctl.fail("write", "EIO", path="*.tmp", sticky=True)
    full = tmpfs(size="64k").path / "model.pt"
    fallback = faultfs.mountpoint / "fallback"
    fallback.mkdir(mode=0o700)
    sleeps: list[float] = []
    quiet = Backoff(sleep=sleeps.append)
    mib = b"x" * (1 << 20)  # past the buffer: the failure is met at write
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        fsprobe.atomic_write(flaky, lambda f: f.write(mib), backoff=quiet)
        result = fsprobe.atomic_write(full, lambda f: f.write(mib), fallback_dirs=[fallback])
    lines = [r.getMessage() for r in caplog.records if " failed at " in r.getMessage()]
    assert len(lines) == 2, lines
    retried, redirected = lines
    [wait] = sleeps
    assert retried.startswith(f"save {flaky}: attempt 1/5 failed at write with EIO (transient): ")
    assert retried.endswith(f"; retrying in {format_seconds(wait)}")
    assert redirected.startswith(f"save {full}: attempt 1/5 failed at write with ENOSPC (capacity)")
    assert redirected.endswith(f"; redirecting to {result.path}, retrying now")
    assert result.redirected and result.path != str(full)


def test_a_permanent_error_with_nowhere_to_go_is_one_log_line_giving_up(faultfs, caplog):
    target = faultfs.mountpoint / "model.pt"
    faultfs.ctl.fail("write", "EROFS", path="*.tmp", sticky=True)
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"), pytest.raises(fsprobe.SaveError):
        fsprobe.atomic_write(target, lambda f: f.write(b"x" * (1 << 20)))
    [line] = [r.getMessage() for r in caplog.records if " failed at " in r.getMessage()]
    assert line.startswith(f"save {target}: attempt 1/5 failed at write with EROFS (permanent): ")
    assert line.endswith("; giving up")


@pytest.mark.parametrize(("fallback_error", "waits"), [("ENOSPC", 1), ("EROFS", 0)])
def test_back_from_a_failed_fallback_the_target_waits_only_after_a_capacity_error(
    faultfs_factory, fallback_error, waits
):
    """The target was full and its fallback failed too: the target again, after the backoff
    when the fallback was full as well (the target may have room by then), at once when the
    fallback could never take it (read-only)."""
    target_fs, fallback_fs = faultfs_factory(), faultfs_factory()
    target = target_fs.mountpoint / "model.pt"
    target_fs.ctl.fail("write", "ENOSPC", path="*.tmp", sticky=True)  # once
    fallback = fallback_fs.mountpoint / "fallback"
    fallback.mkdir(mode=0o700)
    fallback_fs.ctl.fail("write", fallback_error, path="*.tmp", sticky=True)  # once
    sleeps: list[float] = []
    result = fsprobe.atomic_write(
        target,
        lambda f: f.write(b"x" * (1 << 20)),
        fallback_dirs=[fallback],
        backoff=Backoff(sleep=sleeps.append),
    )
    assert (result.path, result.errors) == (str(target), ("ENOSPC", fallback_error))
    assert len(sleeps) == waits and all(wait > 0 for wait in sleeps)


def test_a_runtime_error_that_is_no_write_failure_is_a_bug_raised_as_it_is(tmp_path):
    """Only torch's own words for a failed write make a RuntimeError an I/O failure to retry;
    any other is the writer's bug: raised at once, not retried, nothing left behind."""
    calls = []

    def buggy(stream):
        calls.append(1)
        stream.write(b"half")
        raise RuntimeError("shape mismatch in the writer")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        fsprobe.atomic_write(tmp_path / "model.pt", buggy)
    assert calls == [1]
    assert os.listdir(tmp_path) == []


def test_of_failures_at_once_a_permanent_one_decides_then_capacity_then_the_first():
    eio, estale = FailedAttempt("EIO", "write", "a"), FailedAttempt("ESTALE", "write", "b")
    enospc = FailedAttempt("ENOSPC", "write", "c")
    eacces = FailedAttempt("EACCES", "create", "d")
    assert deciding([eio, enospc, eacces, estale]) is eacces
    assert deciding([eio, enospc, estale]) is enospc
    assert deciding([estale, eio]) is estale
    assert deciding([]) is None


def test_an_exception_chain_that_loops_is_walked_once():
    """A writer's exceptions can reference each other (`__context__` set by hand, re-raised
    errors); the walk for the first OSError must end, finding none or the one there is."""
    first, second = RuntimeError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    answers: list[object] = []
    walk = threading.Thread(target=lambda: answers.append(first_os_error(first)), daemon=True)
    walk.start()
    walk.join(10)
    assert not walk.is_alive() and answers == [None]
    cause = OSError(errno.EIO, "under it all")
    second.__cause__ = cause
    assert first_os_error(first) is cause


def test_a_broken_handle_that_fails_its_close_is_not_called_a_removal_failure(faultfs, caplog):
    """After an EIO that leaves its handle broken, the temp file was removed, then closing the
    handle failed too (EIO from the flush): "could not remove the temp file ...: [Errno 5]"
    was logged for a file that was gone (55 times in a 20-minute soak)."""
    target = faultfs.mountpoint / "model.pt"
    faultfs.ctl.fail("write", "EIO", path="*.tmp", after=1, sticky=True)
    faultfs.ctl.fail("flush", "EIO", path="*.tmp", times=2)  # both handles of the temp
    with caplog.at_level(logging.WARNING, logger="fsprobe"):
        result = fsprobe.save(model_state(), target, backoff=Backoff(sleep=lambda s: None))
    assert result.attempts >= 2 and not result.redirected
    assert leftovers(faultfs.mountpoint) == []  # the temp file is gone
    messages = [record.getMessage() for record in caplog.records]
    assert not [m for m in messages if "could not remove" in m], messages
    closed = [m for m in messages if "closing it failed" in m]
    assert closed and all("removed the temp file" in m and "Errno 5" in m for m in closed)
