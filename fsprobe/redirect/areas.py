"""Where in a fallback directory a redirected checkpoint lands:
``<fallback>/uid-<uid>/<requested path>``, the user's own area (docs/design.md §7; the
rules that keep it hers: docs/security.md, "Fallback directories").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from fsprobe.posix.owned import NotTrusted, components, walk

log = logging.getLogger("fsprobe.redirect")

#: The name of a user's area: ``uid-<uid>``, or ``uid-<uid>.<16 random hex digits>`` where
#: someone else made a ``uid-<uid>`` first (a squat; see `claim_area`).
AREA_NAME = re.compile(r"^uid-(?P<uid>\d+)(?:\.[0-9a-f]{16})?$")
#: An area is its user's alone, to read too: a checkpoint redirected from a directory that
#: only its user may enter must not become readable by everyone who shares the fallback.
AREA_MODE = 0o700
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
#: Names of one fallback directory looked at, at most, by one listing of its areas: anyone who
#: may write a shared fallback can fill it with millions of names, and root's daemon lists it
#: every round (100,000 names take that listing about a tenth of a second).
MAX_AREA_NAMES = 100_000


class CrowdedFallback(OSError):
    """A fallback directory holds more names than one listing of its areas looks at."""


def fallback_entries(fallback: str, max_names: int = MAX_AREA_NAMES) -> Iterator[os.DirEntry]:
    """The entries of `fallback`, streamed (a batch of names at a time, never a list of all);
    `CrowdedFallback` (E2BIG) instead of the entry after the first `max_names`."""
    with os.scandir(fallback) as listing:
        for seen, item in enumerate(listing):
            if seen >= max_names:
                raise CrowdedFallback(
                    errno.E2BIG,
                    f"it holds more than {max_names} names, and those past them were not "
                    "looked at: someone filled it (its areas there are neither counted nor "
                    "synced by root, but kept; their users' own syncs find their own)",
                    fallback,
                )
            yield item


def area_name(uid: int) -> str:
    """The name of a user's area in a fallback directory."""
    return f"uid-{uid}"


def mirrored(requested: str) -> str:
    """`requested` as a path relative to an area: absolute, normalised, without the root."""
    return os.path.abspath(requested).lstrip("/")


def redirect_path(fallback: str, requested: str) -> str:
    """Where a save of `requested` by this user lands in `fallback` (`claim_area`)."""
    return os.path.join(claim_area(fallback).path, mirrored(requested))


def fallback_of(requested: str, landed: str, uid: int) -> str | None:
    """The fallback directory a save of `requested` by `uid` landed in at `landed` (the
    inverse of `redirect_path`), or None if `landed` is not in an area of that user's."""
    relative = "/" + mirrored(requested)
    if not landed.endswith(relative) or os.path.normpath(landed) != landed:
        return None
    area, name = os.path.split(landed[: -len(relative)])
    match = AREA_NAME.match(name)
    if match is None or int(match["uid"]) != uid or area == "/" or not area.startswith("/"):
        return None
    return area


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
    """The calling user's area in `fallback`: ``uid-<uid>``, or, where someone else made that
    name first, the private area this user made instead (if there is one yet)."""
    fallback = os.path.abspath(fallback)
    uid = os.geteuid()
    standard = Area(fallback, os.path.join(fallback, area_name(uid)), uid)
    if _squatter(standard) is None:
        return standard
    return _private_area(fallback, uid) or standard


def claim_area(fallback: str) -> Area:
    """`own_area`, made anew under a name nobody can guess if ``uid-<uid>`` is someone else's.

    Anyone who may write a shared fallback can ``mkdir -m 700 uid-<victim>`` (for every uid at
    once), and the sticky bit keeps the victim from removing it: every redirect of the victim
    failed. Such a squat costs one warning, naming the squatter, when the private area
    ``uid-<uid>.<random>`` is made (64 random bits: not to be made in advance); later saves,
    `locate`, `sync` and root's daemon find it as the user's area (it is theirs, 0700).
    """
    area = own_area(fallback)
    squatter = _squatter(area)
    if squatter is None:
        return area
    name = f"{area_name(area.owner)}.{os.urandom(8).hex()}"
    root = open_root(area.fallback)
    try:
        os.mkdir(name, AREA_MODE, dir_fd=root)
    finally:
        os.close(root)
    private = Area(area.fallback, os.path.join(area.fallback, name), area.owner)
    log.warning(
        "fallback area %s belongs to uid %d, not to you (uid %d): someone made it first; "
        "your redirected checkpoints go to %s instead",
        area.path, squatter, area.owner, private.path,
    )  # fmt: skip
    return private


def _squatter(area: Area) -> int | None:
    """The owner of what stands at `area`'s name when it is not the user's own directory."""
    try:
        info = os.lstat(area.path)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode) and info.st_uid == area.owner:
        return None
    return info.st_uid


def directory_of(item: os.DirEntry, uid: int) -> bool:
    """Whether `item` is a directory (not followed if a link) that `uid` owns."""
    try:
        info = item.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == uid


def _private_area(fallback: str, uid: int) -> Area | None:
    """The private area `claim_area` made for `uid` in `fallback`, if any (the first by name).

    The user's own lookup, not root's: it streams every name, past `MAX_AREA_NAMES` too. A
    neighbour who squatted ``uid-<uid>`` and then filled the fallback with names would
    otherwise hide the user's area from her own saves and `locate` (a resume from an older
    checkpoint, silently). Only her own directories are kept, so what others make costs her
    time, never memory.
    """
    prefix = f"{area_name(uid)}."
    names: list[str] = []
    with contextlib.suppress(OSError), os.scandir(fallback) as listing:
        for item in listing:
            if item.name.startswith(prefix) and directory_of(item, uid):
                names.append(item.name)
    for name in sorted(names):
        area = Area(fallback, os.path.join(fallback, name), uid)
        if AREA_NAME.match(name) and _squatter(area) is None:
            return area
    return None


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
