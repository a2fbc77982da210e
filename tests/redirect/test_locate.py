"""`fsprobe.locate`: where a resume finds the newest committed copy of a checkpoint, a file or a
directory, at its path or redirected to a fallback by a real ENOSPC (a small tmpfs)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

import fsprobe
from fsprobe.redirect.sync import sync
from fsprobe.saving.options import Backoff


def quick() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def big(seed: int) -> dict[str, torch.Tensor]:
    """About 256 KiB: more than the small target holds."""
    return {"w": torch.full((64 * 1024,), float(seed))}


@pytest.fixture
def small_target(tmpfs) -> Path:
    return tmpfs(size="128k").path


@pytest.fixture
def fallback(tmp_path) -> Path:
    directory = tmp_path / "fallback"
    directory.mkdir(mode=0o700)
    return directory


def test_without_a_redirect_it_is_the_path_itself_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fsprobe.locate("ckpt.pt") == str(tmp_path / "ckpt.pt")  # need not exist
    fsprobe.save({"w": torch.ones(2)}, "ckpt.pt")
    assert fsprobe.locate(Path("ckpt.pt"), fallback_dirs=[tmp_path]) == str(tmp_path / "ckpt.pt")


def test_a_redirected_file_is_found(small_target, fallback, monkeypatch):
    target = small_target / "last.pt"
    result = fsprobe.save(big(1), target, fallback_dirs=[fallback], backoff=quick())
    assert result.redirected and not target.exists()
    found = fsprobe.locate(target, fallback_dirs=[fallback])
    assert found == result.path and found.startswith(str(fallback))
    assert torch.equal(torch.load(found)["w"], big(1)["w"])
    monkeypatch.setenv("FSPROBE_FALLBACK_DIRS", str(fallback))  # counts as given
    assert fsprobe.locate(target) == result.path


def redirected_while_full(target: Path, fallback: Path) -> str:
    """Save a small checkpoint while a filler takes the target's room; then free the room."""
    filler = target.parent / "filler"
    filler.write_bytes(b"\0" * (120 * 1024))
    result = fsprobe.save({"w": torch.ones(4096)}, target, fallback_dirs=[fallback])
    assert result.redirected
    filler.unlink()
    return result.path


def test_a_newer_save_at_the_path_wins_over_an_older_redirected_copy(small_target, fallback):
    target = small_target / "small.pt"
    copy = redirected_while_full(target, fallback)
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == copy
    fsprobe.save({"w": torch.zeros(4096)}, target, preflight=False)  # room again: saved home
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == str(target)


def test_after_sync_the_path_itself_is_the_newest(small_target, fallback):
    target = small_target / "small.pt"
    copy = redirected_while_full(target, fallback)
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == copy
    # The room is back; the readiness hook says so instead of waiting out the preflight's cache.
    [outcome] = sync([str(fallback)], ready=lambda entry: None)
    assert outcome.done, outcome
    assert fsprobe.locate(target, fallback_dirs=[fallback]) == str(target)
    assert torch.equal(torch.load(target)["w"], torch.ones(4096))


def test_a_redirected_directory_is_found(small_target, fallback):
    target = small_target / "checkpoint-7"

    def write(staging: str) -> None:
        for name in ("model.pt", "optim.pt"):
            with open(os.path.join(staging, name), "wb") as stream:
                torch.save(big(7), stream)

    result = fsprobe.save_dir(target, write, fallback_dirs=[fallback], backoff=quick())
    assert result.redirected and not target.exists()
    found = Path(fsprobe.locate(target, fallback_dirs=[fallback]))
    assert str(found) == result.path and found.is_dir()
    assert sorted(os.listdir(found)) == ["model.pt", "optim.pt"]
    assert torch.equal(torch.load(found / "model.pt")["w"], big(7)["w"])


def test_a_copy_changed_since_it_was_saved_is_passed_over(small_target, fallback, caplog):
    target = small_target / "last.pt"
    result = fsprobe.save(big(1), target, fallback_dirs=[fallback], backoff=quick())
    assert result.redirected
    with open(result.path, "r+b") as stream:  # bit rot, or someone's edit
        stream.seek(-1, os.SEEK_END)
        stream.write(b"\xff")
    with caplog.at_level(logging.WARNING):
        assert fsprobe.locate(target, fallback_dirs=[fallback]) == str(target)
    assert "sha256" in caplog.text
