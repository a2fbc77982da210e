"""Directory checkpoints on the way back: `fsprobe sync` of a redirected `fsprobe.save_dir`,
verified file by file, published whole, and never over a checkpoint saved meanwhile."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.posix.swap import replace_if_unchanged
from fsprobe.posix.tree import opened
from fsprobe.redirect import manifest, sync
from fsprobe.saving.preflight import preflight_readiness
from tests.support.capability import need_root
from tests.support.crash import leftovers
from tests.support.daemon_process import clean_environment, run_fsprobe
from tests.support.durability import assert_directory_saved
from tests.support.state import daemon_view, publish


def checkpoint(tag: str):
    """A writer of a small directory checkpoint whose every file says `tag`."""

    def write(staging: str) -> None:
        os.mkdir(os.path.join(staging, "optim"))
        Path(staging, "model.pt").write_bytes(f"weights {tag}".encode() * 1000)
        Path(staging, "optim", "state.pt").write_bytes(f"moments {tag}".encode())

    return write


def contents(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


class Redirected:
    """A target directory (on `root`), a fallback, and a state file that can make it refuse."""

    def __init__(self, root: Path, tmp_path: Path) -> None:
        self.target = root / "run"
        self.target.mkdir()
        self.fallback = tmp_path / "fallback"
        self.fallback.mkdir()
        self.state = tmp_path / "state"
        self.state.mkdir(mode=0o700)
        self.requested = self.target / "step-10"

    def mark(self, **facts) -> None:
        publish(str(self.state), {str(self.target): daemon_view(str(self.target), **facts)})

    def save(self, tag: str) -> fsprobe.SaveResult:
        """A `save_dir` that the preflight redirects (the daemon says: read-only)."""
        self.mark(readonly=True)
        result = fsprobe.save_dir(
            self.requested,
            checkpoint(tag),
            fallback_dirs=[self.fallback],
            state_dir=str(self.state),
        )
        assert result.redirected
        self.mark()
        return result

    def sync(self) -> list[str]:
        return [
            o.action
            for o in sync.sync(
                [str(self.fallback)],
                state_dir=str(self.state),
                ready=preflight_readiness(str(self.state)),
            )
        ]

    def located(self) -> str:
        return fsprobe.locate(self.requested, fallback_dirs=[self.fallback])


def test_a_redirected_directory_goes_back_whole_verified_and_durably(faultfs, tmp_path):
    setup = Redirected(faultfs.mountpoint, tmp_path)
    result = setup.save("epoch 2")
    saved = contents(Path(result.path))
    assert not setup.requested.exists() and setup.located() == result.path
    faultfs.ctl.clear_journal()
    assert setup.sync() == ["synced"]
    assert_directory_saved(faultfs, setup.requested)  # files, directories, rename, parent
    assert contents(setup.requested) == saved
    assert setup.located() == str(setup.requested)
    assert not Path(result.path).exists() and manifest.pending([str(setup.fallback)]) == []
    assert os.listdir(setup.target) == ["step-10"]


def test_a_directory_replaces_an_older_one_at_the_original_path(tmpfs, tmp_path):
    setup = Redirected(tmpfs(size="4M").path, tmp_path)  # tmpfs: RENAME_EXCHANGE
    fsprobe.save_dir(setup.requested, checkpoint("epoch 1"))
    time.sleep(0.02)
    result = setup.save("epoch 2")
    saved = contents(Path(result.path))
    assert setup.sync() == ["synced"]
    assert contents(setup.requested) == saved
    assert os.listdir(setup.target) == ["step-10"]


def test_a_copy_changed_in_the_fallback_is_not_put_in_place(tmp_path):
    setup = Redirected(tmp_path, tmp_path)
    fsprobe.save_dir(setup.requested, checkpoint("epoch 1"))
    time.sleep(0.02)
    result = setup.save("epoch 2")
    Path(result.path, "optim", "state.pt").write_bytes(b"rotted")
    assert setup.sync() == ["checksum_mismatch"]
    assert Path(setup.requested, "optim", "state.pt").read_bytes() == b"moments epoch 1"
    assert leftovers(setup.target) == [] and Path(result.path).exists()


def test_a_symlink_in_the_copy_is_refused_and_nothing_is_published(tmp_path):
    setup = Redirected(tmp_path, tmp_path)
    result = setup.save("epoch 2")
    os.symlink("/etc/shadow", Path(result.path, "optim", "link"))
    outcomes = sync.sync(
        [str(setup.fallback)],
        state_dir=str(setup.state),
        ready=preflight_readiness(str(setup.state)),
    )
    assert [o.action for o in outcomes] == ["failed"]
    assert "symbolic link" in outcomes[0].message or "neither" in outcomes[0].message
    assert not setup.requested.exists() and leftovers(setup.target) == []


def test_a_newer_directory_at_the_original_path_is_kept(tmp_path):
    setup = Redirected(tmp_path, tmp_path)
    result = setup.save("epoch 2")
    time.sleep(0.02)
    fsprobe.save_dir(setup.requested, checkpoint("epoch 3"))
    assert setup.sync() == ["superseded"]
    assert Path(setup.requested, "optim", "state.pt").read_bytes() == b"moments epoch 3"
    assert Path(result.path).exists()


@pytest.mark.parametrize("earlier", [False, True])
def test_a_directory_saved_during_the_copy_back_is_never_overwritten(earlier, faultfs, tmp_path):
    """The copy back is held in its fsync; the trainer saves the same checkpoint meanwhile."""
    setup = Redirected(faultfs.mountpoint, tmp_path)
    if earlier:  # an older checkpoint at the path (replaced if nothing newer came)
        fsprobe.save_dir(setup.requested, checkpoint("epoch 1"))
        time.sleep(0.02)
    setup.save("epoch 2")
    held = faultfs.ctl.block("fsync", path=f"*~{os.getpid()}~*~step-10.tmp/model.pt", times=1)
    outcomes: list[str] = []
    syncing = threading.Thread(target=lambda: outcomes.extend(setup.sync()))
    syncing.start()
    try:
        faultfs.ctl.wait_blocked(held, timeout=30)
        fsprobe.save_dir(setup.requested, checkpoint("epoch 9"))
    finally:
        faultfs.ctl.remove(held)
        syncing.join(60)
    assert outcomes == ["superseded"]
    assert Path(setup.requested, "optim", "state.pt").read_bytes() == b"moments epoch 9"
    assert leftovers(setup.target) == [] and os.listdir(setup.target) == ["step-10"]
    assert len(manifest.pending([str(setup.fallback)])) == 1  # the copy waits, untouched


@pytest.mark.parametrize("where", ["tmpfs", "faultfs"])  # exchange, and two renames
def test_replace_if_unchanged_publishes_only_over_the_version_it_was_given(where, tmpfs, faultfs):
    root = tmpfs(size="1M").path if where == "tmpfs" else faultfs.mountpoint
    for name in ("ckpt", "new", "newer"):
        (root / name).mkdir()
        (root / name / "tag").write_text(name)
    with opened(os.open(root, os.O_RDONLY | os.O_DIRECTORY)) as fd:
        seen = os.stat("ckpt", dir_fd=fd)
        (root / "ckpt" / "tag").write_text("changed")  # same inode, another version
        os.utime(root / "ckpt", ns=(seen.st_atime_ns, seen.st_mtime_ns + 10**9))
        assert replace_if_unchanged(fd, "new", "ckpt", seen) == (False, None)
        seen = os.stat("ckpt", dir_fd=fd)
        assert replace_if_unchanged(fd, "new", "newer", None) == (False, None)  # taken
        published, replaced = replace_if_unchanged(fd, "new", "ckpt", seen)
        assert published and replaced is not None
        assert (root / "ckpt" / "tag").read_text() == "new"
        assert (root / replaced / "tag").read_text() == "changed"


def test_the_daemon_counts_a_directory_and_syncs_it_back(tmp_path, tmpfs):
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)], check=True)
    try:  # the target refuses writes: the directory lands in the fallback
        result = fsprobe.save_dir(
            target / "checkpoint-100", checkpoint("epoch 2"), fallback_dirs=[fallback]
        )
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert result.redirected
    saved = contents(Path(result.path))
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nwrite_probe = false\nquota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{fallback}"]\n'
    )
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    pending = f'fsprobe_redirected_pending_bytes{{path="{target}"}}'

    def once(*args: str) -> str:
        code, _out, err = run_fsprobe(
            "run", "--once", "--config", str(config), "--state-dir", str(tmp_path / "state"),
            "--textfile-dir", str(textfiles), *args, env=clean_environment(TMPDIR=str(target)),
        )  # fmt: skip
        assert code == 0, err
        return (textfiles / "fsprobe.prom").read_text()

    assert f"{pending} {float(result.bytes)}" in once()
    assert os.listdir(target) == []  # counting alone never copies
    assert f"{pending} 0.0" in once("--sync-redirected")
    assert os.listdir(target) == ["checkpoint-100"]
    assert contents(target / "checkpoint-100") == saved


def test_a_directory_copy_handed_to_another_user_is_not_brought_back(tmp_path):
    """Only the user's own copy goes home: a redirected directory that now belongs to someone
    else (who could have put anything in it) is refused, and nothing is published."""
    need_root("giving a redirected directory to another user")
    setup = Redirected(tmp_path, tmp_path)
    result = setup.save("epoch 2")
    os.chown(result.path, 65534, 65534)
    before = set(os.listdir("/proc/self/fd"))
    outcomes = sync.sync(
        [str(setup.fallback)],
        state_dir=str(setup.state),
        ready=preflight_readiness(str(setup.state)),
    )
    assert set(os.listdir("/proc/self/fd")) == before  # the refused copy was closed too
    assert [o.action for o in outcomes] == ["skipped"], outcomes
    assert "belongs to uid 65534" in outcomes[0].message
    assert not setup.requested.exists() and leftovers(setup.target) == []


def test_forgetting_a_redirected_directory_removes_it_and_says_so(tmp_path):
    """A trainer that deletes an old directory checkpoint deletes its redirected copy too."""
    setup = Redirected(tmp_path, tmp_path)
    result = setup.save("epoch 2")
    assert manifest.forget(str(setup.requested), [str(setup.fallback)]) == [result.path]
    assert not Path(result.path).exists()
    assert setup.sync() == []  # nothing left to bring back
