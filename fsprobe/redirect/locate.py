"""`fsprobe.locate()`: where the newest committed copy of a checkpoint is, for a resume.

The manifest decides, with its trust rules (`fsprobe.redirect.manifest.newest_copy`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.manifest import newest_copy, pending


def locate(
    path: str | os.PathLike[str], *, fallback_dirs: Iterable[str | os.PathLike[str]] = ()
) -> str:
    """The absolute path to load the checkpoint saved as `path` from: itself, or its newer
    redirected copy in `fallback_dirs` or ``FSPROBE_FALLBACK_DIRS``.

    Nothing is copied or changed; with no newer copy, `path` is returned whether it exists or
    not (loading it then fails as it would have).
    """
    return newest_copy(os.path.abspath(os.fspath(path)), all_fallback_dirs(fallback_dirs))


def numbered_checkpoints(
    directory: str | os.PathLike[str], name: re.Pattern[str], fallbacks: Sequence[str]
) -> list[str]:
    """The checkpoints of `directory` whose names `name` matches, its first group their number
    (``checkpoint-500``): absolute, lowest number first, where they are or redirected to
    `fallbacks` and not synced back yet (how the frameworks' rotation and resume see them)."""
    directory = os.path.abspath(os.fspath(directory))
    names = os.listdir(directory) if os.path.isdir(directory) else []
    names += [
        os.path.basename(entry.requested)
        for entry in pending(fallbacks, mine=True)
        if os.path.dirname(entry.requested) == directory
    ]
    numbered = {int(match[1]): match[0] for match in map(name.match, names) if match}
    return [os.path.join(directory, numbered[number]) for number in sorted(numbered)]


def newest_directory(checkpoints: Sequence[str], fallbacks: Sequence[str]) -> str | None:
    """The newest of `checkpoints` (oldest first) that is a directory wherever it landed, at its
    newest copy (`locate`); None when none is."""
    for checkpoint in reversed(checkpoints):
        found = locate(checkpoint, fallback_dirs=fallbacks)
        if os.path.isdir(found):
            return found
    return None
