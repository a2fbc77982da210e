"""Fallback directories: which ones, and where in one a redirected checkpoint lands.

When the target directory cannot take a checkpoint, `fsprobe.save` writes it into a fallback
directory instead, into the saving user's own area there, at the requested absolute path
mirrored beneath it::

    requested  /lustre/proj/run7/ckpt/last.pt
    fallback   /scratch/team/fallback
    actual     /scratch/team/fallback/uid-1001/lustre/proj/run7/ckpt/last.pt

Mirroring the whole path (not only the file name) keeps two runs that both save ``last.pt``
from overwriting each other and tells a person at a glance where a file belongs. The area per
user (``uid-<uid>``, holding that user's copies and manifest) is what lets a team share one
fallback directory: nobody reads or writes another member's directories, and every name in an area
provably belongs to its user (`fsprobe.posix.owned`): the area and every directory below it are
owned by the user and writable by nobody else, and each is opened without following symlinks.

A fallback directory that others may write (a team's, a scratch root) must have the sticky
bit (``chmod +t``, like ``/tmp``), or they could rename a user's area away and put their own
in its place. Fallback directories always come from the caller (arguments, configuration,
``FSPROBE_FALLBACK_DIRS``), never from a file another process wrote.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fsprobe.posix.owned import NotTrusted, components, walk

FALLBACK_ENV = "FSPROBE_FALLBACK_DIRS"
#: The name of a user's area: ``uid-<uid>``.
AREA_NAME = re.compile(r"^uid-(?P<uid>\d+)$")
#: An area is its user's alone, to read too: a checkpoint redirected from a directory that
#: only its user may enter must not become readable by everyone who shares the fallback.
AREA_MODE = 0o700
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def fallback_dirs_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``FSPROBE_FALLBACK_DIRS``, colon-separated like ``PATH``; empty items are ignored."""
    return tuple(item for item in environ.get(FALLBACK_ENV, "").split(":") if item)


def all_fallback_dirs(
    given: Iterable[str] = (), environ: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """The caller's fallback directories, then those of the environment, each once, absolute."""
    if not given and not environ.get(FALLBACK_ENV):
        return ()  # the common case, on the path of every save
    seen: dict[str, None] = {}
    for directory in (*given, *fallback_dirs_from_env(environ)):
        seen.setdefault(os.path.abspath(os.fspath(directory)), None)
    return tuple(seen)


def area_name(uid: int) -> str:
    """The name of a user's area in a fallback directory."""
    return f"uid-{uid}"


def mirrored(requested: str) -> str:
    """`requested` as a path relative to an area: absolute, normalised, without the root."""
    return os.path.abspath(requested).lstrip("/")


def redirect_path(fallback: str, requested: str) -> str:
    """Where a save of `requested` by this user lands in `fallback`."""
    return os.path.join(own_area(fallback).path, mirrored(requested))


def open_root(fallback: str) -> int:
    """Open a fallback directory itself, as configured; refuse one others could rearrange.

    The configured path is the caller's choice and is followed as given. But when others may
    write the directory, only the sticky bit stops them from renaming a user's area away and
    putting theirs in its place between a check and its use.
    """
    fd = os.open(fallback, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if mode & _OTHERS_WRITE and not mode & stat.S_ISVTX:
        os.close(fd)
        raise NotTrusted(
            f"fallback directory {fallback} is writable by others without the sticky bit "
            f"({stat.filemode(mode)}): they could swap your checkpoints; chmod +t it"
        )
    return fd


@dataclass(frozen=True)
class Area:
    """One user's part of a fallback directory: their manifest and their redirected copies.

    `path` is ``<fallback>/uid-<owner>``, or for a manifest written by fsprobe before areas
    existed, the fallback directory itself (read and synced, never written any more).
    """

    fallback: str
    path: str
    owner: int

    @property
    def legacy(self) -> bool:
        return self.path == self.fallback

    def open(self, create: bool = False) -> int:
        """A descriptor of the area, proven to be the owner's; the caller closes it."""
        root = open_root(self.fallback)
        try:
            if self.legacy:
                return os.dup(root)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(os.path.basename(self.path), AREA_MODE, dir_fd=root)
            area = walk(root, [os.path.basename(self.path)], self.owner, where=self.fallback)
        finally:
            os.close(root)
        if create:  # the owner saving into it; an area of an earlier version was 0755
            mode = stat.S_IMODE(os.fstat(area).st_mode)
            if mode & ~AREA_MODE & 0o777:
                os.fchmod(area, mode & ~0o077)
        return area

    def names(self, actual: str) -> list[str]:
        """The names leading from the area to `actual`; NotTrusted if it is not beneath it."""
        if not actual.startswith(self.path.rstrip("/") + "/"):
            raise NotTrusted(f"{actual} is not in {self.path}")
        return components(actual[len(self.path.rstrip("/")) + 1 :])

    def make_parent(self, actual: str) -> tuple[int, str]:
        """(descriptor of the directory holding `actual`, its name): the area and the
        directories on the way made where missing, every step proven."""
        *directories, name = self.names(actual)
        area = self.open(create=True)
        try:
            return walk(area, directories, self.owner, create=True, where=self.path), name
        finally:
            os.close(area)


def own_area(fallback: str) -> Area:
    """The calling user's area in `fallback`."""
    fallback = os.path.abspath(fallback)
    uid = os.geteuid()
    return Area(fallback, os.path.join(fallback, area_name(uid)), uid)


def prepare_directory(fallback: str, actual: str) -> None:
    """Create the user's area and the mirrored directories of `actual`, proving each one.

    A fallback directory that does not exist is a configuration mistake (a typo, an unmounted
    scratch); creating it would hide that, so it fails with ENOENT like any other missing dir.
    Raises `NotTrusted` (EACCES) when a name on the way is not the user's: a symlink, a
    directory of someone else, one that others may write.
    """
    if not os.path.isdir(fallback):
        raise FileNotFoundError(errno.ENOENT, "fallback directory does not exist", fallback)
    directory, _ = own_area(fallback).make_parent(actual)
    os.close(directory)


def remove_mirrored_dirs(fallback: str, actual: str) -> None:
    """Remove the now empty directories of `actual` in the user's area, and the area if empty.

    Best effort: a directory that is not empty (another checkpoint) or not provably the
    user's stays.
    """
    area = own_area(fallback)
    with contextlib.suppress(OSError):
        remove_empty_parents(area, area.names(actual))


def remove_empty_parents(area: Area, names: list[str]) -> None:
    """Remove the empty directories leading to ``names[-1]``, deepest first, then the area."""
    opened = [area.open()]
    try:
        for name in names[:-2]:
            opened.append(walk(opened[-1], [name], area.owner, where=area.path))
        for parent, name in zip(reversed(opened), reversed(names[:-1])):
            os.rmdir(name, dir_fd=parent)
    finally:
        for fd in opened:
            os.close(fd)
    remove_area_if_empty(area)


def remove_area_if_empty(area: Area) -> None:
    """Remove a user's area once nothing is left in it (OSError if something is)."""
    if area.legacy:
        return
    root = open_root(area.fallback)
    try:
        os.rmdir(os.path.basename(area.path), dir_fd=root)
    finally:
        os.close(root)
