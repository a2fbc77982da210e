"""The probes by name, for where they run (the worker, `fsprobe.probing.threads`): a caller names
one (`ProbeCall`) and loads none of their code, the `lfs` parsers above all."""

from __future__ import annotations

import functools
from collections.abc import Callable

from fsprobe.probing.imports import probe_imports
from fsprobe.probing.lfs_df import probe_lfs_df
from fsprobe.probing.quota import probe_quota
from fsprobe.probing.runner import ProbeCall, Work
from fsprobe.probing.statvfs import probe_statvfs
from fsprobe.probing.tmpdir import probe_tmpdir
from fsprobe.probing.write import probe_write

PROBES: dict[str, Callable[..., object]] = {
    "statvfs": probe_statvfs,
    "tmpdir": probe_tmpdir,
    "write": probe_write,
    "quota": probe_quota,
    "lfs_df": probe_lfs_df,
    "imports": probe_imports,
}


def bound(work: Work) -> Callable[[], object]:
    """`work` as a function to call: a named probe looked up in `PROBES` (KeyError if unknown)."""
    if isinstance(work, ProbeCall):
        return functools.partial(PROBES[work.name], *work.args)
    return work
