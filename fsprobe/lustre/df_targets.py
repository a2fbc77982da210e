"""From two `lfs df` runs (blocks and ``-i``) to one `LustreTarget` per MDT and OST.

Targets lfs could not ask, and inactive ones, are kept so the policy sees every target.
"""

from __future__ import annotations

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.df_parser import DfBlock, DfOutput
from fsprobe.lustre.runner import USAGE_STATUS, status_error_name
from fsprobe.model import LustreTarget

_FLAG_ORDER = "DRN?SIaf"


def _failure(output: DfOutput, command: str, directory: str) -> ProbeFailure:
    """Why a run gave no table for `directory`."""
    if output.not_lustre:
        error = status_error_name(output.status) if output.status else "ENODEV"
        return ProbeFailure(error, f"{directory} is not on a Lustre filesystem (lfs df said so)")
    said = " ".join(m.text for m in output.messages) or " ".join(
        u.text.strip() for u in output.unparsed if u.stream == "stderr"
    )
    if output.status == USAGE_STATUS:
        return ProbeFailure("EINVAL", f"{command}: lfs rejected the command line: {said}")
    if output.status:
        detail = said or "no message"
        return ProbeFailure(
            status_error_name(output.status), f"{command}: exit status {output.status}: {detail}"
        )
    unread = [u for u in output.unparsed if u.stream == "stdout"]
    if unread:
        return ProbeFailure(PARSE, f"{command}: cannot read {unread[0].describe()}")
    return ProbeFailure(
        "ENODEV",
        f"{command} printed no table: {directory} is not on a Lustre filesystem "
        "(Lustre 2.12 and 2.14 print nothing for other filesystems)",
    )


def pick_block(output: DfOutput, mountpoint: str | None, command: str, directory: str) -> DfBlock:
    """The table of the filesystem at `mountpoint` (the first one if none matches)."""
    blocks = [block for block in output.filesystems if block.targets or block.errors]
    if not blocks:
        raise _failure(output, command, directory)
    unread = [u for u in output.unparsed if u.stream == "stdout"]
    if unread:
        raise ProbeFailure(PARSE, f"{command}: cannot read {unread[0].describe()}")
    return next((b for b in blocks if b.mountpoint == mountpoint), blocks[0])


def _merge_flags(*flag_sets: str) -> str:
    present = set("".join(flag_sets))
    return "".join(letter for letter in _FLAG_ORDER if letter in present)


def merge_targets(space: DfBlock, inodes: DfBlock) -> tuple[LustreTarget, ...]:
    """One LustreTarget per (kind, index) seen in either table, MDTs first, by index."""
    if space.inodes or not inodes.inodes:
        raise ProbeFailure(PARSE, "lfs df: expected a block table and an inode (-i) table")
    fsname = space.fsname or inodes.fsname or "lustre"
    found: dict[tuple[str, int], dict] = {}

    def slot(kind: str, index: int, name: str) -> dict:
        return found.setdefault(
            (kind, index),
            {"name": name, "size": None, "avail": None, "files": None, "free": None,
             "active": True, "flags": "", "unknown": 0},
        )  # fmt: skip

    for row in space.targets:
        entry = slot(row.kind, row.index, row.name)
        entry.update(size=row.total.value, avail=row.available.value)
    for row in inodes.targets:
        entry = slot(row.kind, row.index, row.name)
        entry.update(files=row.total.value, free=row.available.value)
    for row in (*space.targets, *inodes.targets):
        entry = found[(row.kind, row.index)]
        entry["flags"] = _merge_flags(entry["flags"], row.flags)
        entry["unknown"] |= row.unknown_state
    for error in (*space.errors, *inodes.errors):
        slot(error.kind, error.index, error.name)
    for inactive in (*space.inactive, *inodes.inactive):
        name = f"{fsname}-{inactive.kind}{inactive.index:04x}"
        slot(inactive.kind, inactive.index, name)["active"] = False
    return tuple(
        LustreTarget(
            name=entry["name"],
            kind=kind,
            index=index,
            size_bytes=entry["size"],
            avail_bytes=entry["avail"],
            files=entry["files"],
            files_free=entry["free"],
            active=entry["active"],
            flags=entry["flags"],
            unknown_state=entry["unknown"],
        )
        for (kind, index), entry in sorted(found.items(), key=lambda item: item[0])
    )
