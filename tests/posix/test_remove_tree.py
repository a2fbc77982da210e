"""`fsprobe.posix.tree.remove_tree`: bounded like every other walk of a tree someone filled.

It removes a staging directory, a crashed save's leftovers and a synced directory copy, in
the user's own run (root's sync as the user, her trainer's save). It listed each directory
whole (`os.listdir`, sorted) and recursed without a bound: a copy grown to many files cost
memory in proportion (in root's service's memory limit, for root's run as the user), and a
deep enough tree raised RecursionError, which no caller's ``except OSError`` expects (a save's
cleanup "never raises").
"""

from __future__ import annotations

import errno
import os
import tracemalloc
from pathlib import Path

import pytest

from fsprobe.posix.tree import MAX_DEPTH, opened, remove_tree
from tests.support.users import share

DEEP = 1100  # past Python's recursion limit, as the old walk went: two frames a level


def make_chain(root: Path, depth: int) -> None:
    """`root`/d/d/.../d, `depth` directories deep (made relative to descriptors: no long path)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def remove_chain(root: Path) -> None:
    """Remove what `make_chain` made, bottom up, without recursion."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while "d" in os.listdir(fds[-1]):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.close(fds.pop())
    while fds:
        os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_a_tree_deeper_than_the_walks_bound_is_refused_with_an_oserror(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    make_chain(tree, DEEP)
    try:
        parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        with opened(parent), pytest.raises(OSError) as refused:  # on main: RecursionError
            remove_tree(parent, "tree")
        assert refused.value.errno == errno.ELOOP
        assert str(MAX_DEPTH) in str(refused.value)
    finally:
        remove_chain(tree)
    tree.rmdir()


def test_a_tree_as_deep_as_the_bound_is_removed(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    make_chain(tree, MAX_DEPTH - 1)
    with opened(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as parent:
        assert remove_tree(parent, "tree")
    assert os.listdir(tmp_path) == []


def test_removing_a_directory_of_many_entries_streams_them(tmp_path):
    """20,000 names of 100 characters: listed whole they take some 3.5 MiB."""
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for number in range(20_000):
        os.close(os.open(f"{number:0100d}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.close(fd)
    with opened(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as parent:
        tracemalloc.start()
        try:
            assert remove_tree(parent, "tree")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert not tree.exists()
    assert peak < 256 * 1024, f"removing 20,000 entries took {peak} bytes at its peak"


def test_what_a_neighbour_owns_stays_with_its_directories_and_links_are_not_followed(
    tmp_path, local_users
):
    share(tmp_path)
    mallory = local_users.user()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("kept")
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "b" / "c").mkdir(parents=True)
    (tree / "a" / "mine").write_text("x")
    (tree / "b" / "c" / "mine").write_text("x")
    (tree / "a" / "link").symlink_to(outside)
    (tree / "b" / "link").symlink_to(outside / "precious")
    theirs = tree / "a" / "theirs"
    theirs.write_text("hers")
    os.chown(theirs, mallory.uid, mallory.gid)
    with opened(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)) as parent:
        assert not remove_tree(parent, "tree")
    left = sorted(str(p.relative_to(tmp_path)) for p in tree.rglob("*"))
    assert left == ["tree/a", "tree/a/theirs"]
    assert (outside / "precious").read_text() == "kept"
