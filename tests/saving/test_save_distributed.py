"""`fsprobe.distributed.save_dir`: one directory written by every rank, committed once, in real
processes joined by gloo (tests.support.ranks), on real filesystems that fail for real.

The module-level functions that are not tests are the scenarios the rank processes run.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
import torch

import fsprobe.distributed
from fsprobe.redirect.areas import own_area
from fsprobe.redirect.manifest import read_manifest
from fsprobe.saving.options import Backoff
from tests.support.crash import leftovers
from tests.support.durability import assert_directory_saved
from tests.support.ranks import (
    DIED,
    RankResult,
    assert_a_dead_rank_fails_the_save,
    finish,
    run_ranks,
    start_ranks,
)

pytestmark = pytest.mark.slow  # a framework, ranks or a server: the full run only

HERE = "tests.saving.test_save_distributed"
#: A shard of 64 Ki floats: 256 KiB of tensor data, a little more on disk.
SHARD_NUMEL = 64 * 1024


def shard(rank: int, seed: int, numel: int = SHARD_NUMEL) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(numel, generator=generator)


def save_shards(
    rank: int,
    world_size: int,
    target: str,
    seed: int = 1,
    numel: int = SHARD_NUMEL,
    need_bytes: int | None = None,
    fallback_dirs: tuple[str, ...] = (),
    die_in_write: bool = False,
    bug_in_write: bool = False,
    save_timeout: float | None = None,
    done: str | None = None,
) -> dict:
    """The scenario: every rank writes ``shard-<rank>.pt`` through a Python file object."""

    def write(staging: str) -> list[str]:
        if die_in_write and rank == 1:
            os._exit(DIED)  # a rank lost before the collective decision (OOM, node failure)
        if bug_in_write and rank == 1:
            raise ValueError("a bug on rank 1")
        path = os.path.join(staging, f"shard-{rank}.pt")
        with open(path, "wb") as stream:
            torch.save({"rank": rank, "shard": shard(rank, seed, numel)}, stream)
        return [path]

    try:
        result = fsprobe.distributed.save_dir(
            target,
            write,
            need_bytes=need_bytes,
            fallback_dirs=fallback_dirs,
            backoff=Backoff(base=0.05, cap=0.2),
            save_timeout=save_timeout,
        )
    finally:
        if done is not None:  # the save has returned on this rank (it may not exit yet)
            Path(f"{done}.{rank}").touch()
    return dataclasses.asdict(result)


def assert_shards(directory: Path, world_size: int, seed: int) -> None:
    assert sorted(os.listdir(directory)) == [f"shard-{r}.pt" for r in range(world_size)]
    for rank in range(world_size):
        loaded = torch.load(directory / f"shard-{rank}.pt")
        assert loaded["rank"] == rank and torch.equal(loaded["shard"], shard(rank, seed))


def previous_checkpoint(target: Path, world_size: int, seed: int) -> None:
    """What an earlier run saved at `target` (written here, in one process, to save time)."""

    def write(staging: str) -> None:
        for rank in range(world_size):
            torch.save(
                {"rank": rank, "shard": shard(rank, seed)},
                os.path.join(staging, f"shard-{rank}.pt"),
            )

    fsprobe.save_dir(target, write)


def test_two_ranks_commit_one_directory_and_agree_on_the_result(tmp_path):
    target = tmp_path / "step-10"
    results = run_ranks(f"{HERE}:save_shards", 2, tmp_path, target=str(target))
    assert results[0].value == results[1].value
    result = results[0].value
    assert (result["path"], result["attempts"], result["errors"]) == (str(target), 1, [])
    assert result["bytes"] == sum(p.stat().st_size for p in target.iterdir())
    assert_shards(target, 2, seed=1)
    assert leftovers(tmp_path) == []


def test_four_ranks_replace_the_previous_checkpoint_whole(tmp_path):
    target = tmp_path / "last"
    previous_checkpoint(target, 4, seed=1)
    run_ranks(f"{HERE}:save_shards", 4, tmp_path, target=str(target), seed=2)
    assert_shards(target, 4, seed=2)
    assert leftovers(tmp_path) == []


def test_one_ranks_write_failing_once_makes_every_rank_retry_and_it_commits(faultfs):
    target = faultfs.mountpoint / "step-10"
    rule = faultfs.ctl.fail("write", "EIO", path="*/shard-1.pt", sticky=True)
    faultfs.ctl.clear_journal()
    results = run_ranks(f"{HERE}:save_shards", 2, faultfs.mountpoint, target=str(target))
    assert_directory_saved(faultfs, target)  # each rank's fsync, then the coordinator's
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert [(r.value["attempts"], r.value["errors"]) for r in results] == [(2, ["EIO"])] * 2
    assert_shards(target, 2, seed=1)
    assert leftovers(faultfs.backing) == []


def test_a_need_summed_over_ranks_sends_the_whole_checkpoint_to_the_fallback(tmpfs, tmp_path):
    """Each shard fits in the target, both do not: the one preflight sees the sum."""
    target_fs = tmpfs(size="512k")
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = target_fs.path / "step-10"
    results = run_ranks(
        f"{HERE}:save_shards",
        2,
        tmp_path,
        target=str(target),
        need_bytes=300 * 1024,  # each rank's own share
        fallback_dirs=[str(fallback)],
    )
    result = results[0].value
    assert results[1].value == result
    assert result["redirected"] and result["errors"] == [] and result["attempts"] == 1
    assert os.listdir(target_fs.path) == []  # nothing of it at the target
    actual = Path(result["path"])
    area = own_area(str(fallback))  # this user's part of the fallback directory
    assert actual == Path(area.path) / str(target).lstrip("/")
    assert_shards(actual, 2, seed=1)
    [entry] = read_manifest(area)
    assert (entry.requested, entry.actual, entry.bytes) == (
        str(target),
        str(actual),
        result["bytes"],
    )


def test_enospc_on_one_rank_redirects_every_rank_together(tmpfs, tmp_path):
    """No need known in advance: the writes find out, and all ranks move to the fallback."""
    target_fs = tmpfs(size="512k")
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = target_fs.path / "step-10"
    results = run_ranks(
        f"{HERE}:save_shards", 2, tmp_path, target=str(target), fallback_dirs=[str(fallback)]
    )
    result = results[0].value
    assert results[1].value == result
    assert result["redirected"] and result["errors"] == ["ENOSPC"] and result["attempts"] == 2
    assert os.listdir(target_fs.path) == []
    assert_shards(Path(result["path"]), 2, seed=1)


def test_a_rank_dying_before_the_decision_fails_the_others_clearly_and_publishes_nothing(
    tmp_path,
):
    target = tmp_path / "last"
    previous_checkpoint(target, 2, seed=1)
    assert_a_dead_rank_fails_the_save(f"{HERE}:save_shards", tmp_path, target=str(target), seed=2)
    assert_shards(target, 2, seed=1)
    assert leftovers(tmp_path) == []  # the coordinator removed its staging directory


def test_a_bug_on_one_rank_is_raised_on_every_rank_and_nothing_is_published(tmp_path):
    target = tmp_path / "last"
    ranks = start_ranks(f"{HERE}:save_shards", 2, tmp_path, target=str(target), bug_in_write=True)
    rank0, rank1 = finish(ranks)
    assert (rank1.raised["type"], rank1.raised["message"]) == ("ValueError", "a bug on rank 1")
    assert rank0.raised["type"] == "RuntimeError" and "a bug on rank 1" in rank0.raised["message"]
    assert not target.exists() and leftovers(tmp_path) == []


#: The deadline of the held-fsync tests (the rank's `save_timeout`).
DEADLINE = 2.0


def held_on_rank_1(faultfs, workdir: Path, **args) -> list[RankResult]:
    """Two ranks save while the filesystem holds rank 1's fsync of its shard.

    The hold is released once the save has returned on both ranks: a process with a thread
    asleep in the kernel cannot exit, so the ranks end after the release.
    """
    done = workdir / "done"
    rule = faultfs.ctl.block("fsync", path="/.fsprobe~*/shard-1.pt")
    ranks = start_ranks(
        f"{HERE}:save_shards", 2, workdir, save_timeout=DEADLINE, done=str(done), **args
    )
    try:
        deadline = time.monotonic() + 90
        while not all(Path(f"{done}.{rank}").exists() for rank in range(2)):
            if time.monotonic() > deadline or any(r.poll() is not None for r in ranks):
                break
            time.sleep(0.05)
    finally:
        faultfs.ctl.remove(rule)
    results = finish(ranks, timeout=60)
    for result in results:
        assert Path(f"{done}.{result.rank}").exists(), f"rank {result.rank} held:\n{result.errors}"
    return results


def wait_until_nothing_left(directory: Path, timeout: float = 30.0) -> None:
    """Until the held attempt, released, is gone from `directory` (its staging removed)."""
    deadline = time.monotonic() + timeout
    while leftovers(directory):
        assert time.monotonic() < deadline, f"left in {directory}: {leftovers(directory)}"
        time.sleep(0.05)


def test_an_fsync_held_past_save_timeout_on_one_rank_moves_every_rank_to_the_fallback(
    faultfs, tmp_path
):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = faultfs.mountpoint / "step-10"
    results = held_on_rank_1(faultfs, tmp_path, target=str(target), fallback_dirs=[str(fallback)])
    for result in results:
        assert result.returncode == 0, f"rank {result.rank} failed:\n{result.errors[-4000:]}"
    result = results[0].value
    assert results[1].value == result
    assert result["redirected"] and result["errors"] == ["TIMEOUT"] and result["attempts"] == 2
    assert_shards(Path(result["path"]), 2, seed=1)
    wait_until_nothing_left(faultfs.mountpoint)
    assert not target.exists()  # the held attempt published nothing


@pytest.mark.parametrize("previous", [False, True])
def test_an_fsync_held_past_save_timeout_without_a_fallback_fails_every_rank(
    faultfs, tmp_path, previous
):
    target = faultfs.mountpoint / "last"
    if previous:
        previous_checkpoint(target, 2, seed=1)
    results = held_on_rank_1(faultfs, tmp_path, target=str(target), seed=2)
    for result in results:
        assert result.returncode == 1 and result.raised["type"] == "SaveError"
        assert [a[:2] for a in result.raised["attempts"]] == [["TIMEOUT", "fsync"]]
        assert "rank 1" in result.raised["attempts"][0][2]
    wait_until_nothing_left(faultfs.mountpoint)
    if previous:
        assert_shards(target, 2, seed=1)  # the held attempt replaced nothing
    else:
        assert not target.exists()
