"""`fsprobe.save_dir`: a checkpoint directory committed whole or not at all, on real filesystems
(a local directory, tmpfs with RENAME_EXCHANGE, the FUSE fault filesystem without it)."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import fsprobe
from fsprobe.posix.atomic import parse_temp_name, temp_name
from fsprobe.posix.swap import exchange, parse_retired_name
from fsprobe.posix.tree import digest_tree, open_directory, opened
from fsprobe.redirect.areas import own_area
from fsprobe.redirect.manifest import read_manifest
from fsprobe.saving.context import SaveContext
from fsprobe.saving.options import Backoff
from tests.support.capability import need_module
from tests.support.crash import a_while_ago, killed_mid_save, leftovers
from tests.support.durability import assert_directory_saved
from tests.support.tmpfs import fill_bytes

REPO = Path(__file__).resolve().parents[2]


def quick(sleeps: list[float] | None = None) -> Backoff:
    return Backoff(sleep=(sleeps if sleeps is not None else []).append)


def model_state(seed: int, width: int = 256) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.Linear(width, 8)
    ).state_dict()


def save(obj: object, path: str) -> None:
    """torch.save through a Python file object, so that a failed write keeps its errno (torch's
    own C++ writer, given a path, reports every failure as "file write failed")."""
    with open(path, "wb") as stream:
        torch.save(obj, stream)


def checkpoint_writer(seed: int, shards: int = 3, calls: list[str] | None = None):
    """A writer like a sharded trainer's: one torch file per shard, a sub-directory, a JSON."""

    def write(staging: str) -> None:
        if calls is not None:
            calls.append(staging)
        os.mkdir(os.path.join(staging, "optim"))
        for shard in range(shards):
            save(model_state(seed + shard), os.path.join(staging, f"model-{shard}.pt"))
        save({"step": seed}, os.path.join(staging, "optim", "state.pt"))
        with open(os.path.join(staging, "meta.json"), "w") as stream:
            json.dump({"seed": seed, "shards": shards}, stream)

    return write


def assert_checkpoint(directory: Path, seed: int, shards: int = 3) -> None:
    """The directory holds exactly the checkpoint written with `seed`, every file loading."""
    expected = {f"model-{i}.pt" for i in range(shards)} | {"optim", "meta.json"}
    assert set(os.listdir(directory)) == expected
    for shard in range(shards):
        loaded = torch.load(directory / f"model-{shard}.pt")
        original = model_state(seed + shard)
        assert all(torch.equal(loaded[k], original[k]) for k in original)
    assert torch.load(directory / "optim" / "state.pt") == {"step": seed}
    assert json.loads((directory / "meta.json").read_text()) == {"seed": seed, "shards": shards}


def test_a_directory_is_published_whole_and_nothing_else_is_left(tmp_path):
    result = fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(1))
    assert_checkpoint(tmp_path / "ckpt", 1)
    assert result.path == result.requested_path == str(tmp_path / "ckpt")
    assert (result.attempts, result.errors, result.redirected) == (1, (), False)
    sizes = [p.stat().st_size for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert result.bytes == sum(sizes) > 0
    assert os.listdir(tmp_path) == ["ckpt"]


def test_staging_is_hidden_beside_the_target_closed_to_others_and_gets_the_umask_mode(tmp_path):
    seen = {}

    def write(staging: str) -> None:
        seen["staging"] = staging
        seen["listing"] = os.listdir(tmp_path)
        seen["mode"] = stat.S_IMODE(os.stat(staging).st_mode)
        seen["final_exists"] = (tmp_path / "ckpt").exists()
        Path(staging, "weights.pt").write_bytes(b"w" * 1000)

    old = os.umask(0o002)  # a group-writable umask: the staging dir must not be, while staging
    try:
        fsprobe.save_dir(tmp_path / "ckpt", write)
    finally:
        os.umask(old)
    name = os.path.basename(seen["staging"])
    assert os.path.dirname(seen["staging"]) == str(tmp_path) and seen["listing"] == [name]
    assert parse_temp_name(name).base == "ckpt" and parse_temp_name(name).pid == os.getpid()
    assert name.startswith(".") and name.endswith(".tmp")
    assert seen["mode"] == 0o700 and not seen["final_exists"]
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt").st_mode) == 0o775  # what mkdir gives
    assert (tmp_path / "ckpt" / "weights.pt").read_bytes() == b"w" * 1000


def test_exchange_swaps_two_directories_on_tmpfs_and_is_refused_by_the_fault_fs(tmpfs, faultfs):
    for root, supported in ((tmpfs(size="1M").path, True), (faultfs.mountpoint, False)):
        (root / "a").mkdir()
        (root / "a" / "1").write_text("one")
        (root / "b").mkdir()
        (root / "b" / "2").write_text("two")
        with opened(os.open(root, os.O_RDONLY | os.O_DIRECTORY)) as fd:
            assert exchange(fd, "a", "b") is supported
        assert os.listdir(root / "a") == (["2"] if supported else ["1"])
        assert os.listdir(root / "b") == (["1"] if supported else ["2"])


@pytest.mark.parametrize("where", ["tmpfs", "faultfs"])  # exchange, and two renames
def test_an_existing_checkpoint_is_replaced_only_by_a_complete_one(where, tmpfs, faultfs):
    root = tmpfs(size="16M").path if where == "tmpfs" else faultfs.mountpoint
    fsprobe.save_dir(root / "ckpt", checkpoint_writer(1))
    seen = {}

    def write(staging: str) -> None:
        checkpoint_writer(2)(staging)
        seen["during"] = sorted(os.listdir(root / "ckpt"))  # the old one, untouched

    result = fsprobe.save_dir(root / "ckpt", write)
    assert seen["during"] == ["meta.json", "model-0.pt", "model-1.pt", "model-2.pt", "optim"]
    assert result.attempts == 1
    assert_checkpoint(root / "ckpt", 2)
    assert os.listdir(root) == ["ckpt"]


def test_a_failure_in_the_middle_publishes_nothing_leaves_nothing_and_is_retried(faultfs):
    target = faultfs.mountpoint / "ckpt"
    # The first write to the 2nd shard fails (and its handle stays broken, as after a real EIO).
    rule = faultfs.ctl.fail("write", "EIO", path="*/model-1.pt", sticky=True)
    calls: list[str] = []
    seen: list[bool] = []
    sleeps: list[float] = []

    def write(staging: str) -> None:
        seen.append(target.exists())
        checkpoint_writer(1, calls=calls)(staging)

    faultfs.ctl.clear_journal()
    result = fsprobe.save_dir(target, write, backoff=quick(sleeps))
    assert_directory_saved(faultfs, target)  # the attempt that counts
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert (result.attempts, result.errors) == (2, ("EIO",)) and len(sleeps) == 1
    assert seen == [False, False]  # nothing published by the failed attempt
    assert len(set(calls)) == 2  # a fresh staging directory for the retry
    assert_checkpoint(target, 1)
    assert leftovers(faultfs.backing) == [] and os.listdir(faultfs.backing) == ["ckpt"]


def test_every_file_and_directory_is_fsynced_before_the_rename_and_the_parent_after(faultfs):
    parent = faultfs.mountpoint / "run"
    parent.mkdir()
    fsprobe.save_dir(parent / "ckpt", checkpoint_writer(1))  # so the next save replaces one
    faultfs.ctl.reset_counts()
    rename = faultfs.ctl.block("rename", path="/run/ckpt")
    at_rename = {}

    def watch() -> None:
        faultfs.ctl.wait_blocked(rename, timeout=60)
        at_rename.update(faultfs.ctl.counts())
        faultfs.ctl.remove(rename)

    watcher = threading.Thread(target=watch)
    watcher.start()
    faultfs.ctl.clear_journal()
    try:
        fsprobe.save_dir(parent / "ckpt", checkpoint_writer(2))
    finally:
        watcher.join(timeout=60)
    assert_directory_saved(faultfs, parent / "ckpt")  # and in that order
    after = faultfs.ctl.counts()
    # 5 files (3 shards, optim/state.pt, meta.json); 2 directories (the staging dir, optim).
    assert (at_rename.get("fsync"), at_rename.get("fsyncdir")) == (5, 2)
    assert (after.get("fsync"), after.get("fsyncdir")) == (5, 3)  # + the parent, after
    assert_checkpoint(parent / "ckpt", 2)


def test_every_attempt_failing_keeps_the_previous_checkpoint_and_leaves_nothing(faultfs):
    target = faultfs.mountpoint / "ckpt"
    fsprobe.save_dir(target, checkpoint_writer(1))
    faultfs.ctl.fail("fsync", "EIO", path="*/meta.json", times=None)
    sleeps: list[float] = []
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.save_dir(target, checkpoint_writer(2), attempts=3, backoff=quick(sleeps))
    assert [(a.errno, a.step) for a in raised.value.attempts] == [("EIO", "fsync")] * 3
    assert raised.value.errno == errno.EIO and len(sleeps) == 2
    faultfs.ctl.clear()
    assert_checkpoint(target, 1)
    assert os.listdir(faultfs.backing) == ["ckpt"]


def test_a_failing_publish_puts_the_previous_checkpoint_back(faultfs):
    """Without RENAME_EXCHANGE the old checkpoint is retired first; if the new one then cannot
    be renamed into place, the old one is renamed back."""
    target = faultfs.mountpoint / "ckpt"
    fsprobe.save_dir(target, checkpoint_writer(1))
    # The 1st rename matching is the refused exchange, the 2nd retires the old checkpoint,
    # the 3rd (the new one into place) fails; the 4th puts the old one back.
    faultfs.ctl.fail("rename", "EIO", path="/ckpt", after=2, times=1)
    with pytest.raises(fsprobe.SaveError) as raised:
        fsprobe.save_dir(target, checkpoint_writer(2), attempts=1)
    assert [(a.errno, a.step) for a in raised.value.attempts] == [("EIO", "rename")]
    assert_checkpoint(target, 1)
    assert os.listdir(faultfs.backing) == ["ckpt"]


def test_a_bug_in_the_writer_is_raised_as_it_is_and_the_staging_dir_removed(tmp_path):
    sleeps: list[float] = []

    def write(staging: str) -> None:
        Path(staging, "half.pt").write_bytes(b"half")
        raise pickle.PicklingError("cannot pickle a lambda")

    with pytest.raises(pickle.PicklingError):
        fsprobe.save_dir(tmp_path / "ckpt", write, backoff=quick(sleeps))
    assert sleeps == [] and os.listdir(tmp_path) == []


def test_unsynced_save_still_publishes_whole(tmp_path):
    result = fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(1), fsync=False)
    assert_checkpoint(tmp_path / "ckpt", 1)
    assert result.bytes > 0


_SAVER = """
import os, sys, torch, fsprobe
torch.manual_seed(2)
def write(staging):
    for shard in range(8):
        torch.save({"w": torch.randn(256 * 1024)}, os.path.join(staging, f"shard-{shard}.pt"))
        print("shard", shard, flush=True)
fsprobe.save_dir(sys.argv[1], write)
print("saved", flush=True)
"""


def test_saver_killed_mid_save_leaves_the_previous_checkpoint_and_the_next_save_cleans(faultfs):
    target = faultfs.mountpoint / "ckpt"
    fsprobe.save_dir(target, checkpoint_writer(1))
    faultfs.ctl.delay("write", 0.02, path="*/shard-*")  # a slow server: the save takes seconds
    with killed_mid_save(_SAVER, str(target)) as saver:
        assert saver.stdout.readline().split() == ["shard", "0"]
        assert saver.stdout.readline().split() == ["shard", "1"]
    faultfs.ctl.clear()
    [staging] = leftovers(faultfs.mountpoint)
    assert parse_temp_name(staging).pid == saver.pid
    assert len(os.listdir(faultfs.mountpoint / staging)) >= 2  # half a checkpoint
    assert_checkpoint(target, 1)
    a_while_ago(faultfs.mountpoint / staging)

    fsprobe.save_dir(target, checkpoint_writer(3), context=SaveContext())  # the job restarted
    assert_checkpoint(target, 3)
    assert os.listdir(faultfs.mountpoint) == ["ckpt"]


_RETIRE_AND_DIE = """
import os, sys
from fsprobe.posix.swap import retired_name
os.chdir(sys.argv[1])
os.rename("ckpt", retired_name("ckpt"))  # the first of the two renames, then a crash
os._exit(0)
"""


def test_a_crash_between_the_two_renames_is_repaired_by_the_next_save(faultfs):
    target = faultfs.mountpoint / "ckpt"
    fsprobe.save_dir(target, checkpoint_writer(1))
    subprocess.run(
        [sys.executable, "-c", _RETIRE_AND_DIE, str(faultfs.mountpoint)], cwd=REPO, check=True
    )
    [retired] = leftovers(faultfs.mountpoint)
    assert not target.exists() and parse_retired_name(retired)[1] == "ckpt"
    a_while_ago(faultfs.mountpoint / retired)

    def write(staging: str) -> None:  # the cleanup before the attempt put the old one back
        seen.append(sorted(os.listdir(faultfs.mountpoint)))
        checkpoint_writer(2)(staging)

    seen: list[list[str]] = []
    fsprobe.save_dir(target, write, context=SaveContext())  # the job restarted
    assert [n for n in seen[0] if not parse_temp_name(n)] == ["ckpt"]  # restored, not retired
    assert_checkpoint(target, 2)
    assert os.listdir(faultfs.mountpoint) == ["ckpt"]


def test_a_retired_checkpoint_replaced_before_the_crash_is_removed(tmp_path):
    fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(1))
    subprocess.run([sys.executable, "-c", _RETIRE_AND_DIE, str(tmp_path)], cwd=REPO, check=True)
    a_while_ago(*(tmp_path / name for name in leftovers(tmp_path)))
    restarted = SaveContext()  # the job, restarted after the crash
    fsprobe.save_dir(tmp_path / "other", checkpoint_writer(5), context=restarted)
    assert_checkpoint(tmp_path / "ckpt", 1)  # restored, untouched
    subprocess.run([sys.executable, "-c", _RETIRE_AND_DIE, str(tmp_path)], cwd=REPO, check=True)
    a_while_ago(*(tmp_path / name for name in leftovers(tmp_path)))
    (tmp_path / "ckpt").mkdir()  # the new one made it into place before the crash
    fsprobe.save_dir(tmp_path / "other", checkpoint_writer(6), context=SaveContext())
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "other"]
    assert os.listdir(tmp_path / "ckpt") == []


def test_a_live_or_foreign_recent_staging_dir_is_kept(tmp_path):
    live = tmp_path / temp_name("ckpt")  # this process: alive
    live.mkdir()
    foreign = tmp_path / temp_name("ckpt").replace(
        f"~{os.uname().nodename.split('.')[0]}~", "~otherhost~", 1
    )
    foreign.mkdir()
    (foreign / "shard.pt").write_bytes(b"being written")  # recently, from another host
    hour_ago = time.time() - 7200
    os.utime(foreign, (hour_ago, hour_ago))  # the directory itself looks old
    fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(1))
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt", live.name, foreign.name])
    os.utime(foreign / "shard.pt", (hour_ago, hour_ago))  # now nothing was written for 2 h
    fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(2))  # cleaned already: kept
    assert foreign.exists()
    fsprobe.save_dir(tmp_path / "ckpt", checkpoint_writer(3), context=SaveContext())
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt", live.name])


def test_a_full_target_redirects_the_whole_directory_and_the_manifest_records_it(tmpfs, tmp_path):
    target_fs = tmpfs(size="256k")
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = target_fs.path / "ckpt"
    result = fsprobe.save_dir(
        target, checkpoint_writer(1), fallback_dirs=[fallback], backoff=quick()
    )
    assert result.redirected and result.errors == ("ENOSPC",)
    assert os.listdir(target_fs.path) == []  # nothing of it at the target
    actual = Path(result.path)
    area = own_area(str(fallback))
    assert actual == Path(area.path) / str(target).lstrip("/")
    assert_checkpoint(actual, 1)
    [entry] = read_manifest(area)
    assert (entry.requested, entry.actual, entry.bytes) == (str(target), str(actual), result.bytes)
    with opened(open_directory(str(actual))) as fd:
        files = digest_tree(fd)
    assert set(files) == {"meta.json", "model-0.pt", "model-1.pt", "model-2.pt", "optim/state.pt"}
    assert leftovers(actual.parent) == []


def test_a_failed_write_of_a_writer_in_rust_is_retried_with_its_errno(faultfs):
    """safetensors (Rust) raises SafetensorError, no OSError, no errno attribute: the errno is
    only in its message, "... (os error 5)". It is still an I/O failure, so it is retried."""
    safetensors_torch = need_module("safetensors.torch")
    tensors = model_state(1)
    faultfs.ctl.fail("write", "EIO", path="/.fsprobe~*ckpt.tmp/*", sticky=True)

    def write(staging: str) -> None:
        safetensors_torch.save_file(tensors, os.path.join(staging, "model.safetensors"))

    result = fsprobe.save_dir(faultfs.mountpoint / "ckpt", write, backoff=quick())
    assert (result.attempts, result.errors) == (2, ("EIO",))
    loaded = safetensors_torch.load_file(faultfs.mountpoint / "ckpt" / "model.safetensors")
    assert all(torch.equal(loaded[key], value) for key, value in tensors.items())


def test_a_directory_save_stuck_in_fsync_goes_to_the_fallback_at_its_deadline(faultfs, tmp_path):
    target = faultfs.mountpoint / "ckpt"
    fsprobe.save_dir(target, checkpoint_writer(1))
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    rule = faultfs.ctl.block("fsync", path="/.fsprobe~*/*")  # every file of a staging dir
    start = time.monotonic()
    try:
        result = fsprobe.save_dir(
            target, checkpoint_writer(2), fallback_dirs=[fallback], save_timeout=2.0
        )
        elapsed = time.monotonic() - start
    finally:
        faultfs.ctl.remove(rule)  # the abandoned attempt goes on: it must publish nothing
    assert result.redirected and result.errors == ("TIMEOUT",) and result.attempts == 2
    assert elapsed < 2.0 + 20  # the deadline, and a busy machine's slack
    assert_checkpoint(Path(result.path), 2)
    deadline = time.monotonic() + 30
    while leftovers(faultfs.mountpoint):  # until the released attempt has cleaned up
        assert time.monotonic() < deadline, "the abandoned attempt left its staging directory"
        time.sleep(0.05)
    assert_checkpoint(target, 1)
    with pytest.raises(ValueError, match="save_timeout"):
        fsprobe.save_dir(target, checkpoint_writer(3), save_timeout=0)


def test_torch_writing_to_a_path_on_a_full_target_is_redirected_as_enospc(tmpfs, tmp_path):
    """torch.save given a path writes through C++: a failure has no errno at all. On a target
    with no room left that is ENOSPC, and the whole directory goes to the fallback."""
    target = tmpfs(size="128k").path / "ckpt"
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)

    def write(staging: str) -> None:
        torch.save(model_state(1), os.path.join(staging, "model.pt"))  # about 260 KiB

    result = fsprobe.save_dir(target, write, fallback_dirs=[fallback], backoff=quick())
    assert result.redirected and result.errors == ("ENOSPC",)
    assert os.listdir(target.parent) == []


def test_a_small_torch_file_written_to_a_path_on_a_full_target_is_redirected_as_enospc(
    tmpfs, tmp_path
):
    """A file smaller than torch's buffer is written once, at its end, where the C++ stream
    fails with "basic_ios::clear: iostream error" and nothing else: ENOSPC there too."""
    mounted = tmpfs(size="128k").path
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    fill_bytes(mounted)

    def write(staging: str) -> None:
        torch.save(model_state(1, width=4), os.path.join(staging, "optimizer.bin"))

    result = fsprobe.save_dir(mounted / "ckpt", write, fallback_dirs=[fallback], backoff=quick())
    assert result.redirected and result.errors == ("ENOSPC",)
    assert os.listdir(mounted) == [".fill-bytes"]


def test_torch_writing_to_a_path_failing_with_room_left_is_retried_as_unknown(faultfs):
    faultfs.ctl.fail("write", "EIO", path="/.fsprobe~*ckpt.tmp/*", sticky=True)

    def write(staging: str) -> None:
        torch.save(model_state(1), os.path.join(staging, "model.pt"))

    result = fsprobe.save_dir(faultfs.mountpoint / "ckpt", write, backoff=quick())
    assert (result.attempts, result.errors) == (2, ("EUNKNOWN",))


@pytest.mark.parametrize("where", ["tmpfs", "faultfs"])  # exchange, and two renames
def test_clean_directory_saves_have_nothing_to_warn_about(where, tmpfs, faultfs, caplog):
    """A first save and a replacement, each on the exchange and the two-rename path: the
    save log stays quiet (a warning there is what an operator is told to look at)."""
    root = tmpfs(size="16M").path if where == "tmpfs" else faultfs.mountpoint
    with caplog.at_level(logging.WARNING, logger="fsprobe"):
        fsprobe.save_dir(root / "ckpt", checkpoint_writer(1))
        fsprobe.save_dir(root / "ckpt", checkpoint_writer(2))
    assert caplog.records == []
    assert_checkpoint(root / "ckpt", 2)
    assert os.listdir(root) == ["ckpt"]


def test_a_symlink_where_the_checkpoint_goes_is_not_replaced(tmp_path):
    """Even one that points nowhere: what is at the checkpoint's path and is no directory of
    the user's is not fsprobe's to replace. The save fails (ENOTDIR, permanent), the link stays,
    nothing is left behind."""
    target = tmp_path / "ckpt"
    target.symlink_to(tmp_path / "nowhere")
    with pytest.raises(fsprobe.SaveError) as failed:
        fsprobe.save_dir(target, checkpoint_writer(1), backoff=quick())
    assert failed.value.attempts[-1].errno == "ENOTDIR"
    assert target.is_symlink() and os.readlink(target) == str(tmp_path / "nowhere")
    assert os.listdir(tmp_path) == ["ckpt"]
