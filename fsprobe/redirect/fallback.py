"""Fallback directories: which ones. The caller's, then those of ``FSPROBE_FALLBACK_DIRS``;
where in one a redirected checkpoint lands is `fsprobe.redirect.areas`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

FALLBACK_ENV = "FSPROBE_FALLBACK_DIRS"


def fallback_dirs_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``FSPROBE_FALLBACK_DIRS``, colon-separated like ``PATH``; empty items are ignored."""
    return tuple(item for item in environ.get(FALLBACK_ENV, "").split(":") if item)


def all_fallback_dirs(
    given: Iterable[str | os.PathLike[str]] = (), environ: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """The caller's fallback directories, then those of the environment, each once, absolute."""
    if not given and not environ.get(FALLBACK_ENV):
        return ()  # the common case, on the path of every save
    seen: dict[str, None] = {}
    for directory in (*given, *fallback_dirs_from_env(environ)):
        seen.setdefault(os.path.abspath(os.fspath(directory)), None)
    return tuple(seen)
