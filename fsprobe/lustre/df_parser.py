"""Reading what `lfs df -v` and `lfs df -i -v` print (2.12-2.17, docs/lfs-output-formats.md §3).

`parse_df` is a pure function that never raises; lines no rule reads are returned by number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fsprobe.lustre.amounts import KIB, Amount, parse_df_value
from fsprobe.lustre.quota_parser import LfsMessage, Unparsed
from fsprobe.lustre.runner import USAGE_STATUS

_TITLE = re.compile(
    r"^UUID +(?P<total>1K-blocks|Inodes) +(?:Used|IUsed) +(?:Available|IFree) "
    r"+(?:Use%|IUse%) +Mounted on\s*$"
)
_NUMBERS = r"(?P<total>\S+) +(?P<used>\S+) +(?P<avail>\S+) +(?P<percent>[0-9]+)%"
#: The mount point follows the percent after one space (2.12-2.16) or two (2.17: `showdf`
#: prints each cell with a space after it and the mount point with one before); the status
#: letters may end in bits 2.17 has no letter for, in octal: ``D(02000)``.
_TARGET_ROW = re.compile(
    r"^(?P<uuid>\S+) +" + _NUMBERS + r" +(?P<mount>.*)\[(?P<kind>MDT|OST):(?P<index>[0-9]+)\]"
    r"(?: +(?P<flags>[DRN?SIaf]*)(?:\((?P<unknown>0[0-7]+)\))?)? *$"
)
_SUMMARY_ROW = re.compile(r"^filesystem_summary: +" + _NUMBERS + r" +(?P<mount>.*?) *$")
_INACTIVE = re.compile(r"^(?P<kind>MDT|OST)(?P<index>[0-9a-fA-F]{4,}) *: inactive device *$")
_TARGET_ERROR = re.compile(
    r"^(?P<uuid>(?P<fs>\S+)-(?P<kind>MDT|OST)(?P<index>[0-9a-fA-F]{4,})(?:_UUID)?) *: (?P<msg>.+)$"
)
_NOT_LUSTRE = re.compile(r"^df:(?P<path>.*) Not a Lustre filesystem$")
_UUID_SUFFIX = re.compile(r"_UUID$")
_STDERR_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("invalid_path", re.compile(r"^error: invalid path '(.*)': .*$")),
    ("usage", re.compile(r"^lfs(?: df)?: (?:unrecognized|invalid) option .*$")),
)


@dataclass(frozen=True)
class DfRow:
    """One MDT or OST: bytes (or inodes with -i), the mount point, the status letters."""

    uuid: str
    name: str  # the UUID without "_UUID"
    kind: str  # MDT | OST
    index: int
    total: Amount
    used: Amount
    available: Amount
    percent: int
    mountpoint: str
    flags: str
    line: int
    unknown_state: int = 0  # status bits lfs has no letter for (2.17 prints them in octal)


@dataclass(frozen=True)
class DfSummary:
    total: Amount
    used: Amount
    available: Amount
    percent: int
    mountpoint: str
    line: int


@dataclass(frozen=True)
class DfInactive:
    """``OST0001             : inactive device`` (-v only; no fsname, a hex index)."""

    kind: str
    index: int
    line: int


@dataclass(frozen=True)
class DfTargetError:
    """``lustre-OST0003_UUID : Input/output error``: the target could not be asked."""

    name: str
    kind: str
    index: int
    message: str
    line: int


@dataclass(frozen=True)
class DfBlock:
    """One filesystem's table; `inodes` for ``lfs df -i``."""

    inodes: bool
    line: int
    targets: tuple[DfRow, ...] = ()
    summary: DfSummary | None = None
    inactive: tuple[DfInactive, ...] = ()
    errors: tuple[DfTargetError, ...] = ()

    @property
    def mountpoint(self) -> str | None:
        if self.summary is not None:
            return self.summary.mountpoint
        return self.targets[0].mountpoint if self.targets else None

    @property
    def fsname(self) -> str | None:
        names = [t.name for t in self.targets] + [e.name for e in self.errors]
        return names[0].rsplit("-", 1)[0] if names else None


@dataclass(frozen=True)
class DfOutput:
    status: int
    filesystems: tuple[DfBlock, ...] = ()
    not_lustre: tuple[str, ...] = ()  # paths lfs reported as "Not a Lustre filesystem" (2.15+)
    messages: tuple[LfsMessage, ...] = ()
    usage_text: tuple[str, ...] = ()
    unparsed: tuple[Unparsed, ...] = ()


@dataclass
class _Block:
    inodes: bool
    line: int
    targets: list[DfRow] = field(default_factory=list)
    summary: DfSummary | None = None
    inactive: list[DfInactive] = field(default_factory=list)
    errors: list[DfTargetError] = field(default_factory=list)

    def build(self) -> DfBlock:
        return DfBlock(
            self.inodes,
            self.line,
            tuple(self.targets),
            self.summary,
            tuple(self.inactive),
            tuple(self.errors),
        )


def _numbers(match: re.Match[str], block: _Block) -> tuple[Amount, Amount, Amount]:
    """The three number cells in bytes (or inodes); raises ValueError naming a bad cell."""
    unit = 1 if block.inodes else KIB
    values = []
    for key in ("total", "used", "avail"):
        amount = parse_df_value(match.group(key), unit)
        if amount is None:
            raise ValueError(f"{match.group(key)!r} is not a number")
        values.append(amount)
    return values[0], values[1], values[2]


def parse_df(stdout: str, stderr: str = "", status: int = 0) -> DfOutput:
    """Sort the output of one `lfs df` run into what it means; never raises."""
    blocks: list[_Block] = []
    not_lustre: list[str] = []
    unparsed: list[Unparsed] = []

    def skip(number: int, line: str, reason: str) -> None:
        unparsed.append(Unparsed("stdout", number, line, reason))

    for number, line in enumerate(stdout.splitlines(), 1):
        line = line.rstrip()
        if not line:
            continue
        match = _TITLE.match(line)
        if match:
            total = match.group("total")
            blocks.append(_Block(total == "Inodes", number))
            continue
        match = _NOT_LUSTRE.match(line)
        if match:
            not_lustre.append(match.group("path"))
            continue
        block = blocks[-1] if blocks else None
        if block is None:
            skip(number, line, "not an lfs df line, or a row before the column titles")
            continue
        _read_line(block, number, line, skip)

    messages: list[LfsMessage] = []
    for number, line in enumerate(stderr.splitlines(), 1):
        if not line.strip():
            continue
        for kind, rule in _STDERR_RULES:
            match = rule.match(line.strip())
            if match:
                detail = match.group(1) if rule.groups else ""
                messages.append(LfsMessage(kind, line.strip(), number, detail))
                break
        else:
            unparsed.append(Unparsed("stderr", number, line, "not a known lfs df message"))

    usage_text: tuple[str, ...] = ()
    if status == USAGE_STATUS:
        usage_text, unparsed = tuple(item.text for item in unparsed), []
    return DfOutput(
        status=status,
        filesystems=tuple(block.build() for block in blocks),
        not_lustre=tuple(not_lustre),
        messages=tuple(messages),
        usage_text=usage_text,
        unparsed=tuple(unparsed),
    )


def _read_line(block: _Block, number: int, line: str, skip) -> None:
    match = _TARGET_ROW.match(line)
    if match:
        try:
            total, used, avail = _numbers(match, block)
        except ValueError as error:
            skip(number, line, str(error))
            return
        uuid = match.group("uuid")
        block.targets.append(
            DfRow(
                uuid=uuid,
                name=_UUID_SUFFIX.sub("", uuid),
                kind=match.group("kind"),
                index=int(match.group("index")),
                total=total,
                used=used,
                available=avail,
                percent=int(match.group("percent")),
                mountpoint=match.group("mount"),
                flags=match.group("flags") or "",
                line=number,
                unknown_state=int(match.group("unknown") or "0", 8),
            )
        )
        return
    match = _SUMMARY_ROW.match(line)
    if match:
        try:
            total, used, avail = _numbers(match, block)
        except ValueError as error:
            skip(number, line, str(error))
            return
        percent = int(match.group("percent"))
        block.summary = DfSummary(total, used, avail, percent, match.group("mount"), number)
        return
    match = _INACTIVE.match(line)
    if match:
        index = int(match.group("index"), 16)
        block.inactive.append(DfInactive(match.group("kind"), index, number))
        return
    match = _TARGET_ERROR.match(line)
    if match:
        name = _UUID_SUFFIX.sub("", match.group("uuid"))
        kind, index = match.group("kind"), int(match.group("index"), 16)
        block.errors.append(DfTargetError(name, kind, index, match.group("msg").strip(), number))
        return
    skip(number, line, "not an lfs df row, summary, inactive or error line")
