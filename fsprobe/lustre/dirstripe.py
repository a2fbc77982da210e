"""The MDTs of a directory, from ``lfs getdirstripe DIR``: where a new file's inode goes.

A new file's inode is created on the MDT of its parent directory, or, in a striped directory,
on the stripe its name hashes to, which may be any of them (lustre-release v2_17_0,
lustre/llite/dir.c `LL_IOC_LMV_GETSTRIPE`, lustre/utils/liblustreapi.c `lmv_dump_user_lmm`;
docs/lfs-output-formats.md §5). The form is the same from 2.12 to 2.17.
"""

from __future__ import annotations

import re

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.runner import LfsRun, status_error_name

#: The first line: ``lmv_stripe_count: 2 lmv_stripe_offset: 1 lmv_hash_type: crush`` (the
#: offset is the directory's own MDT; a plain directory has count 0).
_HEADER = re.compile(r"^lmv_stripe_count: ([0-9]+) lmv_stripe_offset: ([0-9]+)(?: |$)")
#: The stripes' title, then one ``%6u\t\t [FID]\t\t`` line per stripe: its MDT and object.
_TITLE = "mdtidx\t\t FID[seq:oid:ver]"
_STRIPE = re.compile(r"^ *([0-9]+)\t\t \[0x[0-9a-f]+:0x[0-9a-f]+:0x[0-9a-f]+\]\t\t( \*)?$")


def parse_dirstripe(run: LfsRun) -> frozenset[int]:
    """The MDT indexes a new file in the directory can be created on; ProbeFailure for a failed
    run or a line of another form (named, with the command)."""
    if run.status != 0:
        said = run.stderr.strip() or "no message"
        raise ProbeFailure(status_error_name(run.status), f"{run.command}: {said}")
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    header = _HEADER.match(lines[0]) if lines else None
    if header is None:
        raise ProbeFailure(PARSE, f"{run.command}: cannot read {run.stdout.strip()[:200]!r}")
    count, offset = int(header.group(1)), int(header.group(2))
    stripes: list[int] = []
    for line in lines[1:]:
        stripe = _STRIPE.match(line)
        if line == _TITLE and not stripes:
            continue
        if stripe is None:
            raise ProbeFailure(PARSE, f"{run.command}: cannot read the line {line[:200]!r}")
        stripes.append(int(stripe.group(1)))
    if len(stripes) != count:
        raise ProbeFailure(PARSE, f"{run.command}: {len(stripes)} stripes listed of {count}")
    return frozenset(stripes or (offset,))
