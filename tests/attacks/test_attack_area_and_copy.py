"""A second user of the team against a user's area and its copies, as real accounts.

The area and mirrored directories a redirected save makes in a shared sticky fallback
(`Area.make_parent`: a FIFO or a directory planted in the area's place, a cwd kept inside from
before the area was closed), and a copy stretched after its save, against root's sync back.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.redirect.test_trust_fallback import SAVE, area_of, fsprobe_sync, make_dir, private_area
from tests.support.users import REPO, share


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A directory every test user can reach; what is made inside decides what they may do."""
    share(tmp_path)
    return tmp_path


def test_a_fifo_in_place_of_a_users_area_neither_hangs_nor_diverts_a_save(local_users, place):
    """make_parent finds the area's name taken (mkdir: EEXIST) and must not block opening it."""
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    area = area_of(scratch, alice)
    mallory.run(os.mkfifo, str(area), 0o666)
    target = make_dir(place / "ckpt", 0o755)  # not Alice's to write: her save is redirected

    done = alice.python(SAVE, str(target / "model.pt"), "alice's", str(scratch), timeout=60)
    assert done.returncode == 0, done.stderr  # a squat: into a private area (issue 18.5)
    assert private_area(scratch, alice) in Path(json.loads(done.stdout)["path"]).parents
    assert area.is_fifo() and area.lstat().st_uid == mallory.uid  # not removed, not replaced
    assert os.listdir(target) == []


def test_an_area_made_by_someone_else_receives_nothing(local_users, place):
    """Mallory makes `uid-<alice>` first, open to all: make_parent must not create in it."""
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    area = area_of(scratch, alice)
    mallory.run(lambda: (os.mkdir(area), os.chmod(area, 0o777)))
    target = make_dir(place / "ckpt", 0o755)

    done = alice.python(SAVE, str(target / "model.pt"), "alice's", str(scratch))
    assert done.returncode == 0, done.stderr  # a squat: into a private area (issue 18.5)
    assert private_area(scratch, alice) in Path(json.loads(done.stdout)["path"]).parents
    assert os.listdir(area) == []
    assert area.stat().st_uid == mallory.uid and area.stat().st_mode & 0o777 == 0o777


MALLORY_HOLDS_A_WAY_IN = """
import os, sys, time
os.chdir(sys.argv[1])      # while Alice's area of an earlier version is still 0755
print("in", flush=True)
sys.stdin.readline()       # Alice's next save closes the area to 0700 meanwhile
os.symlink(sys.argv[2], "ckpt")  # then plant a symlink where her next mirrored dir goes
print("planted", flush=True)
sys.stdin.readline()
"""


def test_a_way_into_a_group_writable_mirror_kept_from_before_the_area_closed(local_users, place):
    """Alice's umask 002 left a mirrored directory writable by her team; her area was 0755
    (an earlier version). Mallory, of her team, keeps a working directory inside before the
    area is closed to 0700, then plants a symlink where make_parent creates the next directory:
    Alice's checkpoint must not follow it into Mallory's directory."""
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    scratch = make_dir(place / "scratch", 0o1777)
    requested = place / "run" / "ckpt" / "model.pt"
    area = area_of(scratch, alice)
    mirror = Path(str(area) + str(requested.parent.parent))  # .../uid-A/<place>/run

    def old_area() -> None:
        os.umask(0o002)
        mirror.mkdir(parents=True)
        os.chmod(area, 0o755)
        for directory in [mirror, *mirror.parents]:
            if directory == area:
                break
            os.chown(directory, -1, team)
            os.chmod(directory, 0o775)

    alice.run(old_area)
    trap = make_dir(place / "trap", 0o777, owner=mallory)
    make_dir(place / "run", 0o755)  # root's: Alice's save is redirected
    make_dir(place / "run" / "ckpt", 0o755)

    mallory_process = subprocess.Popen(
        [mallory.python_executable, "-c", MALLORY_HOLDS_A_WAY_IN, str(mirror), str(trap)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **mallory.subprocess_kwargs(),
    )
    try:
        assert mallory_process.stdout.readline() == "in\n"
        alice.run(os.chmod, str(area), 0o700)  # what make_parent's open(create=True) does
        mallory_process.stdin.write("\n")
        mallory_process.stdin.flush()
        assert mallory_process.stdout.readline() == "planted\n"
        assert (mirror / "ckpt").is_symlink()

        done = alice.python(SAVE, str(requested), "alice's", str(scratch))
    finally:
        mallory_process.stdin.close()
        mallory_process.wait(timeout=30)
    assert os.listdir(trap) == [], done
    assert done.returncode != 0 and "EACCES" in done.stderr, (done.stdout, done.stderr)


MALLORY_GROWS_THE_COPY = """
import os, sys
os.chdir(sys.argv[1])      # while Alice's area of an earlier version is still 0755
print("in", flush=True)
sys.stdin.readline()       # Alice's redirected save has made the copy (0664, her team's)
fd = os.open(sys.argv[2], os.O_WRONLY)
os.ftruncate(fd, 1 << 40)  # sparse: a terabyte of zeros that costs the fallback nothing
print("grown", flush=True)
sys.stdin.readline()
"""


def test_a_copy_grown_by_the_team_after_the_save_is_not_copied_back_past_its_size(
    local_users, place, tmpfs
):
    """Mallory, of Alice's team, kept a way into a group-writable mirrored directory (umask
    002, setgid team directory) before Alice's area was closed, and makes Alice's redirected
    copy grow after the save. Root's `fsprobe sync` copies it back with `copy_bytes`, which
    reads to the end of the file: it must not write more than the manifest's size into the
    target filesystem (here a 64 MiB tmpfs; on a shared Lustre, everyone's)."""
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    scratch = make_dir(place / "scratch", 0o1777)
    target_fs = tmpfs(size="64M").path
    share(target_fs)
    target = make_dir(target_fs / "ckpt", 0o755)  # root's: Alice's save is redirected
    requested = target / "model.pt"
    area = area_of(scratch, alice)
    mirror = Path(str(area) + str(target))

    def old_area() -> None:
        os.umask(0o002)
        mirror.mkdir(parents=True)
        os.chmod(area, 0o755)
        for directory in [mirror, *mirror.parents]:
            if directory == area:
                break
            os.chown(directory, -1, team)
            os.chmod(directory, 0o2755)  # setgid: new files are the team's

    alice.run(old_area)
    mallory_process = subprocess.Popen(
        [mallory.python_executable, "-c", MALLORY_GROWS_THE_COPY, str(mirror), "model.pt"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **mallory.subprocess_kwargs(),
    )
    try:
        assert mallory_process.stdout.readline() == "in\n"
        save = "import os; os.umask(0o002)\n" + SAVE
        done = alice.python(save, str(requested), "alice's", str(scratch))
        assert done.returncode == 0, done.stderr
        assert '"redirected": true' in done.stdout, done.stdout
        mallory_process.stdin.write("\n")
        mallory_process.stdin.flush()
        assert mallory_process.stdout.readline() == "grown\n"
        os.chown(target, alice.uid, alice.gid)  # the target is Alice's to write again

        _, report = fsprobe_sync(local_users.python, None, "--fallback-dir", str(scratch))
    finally:
        mallory_process.stdin.close()
        mallory_process.wait(timeout=30)
    actions = [entry["action"] for entry in report["entries"]]
    messages = [entry.get("message", "") for entry in report["entries"]]
    assert "ENOSPC" not in " ".join(messages), report
    assert actions == ["failed"] and "EFBIG" in " ".join(messages), report
    assert os.listdir(target) == []
