"""The probes by name, for where they run (the worker, `fsprobe.probing.threads`): a caller names
one (`ProbeCall`) and loads none of their code, the `lfs` parsers above all."""

from __future__ import annotations

import functools
from collections.abc import Callable

from fsprobe.lustre.caches import LustreCaches
from fsprobe.probing.imports import probe_imports
from fsprobe.probing.lfs_df import probe_lfs_df
from fsprobe.probing.quota import lookup_quota, probe_quota
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
    "quota_lookup": lookup_quota,
}
#: The probes that ask `lfs`: they keep its answers in the caches of where they run.
_ASKING_LFS = frozenset({"quota", "lfs_df", "imports", "quota_lookup"})


def bound(work: Work, caches: LustreCaches) -> Callable[[], object]:
    """`work` as a function to call: a named probe looked up in `PROBES` (KeyError if unknown),
    handed `caches` if it asks `lfs`."""
    if not isinstance(work, ProbeCall):
        return work
    if work.name in _ASKING_LFS:
        return functools.partial(PROBES[work.name], *work.args, caches=caches)
    return functools.partial(PROBES[work.name], *work.args)
