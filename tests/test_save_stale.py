"""Cleaning up the temp files of crashed saves: ours by name, writer surely gone, nothing else."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import fsprobe
from fsprobe.atomic import hostname
from fsprobe.saving.stale import FOREIGN_STALE_SECONDS, remove_stale_temps


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def temp(directory, host: str, pid: int, base: str = "model.pt", age: float = 0.0) -> str:
    path = os.path.join(directory, f".fsprobe~{host}~{pid}~0123abcd~{base}.tmp")
    with open(path, "wb") as stream:
        stream.write(b"half a checkpoint")
    if age:
        then = time.time() - age
        os.utime(path, (then, then))
    return path


def test_removes_only_temps_whose_writer_is_certainly_gone(tmp_path, caplog):
    me = hostname()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as alive:
        try:
            crashed = temp(tmp_path, me, dead_pid())
            running = temp(tmp_path, me, alive.pid, base="other.pt")
            mine = temp(tmp_path, me, os.getpid(), base="mine.pt")  # another thread may be saving
            foreign_old = temp(tmp_path, "othernode", 4242, age=FOREIGN_STALE_SECONDS + 60)
            foreign_young = temp(tmp_path, "othernode", 4243, age=60)
            with caplog.at_level(logging.INFO, logger="fsprobe.save"):
                removed = remove_stale_temps(str(tmp_path))
        finally:
            alive.kill()
    assert sorted(removed) == sorted([crashed, foreign_old])
    for path in (running, mine, foreign_young):
        assert os.path.exists(path)
    assert "left by a crashed save" in caplog.text


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
    directory = tmp_path / f".fsprobe~{me}~{gone}~0123abcd~dir.tmp"
    directory.mkdir()
    link = tmp_path / f".fsprobe~{me}~{gone}~0123abcd~link.tmp"
    link.symlink_to(tmp_path / "model.pt")
    assert remove_stale_temps(str(tmp_path)) == []
    assert sorted(os.listdir(tmp_path)) == sorted([*lookalikes, directory.name, link.name])


def test_a_save_cleans_its_directory_first_and_only_that(tmp_path):
    target, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    gone = dead_pid()
    crashed = temp(target, hostname(), gone)
    untouched = temp(elsewhere, hostname(), gone)
    fsprobe.save({"epoch": 2}, target / "model.pt")
    assert not os.path.exists(crashed)
    assert os.path.exists(untouched)
    assert sorted(os.listdir(target)) == ["model.pt"]


def test_missing_directory_is_not_an_error(tmp_path):
    assert remove_stale_temps(str(tmp_path / "absent")) == []
