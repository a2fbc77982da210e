"""The default layout of a directory, from ``lfs getstripe -d -y DIR``: which pools new files use.

Plain and composite layouts, up to 2.15 and from 2.16 (LU-15565): docs/lfs-output-formats.md.
Every line not of the form is reported, not skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fsprobe.errors import PARSE, ProbeFailure
from fsprobe.lustre.runner import LfsRun, status_error_name

#: ``key: value`` or a bare ``key:`` (a component or a sub-layout), indented, maybe a list item.
_LINE = re.compile(r"^\s*(?:- )?([A-Za-z_][A-Za-z0-9_.]*):(?:\s+(\S+))?\s*$")
#: The key that opens a component in every version (``componentN:`` only up to 2.15).
_COMPONENT_START = "lcme_id"


@dataclass(frozen=True)
class Component:
    """One component of a layout: the pool its stripes go to, or Data-on-MDT."""

    pool: str | None
    on_mdt: bool = False


@dataclass(frozen=True)
class Layout:
    """A directory's default layout, as far as placement goes."""

    components: tuple[Component, ...]
    composite: bool

    @property
    def inherits_pool(self) -> bool:
        """Whether a new file takes the pool of the root's default layout instead: a plain
        layout without a pool does (LOD's `lod_ah_init` fills in what a plain default leaves
        unset from the root's plain default, the pool among it)."""
        return not self.composite and self.components[0].pool is None

    @property
    def pools(self) -> tuple[str, ...]:
        """The pools that OST components name, sorted, each once."""
        return tuple(sorted({c.pool for c in self.components if c.pool and not c.on_mdt}))

    @property
    def anywhere(self) -> bool:
        """Whether some component may place data on any OST (it names no pool)."""
        return any(c.pool is None and not c.on_mdt for c in self.components)


def _component(fields: dict[str, str]) -> Component:
    return Component(pool=fields.get("pool") or None, on_mdt=fields.get("pattern") == "mdt")


def parse_layout(run: LfsRun) -> Layout:
    """The layout `lfs getstripe -d -y` printed; ProbeFailure for a failed run or a line that
    is not YAML of the expected form (named, with the command)."""
    if run.status != 0:
        said = run.stderr.strip() or "no message"
        raise ProbeFailure(status_error_name(run.status), f"{run.command}: {said}")
    components: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in run.stdout.splitlines():
        if not line.strip():
            continue
        match = _LINE.match(line)
        if match is None:
            raise ProbeFailure(PARSE, f"{run.command}: cannot read {line.strip()!r}")
        key, value = match.group(1), match.group(2)
        if key == _COMPONENT_START:
            if current:
                components.append(current)
            current = {}
        if value is not None:
            current[key] = value
    if current:
        components.append(current)
    # The composite header (lcm_*) precedes the first component: it holds no sub-layout.
    placed = [fields for fields in components if "pattern" in fields or "pool" in fields]
    if not placed:
        raise ProbeFailure(PARSE, f"{run.command}: printed no layout ({run.stdout.strip()!r})")
    composite = any(_COMPONENT_START in fields for fields in components)
    return Layout(tuple(_component(fields) for fields in placed), composite)
