"""A save never hangs on a stuck filesystem past its `save_timeout`, and survives a lost temp.

A filesystem can hold an fsync in the kernel for as long as it likes; the fault filesystem's
``block`` does exactly that (the thread sleeps uninterruptibly until the rule is removed).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import pytest
import torch

import fsprobe
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import SaveError
from tests.support.crash import leftovers

#: The deadline of the tests, and what a stuck save may take beyond it on a busy machine.
DEADLINE = 2.0
SLACK = 20.0


def no_sleep() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def wait_until_gone(directory, timeout: float = 30.0) -> None:
    """Until the abandoned attempt, released, has removed its temp file."""
    deadline = time.monotonic() + timeout
    while leftovers(directory):
        assert time.monotonic() < deadline, "the abandoned attempt left its temp file"
        time.sleep(0.05)


@pytest.fixture
def stuck(faultfs):
    """A checkpoint directory whose filesystem holds every fsync until released."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    fsprobe.atomic_write(target / "model.pt", lambda stream: stream.write(b"epoch 1"))
    rule = faultfs.ctl.block("fsync", path="/ckpt/*")
    yield target, lambda: faultfs.ctl.remove(rule)
    faultfs.ctl.clear()


def test_a_save_stuck_in_fsync_goes_to_the_fallback_at_its_deadline(stuck, tmp_path):
    target, release = stuck
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    state = {"weights": torch.arange(1000)}
    start = time.monotonic()
    try:
        result = fsprobe.save(
            state,
            target / "model.pt",
            fallback_dirs=[fallback],
            save_timeout=DEADLINE,
            preflight=False,  # the attempt itself must not hang, whatever the preflight said
        )
        took = time.monotonic() - start
    finally:
        release()
    assert DEADLINE <= took < DEADLINE + SLACK
    assert result.redirected and result.errors == ("TIMEOUT",) and result.attempts == 2
    assert torch.equal(torch.load(result.path)["weights"], state["weights"])
    wait_until_gone(target)  # released, the abandoned attempt comes back and publishes nothing
    assert (target / "model.pt").read_bytes() == b"epoch 1"


def test_without_a_fallback_a_stuck_save_fails_at_its_deadline(stuck, caplog):
    target, release = stuck
    start = time.monotonic()
    try:
        with pytest.raises(SaveError) as failure:
            fsprobe.atomic_write(
                target / "model.pt",
                lambda stream: stream.write(b"epoch 2"),
                save_timeout=DEADLINE,
                preflight=False,
            )
        took = time.monotonic() - start
    finally:
        release()
    assert DEADLINE <= took < DEADLINE + SLACK
    assert [(a.errno, a.step) for a in failure.value.attempts] == [("TIMEOUT", "fsync")]
    assert "abandoned, its thread is left behind" in caplog.text
    wait_until_gone(target)
    assert (target / "model.pt").read_bytes() == b"epoch 1"


def test_a_deadline_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="save_timeout"):
        fsprobe.atomic_write(tmp_path / "x", lambda stream: None, save_timeout=0)


def test_a_temp_file_that_vanished_mid_save_is_retried(tmp_path):
    """Someone else's cleanup removed the temp file: ENOENT at rename, yet nothing is wrong."""
    lost = []

    def write(stream) -> None:
        stream.write(b"the checkpoint")
        if not lost:
            lost.append(stream.name)
            os.unlink(stream.name)

    result = fsprobe.atomic_write(tmp_path / "model.pt", write, backoff=no_sleep())
    assert result.attempts == 2 and result.errors == ("ENOENT",)
    assert (tmp_path / "model.pt").read_bytes() == b"the checkpoint"
    assert leftovers(tmp_path) == []


def attempts_held_at(faultfs, op: str, path: str, save: Callable[[], object]) -> list:
    """(errno, step) of each attempt of `save`, which must fail, while the filesystem holds
    `op` on `path`; the hold is released whatever happens."""
    rule = faultfs.ctl.block(op, path=path)
    try:
        with pytest.raises(SaveError) as failure:
            save()
    finally:
        faultfs.ctl.remove(rule)
    return [(attempt.errno, attempt.step) for attempt in failure.value.attempts]


@pytest.mark.parametrize(
    ("op", "path", "step"),
    [
        ("write", "/ckpt/.fsprobe~*", "write"),
        ("fsync", "/ckpt/.fsprobe~*", "fsync"),
        ("flush", "/ckpt/.fsprobe~*", "close"),  # NFS and Lustre may write back at close
        ("fsyncdir", "/ckpt", "fsync_dir"),
    ],
)
def test_a_save_stuck_at_any_step_names_that_step(faultfs, op, path, step):
    """The failure says where the filesystem held the save, for the log and the metrics."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    save = functools.partial(
        fsprobe.atomic_write,
        target / "model.pt",
        lambda stream: stream.write(b"x" * (1 << 20)),  # past the buffer: written now
        save_timeout=DEADLINE,
        preflight=False,
        attempts=1,
    )
    assert attempts_held_at(faultfs, op, path, save) == [("TIMEOUT", step)]
    wait_until_gone(target)
    # Held before the rename, the abandoned attempt publishes nothing when it comes back.
    assert (target / "model.pt").exists() is (step == "fsync_dir")


def write_a_shard(staging: str) -> None:
    with open(os.path.join(staging, "shard.bin"), "wb") as shard:
        shard.write(b"x" * (1 << 20))  # past the buffer: written now


@pytest.mark.parametrize(
    ("op", "path", "step"),
    [
        ("mkdir", "/ckpt/.fsprobe~*", "mkdir"),
        ("write", "/ckpt/.fsprobe~*/shard.bin", "write"),
        ("fsync", "/ckpt/.fsprobe~*/shard.bin", "fsync"),
        ("fsyncdir", "/ckpt", "fsync_dir"),
    ],
)
def test_a_directory_save_stuck_at_any_step_names_that_step(faultfs, op, path, step):
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    save = functools.partial(
        fsprobe.save_dir,
        target / "step-10",
        write_a_shard,
        save_timeout=DEADLINE,
        preflight=False,
        attempts=1,
    )
    assert attempts_held_at(faultfs, op, path, save) == [("TIMEOUT", step)]
    wait_until_gone(target)
    assert (target / "step-10").exists() is (step == "fsync_dir")
