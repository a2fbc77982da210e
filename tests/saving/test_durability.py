"""Durability asserted from the fault filesystem's journal (docs/design.md §7, §9): every save and
write probe fsyncs the file before the rename that publishes it, and the directory after.

Byte-for-byte comparisons cannot see a missing fsync (the page cache has the data either
way); the journal of the calls that reached the filesystem can. The rules are in
:mod:`tests.support.durability`, which tests/saving/test_durability_helper.py shows failing on
journals that break them.
"""

from __future__ import annotations

import os

import pytest
import torch

import fsprobe
from fsprobe.posix.atomic import parse_temp_name
from fsprobe.probing.write import probe_write
from fsprobe.redirect import manifest, sync
from fsprobe.saving.options import Backoff
from fsprobe.saving.preflight import preflight_readiness
from tests.support.durability import (
    NotDurable,
    assert_file_saved,
    check_file_published,
    check_rename_durable,
    inside,
    read_journal,
)


def no_sleep() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Linear(256, 256).state_dict()


@pytest.fixture
def ckpt(faultfs):
    """A checkpoint directory on the fault filesystem, with a clean journal."""
    directory = faultfs.mountpoint / "ckpt"
    directory.mkdir()
    faultfs.ctl.clear_journal()
    return directory


def test_torch_save_fsyncs_the_temp_file_then_renames_then_fsyncs_the_directory(faultfs, ckpt):
    result = fsprobe.save(model_state(), ckpt / "model.pt")
    rename = assert_file_saved(faultfs, ckpt / "model.pt")
    assert parse_temp_name(os.path.basename(rename.paths[0])).base == "model.pt"
    assert result.path == str(ckpt / "model.pt")


def test_replacing_an_existing_checkpoint_is_as_durable_as_the_first_save(faultfs, ckpt):
    fsprobe.save(model_state(seed=1), ckpt / "model.pt")
    faultfs.ctl.clear_journal()
    fsprobe.save(model_state(seed=2), ckpt / "model.pt")
    assert_file_saved(faultfs, ckpt / "model.pt")


def test_atomic_write_of_any_writer_is_durable(faultfs, ckpt):
    fsprobe.atomic_write(ckpt / "meta.json", lambda f: f.write(b'{"step": 7}'))
    assert_file_saved(faultfs, ckpt / "meta.json")


def test_a_writer_that_closes_the_file_itself_is_still_fsynced_before_the_rename(faultfs, ckpt):
    def write(stream):
        stream.write(b"closed by the writer")
        stream.close()

    fsprobe.atomic_write(ckpt / "ckpt.bin", write)
    rename = assert_file_saved(faultfs, ckpt / "ckpt.bin")
    calls = read_journal(faultfs)
    temp = rename.paths[0]
    # The writer's close came first (a flush); the fsync went through the temp file's own
    # descriptor, still open, afterwards.
    [close] = [c for c in calls if c.op == "flush" and c.paths == (temp,)][:1]
    fsyncs = [c for c in calls if c.op == "fsync" and c.paths == (temp,)]
    assert fsyncs and all(close.index < f.index < rename.index for f in fsyncs)
    assert (ckpt / "ckpt.bin").read_bytes() == b"closed by the writer"


def test_the_attempt_that_succeeds_after_a_failed_one_is_durable(faultfs, ckpt):
    faultfs.ctl.fail("write", "EIO", path="*.tmp", sticky=True)
    result = fsprobe.save(model_state(), ckpt / "model.pt", backoff=no_sleep())
    assert result.attempts == 2 and result.errors == ("EIO",)
    rename = assert_file_saved(faultfs, ckpt / "model.pt")
    calls = read_journal(faultfs)
    failed = [c for c in calls if c.op == "write" and not c.ok]
    assert failed and failed[0].paths[0] != rename.paths[0]  # a fresh temp file, not the first
    assert any(c.op == "unlink" and c.ok and c.paths == failed[0].paths for c in calls)


def test_a_failed_fsync_is_not_taken_for_a_durable_save(faultfs, ckpt):
    faultfs.ctl.fail("fsync", "EIO", path="*.tmp")
    result = fsprobe.save(model_state(), ckpt / "model.pt", backoff=no_sleep())
    assert result.errors == ("EIO",)
    assert_file_saved(faultfs, ckpt / "model.pt")


def test_a_failed_directory_fsync_fails_the_attempt(faultfs, ckpt):
    """The rename is not durable until the directory is: an EIO there is a failed save."""
    rule = faultfs.ctl.fail("fsyncdir", "EIO", path="/ckpt")
    result = fsprobe.save(model_state(), ckpt / "model.pt", backoff=no_sleep())
    assert faultfs.ctl.rule(rule)["hits"] == 1
    assert result.attempts == 2 and result.errors == ("EIO",)
    assert_file_saved(faultfs, ckpt / "model.pt")


def test_a_redirected_save_is_durable_in_the_fallback(faultfs_factory, tmp_path):
    target_fs, fallback_fs = faultfs_factory(), faultfs_factory()
    target = target_fs.mountpoint / "model.pt"
    target_fs.ctl.fail("create", "EROFS", path="*.tmp", times=None)
    fallback_fs.ctl.clear_journal()
    result = fsprobe.save(
        model_state(), target, fallback_dirs=[fallback_fs.mountpoint], backoff=no_sleep()
    )
    assert result.redirected
    assert_file_saved(fallback_fs, result.path)


def test_sync_back_publishes_the_copy_durably(faultfs, tmp_path):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = faultfs.mountpoint / "model.pt"
    faultfs.ctl.set_readonly(True)
    saved = fsprobe.save(model_state(), target, fallback_dirs=[fallback], backoff=no_sleep())
    assert saved.redirected
    faultfs.ctl.set_readonly(False)
    faultfs.ctl.clear_journal()
    [outcome] = sync.sync([str(fallback)], ready=preflight_readiness())
    assert outcome.action == "synced", outcome
    assert_file_saved(faultfs, target)


def test_unsynced_saves_are_caught_by_the_check(faultfs, ckpt):
    """fsync=False is the documented way to skip durability; the check must notice it."""
    fsprobe.atomic_write(ckpt / "fast.bin", lambda f: f.write(b"x"), fsync=False)
    with pytest.raises(NotDurable, match="not fsynced"):
        assert_file_saved(faultfs, ckpt / "fast.bin")


def test_the_write_probe_fsyncs_its_file_before_the_rename_and_the_directory_after(faultfs):
    faultfs.ctl.clear_journal()
    result = probe_write(str(faultfs.mountpoint), size=64 * 1024)
    assert result.ok
    calls = read_journal(faultfs)
    [rename] = [c for c in calls if c.op == "rename"]
    assert parse_temp_name(os.path.basename(rename.paths[0])).base == "write-probe"
    check_rename_durable(calls, rename)
    assert check_file_published(calls, rename.paths[1]) == rename
    # ...and the renamed file is removed after the directory fsync, the one step after it.
    [unlink] = [c for c in calls if c.op == "unlink"]
    assert unlink.paths == (rename.paths[1],) and unlink.ok
    directory_syncs = [c for c in calls if c.op == "fsyncdir" and c.ok]
    assert directory_syncs and rename.index < directory_syncs[0].index < unlink.index
    assert directory_syncs[0].paths == (inside(faultfs, faultfs.mountpoint),)


def test_the_redirect_manifest_line_is_fsynced_after_it_is_written(faultfs_factory):
    """`fsprobe sync` and `fsprobe.locate` find a redirected checkpoint only through its
    manifest line: a crash must not lose it while the checkpoint survives."""
    target_fs, fallback_fs = faultfs_factory(), faultfs_factory()
    target_fs.ctl.fail("create", "EROFS", path="*.tmp", times=None)
    fallback_fs.ctl.clear_journal()
    result = fsprobe.save(
        model_state(),
        target_fs.mountpoint / "model.pt",
        fallback_dirs=[fallback_fs.mountpoint],
        backoff=no_sleep(),
    )
    assert result.redirected
    calls = read_journal(fallback_fs)
    manifest_calls = [c for c in calls if c.paths and c.paths[0].endswith(manifest.MANIFEST)]
    writes = [c.index for c in manifest_calls if c.op == "write" and c.ok]
    syncs = [c.index for c in manifest_calls if c.op == "fsync" and c.ok]
    assert writes and syncs and max(syncs) > max(writes), "\n".join(map(str, manifest_calls))
