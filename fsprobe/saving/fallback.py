"""Fallback directories: which ones, and where a redirected checkpoint lands in one.

When the target directory cannot take a checkpoint, `fsprobe.save` writes it into a fallback
directory instead, at the requested absolute path mirrored under the fallback::

    requested  /lustre/proj/run7/ckpt/last.pt
    fallback   /scratch/me/fallback
    actual     /scratch/me/fallback/lustre/proj/run7/ckpt/last.pt

Mirroring the whole path (not only the file name) keeps two runs that both save ``last.pt`` from
overwriting each other in the fallback, and tells a person at a glance where a file belongs.
Fallback directories always come from the caller (arguments, configuration,
``FSPROBE_FALLBACK_DIRS``), never from a file another process wrote.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping

from fsprobe.paths import is_under

FALLBACK_ENV = "FSPROBE_FALLBACK_DIRS"


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


def redirect_path(fallback: str, requested: str) -> str:
    """Where a save of `requested` lands in `fallback`: its absolute path mirrored beneath."""
    return os.path.join(os.path.abspath(fallback), os.path.abspath(requested).lstrip("/"))


def prepare_directory(fallback: str, actual: str) -> None:
    """Create the mirrored directories of `actual` inside `fallback`, never `fallback` itself.

    A fallback directory that does not exist is a configuration mistake (a typo, an unmounted
    scratch); creating it would hide that, so it fails with ENOENT like any other missing dir.
    """
    if not os.path.isdir(fallback):
        raise FileNotFoundError(errno.ENOENT, "fallback directory does not exist", fallback)
    os.makedirs(os.path.dirname(actual), exist_ok=True)


def remove_mirrored_dirs(fallback: str, actual: str) -> None:
    """Remove the now empty mirrored directories of `actual`, up to (not including) `fallback`."""
    directory = os.path.dirname(actual)
    root = os.path.abspath(fallback)
    while is_under(directory, root) and directory != root:
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty (another checkpoint, a user's file) or not ours to remove
        directory = os.path.dirname(directory)
