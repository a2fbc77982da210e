"""Reading what `lfs quota` prints, in every layout of Lustre 2.12, 2.14, 2.15 and 2.16.

`parse_quota(stdout, stderr, status)` is a pure function that never raises. It returns the
sections (one per ``Disk quotas for ...`` header), their rows (the main row of a filesystem, with
the ``-v`` per-target rows and the ``Total allocated`` line kept apart under it), the notices,
the recognised error messages, and every line it could not read, by number. It does not judge:
whether a non-zero exit status still left a usable row is for the caller to decide.

Rules (section numbers of the reference, ``lfs-output-formats.md``):
- rows are read from the right: the last eight cells are the numbers, everything before them is
  the Filesystem cell, so a path with spaces or a 2.16 path longer than 16 characters still reads
  (1.4); a row whose label is blank follows a line that could not be read on its own is that
  line's wrapped label (≤2.15, 1.4 and 1.6);
- ``*`` glued to the used value is the over marker, ``**`` the ≤2.15 EREMOTEIO form (1.5);
- ``[...]`` marks an inaccurate value, with -h possibly padded inside: ``[    4G]`` (1.5);
- -h block values (``512k``, ``1.465G``) carry the tolerance of their four digits (1.5);
- grace cells are ``-``, a countdown, ``none`` (≤2.15) or ``expired`` (2.16) (1.5).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from fsprobe.lustre.amounts import Amount, parse_count, parse_quota_bytes
from fsprobe.lustre.grace import NO_TIMER, Grace, parse_countdown, parse_grace
from fsprobe.lustre.runner import USAGE_STATUS

QUOTA_TYPE_NAMES = {"usr": "user", "grp": "group", "prj": "project"}
_ID_LETTERS = {"user": "u", "group": "g", "project": "p"}


@dataclass(frozen=True)
class Usage:
    """One resource group of a row (blocks or inodes); blocks are in bytes.

    `soft` is None where the cell is ``-`` (the per-target rows). `over` is the ``*`` marker: a
    hard limit reached, or a soft limit whose grace timer the server started. `remote_error` is
    the ≤2.15 ``**``/``N*`` form of an EREMOTEIO reply.
    """

    used: Amount
    over: bool
    soft: Amount | None
    hard: Amount
    grace: Grace
    remote_error: bool = False

    @property
    def inaccurate(self) -> bool:
        limits = (self.soft, self.hard)
        return self.used.inaccurate or any(a is not None and a.inaccurate for a in limits)


@dataclass(frozen=True)
class TargetRow:
    """A ``-v`` row: usage on one MDT or OST and the share of the limit granted to it."""

    name: str  # "lustre-OST0001", without "_UUID" and "[inact]"
    kind: str  # MDT | OST
    index: int
    inactive: bool
    blocks: Usage
    inodes: Usage | None  # None for OSTs: their inode group is all "-"
    line: int


@dataclass(frozen=True)
class TotalAllocated:
    """``Total allocated inode limit: N, total allocated block limit: M`` (after ``-v`` rows)."""

    inodes: int
    bytes: Amount
    line: int


@dataclass(frozen=True)
class QuotaRow:
    """The main row of one filesystem (the label is the path as typed, blank for one target)."""

    label: str
    blocks: Usage
    inodes: Usage | None
    line: int
    quota_id: str | None = None  # the 2.16 `-a` ID column
    pool: str | None = None  # from a preceding "Quotas for pool: X" line
    targets: tuple[TargetRow, ...] = ()
    total_allocated: TotalAllocated | None = None

    @property
    def inaccurate(self) -> bool:
        return self.blocks.inaccurate or (self.inodes is not None and self.inodes.inaccurate)


@dataclass(frozen=True)
class DefaultLimits:
    """One half of a default-quota row: limits and the grace period in seconds.

    `grace_seconds` is None when ≤2.15 printed ``none`` (it does so whenever the default soft
    limit is set, treating the period as an expired timestamp).
    """

    soft: Amount
    hard: Amount
    grace_seconds: int | None


@dataclass(frozen=True)
class DefaultRow:
    """A row of ``lfs quota -U/-G/-P``."""

    label: str
    blocks: DefaultLimits
    inodes: DefaultLimits
    line: int
    pool: str | None = None


@dataclass(frozen=True)
class QuotaSection:
    """The rows under one header; `form` says which header (or none, with -q)."""

    form: str  # "id" | "default" | "all" | "unlabeled"
    type: str | None  # user | group | project
    name: str | None  # the ID as typed after -u/-g/-p: a name or a number
    id: int | None
    line: int | None
    rows: tuple[QuotaRow, ...] = ()
    default_rows: tuple[DefaultRow, ...] = ()


@dataclass(frozen=True)
class GracePeriod:
    """One side of ``lfs quota -t``: a period in seconds, or ``notify`` (2.14+)."""

    seconds: int | None
    notify: bool = False
    inaccurate: bool = False


@dataclass(frozen=True)
class GraceTimes:
    block: GracePeriod
    inode: GracePeriod
    line: int


@dataclass(frozen=True)
class DefaultNotice:
    """``uid 1001 is using default block quota setting`` (≤2.15)."""

    type: str
    id: int
    resource: str  # "block" | "file"


@dataclass(frozen=True)
class LfsMessage:
    """A recognised line of stderr; `detail` is the quota type, strerror or target named."""

    kind: str
    text: str
    line: int
    detail: str = ""


@dataclass(frozen=True)
class Unparsed:
    """A line that none of the rules could read, and why."""

    stream: str  # stdout | stderr
    line: int
    text: str
    reason: str

    def describe(self) -> str:
        return f"{self.stream} line {self.line}: {self.text.strip()!r} ({self.reason})"


@dataclass(frozen=True)
class QuotaOutput:
    """Everything `lfs quota` printed, sorted into what it means."""

    status: int
    sections: tuple[QuotaSection, ...] = ()
    grace_times: tuple[GraceTimes, ...] = ()
    default_notices: tuple[DefaultNotice, ...] = ()
    errors_notice: bool = False  # "Some errors happened when getting quota info..."
    errors_notice_flag: int | None = None  # 2.16's leading 0/1 (1: the main row was inaccurate)
    pools_of: str | None = None  # "Pools from <fsname>:"
    title_indent: int | None = None  # 5 up to 2.15, 6 from 2.16
    messages: tuple[LfsMessage, ...] = ()
    usage_text: tuple[str, ...] = ()  # the usage printed with exit status 4
    unparsed: tuple[Unparsed, ...] = ()

    def message(self, kind: str) -> LfsMessage | None:
        return next((m for m in self.messages if m.kind == kind), None)

    def section(self, quota_type: str, quota_id: int) -> QuotaSection | None:
        """The section whose header names this type and numeric ID."""
        for candidate in self.sections:
            if (candidate.form, candidate.type, candidate.id) == ("id", quota_type, quota_id):
                return candidate
        return None

    @property
    def inaccurate(self) -> bool:
        rows = (row for section in self.sections for row in section.rows)
        return self.errors_notice or any(row.inaccurate for row in rows)


# --- line rules

_HEADER_ID = re.compile(r"^Disk quotas for (usr|grp|prj) (.*) \(([ugp])id ([0-9]+)\):$")
_HEADER_DEFAULT = re.compile(r"^Disk default (usr|grp|prj) quota:$")
_HEADER_ALL = re.compile(r"^Disk (usr|grp|prj) quotas$")
_TITLE = re.compile(
    r"^( *)Filesystem +(quota_id +)?(kbytes|used) +quota +limit +grace +files +quota +limit +grace$"
)
_TITLE_DEFAULT = re.compile(r"^( *)Filesystem +bquota +blimit +bgrace +iquota +ilimit +igrace$")
_ERRORS_NOTICE = re.compile(
    r"^(?:([01]) )?Some errors happened when getting quota info\. "
    r"Some devices may be not working or deactivated\. "
    r'The data in "\[\]" is inaccurate\.$'
)
_DEFAULT_NOTICE = re.compile(r"^([ugp])id ([0-9]+) is using default (block|file) quota setting$")
_TOTAL = re.compile(r"^Total allocated inode limit: ([0-9]+), total allocated block limit: +(\S+)$")
_POOLS_FROM = re.compile(r"^Pools from (.*):$")
_POOL = re.compile(r"^Quotas for pool: (.*)$")
_GRACE_TIMES = re.compile(r"^Block grace time: (\S+); Inode grace time: (\S+)$")
_TARGET_NAME = re.compile(
    r"^(?P<fs>.+)-(?P<kind>MDT|OST)(?P<index>[0-9a-fA-F]{4,})(?:_UUID)?(?P<inact>\[inact\])?$"
)
# A cell: a bracketed value (possibly padded inside, -h) or a run of non-blanks; stars glued on.
_TOKEN = re.compile(r"\[[^\]\n]*\]\**|\S+")
_USED = re.compile(
    r"^(?:\[\s*(?P<bracketed>[^\s\[\]*]+)(?P<inner>\*)?\s*\]|(?P<plain>[^\s\[\]*]+))"
    r"(?P<stars>\*{0,2})$"
)
_LIMIT = re.compile(r"^(?P<open>\[)?\s*(?P<num>[^\s\[\]*]+)\s*(?(open)\])$")

_STDERR_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("permission_denied", re.compile(r"Permission denied\.$")),
    ("not_enabled", re.compile(r"(usr|grp|prj) quotas are not enabled\.$")),
    ("unexpected_error", re.compile(r"Unexpected quotactl error: (.*)$")),
    ("target_failed", re.compile(r"quotactl ((?:ost|mdt)[0-9]+) failed\.$")),
    ("not_lustre", re.compile(r"'(.*)' (?:dev )?not on a mounted Lustre filesystem$")),
    ("no_pool", re.compile(r"Cannot find pool '(.*)'$")),
    (
        "usage",
        re.compile(
            r"lfs quota: (invalid id '.*'|unrecognized option .*|invalid option .*"
            r"|name and mount point must be specified|u/g-name is required"
            r"|missing quota info argument\(s\))$"
        ),
    ),
)

ROW_CELLS = 8
DEFAULT_ROW_CELLS = 6


class _BadCell(Exception):
    """A cell that does not read as what its column holds; turned into an `Unparsed` reason."""


def _used(token: str, reader: Callable[[str], Amount | None]) -> tuple[Amount, bool, bool]:
    """(amount, over, remote_error) of a used cell: ``123``, ``123*``, ``1234**``, ``[    4G]*``."""
    match = _USED.match(token)
    number = match.group("bracketed") or match.group("plain") if match else None
    amount = reader(number) if number is not None else None
    if match is None or amount is None:
        raise _BadCell(f"{token!r} is not a used value")
    stars, inner = len(match.group("stars")), match.group("inner") is not None
    if match.group("bracketed"):
        amount = Amount(amount.value, amount.tolerance, inaccurate=True)
    return amount, stars >= 1, inner or stars == 2


def _amount(token: str, reader: Callable[[str], Amount | None], what: str) -> Amount:
    match = _LIMIT.match(token)
    amount = reader(match.group("num")) if match else None
    if match is None or amount is None:
        raise _BadCell(f"{token!r} is not a {what}")
    if match.group("open"):
        amount = Amount(amount.value, amount.tolerance, inaccurate=True)
    return amount


def _usage(cells: list[str], reader: Callable[[str], Amount | None]) -> Usage:
    used_cell, soft_cell, hard_cell, grace_cell = cells
    used, over, remote = _used(used_cell, reader)
    soft = None if soft_cell == "-" else _amount(soft_cell, reader, "soft limit")
    hard = _amount(hard_cell, reader, "hard limit")
    grace = parse_grace(grace_cell)
    if grace is None:
        raise _BadCell(f"{grace_cell!r} is not a grace time")
    return Usage(used, over, soft, hard, grace, remote)


def _split(line: str, count: int) -> tuple[str, list[str]] | None:
    """The label and the last `count` cells of a row, or None when there are fewer cells."""
    tokens = list(_TOKEN.finditer(line))
    if len(tokens) < count:
        return None
    cells = tokens[len(tokens) - count :]
    return line[: cells[0].start()].strip(), [token.group() for token in cells]


def _row_cells(cells: list[str]) -> tuple[Usage, Usage | None]:
    blocks = _usage(cells[:4], parse_quota_bytes)
    inodes = None if cells[4:] == ["-"] * 4 else _usage(cells[4:], parse_count)
    return blocks, inodes


def _default_limits(cells: list[str], reader: Callable[[str], Amount | None]) -> DefaultLimits:
    soft = _amount(cells[0], reader, "default soft limit")
    hard = _amount(cells[1], reader, "default hard limit")
    if cells[2] == "none":
        return DefaultLimits(soft, hard, None)
    if not (cells[2].isdigit() and cells[2].isascii()):
        raise _BadCell(f"{cells[2]!r} is not a grace period in seconds")
    return DefaultLimits(soft, hard, int(cells[2]))


def _grace_period(text: str) -> GracePeriod | None:
    inaccurate = text.startswith("[") and text.endswith("]")
    inner = text[1:-1] if inaccurate else text
    if inner == "notify":
        return GracePeriod(None, notify=True, inaccurate=inaccurate)
    seconds = parse_countdown(inner)
    return None if seconds is None else GracePeriod(seconds, inaccurate=inaccurate)


def _target_of(label: str, row: QuotaRow | None) -> tuple[str, str, int, bool] | None:
    """(name, kind, index, tagged inactive) when `label` names an MDT/OST under a main row."""
    match = _TARGET_NAME.match(label)
    if match is None or row is None:
        return None
    name = f"{match.group('fs')}-{match.group('kind')}{match.group('index')}"
    return name, match.group("kind"), int(match.group("index"), 16), bool(match.group("inact"))


def _looks_inactive(blocks: Usage) -> bool:
    """2.16 cuts the ``[inact]`` tag off; only its bracketed zeros are left (1.6)."""
    return blocks.used == Amount(0, inaccurate=True) and blocks.hard == Amount(0, inaccurate=True)


@dataclass
class _SectionBuilder:
    form: str
    type: str | None
    name: str | None
    id: int | None
    line: int | None
    rows: list[QuotaRow] = field(default_factory=list)
    targets: list[list[TargetRow]] = field(default_factory=list)
    default_rows: list[DefaultRow] = field(default_factory=list)

    def build(self) -> QuotaSection:
        rows = tuple(
            dataclasses.replace(row, targets=tuple(targets))
            for row, targets in zip(self.rows, self.targets)
        )
        return QuotaSection(
            self.form, self.type, self.name, self.id, self.line, rows, tuple(self.default_rows)
        )


class _StdoutReader:
    """Walks stdout line by line, keeping the state that the layout implies."""

    def __init__(self) -> None:
        self.sections: list[_SectionBuilder] = []
        self.mode = "normal"  # normal | all | default: which row layout follows
        self.pool: str | None = None
        # A line that is no row, kept in case it is a wrapped label: (number, text, reason).
        self.pending: tuple[int, str, str] | None = None
        self.grace_times: list[GraceTimes] = []
        self.notices: list[DefaultNotice] = []
        self.errors_notice = False
        self.errors_flag: int | None = None
        self.pools_of: str | None = None
        self.title_indent: int | None = None
        self.unparsed: list[Unparsed] = []

    # -- helpers

    def _section(self) -> _SectionBuilder:
        if not self.sections:
            form = "default" if self.mode == "default" else "unlabeled"
            self.sections.append(_SectionBuilder(form, None, None, None, None))
        return self.sections[-1]

    def _flush_pending(self) -> None:
        if self.pending is not None:
            number, text, reason = self.pending
            self.unparsed.append(Unparsed("stdout", number, text, reason))
            self.pending = None

    def _start_section(self, form: str, abbrev: str, name: str | None, number: int, qid=None):
        self.sections.append(_SectionBuilder(form, QUOTA_TYPE_NAMES[abbrev], name, qid, number))
        self.mode = {"id": "normal"}.get(form, form)

    # -- the rules, in order

    def feed(self, number: int, line: str) -> None:
        line = line.rstrip()  # trailing blanks carry nothing; a path never ends the line
        if not line:
            self._flush_pending()
            return
        if self._header(number, line) or self._notice(number, line):
            self._flush_pending()
            return
        self._row(number, line)

    def _header(self, number: int, line: str) -> bool:
        match = _HEADER_ID.match(line)
        if match:
            abbrev, name, letter, qid = match.groups()
            if letter != _ID_LETTERS[QUOTA_TYPE_NAMES[abbrev]]:
                return False
            self._start_section("id", abbrev, name, number, int(qid))
            return True
        match = _HEADER_DEFAULT.match(line)
        if match:
            self._start_section("default", match.group(1), None, number)
            return True
        match = _HEADER_ALL.match(line)
        if match:
            self._start_section("all", match.group(1), None, number)
            return True
        match = _TITLE.match(line)
        if match:
            self.title_indent = len(match.group(1))
            self.mode = "all" if match.group(2) else "normal"
            return True
        match = _TITLE_DEFAULT.match(line)
        if match:
            self.title_indent = len(match.group(1))
            self.mode = "default"
            return True
        return False

    def _notice(self, number: int, line: str) -> bool:
        stripped = line.strip()
        match = _ERRORS_NOTICE.match(stripped)
        if match:
            self.errors_notice = True
            if match.group(1) is not None:
                self.errors_flag = int(match.group(1))
            return True
        match = _DEFAULT_NOTICE.match(stripped)
        if match:
            letter, qid, resource = match.groups()
            kind = {"u": "user", "g": "group", "p": "project"}[letter]
            self.notices.append(DefaultNotice(kind, int(qid), resource))
            return True
        match = _TOTAL.match(stripped)
        if match:
            return self._total(number, line, int(match.group(1)), match.group(2))
        match = _POOLS_FROM.match(stripped)
        if match:
            self.pools_of = match.group(1)
            return True
        match = _POOL.match(stripped)
        if match:
            self.pool = match.group(1)
            return True
        match = _GRACE_TIMES.match(stripped)
        if match:
            block, inode = _grace_period(match.group(1)), _grace_period(match.group(2))
            if block is None or inode is None:
                self.unparsed.append(Unparsed("stdout", number, line, "unreadable grace time"))
            else:
                self.grace_times.append(GraceTimes(block, inode, number))
            return True
        return False

    def _total(self, number: int, line: str, inodes: int, block_text: str) -> bool:
        amount = parse_quota_bytes(block_text)
        section = self.sections[-1] if self.sections else None
        if amount is None or section is None or not section.rows:
            reason = "unreadable block limit" if amount is None else "no quota row before it"
            self.unparsed.append(Unparsed("stdout", number, line, reason))
            return True
        total = TotalAllocated(inodes, amount, number)
        section.rows[-1] = dataclasses.replace(section.rows[-1], total_allocated=total)
        return True

    def _row(self, number: int, line: str) -> None:
        try:
            if self.mode == "default":
                self._default_row(number, line)
            else:
                self._quota_row(number, line)
        except _BadCell as error:
            # Not a row; but it may be a label that wrapped (≤2.15), so wait for the next line.
            self._flush_pending()
            self.pending = (number, line, str(error))

    def _label(self, label: str) -> str:
        """The row's label; a blank one continues a wrapped label line (≤2.15)."""
        if label or self.pending is None:
            self._flush_pending()
            return label
        _, text, _ = self.pending
        self.pending = None
        return text.strip()

    def _quota_row(self, number: int, line: str) -> None:
        count = ROW_CELLS + (1 if self.mode == "all" else 0)
        split = _split(line, count)
        if split is None:
            raise _BadCell(f"fewer than {count} cells")
        label, cells = split
        quota_id = cells.pop(0) if self.mode == "all" else None
        blocks, inodes = _row_cells(cells)
        label = self._label(label)
        section = self._section()
        parent = section.rows[-1] if section.rows else None
        target = _target_of(label, parent) if quota_id is None else None
        if target is not None:
            name, kind, index, tagged = target
            inactive = tagged or _looks_inactive(blocks)
            section.targets[-1].append(
                TargetRow(name, kind, index, inactive, blocks, inodes, number)
            )
            return
        row = QuotaRow(label, blocks, inodes, number, quota_id, self.pool)
        if self.pool is not None and parent is not None and _same_values(parent, row):
            return  # 2.16 prints the last pool's row a second time (1.8)
        section.rows.append(row)
        section.targets.append([])

    def _default_row(self, number: int, line: str) -> None:
        split = _split(line, DEFAULT_ROW_CELLS)
        if split is None:
            raise _BadCell(f"fewer than {DEFAULT_ROW_CELLS} cells")
        label, cells = split
        blocks = _default_limits(cells[:3], parse_quota_bytes)
        inodes = _default_limits(cells[3:], parse_count)
        label = self._label(label)
        self._section().default_rows.append(DefaultRow(label, blocks, inodes, number, self.pool))

    def finish(self) -> None:
        self._flush_pending()


def _same_values(a: QuotaRow, b: QuotaRow) -> bool:
    return (a.label, a.blocks, a.inodes, a.quota_id, a.pool) == (
        b.label,
        b.blocks,
        b.inodes,
        b.quota_id,
        b.pool,
    )


def _read_stderr(stderr: str) -> tuple[list[LfsMessage], list[Unparsed]]:
    messages, unparsed = [], []
    for number, line in enumerate(stderr.splitlines(), 1):
        if not line.strip():
            continue
        for kind, rule in _STDERR_RULES:
            match = rule.search(line.strip())
            if match:
                detail = match.group(1) if rule.groups else ""
                messages.append(LfsMessage(kind, line.strip(), number, detail))
                break
        else:
            unparsed.append(Unparsed("stderr", number, line, "not a known lfs quota message"))
    return messages, unparsed


def parse_quota(stdout: str, stderr: str = "", status: int = 0) -> QuotaOutput:
    """Sort the output of one `lfs quota` run into what it means; never raises."""
    reader = _StdoutReader()
    for number, line in enumerate(stdout.splitlines(), 1):
        reader.feed(number, line)
    reader.finish()
    messages, stderr_unparsed = _read_stderr(stderr)
    unparsed = reader.unparsed + stderr_unparsed
    usage_text: tuple[str, ...] = ()
    if status == USAGE_STATUS:
        # With its usage text lfs prints lines that are not meant to be read as data.
        usage_text = tuple(item.text for item in unparsed)
        unparsed = []
    return QuotaOutput(
        status=status,
        sections=tuple(section.build() for section in reader.sections),
        grace_times=tuple(reader.grace_times),
        default_notices=tuple(reader.notices),
        errors_notice=reader.errors_notice,
        errors_notice_flag=reader.errors_flag,
        pools_of=reader.pools_of,
        title_indent=reader.title_indent,
        messages=tuple(messages),
        usage_text=usage_text,
        unparsed=tuple(sorted(unparsed, key=lambda u: (u.stream != "stdout", u.line))),
    )


__all__ = [
    "NO_TIMER",
    "QUOTA_TYPE_NAMES",
    "DefaultLimits",
    "DefaultNotice",
    "DefaultRow",
    "GracePeriod",
    "GraceTimes",
    "LfsMessage",
    "QuotaOutput",
    "QuotaRow",
    "QuotaSection",
    "TargetRow",
    "TotalAllocated",
    "Unparsed",
    "Usage",
    "parse_quota",
]
