"""`fsprobe.save_async` and `fsprobe.wait_saves`: real torch, the fault filesystem, a real
interpreter exit. The snapshot, the order per destination, the bound on waiting saves, failures
on the future and in the log."""

from __future__ import annotations

import collections
import errno
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path

import pytest
import torch

import fsprobe
from fsprobe.saving.cpu_copy import cpu_copy
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import SaveResult
from fsprobe.saving.writers import BackgroundSaves
from tests.support.crash import leftovers

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_save_left_running():
    """Every test leaves the process's background saves as it found them: none."""
    yield
    fsprobe.wait_saves(timeout=60)


def trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small model with tied weights, after one Adam step (so the optimizer has state)."""
    torch.manual_seed(seed)
    embedding = torch.nn.Embedding(64, 32)
    head = torch.nn.Linear(32, 64, bias=False)
    head.weight = embedding.weight  # tied: one storage under two names
    model = torch.nn.Sequential(embedding, torch.nn.Linear(32, 32), head)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randint(0, 64, (4, 8))).sum().backward()
    optimizer.step()
    return model, optimizer


def checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """What a training loop saves: state dicts, plain values, a view, a parameter."""
    buffer = torch.arange(100.0)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "history": [0.9, 0.7, (1, "a")],
        "window": buffer[10:20],  # a view: torch.save writes the whole buffer
        "buffer": buffer,
        "scale": torch.nn.Parameter(torch.ones(3)),
        "config": {"lr": 0.1, "name": "run7", "betas": (0.9, 0.999)},
    }


def tensors_of(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_of(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_of(item)]
    return []


def assert_same(loaded, expected) -> None:
    assert type(loaded) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert torch.equal(loaded, expected)
    elif isinstance(expected, dict):
        assert list(loaded) == list(expected)
        for key in expected:
            assert_same(loaded[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(loaded) == len(expected)
        for a, b in zip(loaded, expected):
            assert_same(a, b)
    else:
        assert loaded == expected


# -- the snapshot ------------------------------------------------------------------------------


def test_the_snapshot_shares_no_memory_with_the_original_and_keeps_its_shape():
    model, optimizer = trained()
    original = checkpoint(model, optimizer)
    copied = cpu_copy(original)
    assert_same(copied, original)
    originals = {t.untyped_storage().data_ptr() for t in tensors_of(original)}
    assert all(t.untyped_storage().data_ptr() not in originals for t in tensors_of(copied))
    # What torch.save would write from the original: the same sharing, types and attributes.
    assert copied["model"]["0.weight"].untyped_storage().data_ptr() == (
        copied["model"]["2.weight"].untyped_storage().data_ptr()
    )
    assert copied["window"].untyped_storage().data_ptr() == (
        copied["buffer"].untyped_storage().data_ptr()
    )
    assert copied["window"].storage_offset() == 10
    assert type(copied["scale"]) is torch.nn.Parameter and copied["scale"].requires_grad
    assert copied["model"]._metadata == original["model"]._metadata
    assert copied["model"]._metadata is not original["model"]._metadata
    assert copied["config"] is not original["config"]


def test_an_object_met_twice_is_copied_once():
    weights = torch.ones(4)
    shared = [weights]
    copied = cpu_copy({"a": weights, "b": weights, "list": shared, "again": shared})
    assert copied["a"] is copied["b"]
    assert copied["list"] is copied["again"] and copied["list"][0] is copied["a"]


def test_other_objects_are_deep_copied():
    class Settings:
        def __init__(self) -> None:
            self.steps = [1, 2]

    settings = Settings()
    copied = cpu_copy({"settings": settings, "ids": {1, 2}})
    settings.steps.append(3)
    assert copied["settings"].steps == [1, 2]
    assert copied["ids"] == {1, 2}


# -- save_async ----------------------------------------------------------------------------------


def test_the_future_holds_the_bytes_a_synchronous_save_writes(tmp_path):
    model, optimizer = trained()
    state = checkpoint(model, optimizer)
    synchronous = fsprobe.save(state, tmp_path / "sync.pt")
    future = fsprobe.save_async(state, tmp_path / "async.pt")
    assert isinstance(future, Future)
    result = future.result(timeout=60)
    assert isinstance(result, SaveResult)
    assert result.path == str(tmp_path / "async.pt") and not result.redirected
    assert result.bytes == synchronous.bytes == os.path.getsize(tmp_path / "async.pt")
    assert (tmp_path / "async.pt").read_bytes() == (tmp_path / "sync.pt").read_bytes()
    loaded = torch.load(tmp_path / "async.pt", weights_only=False)
    assert_same(loaded, state)
    assert loaded["model"]["0.weight"].data_ptr() == loaded["model"]["2.weight"].data_ptr()


def test_a_tensor_changed_in_place_right_after_save_async_returns_is_saved_as_it_was(faultfs):
    model, optimizer = trained()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    expected = {
        "model": {k: v.clone() for k, v in state["model"].items()},
        "exp_avg": optimizer.state_dict()["state"][0]["exp_avg"].clone(),
    }
    # The write is held until the training has changed everything in place.
    held = faultfs.ctl.block("write", path="*.tmp")
    future = fsprobe.save_async(state, faultfs.mountpoint / "ckpt.pt")
    faultfs.ctl.wait_blocked(held)
    model(torch.randint(0, 64, (4, 8))).sum().backward()
    optimizer.step()  # in place: the weights and Adam's moments
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    assert not future.done()
    faultfs.ctl.remove(held)
    future.result(timeout=60)
    loaded = torch.load(faultfs.mountpoint / "ckpt.pt")
    for key, value in expected["model"].items():
        assert torch.equal(loaded["model"][key], value), key
        assert not torch.equal(loaded["model"][key], state["model"][key]), key
    assert torch.equal(loaded["optimizer"]["state"][0]["exp_avg"], expected["exp_avg"])


def test_a_failure_in_the_background_surfaces_on_the_future_and_in_the_log(faultfs, caplog):
    target = faultfs.mountpoint / "ckpt.pt"
    fsprobe.save({"step": torch.zeros(8)}, target)
    faultfs.ctl.fail("write", "EIO", path="*.tmp", times=None, sticky=True)
    sleeps: list[float] = []
    with caplog.at_level(logging.WARNING, logger="fsprobe.save"):
        future = fsprobe.save_async(
            {"step": torch.ones(8)}, target, attempts=2, backoff=Backoff(sleep=sleeps.append)
        )
        error = future.exception(timeout=60)
    assert isinstance(error, fsprobe.SaveError) and error.errno == errno.EIO
    assert [a.errno for a in error.attempts] == ["EIO", "EIO"] and len(sleeps) == 1
    failed = [r for r in caplog.records if "background save of" in r.getMessage()]
    assert [r.levelname for r in failed] == ["ERROR"]
    assert str(target) in failed[0].getMessage() and "EIO" in failed[0].getMessage()
    faultfs.ctl.clear()
    assert torch.equal(torch.load(target)["step"], torch.zeros(8))  # the previous one


def test_a_background_loop_survives_a_transient_error_and_a_full_target_and_resumes(
    faultfs, tmpfs, tmp_path
):
    """Issue 9's "done when" for a plain loop that saves in the background: a write failing
    once is retried, a target with no room sends the checkpoint whole to the fallback, and
    `fsprobe.locate` then finds the newest checkpoint, which loads as it was saved."""
    model, optimizer = trained()
    flaky = faultfs.mountpoint / "last.pt"
    rule = faultfs.ctl.fail("write", "EIO", path="*.tmp", sticky=True)  # once
    first = checkpoint(model, optimizer)
    result = fsprobe.save_async(first, flaky, backoff=Backoff(sleep=lambda _: None)).result(60)
    assert (result.attempts, result.errors, result.redirected) == (2, ("EIO",), False)
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert_same(torch.load(flaky, weights_only=False), first)

    full = tmpfs(size="128k").path / "last.pt"
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    small = {"step": 1, "weights": torch.zeros(4096)}  # 16 KiB
    fsprobe.save_async(small, full, fallback_dirs=[fallback]).result(60)
    big = {"step": 2, "weights": torch.ones(64 * 1024)}  # 256 KiB: no room left for it
    result = fsprobe.save_async(big, full, fallback_dirs=[fallback]).result(60)
    # Judged by the last save's size, the preflight lets it try; the write meets ENOSPC.
    assert (result.redirected, result.errors) == (True, ("ENOSPC",))
    assert torch.load(full)["step"] == 1  # the older checkpoint stays where it was
    newest = fsprobe.locate(full, fallback_dirs=[fallback])
    assert newest == result.path and newest.startswith(str(fallback))
    assert_same(torch.load(newest), big)


def test_an_error_that_is_not_io_surfaces_on_the_future_with_its_traceback(tmp_path, caplog):
    def local_function():  # copied by reference in the snapshot; pickle refuses it
        return None

    with caplog.at_level(logging.ERROR, logger="fsprobe.save"):
        future = fsprobe.save_async({"w": torch.ones(2), "f": local_function}, tmp_path / "a.pt")
        error = future.exception(timeout=60)
    assert isinstance(error, (pickle.PicklingError, AttributeError)), error
    assert error.__traceback__ is not None
    [record] = [r for r in caplog.records if "background save of" in r.getMessage()]
    assert record.exc_info is not None and "local_function" in caplog.text
    assert not (tmp_path / "a.pt").exists() and os.listdir(tmp_path) == []


def test_a_failed_save_does_not_keep_its_snapshot_alive(faultfs):
    faultfs.ctl.fail("write", "EIO", path="*.tmp", times=None, sticky=True)
    future = fsprobe.save_async({"w": torch.ones(1024)}, faultfs.mountpoint / "a.pt", attempts=1)
    error = future.exception(timeout=60)
    frames = []
    traceback = error.__traceback__
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    assert frames, "the traceback is kept"
    held = [
        name
        for frame in frames
        for name, value in frame.f_locals.items()
        if isinstance(value, dict) and "w" in value
    ]
    assert held == []


def test_arguments_that_the_save_would_refuse_are_refused_at_once(tmp_path):
    with pytest.raises(TypeError):
        fsprobe.save_async({}, tmp_path / "a.pt", atempts=3)
    with open(tmp_path / "file", "wb") as stream, pytest.raises(TypeError, match="needs a path"):
        fsprobe.save_async({}, stream)
    assert fsprobe.default_context().background().pending() == []


def test_saves_of_one_path_run_one_at_a_time_in_order_and_other_paths_go_on(faultfs):
    (faultfs.mountpoint / "slow").mkdir()
    slow, other = faultfs.mountpoint / "slow" / "ckpt.pt", faultfs.mountpoint / "other.pt"
    held = faultfs.ctl.block("write", path="/slow/*.tmp")
    finished: list[int] = []
    futures = []
    for step in range(2):
        futures.append(fsprobe.save_async({"step": torch.tensor(step)}, slow))
        futures[-1].add_done_callback(lambda _, step=step: finished.append(step))
    faultfs.ctl.wait_blocked(held)
    assert futures[0].running() and not futures[1].running()
    # A save of another path is not held up by them.
    fsprobe.save_async({"other": torch.ones(1)}, other).result(timeout=60)
    assert not futures[0].done()
    faultfs.ctl.remove(held)
    fsprobe.wait_saves(timeout=60)
    assert finished == [0, 1]
    assert torch.load(slow)["step"] == 1


def test_wait_saves_returns_when_every_save_is_done_and_times_out_when_not(faultfs):
    held = faultfs.ctl.block("write", path="*.tmp")
    futures = [
        fsprobe.save_async({"i": torch.tensor(i)}, faultfs.mountpoint / f"{i}.pt") for i in range(3)
    ]
    faultfs.ctl.wait_blocked(held, count=2)  # two writer threads, both held
    with pytest.raises(FutureTimeoutError, match=r"still running"):
        fsprobe.wait_saves(timeout=0.2)
    faultfs.ctl.remove(held)
    fsprobe.wait_saves(timeout=60)
    assert all(f.done() and f.exception() is None for f in futures)
    assert sorted(os.listdir(faultfs.mountpoint)) == ["0.pt", "1.pt", "2.pt"]


def test_a_cancelled_save_that_was_still_waiting_is_not_written(faultfs):
    held = faultfs.ctl.block("write", path="*.tmp")
    target = faultfs.mountpoint / "ckpt.pt"
    first = fsprobe.save_async({"v": torch.tensor(1)}, target)
    second = fsprobe.save_async({"v": torch.tensor(2)}, target)
    faultfs.ctl.wait_blocked(held)
    assert second.cancel() and not first.cancel()
    faultfs.ctl.remove(held)
    fsprobe.wait_saves(timeout=60)
    assert torch.load(target)["v"] == 1


def test_a_caller_blocks_before_its_snapshot_while_the_waiting_slots_are_full(faultfs, caplog):
    """One writer, one waiting slot: the third save waits for the second to start."""
    saves = BackgroundSaves(workers=1, max_waiting=1)
    held = faultfs.ctl.block("write", path="*.tmp")
    snapshots: list[str] = []

    def job(name: str):
        def prepare():
            snapshots.append(name)  # the snapshot would be taken here
            target = faultfs.mountpoint / name
            return lambda: fsprobe.save({"name": name}, target)

        return prepare

    first = saves.submit(str(faultfs.mountpoint / "a.pt"), job("a.pt"))
    faultfs.ctl.wait_blocked(held)
    second = saves.submit(str(faultfs.mountpoint / "b.pt"), job("b.pt"))
    third: list[Future] = []
    caller = threading.Thread(
        target=lambda: third.append(saves.submit(str(faultfs.mountpoint / "c.pt"), job("c.pt")))
    )
    caller.start()
    caller.join(timeout=0.5)
    assert caller.is_alive() and snapshots == ["a.pt", "b.pt"]
    assert not first.done() and not second.running()
    faultfs.ctl.remove(held)
    caller.join(timeout=60)
    assert snapshots == ["a.pt", "b.pt", "c.pt"]
    saves.wait(timeout=60)
    assert [f.result().path for f in (first, second, third[0])] == [
        str(faultfs.mountpoint / name) for name in ("a.pt", "b.pt", "c.pt")
    ]


def test_a_failing_snapshot_raises_in_the_caller_and_frees_its_slot(tmp_path):
    saves = BackgroundSaves(workers=1, max_waiting=1)

    def broken():
        raise RuntimeError("snapshot failed")

    with pytest.raises(RuntimeError, match="snapshot failed"):
        saves.submit(str(tmp_path / "a.pt"), broken)
    future = saves.submit(str(tmp_path / "a.pt"), lambda: lambda: "written")
    assert future.result(timeout=60) == "written"
    saves.wait(timeout=60)
    assert saves.pending() == []


_EXITING = """
import logging, sys, torch, fsprobe
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
future = fsprobe.save_async({"weights": torch.arange(1000)}, sys.argv[1])
print("queued", flush=True)
"""


def test_interpreter_exit_waits_for_the_save_and_says_so(faultfs):
    target = faultfs.mountpoint / "ckpt.pt"
    # Slow writes: the save is still running when the script's last line has run.
    faultfs.ctl.delay("write", 1.0, path="*.tmp", times=1)
    finished = subprocess.run(
        [sys.executable, "-c", _EXITING, str(target)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout == "queued\n"
    assert f"waiting for 1 background save(s) to finish before exiting: {target}" in (
        finished.stderr
    )
    assert "background saves finished" in finished.stderr
    assert torch.equal(torch.load(target)["weights"], torch.arange(1000))


_FORKING = """
import os, sys, torch, fsprobe

future = fsprobe.save_async({"w": torch.ones(1)}, sys.argv[1])
pid = os.fork()
if pid == 0:
    os._exit(0 if fsprobe.default_context().background().pending() == [] else 1)
_, status = os.waitpid(pid, 0)
future.result(timeout=60)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_starts_without_its_parents_saves(faultfs):
    held = faultfs.ctl.delay("write", 1.0, path="*.tmp", times=1)
    finished = subprocess.run(
        [sys.executable, "-c", _FORKING, str(faultfs.mountpoint / "a.pt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout == "0\n"
    assert faultfs.ctl.rule(held)["hits"] == 1


def test_the_queue_is_gone_once_a_destination_has_nothing_left(tmp_path):
    futures = [fsprobe.save_async({"i": i}, tmp_path / "a.pt") for i in range(3)]
    fsprobe.wait_saves(timeout=60)
    assert [f.result().attempts for f in futures] == [1, 1, 1]
    saves = fsprobe.default_context().background()
    assert saves._queues == {} and saves._running == {}
    assert collections.Counter(os.listdir(tmp_path)) == {"a.pt": 1}


_EXIT_RIGHT_AFTER = """
import sys, torch, fsprobe
fsprobe.save_async({"w": torch.ones(4_000_000)}, sys.argv[1], preflight=False)
fsprobe.wait_saves()
"""


def test_exiting_right_after_the_saves_finished_never_aborts(tmp_path):
    """The writer thread frees the snapshot before a waiter wakes up.

    Freed after, about half of these exits aborted ("terminate called without an active
    exception"): the thread was still freeing the 16 MB tensor in torch's C++ code when the
    interpreter ended. Six runs catch that with a probability of 99 %.
    """
    for run in range(6):
        finished = subprocess.run(
            [sys.executable, "-c", _EXIT_RIGHT_AFTER, str(tmp_path / "ckpt.pt")],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (run, finished.returncode, finished.stderr) == (run, 0, "")


def test_an_interrupt_stops_a_running_save_at_its_next_write(faultfs, caplog):
    """`interrupt` (Ctrl-C in `wait_saves`, or at exit) stops a running background save at
    its next write, its temp file removed, however much it still had to write."""
    context = fsprobe.SaveContext()
    faultfs.ctl.delay("write", 0.1, path="*.tmp")  # slow writes: the whole save takes a minute
    target = faultfs.mountpoint / "ckpt.pt"
    big = {f"layer{i}": torch.ones(1 << 20, dtype=torch.uint8) for i in range(64)}  # 64 writes
    future = fsprobe.save_async(big, target, context=context)
    give_up = time.monotonic() + 60
    while not any((faultfs.mountpoint / n).stat().st_size for n in leftovers(faultfs.mountpoint)):
        assert time.monotonic() < give_up, "the save never started writing"
        time.sleep(0.02)
    context.background().interrupt()  # waits for it to stop, STOP_SECONDS at most
    assert isinstance(future.exception(timeout=0), KeyboardInterrupt)
    assert "left behind" not in caplog.text
    assert leftovers(faultfs.mountpoint) == [] and not target.exists()
