"""`fsprobe.locate()`: where the newest committed copy of a checkpoint is, for a resume.

The manifest decides, with its trust rules (`fsprobe.redirect.manifest.newest_copy`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from fsprobe.redirect.fallback import all_fallback_dirs
from fsprobe.redirect.manifest import newest_copy


def locate(
    path: str | os.PathLike[str], *, fallback_dirs: Iterable[str | os.PathLike[str]] = ()
) -> str:
    """The absolute path to load the checkpoint saved as `path` from: itself, or its newer
    redirected copy in `fallback_dirs` or ``FSPROBE_FALLBACK_DIRS``.

    Nothing is copied or changed; with no newer copy, `path` is returned whether it exists or
    not (loading it then fails as it would have).
    """
    return newest_copy(os.path.abspath(os.fspath(path)), all_fallback_dirs(fallback_dirs))
