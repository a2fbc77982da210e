"""DCP through `fsprobe.integrations.dcp`: real ranks (gloo, CPU; tests.support.ranks), real
faults (the FUSE fault filesystem, a small tmpfs), real kills.

Each rank holds a state of its own (``rank<r>.*``, written only by that rank, as optimizer
shards are) and a replicated part (``shared.*``, which DCP writes once); the module-level
functions that are not tests are the scenarios the rank processes run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as torch_dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

import fsprobe
from fsprobe.integrations import dcp
from fsprobe.redirect.areas import own_area
from fsprobe.redirect.manifest import read_manifest
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import FailedAttempt
from tests.support.crash import a_while_ago, leftovers
from tests.support.durability import assert_directory_saved
from tests.support.ranks import (
    DIED,
    assert_a_dead_rank_fails_the_save,
    finish,
    run_ranks,
    start_ranks,
)

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

REPO = Path(__file__).resolve().parents[2]
HERE = "tests.integrations.test_integration_dcp"
NUMEL = 64 * 1024  # 256 KiB per tensor


def rank_state(rank: int, seed: int, numel: int = NUMEL) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return {
        f"rank{rank}.weight": torch.randn(numel, generator=generator),
        f"rank{rank}.step": torch.tensor(seed),
        "shared.bias": torch.arange(16, dtype=torch.float32) * seed,
    }


def zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: torch.zeros_like(value) for key, value in state.items()}


def quick() -> Backoff:
    return Backoff(base=0.05, cap=0.2)


def save_state(
    rank: int,
    world_size: int,
    target: str,
    seed: int = 1,
    numel: int = NUMEL,
    fallback_dirs: tuple[str, ...] = (),
    plain: bool = False,
    die_in_write: bool = False,
) -> dict:
    """The scenario: every rank saves its state with `dcp.save` (or plain DCP + FsprobeWriter)."""
    state = rank_state(rank, seed, numel)
    if plain:
        writer = dcp.FsprobeWriter(target, backoff=quick())
        torch_dcp.save(state, storage_writer=writer)
        return {"result": dataclasses.asdict(writer.last_result) if writer.last_result else None}
    writer = _DyingWriter(target, backoff=quick(), fallback_dirs=fallback_dirs)
    writer.die = die_in_write and rank == 1
    return {"result": dataclasses.asdict(dcp.save(state, target, writer=writer))}


class _DyingWriter(dcp.FsprobeWriter):
    """Dies (as after an OOM kill) when told to, in the middle of the write phase."""

    die = False

    def write_data(self, plan, planner):
        if self.die:
            os._exit(DIED)
        return super().write_data(plan, planner)


def load_state(
    rank: int, world_size: int, target: str, seed: int, fallback_dirs: tuple[str, ...] = ()
) -> dict:
    """The scenario: every rank loads its state and compares it with what was saved."""
    expected = rank_state(rank, seed)
    loaded = zeros_like(expected)
    where = dcp.load(loaded, target, fallback_dirs=fallback_dirs)
    equal = all(torch.equal(loaded[key], expected[key]) for key in expected)
    return {"where": where, "equal": equal}


def async_save_state(rank: int, world_size: int, target: str, seed: int) -> dict:
    """The scenario: `async_save`, then the state changes in place before the save ends."""
    state = rank_state(rank, seed)
    future = dcp.async_save(state, target, backoff=quick())
    for tensor in state.values():
        tensor.add_(1)  # the optimizer's next step: must not reach the checkpoint
    return {"result": dataclasses.asdict(future.result(timeout=60))}


def all_ranks_state(world_size: int, seed: int) -> dict[str, torch.Tensor]:
    """What every rank saved, together: the state one process loads a checkpoint into."""
    state: dict[str, torch.Tensor] = {}
    for rank in range(world_size):
        state.update(rank_state(rank, seed))
    return state


def assert_loads(target: Path, world_size: int, seed: int, fallback_dirs=()) -> str:
    """Load the checkpoint of `world_size` ranks here, in one process; returns where from."""
    expected = all_ranks_state(world_size, seed)
    loaded = zeros_like(expected)
    where = dcp.load(loaded, target, fallback_dirs=fallback_dirs)
    assert all(torch.equal(loaded[key], expected[key]) for key in expected)
    return where


def previous_checkpoint(target: Path, world_size: int, seed: int) -> None:
    """What an earlier run saved at `target` (here, in one process, to save time)."""
    dcp.save(all_ranks_state(world_size, seed), target)


def checkpoint_files(directory: Path, world_size: int) -> list[str]:
    return sorted([".metadata", *(f"__{r}_0.distcp" for r in range(world_size))])


def test_save_and_load_round_trip_with_two_ranks(tmp_path):
    target = tmp_path / "step-10"
    saved = run_ranks(f"{HERE}:save_state", 2, tmp_path, target=str(target))
    assert saved[0].value == saved[1].value
    result = saved[0].value["result"]
    assert (result["path"], result["attempts"], result["redirected"]) == (str(target), 1, False)
    assert sorted(os.listdir(target)) == checkpoint_files(target, 2)
    assert result["bytes"] == sum(p.stat().st_size for p in target.iterdir())
    assert leftovers(tmp_path) == []
    loaded = run_ranks(f"{HERE}:load_state", 2, tmp_path, target=str(target), seed=1)
    assert [r.value for r in loaded] == [{"where": str(target), "equal": True}] * 2


def test_plain_dcp_save_with_the_writer_commits_only_in_finish(tmp_path):
    target = tmp_path / "step-10"
    saved = run_ranks(f"{HERE}:save_state", 2, tmp_path, target=str(target), plain=True)
    assert saved[0].value["result"]["path"] == str(target)
    assert saved[1].value["result"] is None  # the result is the coordinator's
    assert sorted(os.listdir(target)) == checkpoint_files(target, 2)
    assert assert_loads(target, 2, seed=1) == str(target)


def test_a_write_failing_once_on_each_rank_is_retried_per_file_and_commits(faultfs):
    target = faultfs.mountpoint / "step-10"
    eio = faultfs.ctl.fail("write", "EIO", path="*/__1_0.distcp", sticky=True)
    estale = faultfs.ctl.fail("write", "ESTALE", path="*/__0_0.distcp", sticky=True)
    faultfs.ctl.clear_journal()
    saved = run_ranks(f"{HERE}:save_state", 2, faultfs.mountpoint, target=str(target))
    assert_directory_saved(faultfs, target)  # shards, .metadata, directory, rename, parent
    assert (faultfs.ctl.rule(eio)["hits"], faultfs.ctl.rule(estale)["hits"]) == (1, 1)
    result = saved[0].value["result"]
    assert (result["attempts"], result["errors"]) == (1, [])  # retried per file, not whole
    assert "rank 1" in saved[1].errors and "failed at write with EIO" in saved[1].errors
    assert "rank 0" in saved[0].errors and "failed at write with ESTALE" in saved[0].errors
    faultfs.ctl.clear()
    assert_loads(target, 2, seed=1)
    assert leftovers(faultfs.backing) == []


def test_a_file_is_written_again_in_place_only_after_a_transient_error():
    """`retried_in_place`, a file of a rank: a transient failure is written again until the
    attempts are spent, anything else fails the attempt it is part of at once."""
    options = fsprobe.SaveOptions(attempts=3, backoff=Backoff(sleep=lambda seconds: None))

    def writes(*errnos: str) -> list[str]:
        """The errnos of the writes made, each failing with the next of `errnos`, then not."""
        pending, made = list(errnos), []

        def write() -> str:
            made.append(pending[0] if pending else "ok")
            if pending:
                raise FailedAttempt(pending.pop(0), "write", "__1_0.distcp")
            return "written"

        try:
            assert dcp.retried_in_place(write, options, "__1_0.distcp") == "written"
        except FailedAttempt as failure:
            assert failure.errno == made[-1]
        return made

    assert writes("EIO", "ESTALE") == ["EIO", "ESTALE", "ok"]
    assert writes("ENOSPC") == ["ENOSPC"]
    assert writes("EIO", "EROFS", "EIO") == ["EIO", "EROFS"]
    assert writes("EIO", "EIO", "EIO", "EIO") == ["EIO", "EIO", "EIO"]  # the attempts spent


def test_a_file_out_of_room_is_not_written_again_the_whole_checkpoint_moves(faultfs, tmp_path):
    """Only a transient error is retried per file: ENOSPC under one rank's file fails the
    attempt at once, and the next one lands whole in the fallback, for every rank."""
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = faultfs.mountpoint / "step-10"
    enospc = faultfs.ctl.fail("write", "ENOSPC", path="*/__1_0.distcp", sticky=True)
    saved = run_ranks(
        f"{HERE}:save_state",
        2,
        faultfs.mountpoint,
        target=str(target),
        fallback_dirs=[str(fallback)],
    )
    result = saved[0].value["result"]
    assert saved[1].value["result"] == result
    assert (result["redirected"], result["attempts"], result["errors"]) == (True, 2, ["ENOSPC"])
    assert faultfs.ctl.rule(enospc)["hits"] == 1  # not written again in place
    assert not target.exists()
    faultfs.ctl.clear()
    assert assert_loads(target, 2, seed=1, fallback_dirs=[fallback]) == result["path"]
    assert leftovers(faultfs.backing) == []


def test_a_checkpoint_whose_shards_fit_but_not_the_whole_lands_whole_in_the_fallback(
    tmpfs, tmp_path
):
    """... is found there by `load`, and `fsprobe sync` brings it back whole once it fits."""
    target_fs = tmpfs(size="1M")  # each rank's 256 KiB shard fits, the four of them do not
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = target_fs.path / "step-10"
    saved = run_ranks(
        f"{HERE}:save_state", 4, tmp_path, target=str(target), fallback_dirs=[str(fallback)]
    )
    result = saved[0].value["result"]
    assert all(r.value["result"] == result for r in saved)
    assert result["redirected"] and result["errors"] == [] and result["attempts"] == 1
    assert os.listdir(target_fs.path) == []  # nothing of it at the target
    actual = Path(result["path"])
    area = own_area(str(fallback))  # this user's part of the fallback directory
    assert actual == Path(area.path) / str(target).lstrip("/")
    assert sorted(os.listdir(actual)) == checkpoint_files(actual, 4)
    [entry] = read_manifest(area)
    assert (entry.requested, entry.actual, entry.bytes) == (
        str(target),
        str(actual),
        result["bytes"],
    )
    assert assert_loads(target, 4, seed=1, fallback_dirs=[fallback]) == str(actual)
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == str(actual)

    subprocess.run(["mount", "-o", "remount,size=8M", str(target_fs.path)], check=True)
    synced = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(fallback)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert synced.returncode == 0, synced.stderr
    [outcome] = json.loads(synced.stdout)["entries"]
    assert outcome["action"] == "synced" and outcome["requested"] == str(target)
    assert os.listdir(target_fs.path) == ["step-10"]  # whole, and nothing else
    assert sorted(os.listdir(target)) == checkpoint_files(target, 4)
    assert not actual.exists() and read_manifest(area) == []
    assert assert_loads(target, 4, seed=1, fallback_dirs=[fallback]) == str(target)
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == str(target)


def test_every_rank_killed_mid_save_leaves_the_previous_checkpoint_and_the_next_cleans(faultfs):
    target = faultfs.mountpoint / "last"
    previous_checkpoint(target, 2, seed=1)
    faultfs.ctl.delay("write", 0.05, path="*.distcp")  # a slow server: the save takes seconds
    ranks = start_ranks(f"{HERE}:save_state", 2, faultfs.mountpoint, target=str(target), seed=2)
    try:
        deadline = time.monotonic() + 60
        while True:  # until the staging directory holds part of a shard
            staging = [faultfs.backing / n for n in leftovers(faultfs.backing)]
            shards = [f for s in staging for f in s.iterdir()] if staging else []
            if any(f.stat().st_size > 64 * 1024 for f in shards):
                break
            assert all(r.poll() is None for r in ranks), "a rank ended before it was killed"
            assert time.monotonic() < deadline, "the ranks never started writing"
            time.sleep(0.05)
        for rank in ranks:
            rank.send_signal(signal.SIGKILL)
    finally:
        results = finish(ranks, timeout=30)
    faultfs.ctl.clear()
    assert [r.returncode for r in results] == [-signal.SIGKILL] * 2
    [staging] = leftovers(faultfs.mountpoint)  # the killed save's staging directory
    assert_loads(target, 2, seed=1)
    a_while_ago(faultfs.mountpoint / staging)  # as the next save finds it, not at once

    run_ranks(f"{HERE}:save_state", 2, faultfs.mountpoint, target=str(target), seed=3)
    assert leftovers(faultfs.mountpoint) == []
    assert_loads(target, 2, seed=3)


def test_a_rank_dying_before_the_decision_fails_the_others_within_the_timeout(tmp_path):
    target = tmp_path / "last"
    assert_a_dead_rank_fails_the_save(f"{HERE}:save_state", tmp_path, target=str(target))
    assert not target.exists() and leftovers(tmp_path) == []


def test_async_save_writes_the_state_as_it_was_when_called(tmp_path):
    target = tmp_path / "step-10"
    saved = run_ranks(f"{HERE}:async_save_state", 2, tmp_path, target=str(target), seed=4)
    assert saved[0].value == saved[1].value and saved[0].value["result"]["path"] == str(target)
    assert_loads(target, 2, seed=4)


class _HeldPlanner(DefaultSavePlanner):
    """DCP's planner, held in the plan (in the background save's thread) until `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.held, self.release = threading.Event(), threading.Event()

    def create_local_plan(self):
        self.held.set()
        assert self.release.wait(120), "the test never released the save"
        return super().create_local_plan()


def test_wait_saves_waits_for_a_dcp_async_save_still_in_flight(tmp_path):
    """DCP's `async_save` runs on the writers of the default context, which
    `fsprobe.wait_saves()` waits for, as for `fsprobe.save_async`."""
    target = tmp_path / "step-5"
    planner = _HeldPlanner()
    try:
        future = dcp.async_save(all_ranks_state(1, seed=5), target, planner=planner)
        assert planner.held.wait(60), "the background save never started"
        with pytest.raises(concurrent.futures.TimeoutError, match=str(target)):
            fsprobe.wait_saves(0.5)  # held: it cannot be done, however long the wait
        assert not future.done() and not target.exists()
    finally:
        planner.release.set()
    fsprobe.wait_saves(120)
    assert future.done()
    assert future.result().path == str(target)
    assert assert_loads(target, 1, seed=5) == str(target)


def dcp_refusal(writer: torch_dcp.FileSystemWriter, state: dict) -> BaseException:
    """What `dcp.save` raised: DCP's CheckpointException, around the rank's own exception."""
    try:
        torch_dcp.save(state, storage_writer=writer)
    except CheckpointException as error:
        assert list(error.failures) == [0]
        return error.failures[0][0]
    raise AssertionError(f"{type(writer).__name__}(overwrite=False) saved over a checkpoint")


def test_overwrite_false_refuses_an_existing_checkpoint_as_dcp_does_before_writing(tmp_path):
    """FileSystemWriter's own refusal, word for word, and the checkpoint there untouched."""
    refusals = {}
    for kind in (torch_dcp.FileSystemWriter, dcp.FsprobeWriter):
        target = tmp_path / kind.__name__
        torch_dcp.save(rank_state(0, 1), storage_writer=kind(target))
        before = {p.name: p.read_bytes() for p in target.iterdir()}
        refusal = dcp_refusal(kind(target, overwrite=False), rank_state(0, 2))
        refusals[kind] = refusal
        assert {p.name: p.read_bytes() for p in target.iterdir()} == before
        assert leftovers(tmp_path) == []
    theirs, ours = refusals[torch_dcp.FileSystemWriter], refusals[dcp.FsprobeWriter]
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)
    assert "Checkpoint already exists and self.overwrite=False." in str(ours)
    # Through fsprobe's save too: DCP's own exception, not a retry.
    with pytest.raises(CheckpointException, match=r"Checkpoint already exists and self\.overwr"):
        dcp.save(rank_state(0, 2), tmp_path / "FsprobeWriter", overwrite=False)
    # A new checkpoint is written as ever.
    dcp.save(rank_state(0, 3), tmp_path / "new", overwrite=False)


def test_what_the_user_put_beside_the_checkpoint_is_carried_into_the_new_one(tmp_path):
    """Plain DCP writes into the existing directory and leaves other files alone; fsprobe
    publishes a fresh one and carries them over (files, a directory, a symlink), while DCP's
    own files of the old checkpoint are replaced."""
    target = tmp_path / "latest"
    previous_checkpoint(target, 1, seed=1)
    (target / "notes.txt").write_text("lr 3e-4, warmup 100\n")
    os.chmod(target / "notes.txt", 0o640)
    (target / "config").mkdir()
    (target / "config" / "model.yaml").write_text("layers: 2\n")
    (target / "run.log").symlink_to("/var/log/nowhere")
    (target / "__5_0.distcp").write_bytes(b"a shard of a run with more ranks")
    dcp.save(all_ranks_state(1, seed=2), target)
    assert sorted(os.listdir(target)) == [
        ".metadata",
        "__0_0.distcp",
        "config",
        "notes.txt",
        "run.log",
    ]
    assert (target / "notes.txt").read_text() == "lr 3e-4, warmup 100\n"
    assert (target / "notes.txt").stat().st_mode & 0o777 == 0o640
    assert (target / "config" / "model.yaml").read_text() == "layers: 2\n"
    assert os.readlink(target / "run.log") == "/var/log/nowhere"
    assert assert_loads(target, 1, seed=2) == str(target)
    assert leftovers(tmp_path) == []


def test_an_entry_that_cannot_be_carried_fails_the_save_naming_it(tmp_path):
    target = tmp_path / "latest"
    previous_checkpoint(target, 1, seed=1)
    os.mkfifo(target / "control")
    with pytest.raises(fsprobe.SaveError) as raised:
        dcp.save(all_ranks_state(1, seed=2), target, attempts=1)
    assert [(a.errno, a.step) for a in raised.value.attempts] == [("EPERM", "carry")]
    assert "control in the checkpoint is neither" in raised.value.attempts[0].message
    assert_loads(target, 1, seed=1)  # the old checkpoint, untouched
    assert (target / "control").exists()
    assert leftovers(tmp_path) == []


def test_a_collective_that_fails_for_its_own_cause_names_it_first(tmp_path):
    """torch.distributed's object collectives need numpy (the receiving rank unpickles from
    ``tensor.numpy()``); without it the save's broadcast fails on the rank that receives, and
    its error says so first, a dead rank only as a possibility."""
    hidden = tmp_path / "no-numpy"
    (hidden / "numpy").mkdir(parents=True)
    (hidden / "numpy" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named numpy (hidden by a test)", name="numpy")\n'
    )
    target = tmp_path / "step-10"
    ranks = start_ranks(
        f"{HERE}:save_state",
        2,
        tmp_path,
        # Bounds a hang only: the other rank must see the coordinator's exit (a closed
        # connection), not its own timeout, however slowly a loaded machine tears it down.
        collective_timeout=90.0,
        first_on_path=hidden,
        target=str(target),
    )
    coordinator, other = finish(ranks, timeout=180)
    for rank in (coordinator, other):
        assert rank.returncode == 1 and rank.raised["type"] == "SaveError", rank.errors[-2000:]
        assert "another rank died" not in rank.raised["message"]
    # The coordinator gathers the plans: its own cause first, the install that fixes it.
    message = coordinator.raised["message"]
    assert "failed: Numpy is not available (torch.distributed's object collectives" in message
    assert message.index("Numpy is not available") < message.index("another rank may have died")
    # The other rank saw the coordinator go: a lost connection, and it says so first.
    assert "Connection closed by peer" in other.raised["message"]
    assert not target.exists() and leftovers(tmp_path) == []


def test_the_torch_extra_installs_what_the_object_collectives_need():
    """fsprobe's ``torch`` extra must bring numpy (the test above shows why)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(r.startswith("numpy") for r in extras["torch"])
