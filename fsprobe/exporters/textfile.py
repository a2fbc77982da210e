"""The textfile output: ``fsprobe.prom`` for node_exporter's textfile collector.

node_exporter reads every ``*.prom`` file of its directory on each scrape, so the file must be
replaced atomically — a half-written file makes the whole collector fail. The new content is
written to a hidden temporary name (not ``*.prom``, so never read half-written), then renamed
over the old file. No timestamps: node_exporter refuses samples that carry one.
"""

from __future__ import annotations

import os

from fsprobe.atomic import publish_file

TEXTFILE_NAME = "fsprobe.prom"


def write_textfile(directory: str, exposition: bytes) -> str:
    """Replace ``<directory>/fsprobe.prom`` with `exposition`; returns its path."""
    path = os.path.join(directory, TEXTFILE_NAME)
    publish_file(path, exposition, 0o644)  # node_exporter usually runs as another user
    return path
