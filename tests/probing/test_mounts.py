"""The mount table: octal escapes, longest prefix, stacked mounts, missing targets."""

from __future__ import annotations

import os

from fsprobe.probing.mounts import find_mount, parse_mountinfo, read_mounts
from fsprobe.probing.quota import locate

MOUNTINFO = (
    "22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "30 22 0:42 / /lustre rw,relatime shared:9 - lustre 10.0.0.1@o2ib:/proj rw,flock\n"
    "31 22 0:43 / /mnt/my\\040data rw - nfs4 srv:/export\\040x rw\n"
    "32 22 0:44 / /mnt/ro ro,relatime - tmpfs tmpfs rw\n"
    "33 32 0:45 / /mnt/ro rw,relatime - tmpfs tmpfs2 rw\n"
    "garbage line\n"
    "34 22 0:46 / /lustre/proj/sub rw master:3 unbindable - nfs srv:/sub rw\n"
)


def test_parse_unescapes_and_skips_malformed_lines():
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 6
    spaced = mounts[2]
    assert spaced.mountpoint == "/mnt/my data"
    assert spaced.source == "srv:/export x"
    assert spaced.fstype == "nfs4"
    assert spaced.device == "0:43"
    assert mounts[3].readonly and not mounts[4].readonly


def test_optional_fields_before_the_separator_are_skipped():
    last = parse_mountinfo(MOUNTINFO)[-1]
    assert (last.mountpoint, last.fstype, last.source) == ("/lustre/proj/sub", "nfs", "srv:/sub")


def test_longest_prefix_wins_and_prefix_must_end_at_a_component():
    mounts = parse_mountinfo(MOUNTINFO)
    assert find_mount("/lustre/proj/ckpt", mounts).fstype == "lustre"
    assert find_mount("/lustre/proj/sub/x", mounts).fstype == "nfs"
    assert find_mount("/lustreX/y", mounts).mountpoint == "/"
    assert find_mount("/mnt/my data/run1", mounts).fstype == "nfs4"


def test_stacked_mounts_the_last_one_is_visible():
    assert find_mount("/mnt/ro/x", parse_mountinfo(MOUNTINFO)).source == "tmpfs2"


def test_real_mount_table_has_root():
    assert find_mount("/", read_mounts()).mountpoint == "/"


def test_a_target_not_made_yet_is_stood_in_for_by_its_nearest_existing_directory(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert locate(str(link / "not" / "yet"))[0] == os.path.realpath(real)  # symlinks resolved
    assert locate(str(real))[0] == os.path.realpath(real)
