"""Ctrl-C ends a save at once: a real SIGINT to a trainer in the middle of a large `torch.save`.

The fault filesystem slows every write down, so that the signal lands while the checkpoint is
being written (the test waits until the temp file has its first bytes). Python raises the
KeyboardInterrupt inside fsprobe's file object; torch turns it into ``RuntimeError: ...
unexpected pos ...``, which used to be retried as a transient ``EUNKNOWN``: the save completed,
the trainer ran on, the target was counted against.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import fsprobe.distributed
from fsprobe.events.emit import SOCKET_NAME
from fsprobe.events.event import SaveEvent, decode
from tests.support.crash import REPO, leftovers
from tests.support.ranks import finish, start_ranks

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

#: The trainer: one small save first (its event proves the socket is heard), then a large one.
TRAINER = """
import logging, os, sys
import torch
import fsprobe

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
target, kind, timeout = sys.argv[1], sys.argv[2], sys.argv[3]
save_timeout = None if timeout == "none" else float(timeout)
fsprobe.atomic_write(os.path.join(target, "warmup.bin"), lambda f: f.write(b"x"))
state = {"weights": torch.ones(64 * 1024 * 1024, dtype=torch.uint8)}
print("saving", flush=True)
if kind == "file":
    fsprobe.save(state, os.path.join(target, "model.pt"), save_timeout=save_timeout)
elif kind == "async-wait":  # Ctrl-C while waiting for the background save
    fsprobe.save_async(state, os.path.join(target, "model.pt"), save_timeout=save_timeout)
    fsprobe.wait_saves()
elif kind == "async-exit":  # Ctrl-C in the training loop: it ends the process
    fsprobe.save_async(state, os.path.join(target, "model.pt"), save_timeout=save_timeout)
    while True:
        sum(range(1000))
else:
    def write(staging):
        with open(os.path.join(staging, "model.pt"), "wb") as f:
            torch.save(state, f)
    fsprobe.save_dir(os.path.join(target, "step-1"), write, save_timeout=save_timeout)
print("saved", flush=True)
"""

#: Each FUSE write of the mount waits this long: 64 MiB take many seconds to write.
SLOW_WRITE = 0.02
#: A bound against a hang, never a measure.
HANG = 120.0


def written_temp(directory: Path) -> bool:
    """Whether a save's temp file (or a file in its staging directory) has bytes in it."""
    for name in leftovers(directory):
        path = directory / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        if any(f.stat().st_size > 0 for f in files):
            return True
    return False


def events(listener: socket.socket) -> list[str]:
    """The requested paths of the save events queued on the daemon's socket (a process's
    goodbye is no save)."""
    heard = []
    while True:
        try:
            event = decode(listener.recv(65536))
        except BlockingIOError:
            return heard
        if isinstance(event, SaveEvent):
            heard.append(event.requested)


def interrupted(
    command: list[str], ready: Callable[[], bool], env: dict[str, str]
) -> tuple[int, str, str]:
    """Run ``python -c command...``, which prints ``saving`` first; Ctrl-C it once `ready()`.
    Its exit status, output and error output."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", *command],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline() == "saving\n"
        give_up = time.monotonic() + HANG
        while not ready():
            assert trainer.poll() is None, trainer.communicate()
            assert time.monotonic() < give_up, "the save never got there"
            time.sleep(0.02)
        trainer.send_signal(signal.SIGINT)
        out, err = trainer.communicate(timeout=HANG)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    return trainer.returncode, out, err


@pytest.mark.parametrize(
    ("kind", "save_timeout"),
    [
        ("file", "none"),
        ("file", "600"),
        ("dir", "none"),
        ("dir", "600"),
        ("async-wait", "none"),
        ("async-wait", "600"),
        ("async-exit", "none"),
    ],
)
def test_ctrl_c_in_a_large_torch_save_ends_it_at_once(faultfs, tmp_path: Path, kind, save_timeout):
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    listener.bind(str(state_dir / SOCKET_NAME))
    faultfs.ctl.delay("write", SLOW_WRITE)
    env = {**os.environ, "FSPROBE_STATE_DIR": str(state_dir)}
    try:
        returncode, out, err = interrupted(
            [TRAINER, str(target), kind, save_timeout], lambda: written_temp(target), env
        )
    finally:
        faultfs.ctl.clear()
    # Python ends a process whose KeyboardInterrupt nobody caught with SIGINT itself.
    assert returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err.splitlines(), err  # the traceback's exception line
    assert "unexpected pos" not in err and "RuntimeError" not in err, err
    assert "failed at" not in err and "retrying" not in err, err  # no attempt counted, no retry
    assert "saved" not in out
    assert leftovers(target) == [], "the interrupted save left its temp file"
    assert sorted(os.listdir(target)) == ["warmup.bin"]
    assert events(listener) == [str(target / "warmup.bin")]  # the interrupted save sent none
    if kind.startswith("async"):  # after the traceback, at exit; or before it, in wait_saves
        assert f"background save of {target / 'model.pt'} interrupted: nothing written" in err
    listener.close()


def slow_shards(rank: int, world_size: int, target: str) -> str:
    """The collective scenario: every rank writes a 16 MiB shard through a Python file object."""

    def write(staging: str) -> list[str]:
        path = os.path.join(staging, f"shard-{rank}.pt")
        with open(path, "wb") as stream:
            torch.save({"shard": torch.ones(16 * 1024 * 1024, dtype=torch.uint8)}, stream)
        return [path]

    return fsprobe.distributed.save_dir(target, write).path


def shards_being_written(directory: Path) -> int:
    """How many files in a staging directory in `directory` have bytes in them."""
    return sum(
        1
        for name in leftovers(directory)
        for f in (directory / name).rglob("*")
        if f.is_file() and f.stat().st_size > 0
    )


def test_ctrl_c_to_a_job_in_a_collective_save_ends_it_on_every_rank(
    faultfs, tmp_path: Path, monkeypatch
):
    """Ctrl-C in a terminal reaches every rank of the job: each raises its KeyboardInterrupt,
    nothing is retried or published, the staging directory is gone, no save is reported."""
    parent = faultfs.mountpoint / "ckpt"
    parent.mkdir()
    target = parent / "last"
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o755)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    listener.bind(str(state_dir / SOCKET_NAME))
    monkeypatch.setenv("FSPROBE_STATE_DIR", str(state_dir))
    faultfs.ctl.delay("write", SLOW_WRITE)
    ranks = start_ranks(
        "tests.saving.test_save_interrupt:slow_shards", 2, tmp_path, target=str(target)
    )
    try:
        give_up = time.monotonic() + HANG
        while shards_being_written(parent) < 2:
            assert all(rank.poll() is None for rank in ranks), finish(ranks)
            assert time.monotonic() < give_up, "the ranks never started writing"
            time.sleep(0.05)
        for rank in ranks:
            rank.send_signal(signal.SIGINT)
        results = finish(ranks, timeout=HANG)
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
        faultfs.ctl.clear()
    for result in results:
        assert result.returncode == -signal.SIGINT, result.errors
        # torch prefixes each line a rank prints with "[rank<N>]: "
        lines = [line.split("]: ", 1)[-1] for line in result.errors.splitlines()]
        assert "KeyboardInterrupt" in lines, result.errors
        assert "unexpected pos" not in result.errors, result.errors
        assert "failed at" not in result.errors and "retrying" not in result.errors
    assert not target.exists() and leftovers(parent) == []
    assert events(listener) == []
    listener.close()


#: A trainer whose save (bounded: its attempt runs in a thread of its own) is published and then
#: held in the fsync of its directory.
PUBLISHED = """
import os, sys
import fsprobe
print("saving", flush=True)
fsprobe.atomic_write(os.path.join(sys.argv[1], "model.pt"), lambda f: f.write(b"new"),
                     save_timeout=600)
print("saved", flush=True)
"""


def test_ctrl_c_after_the_rename_keeps_the_checkpoint_it_published(faultfs):
    """Ctrl-C while the directory is fsynced after the rename: the checkpoint is in place, and
    the interrupt must not remove it as the attempt's temp file (the waiting thread removes
    what the attempt made only until it publishes)."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    faultfs.ctl.delay("fsyncdir", 5.0, path="/ckpt")
    try:
        returncode, out, err = interrupted(
            [PUBLISHED, str(target)], (target / "model.pt").exists, dict(os.environ)
        )
    finally:
        faultfs.ctl.clear()
    assert returncode == -signal.SIGINT, err
    assert "saved" not in out
    assert (target / "model.pt").read_bytes() == b"new"
    assert leftovers(target) == []
