"""Loud typos: a save into a directory that never existed fails at once, never into a fallback;
one that existed and vanished (a scratch purge) is redirected, and said; a fallback that does
not exist is said when first named and in the failure."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import fsprobe
from fsprobe.saving.options import Backoff
from fsprobe.saving.retry import MissingDirectory, SaveError
from tests.support.capability import need_module
from tests.support.crash import leftovers
from tests.support.state import daemon_view, publish

NO_WAIT = Backoff(sleep=lambda seconds: None)


def write(stream) -> None:
    stream.write(b"the checkpoint")


@pytest.fixture
def fallback(tmp_path):
    directory = tmp_path / "fallback"
    directory.mkdir()
    return directory


def test_a_save_into_a_directory_that_never_existed_fails_at_once(tmp_path, fallback, caplog):
    (tmp_path / "checkpoints").mkdir()
    typo = tmp_path / "checkpoitns" / "model.pt"
    with pytest.raises(MissingDirectory) as refused:
        fsprobe.atomic_write(typo, write, fallback_dirs=[fallback], backoff=NO_WAIT)
    error = refused.value
    assert isinstance(error, FileNotFoundError) and isinstance(error, SaveError)
    assert error.filename == str(typo)
    assert [(a.errno, a.step) for a in error.attempts] == [("ENOENT", "create")]  # no retry
    message = str(error)
    assert f"the directory {typo.parent} does not exist and never did in this process" in message
    assert f"there is no checkpoitns/ in {tmp_path}, did you mean checkpoints/?" in message
    assert list(fallback.iterdir()) == []  # nothing redirected: the typo did not vanish
    assert "redirecting" not in caplog.text


def test_a_missing_parent_deeper_down_names_the_nearest_existing_directory(tmp_path):
    (tmp_path / "runs").mkdir()
    typo = tmp_path / "rnus" / "run7" / "step-100"
    with pytest.raises(
        MissingDirectory, match=f"there is no rnus/ in {tmp_path}, did you mean runs/"
    ):
        fsprobe.save_dir(typo, lambda staging: None, backoff=NO_WAIT)
    assert not (tmp_path / "rnus").exists()


def test_a_torch_save_into_a_typo_is_refused_too(tmp_path, fallback):
    torch = need_module("torch")
    with pytest.raises(FileNotFoundError, match="never did in this process"):
        fsprobe.save(
            {"w": torch.zeros(3)}, tmp_path / "ckpts" / "last.pt", fallback_dirs=[fallback]
        )
    assert list(fallback.iterdir()) == []


def test_a_directory_that_vanished_is_redirected_and_said(tmp_path, fallback, caplog):
    target = tmp_path / "scratch" / "run7"
    target.mkdir(parents=True)
    fsprobe.atomic_write(target / "model.pt", write, fallback_dirs=[fallback])
    shutil.rmtree(tmp_path / "scratch")  # the purge
    with caplog.at_level(logging.WARNING, "fsprobe.save"):
        result = fsprobe.atomic_write(target / "model.pt", write, fallback_dirs=[fallback])
    assert result.redirected and result.errors == ("ENOENT",)
    assert result.path.startswith(str(fallback))
    said = [
        r.getMessage()
        for r in caplog.records
        if "where this process saved before" in r.getMessage()
    ]
    assert len(said) == 1, caplog.text
    assert str(target) in said[0] and result.path in said[0]
    assert Path(result.path).read_bytes() == b"the checkpoint"


def test_a_directory_that_vanished_without_a_fallback_says_so(tmp_path):
    target = tmp_path / "run8"
    target.mkdir()
    fsprobe.atomic_write(target / "model.pt", write)
    shutil.rmtree(target)
    with pytest.raises(SaveError) as failed:
        fsprobe.atomic_write(target / "model.pt", write, backoff=NO_WAIT)
    assert not isinstance(failed.value, MissingDirectory)
    assert f"its directory {target}, where this process saved before, is gone" in str(failed.value)


def test_a_fallback_that_does_not_exist_is_said_first_and_in_the_failure(tmp_path, caplog):
    target = tmp_path / "run9"
    target.mkdir()
    missing = tmp_path / "fallbak"
    with caplog.at_level(logging.WARNING, "fsprobe.preflight"):
        fsprobe.atomic_write(target / "a.pt", write, fallback_dirs=[missing])
        fsprobe.atomic_write(target / "b.pt", write, fallback_dirs=[missing])
    said = [r for r in caplog.records if str(missing) in r.getMessage()]
    assert len(said) == 1 and "it does not exist" in said[0].getMessage()  # once
    shutil.rmtree(target)  # now the save needs its fallback
    with pytest.raises(SaveError) as failed:
        fsprobe.atomic_write(target / "c.pt", write, fallback_dirs=[missing], backoff=NO_WAIT)
    assert f"fallback {missing} skipped: it does not exist" in str(failed.value)
    assert leftovers(tmp_path) == []


def test_a_typo_the_preflight_would_redirect_is_refused_too(tmp_path, fallback):
    """The daemon says the watched target is read-only: a save into a subdirectory of it that
    never existed is not sent to the fallback either (where the typo would vanish), while a
    save into one that exists is redirected."""
    target, state = tmp_path / "ckpt", tmp_path / "state"
    (target / "run7").mkdir(parents=True)
    state.mkdir(mode=0o700)
    publish(str(state), {str(target): daemon_view(str(target), readonly=True)})
    options = {"fallback_dirs": [fallback], "state_dir": str(state)}
    with pytest.raises(MissingDirectory, match=r"there is no rnu7/ in .*, did you mean run7/"):
        fsprobe.atomic_write(target / "rnu7" / "model.pt", write, **options)
    assert list(fallback.iterdir()) == []
    result = fsprobe.atomic_write(target / "run7" / "model.pt", write, **options)
    assert result.redirected and result.errors == ()
