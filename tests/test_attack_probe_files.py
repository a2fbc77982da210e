"""A member of a team against root's write probe of the team's root-owned directory.

A project directory owned by root, group-writable and without the sticky bit (``root:proj
2770``, as admins make them) is probed as its owner: root. Any member may rename in it, so
Mallory, watching it with inotify, moves each probe file into a directory of hers the moment it
is created. The probe can neither stop that nor find the file again, and on main each stolen
file stayed: 1 MiB of root's (``write_bytes``, up to 64 MiB), beyond every quota, per probe.
The probe now empties a file that still has a name after its removal: what Mallory keeps is an
empty inode, and nothing of hers is removed in its place.
"""

from __future__ import annotations

import os
import subprocess
import time

from fsprobe.errors import ProbeFailure
from fsprobe.probing.write import probe_write
from tests.support.users import share

PROBES = 6
SIZE = 1 << 20

#: Mallory's watcher: every probe file created in DIRECTORY is renamed into STASH at once.
STEAL = r"""
import ctypes, os, select, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
directory, stash, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
watch = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(watch, directory.encode(), 0x100 | 0x80) >= 0  # CREATE|MOVED_TO
source = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
into = os.open(stash, os.O_RDONLY | os.O_DIRECTORY)
print("watching", flush=True)
stolen = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    if not select.select([watch], [], [], 0.1)[0]:
        continue
    events = os.read(watch, 65536)
    at = 0
    while at < len(events):
        _, _, _, length = struct.unpack_from("iIII", events, at)
        name = events[at + 16 : at + 16 + length].rstrip(b"\0").decode()
        at += 16 + length
        if "write-probe" in name:
            try:
                os.rename(name, f"{stolen}{name}", src_dir_fd=source, dst_dir_fd=into)
                stolen += 1
            except OSError:
                pass
print(stolen, flush=True)
"""


def test_a_probe_file_a_team_member_steals_from_roots_directory_is_left_empty(
    tmp_path, local_users
):
    share(tmp_path)
    team = local_users.group()
    mallory = local_users.user(team)
    project = tmp_path / "project"
    project.mkdir()
    os.chown(project, 0, team)
    os.chmod(project, 0o2770)
    stash = project / "mallory"
    stash.mkdir()
    os.chown(stash, mallory.uid, mallory.gid)
    watcher = subprocess.Popen(
        [mallory.python_executable, "-c", STEAL, str(project), str(stash), "60"],
        **mallory.subprocess_kwargs(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert watcher.stdout.readline().strip() == "watching"
        outcomes = []
        for _ in range(PROBES):
            try:
                outcomes.append(probe_write(str(project), SIZE).ok)
            except ProbeFailure as failure:
                outcomes.append(failure.message)
            time.sleep(0.1)
    finally:
        watcher.kill()
        watcher.wait()
    kept = {p.name: (p.stat().st_uid, p.stat().st_size) for p in stash.iterdir()}
    assert kept, f"Mallory stole nothing (the attack did not happen): {outcomes}"
    assert set(kept.values()) == {(0, 0)}, kept  # root's, and empty
    assert sorted(p.name for p in project.iterdir()) == ["mallory"]
