"""Path predicates shared by the mount table, the state file and the fallback directories."""

from __future__ import annotations

import os


def is_under(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or inside it, by the text of both (made absolute).

    A string comparison: it says nothing about symlinks on the way, so it is for paths that
    were resolved already or that are compared for bookkeeping, never for a trust decision.
    """
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")
