"""``fsprobe.prom`` for node_exporter's textfile collector: replaced atomically, no timestamps."""

from __future__ import annotations

from fsprobe.posix.outputdir import OutputDirectory

TEXTFILE_NAME = "fsprobe.prom"


def open_textfile_dir(path: str) -> OutputDirectory:
    """The textfile directory, opened once and checked like the state dir: a directory of
    root's (or of the daemon's user) that nobody else may write, never through a symlink."""
    return OutputDirectory(path, "textfile dir")


def write_textfile(directory: OutputDirectory, exposition: bytes) -> str:
    """Replace ``fsprobe.prom`` in `directory` with `exposition`; returns its path."""
    return directory.publish(TEXTFILE_NAME, exposition, 0o644)  # node_exporter: another user
