"""Cleaning up the temp files of crashed saves: ours by name and owner, writer provably gone.

A writer's proof of life is the lock it holds on its temp file, not its pid: pids mean nothing
in another PID namespace (two containers of a pod share a host name, not their pids) or
behind ``hidepid``. These tests use real processes in real PID namespaces (``unshare``) and
real users.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fsprobe
from fsprobe.posix.atomic import TempFile, hostname, is_live_here, parse_temp_name, temp_name
from fsprobe.probing.write import probe_write
from fsprobe.saving.context import SaveContext
from fsprobe.saving.options import Backoff
from fsprobe.saving.stale import (
    FOREIGN_STALE_SECONDS,
    MIN_AGE_SECONDS,
    clean_directory,
    is_stale,
)
from tests.support.capability import need_module, require
from tests.support.crash import leftovers
from tests.support.users import REPO, share

#: A writer that holds its temp file (locked, as every fsprobe writer does) until killed.
_WRITER = """
import sys, time
from fsprobe.posix.atomic import TempFile, temp_name
temp = TempFile(None, sys.argv[1] + "/" + temp_name("model.pt"))
print(temp.name, flush=True)
time.sleep(300)
"""

#: Remove the stale temp files of a directory; print what was removed.
_CLEANER = """
import json, sys
from fsprobe.saving.stale import clean_directory
print(json.dumps(clean_directory(sys.argv[1])))
"""


def backdate(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp(directory, host: str, pid: int, base: str = "model.pt", age: float = 0.0) -> str:
    """A temp file as a crashed writer left it: named after it, written, unlocked."""
    path = os.path.join(directory, f".fsprobe~{host}~{pid}~0123abcd~{base}.tmp")
    with open(path, "wb") as stream:
        stream.write(b"half a checkpoint")
    if age:
        backdate(path, age)
    return path


class Writer:
    """A live writer in a process of its own (optionally in a new PID namespace)."""

    def __init__(self, directory, namespace: bool = False) -> None:
        command = [sys.executable, "-c", _WRITER, str(directory)]
        if namespace:
            command = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        self.path = self.process.stdout.readline().strip()
        assert self.path, "the writer did not start"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def clean_in_new_pid_namespace(directory) -> list[str]:
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _CLEANER, directory],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture
def unshare_works() -> None:
    """A new PID namespace with its own /proc needs root."""
    if os.geteuid() != 0:
        require("a new PID namespace (unshare --pid --mount-proc) needs root")


def test_removes_only_temps_whose_writer_is_certainly_gone(tmp_path, caplog):
    me = hostname()
    writer = Writer(tmp_path)
    try:
        backdate(writer.path, 2 * FOREIGN_STALE_SECONDS)  # a writer stuck for hours: alive
        crashed = temp(tmp_path, me, dead_pid(), age=2 * MIN_AGE_SECONDS)
        young = temp(tmp_path, me, dead_pid(), base="young.pt")  # may be just being created
        foreign_old = temp(tmp_path, "othernode", 4242, age=FOREIGN_STALE_SECONDS + 60)
        foreign_young = temp(tmp_path, "othernode", 4243, age=2 * MIN_AGE_SECONDS)
        with caplog.at_level(logging.INFO, logger="fsprobe.save"):
            removed = clean_directory(str(tmp_path))
        assert os.path.exists(writer.path)
    finally:
        writer.stop()
    assert sorted(removed) == sorted([crashed, foreign_old])
    for path in (young, foreign_young):
        assert os.path.exists(path)
    assert "left by a crashed save" in caplog.text
    assert clean_directory(str(tmp_path)) == [writer.path]  # its writer is gone now


def test_a_temp_this_process_is_writing_is_known_without_its_lock(tmp_path):
    """On NFS a lock is per process: another thread's temp file must be known without it."""
    with TempFile(None, str(tmp_path / temp_name("model.pt"))) as live:
        info = os.stat(live.name)
        assert is_live_here(info)
    assert not is_live_here(info)
    old = time.time() - 2 * FOREIGN_STALE_SECONDS
    name = parse_temp_name(os.path.basename(live.name))
    assert is_stale(name, old, False, time.time())  # what the lock alone would say
    assert not is_stale(name, old, True, time.time())


def test_never_touches_what_is_not_ours(tmp_path):
    me = hostname()
    gone = dead_pid()
    lookalikes = [
        f".fsprobe~{me}~{gone}~nothex~model.pt.tmp",  # token is not ours
        f".fsprobe~{me}~{gone}~0123abcd~model.pt",  # no .tmp suffix
        f"fsprobe~{me}~{gone}~0123abcd~model.pt.tmp",  # not hidden
        "model.pt.tmp",
        "model.pt",
    ]
    for name in lookalikes:
        (tmp_path / name).write_bytes(b"a user's file")
        backdate(tmp_path / name, 2 * FOREIGN_STALE_SECONDS)
    directory = tmp_path / f".fsprobe~{me}~{gone}~0123abcd~dir.tmp"
    directory.mkdir()
    link = tmp_path / f".fsprobe~{me}~{gone}~0123abcd~link.tmp"
    link.symlink_to(tmp_path / "model.pt")
    fifo = tmp_path / f".fsprobe~{me}~{gone}~0123abcd~fifo.tmp"
    os.mkfifo(fifo)
    for path in (directory, fifo):
        backdate(path, 2 * FOREIGN_STALE_SECONDS)
    # The directory is what a crashed directory save leaves, its staging directory: that goes.
    assert clean_directory(str(tmp_path)) == [str(directory)]
    assert sorted(os.listdir(tmp_path)) == sorted([*lookalikes, link.name, fifo.name])


def test_a_live_temp_of_another_pid_namespace_is_kept(tmp_path, unshare_works):
    writer = Writer(tmp_path)  # its pid means nothing in the cleaner's namespace
    try:
        backdate(writer.path, 2 * FOREIGN_STALE_SECONDS)
        assert clean_in_new_pid_namespace(str(tmp_path)) == []
        assert os.path.exists(writer.path)
    finally:
        writer.stop()


def test_a_dead_writer_of_another_pid_namespace_is_cleaned_up(tmp_path, unshare_works):
    writer = Writer(tmp_path, namespace=True)
    try:
        assert parse_temp_name(os.path.basename(writer.path)).pid == 1  # a pid alive here too
        backdate(writer.path, 2 * MIN_AGE_SECONDS)
        assert clean_directory(str(tmp_path)) == []  # its lock is held: alive
    finally:
        writer.stop()  # its namespace's init dies a moment after unshare (--kill-child)
    deadline = time.monotonic() + 30
    while not (removed := clean_directory(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert removed == [writer.path]


def test_a_save_in_another_namespace_leaves_a_stuck_save_alone(faultfs, unshare_works):
    """Two containers of a pod save into one directory: neither removes the other's temp."""
    ckpt = faultfs.mountpoint / "ckpt"
    ckpt.mkdir()
    rule = faultfs.ctl.block("fsync", path="*rank0.pt.tmp")  # rank 0's server stalls
    results: list[object] = []
    rank0 = threading.Thread(
        target=lambda: results.append(fsprobe.save({"rank": 0}, ckpt / "rank0.pt", attempts=1))
    )
    rank0.start()
    try:
        faultfs.ctl.wait_blocked(rule)
        [name] = [n for n in os.listdir(faultfs.backing / "ckpt") if parse_temp_name(n)]
        backdate(faultfs.backing / "ckpt" / name, 2 * FOREIGN_STALE_SECONDS)  # stuck for hours
        code = "import sys, fsprobe; fsprobe.atomic_write(sys.argv[1], lambda f: f.write(b'1'))"
        rank1 = [sys.executable, "-c", code, str(ckpt / "rank1.pt")]
        unshare = ["unshare", "--pid", "--fork", "--mount-proc"]
        subprocess.run([*unshare, *rank1], cwd=REPO, check=True, timeout=120)
        assert os.path.exists(faultfs.backing / "ckpt" / name)
    finally:
        faultfs.ctl.remove(rule)
        rank0.join(60)
    [result] = results
    assert result.attempts == 1 and result.errors == ()
    assert sorted(os.listdir(ckpt)) == ["rank0.pt", "rank1.pt"]


def test_a_write_probe_held_by_the_filesystem_keeps_its_file(faultfs, unshare_works):
    """The sidecar's probe files were deleted by a trainer's cleanup, and the target turned
    unhealthy: a probe's file is locked like a save's."""
    rule = faultfs.ctl.block("fsync", path="*write-probe*")
    results: list[object] = []
    probing = threading.Thread(
        target=lambda: results.append(probe_write(str(faultfs.mountpoint), size=4096))
    )
    probing.start()
    try:
        faultfs.ctl.wait_blocked(rule)
        [name] = [n for n in os.listdir(faultfs.backing) if parse_temp_name(n)]
        backdate(faultfs.backing / name, 2 * FOREIGN_STALE_SECONDS)
        assert clean_in_new_pid_namespace(str(faultfs.mountpoint)) == []
        assert clean_directory(str(faultfs.mountpoint)) == []
    finally:
        faultfs.ctl.remove(rule)
        probing.join(60)
    [result] = results
    assert result.ok and os.listdir(faultfs.mountpoint) == []


def test_a_save_cleans_its_directory_first_and_only_that(tmp_path):
    target, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    gone = dead_pid()
    crashed = temp(target, hostname(), gone, age=2 * MIN_AGE_SECONDS)
    untouched = temp(elsewhere, hostname(), gone, age=2 * MIN_AGE_SECONDS)
    fsprobe.save({"epoch": 2}, target / "model.pt")
    assert not os.path.exists(crashed)
    assert os.path.exists(untouched)
    assert sorted(os.listdir(target)) == ["model.pt"]


def test_nobody_removes_another_users_temp_file_root_included(local_users, tmp_path):
    share(tmp_path)
    alice, bob = local_users.user(), local_users.user()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    crashed = Path(alice.run(temp, str(shared), hostname(), dead_pid(), "model.pt"))
    backdate(crashed, 2 * FOREIGN_STALE_SECONDS)  # long dead, by every rule but ownership

    assert bob.run(clean_directory, str(shared)) == []
    assert clean_directory(str(shared)) == []  # root: not its file either
    assert crashed.exists()
    assert alice.run(clean_directory, str(shared)) == [str(crashed)]


def test_missing_directory_is_not_an_error(tmp_path):
    assert clean_directory(str(tmp_path / "absent")) == []


def test_a_temp_name_swapped_for_a_symlink_to_it_is_not_removed(tmp_path):
    """Someone replaced a writer's temp file by a symlink to it (kept under another name): the
    symlink is not the writer's, so discarding the temp leaves it alone."""
    temp = TempFile(None, str(tmp_path / temp_name("model.pt")))
    os.link(temp.name, tmp_path / "kept")  # the same file under a name of theirs
    os.unlink(temp.name)
    os.symlink(tmp_path / "kept", temp.name)
    temp.discard()
    assert os.path.islink(temp.name)
    assert (tmp_path / "kept").exists()


@pytest.mark.parametrize("next_save", ["file", "directory"])
def test_a_staging_directory_its_attempt_could_not_remove_goes_with_the_next_save(
    faultfs, next_save
):
    """A failed attempt of a directory save whose staging directory the filesystem would not
    let go (rmdir EBUSY, as a FUSE server holding a hidden file of it) leaves it behind; the
    next save in that directory, of either kind, removes it at once, not 60 s later."""
    run = faultfs.mountpoint / "run"
    run.mkdir()
    failing = faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*/a.bin", times=None)
    busy = faultfs.ctl.fail("rmdir", "EBUSY", path="/run/.fsprobe~*", times=1)

    def write(staging):
        with open(os.path.join(staging, "a.bin"), "wb") as f:
            f.write(b"x" * 4096)

    with pytest.raises(OSError):
        fsprobe.save_dir(run / "ckpt", write, attempts=1, redirect=False)
    assert faultfs.ctl.rule(busy)["hits"] == 1
    [left] = os.listdir(run)
    assert parse_temp_name(left) and os.listdir(run / left) == []

    faultfs.ctl.remove(failing)
    if next_save == "file":
        fsprobe.atomic_write(run / "other.bin", lambda f: f.write(b"y"))
        assert os.listdir(run) == ["other.bin"]
    else:
        fsprobe.save_dir(run / "ckpt", write)
        assert os.listdir(run) == ["ckpt"]


def test_what_a_save_that_gave_up_left_goes_with_the_next_save_wherever_it_goes(faultfs):
    """The leftover of a save that gave up is this process's to remove at its very next
    attempt, though that goes to another directory: not an hour or a process later. The save
    that removed it counts it."""
    run, other = faultfs.mountpoint / "run", faultfs.mountpoint / "other"
    run.mkdir(), other.mkdir()
    faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*/a.bin", times=None)
    faultfs.ctl.fail("rmdir", "EBUSY", path="/run/.fsprobe~*", times=1)

    def write(staging):
        with open(os.path.join(staging, "a.bin"), "wb") as f:
            f.write(b"x" * 4096)

    with pytest.raises(OSError):
        fsprobe.save_dir(run / "ckpt", write, attempts=1, redirect=False)
    assert len(leftovers(run)) == 1
    result = fsprobe.atomic_write(other / "b.bin", lambda f: f.write(b"y"))
    assert os.listdir(run) == [] and os.listdir(other) == ["b.bin"]
    assert result.leftovers_removed == 1


@pytest.mark.parametrize("kind", ["save_dir", "save"])
def test_no_failed_attempt_leaves_an_inode_where_removes_are_hidden(faultfs_factory, kind):
    """Where a file removed while open stays as a hidden name until closed (libfuse's default,
    NFS's silly rename), the failed `torch.save`'s file is still open while its error is
    handled, and its staging directory cannot go then. It goes before the next attempt: the
    error is not kept alive by a reference cycle in the save. A save that takes three attempts
    leaves nothing but its checkpoint, and counts the two it removed."""
    torch = need_module("torch")
    faultfs = faultfs_factory(hidden_removes=True)
    run = faultfs.mountpoint / "run"
    run.mkdir()
    failing = faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*", times=None)
    seen: list[list[str]] = []

    def attempt_starts() -> None:
        seen.append(sorted(leftovers(run)))
        if len(seen) == 3:  # the third attempt succeeds
            faultfs.ctl.remove(failing)

    quick = Backoff(sleep=lambda seconds: None)
    state = {"w": torch.zeros(1 << 16)}
    if kind == "save_dir":

        def write(staging: str) -> None:
            attempt_starts()
            torch.save(state, os.path.join(staging, "model.pt"))  # torch's own writer

        result = fsprobe.save_dir(run / "ckpt", write, backoff=quick)
    else:

        def record(stream) -> None:
            attempt_starts()
            torch.save(state, stream)

        result = fsprobe.atomic_write(run / "ckpt", record, backoff=quick)
    assert result.attempts == 3
    assert [len(names) for names in seen] == [1, 1, 1]  # only the attempt's own each time
    assert os.listdir(run) == ["ckpt"]
    assert result.leftovers_removed == (2 if kind == "save_dir" else 0)


def test_a_context_cleans_a_directory_once_and_the_next_process_cleans_it_again(tmp_path):
    """A crashed save's leftover comes from a process that ended before this one saved here:
    the first save of a process (a `SaveContext`) into a directory removes it, the later ones
    do not look again (docs/design.md §7); a restarted job's first save does."""
    target = tmp_path / "ckpt"
    target.mkdir()
    crashed = temp(target, hostname(), dead_pid(), age=2 * MIN_AGE_SECONDS)
    job = SaveContext()
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"1"), context=job)
    assert not os.path.exists(crashed)

    crashed = temp(target, hostname(), dead_pid(), age=2 * MIN_AGE_SECONDS)  # after it looked
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"2"), context=job)
    assert os.path.exists(crashed)
    assert target in [Path(d) for d in job.cleaned]

    restarted = SaveContext()
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"3"), context=restarted)
    assert sorted(os.listdir(target)) == ["a.bin"]


def test_a_context_looks_again_an_hour_after_it_cleaned(tmp_path):
    """A process that crashed while this one keeps saving into the same directory: what it
    left is removed by the first save here once an hour has passed since this context looked
    (by then it is stale wherever it ran), not before."""
    target = tmp_path / "ckpt"
    target.mkdir()
    job = SaveContext()
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"1"), context=job)
    crashed = temp(target, hostname(), dead_pid(), age=2 * MIN_AGE_SECONDS)  # after it looked
    (key,) = [d for d in job.cleaned if Path(d) == target]
    job.cleaned[key] -= FOREIGN_STALE_SECONDS - 60  # 59 minutes ago
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"2"), context=job)
    assert os.path.exists(crashed)
    job.cleaned[key] -= 120  # 61 minutes ago
    fsprobe.atomic_write(target / "a.bin", lambda f: f.write(b"3"), context=job)
    assert sorted(os.listdir(target)) == ["a.bin"]


def test_a_temp_file_its_attempt_could_not_remove_goes_before_the_next_attempt(faultfs):
    """An attempt that failed and could not remove its temp file (an unlink the filesystem
    refused) leaves it to this process: the next attempt into that directory removes it at
    once, though it is seconds old, and so does the next save after a save that gave up."""
    run = faultfs.mountpoint / "run"
    run.mkdir()
    job = SaveContext()
    fsprobe.atomic_write(run / "a.bin", lambda f: f.write(b"0"), context=job)  # cleaned
    faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*", times=1)
    busy = faultfs.ctl.fail("unlink", "EBUSY", path="/run/.fsprobe~*", times=1)
    seen: list[list[str]] = []

    def write(stream) -> None:
        seen.append(sorted(os.listdir(run)))
        stream.write(b"x" * 4096)

    quick = Backoff(sleep=lambda seconds: None)
    fsprobe.atomic_write(run / "a.bin", write, attempts=2, backoff=quick, context=job)
    assert faultfs.ctl.rule(busy)["hits"] == 1
    [abandoned] = [n for n in seen[0] if parse_temp_name(n)]  # the first attempt's own
    assert abandoned not in seen[1]  # gone before the second attempt wrote
    assert sorted(os.listdir(run)) == ["a.bin"]

    faultfs.ctl.fail("write", "EIO", path="/run/.fsprobe~*", times=1)
    faultfs.ctl.fail("unlink", "EBUSY", path="/run/.fsprobe~*", times=1)
    with pytest.raises(OSError):
        fsprobe.atomic_write(run / "a.bin", write, attempts=1, redirect=False, context=job)
    assert len(leftovers(run)) == 1
    fsprobe.atomic_write(run / "b.bin", lambda f: f.write(b"y"), context=job)
    assert sorted(os.listdir(run)) == ["a.bin", "b.bin"]
