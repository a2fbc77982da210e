"""Reading what `lfs quota -u|-g|-p ID DIR` prints, in Lustre 2.12 to 2.17.

`parse_quota` is a pure function that never raises and does not judge; the rules it follows are
docs/lfs-output-formats.md §1 and §4 (2.17: §1.11, before 2.10: §1.12).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fsprobe.lustre.amounts import Amount, parse_count, parse_kib
from fsprobe.lustre.grace import Grace, parse_grace
from fsprobe.lustre.runner import USAGE_STATUS

QUOTA_TYPE_NAMES = {"usr": "user", "grp": "group", "prj": "project"}
_ID_LETTERS = {"user": "u", "group": "g", "project": "p"}


@dataclass(frozen=True)
class Usage:
    """One resource group of a row (blocks or inodes); blocks are in bytes.

    `over` is the ``*`` marker: a hard limit reached, or a soft limit whose grace timer the
    server started. `remote_error` is the ≤2.15 ``**``/``N*`` form of an EREMOTEIO reply.
    """

    used: Amount
    over: bool
    soft: Amount
    hard: Amount
    grace: Grace
    remote_error: bool = False

    @property
    def inaccurate(self) -> bool:
        return self.used.inaccurate or self.soft.inaccurate or self.hard.inaccurate


@dataclass(frozen=True)
class QuotaRow:
    """The row of the filesystem; the label is the directory as typed (lfs echoes it)."""

    label: str
    blocks: Usage
    inodes: Usage
    line: int

    @property
    def inaccurate(self) -> bool:
        return self.blocks.inaccurate or self.inodes.inaccurate


@dataclass(frozen=True)
class QuotaSection:
    """The rows under one ``Disk quotas for <type> <name> (<t>id <id>):`` header."""

    type: str  # user | group | project
    name: str  # the ID as typed after -u/-g/-p
    id: int
    line: int
    rows: tuple[QuotaRow, ...] = ()


@dataclass(frozen=True)
class DefaultNotice:
    """``uid 1001 is using default block quota setting`` (≤2.15)."""

    type: str
    id: int
    resource: str  # "block" | "file"


@dataclass(frozen=True)
class LfsMessage:
    """A recognised line of stderr; `detail` is the quota type, strerror or path named."""

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
    default_notices: tuple[DefaultNotice, ...] = ()
    errors_notice: bool = False  # "Some errors happened when getting quota info..."
    errors_notice_flag: int | None = None  # 2.16's leading 0/1 (1: the main row was inaccurate)
    title_indent: int | None = None  # 5 up to 2.15, 6 in 2.16, 5 in 2.17
    title_release: str | None = None  # the form of the title: "2.10" (2.10-2.16) or "2.17"
    unknown_title: Unparsed | None = None  # a title line of a form fsprobe does not know
    too_old_header: Unparsed | None = None  # the header of lfs before 2.10
    messages: tuple[LfsMessage, ...] = ()
    usage_text: tuple[str, ...] = ()  # the usage printed with exit status 4
    unparsed: tuple[Unparsed, ...] = ()

    def message(self, kind: str) -> LfsMessage | None:
        return next((m for m in self.messages if m.kind == kind), None)

    def section(self, quota_type: str, quota_id: int) -> QuotaSection | None:
        """The section whose header names this type and numeric ID."""
        return next((s for s in self.sections if (s.type, s.id) == (quota_type, quota_id)), None)

    @property
    def inaccurate(self) -> bool:
        rows = (row for section in self.sections for row in section.rows)
        return self.errors_notice or any(row.inaccurate for row in rows)


# --- line rules

_HEADER = re.compile(r"^Disk quotas for (usr|grp|prj) (.*) \(([ugp])id ([0-9]+)\):$")
_TITLE = re.compile(
    r"^( *)Filesystem +kbytes +(?:(quota +limit +grace +files +quota +limit +grace)"
    r"|bquota +blimit +bgrace +files +iquota +ilimit +igrace)$"
)
_OLD_HEADER = re.compile(r"^Disk quotas for (?:user|group) .* \([ug]id [0-9]+\):$")
#: A line where the column title belongs: right after a header, its first word "Filesystem".
_TITLE_LIKE = re.compile(r"^ *Filesystem\b")
_ERRORS_NOTICE = re.compile(
    r"^(?:([01]) )?Some errors happened when getting quota info\. "
    r"Some devices may be not working or deactivated\. "
    r'The data in "\[\]" is inaccurate\.$'
)
_DEFAULT_NOTICE = re.compile(r"^([ugp])id ([0-9]+) is using default (block|file) quota setting$")
# A cell: a bracketed value or a run of non-blanks; stars glued on.
_TOKEN = re.compile(r"\[[^\]\n]*\]\**|\S+")
_USED = re.compile(
    r"^(?:\[(?P<bracketed>[^\s\[\]*]+)(?P<inner>\*)?\]|(?P<plain>[^\s\[\]*]+))(?P<stars>\*{0,2})$"
)
_LIMIT = re.compile(r"^(?P<open>\[)?(?P<num>[^\s\[\]*]+)(?(open)\])$")

_STDERR_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("permission_denied", re.compile(r"Permission denied\.$")),
    ("not_enabled", re.compile(r"(usr|grp|prj) quotas are not enabled\.$")),
    ("unexpected_error", re.compile(r"Unexpected quotactl error: (.*)$")),
    ("not_lustre", re.compile(r"'(.*)' (?:dev )?not on a mounted Lustre filesystem$")),
    (
        "usage",
        re.compile(r"lfs quota: (invalid id '.*'|unrecognized option .*|invalid option .*)$"),
    ),
)

ROW_CELLS = 8


class _BadCell(Exception):
    """A cell that does not read as what its column holds; turned into an `Unparsed` reason."""


def _used(token: str, reader: Callable[[str], Amount | None]) -> tuple[Amount, bool, bool]:
    """(amount, over, remote_error) of a used cell: ``123``, ``123*``, ``1234**``, ``[4]*``."""
    match = _USED.match(token)
    number = match.group("bracketed") or match.group("plain") if match else None
    amount = reader(number) if number is not None else None
    if match is None or amount is None:
        raise _BadCell(f"{token!r} is not a used value")
    stars, inner = len(match.group("stars")), match.group("inner") is not None
    if match.group("bracketed"):
        amount = Amount(amount.value, inaccurate=True)
    return amount, stars >= 1, inner or stars == 2


def _limit(token: str, reader: Callable[[str], Amount | None], what: str) -> Amount:
    match = _LIMIT.match(token)
    amount = reader(match.group("num")) if match else None
    if match is None or amount is None:
        raise _BadCell(f"{token!r} is not a {what}")
    if match.group("open"):
        amount = Amount(amount.value, inaccurate=True)
    return amount


def _usage(cells: list[str], reader: Callable[[str], Amount | None]) -> Usage:
    used_cell, soft_cell, hard_cell, grace_cell = cells
    used, over, remote = _used(used_cell, reader)
    soft = _limit(soft_cell, reader, "soft limit")
    hard = _limit(hard_cell, reader, "hard limit")
    grace = parse_grace(grace_cell)
    if grace is None:
        raise _BadCell(f"{grace_cell!r} is not a grace time")
    return Usage(used, over, soft, hard, grace, remote)


def _marked_by_numbers(usage: Usage) -> Usage:
    """2.17 marks the inode used value with the block over-state (1.11): the inode mark is what
    lfs would have set, a hard limit reached or a grace timer started."""
    at_hard = usage.hard.value > 0 and usage.used.value >= usage.hard.value
    timer = usage.grace.running or usage.grace.expired
    return replace(usage, over=at_hard or timer)


def _split(line: str) -> tuple[str, list[str]]:
    """The label and the last `ROW_CELLS` cells of a row; _BadCell when there are fewer."""
    tokens = list(_TOKEN.finditer(line))
    if len(tokens) < ROW_CELLS:
        raise _BadCell(f"fewer than {ROW_CELLS} cells")
    cells = tokens[len(tokens) - ROW_CELLS :]
    return line[: cells[0].start()].strip(), [token.group() for token in cells]


@dataclass
class _Section:
    type: str
    name: str
    id: int
    line: int
    rows: list[QuotaRow] = field(default_factory=list)

    def build(self) -> QuotaSection:
        return QuotaSection(self.type, self.name, self.id, self.line, tuple(self.rows))


class _StdoutReader:
    """Walks stdout line by line, keeping the state that the layout implies."""

    def __init__(self) -> None:
        self.sections: list[_Section] = []
        # A line that is no row, kept in case it is a wrapped label: (number, text, reason).
        self.pending: tuple[int, str, str] | None = None
        self.notices: list[DefaultNotice] = []
        self.errors_notice = False
        self.errors_flag: int | None = None
        self.title_indent: int | None = None
        self.title_release: str | None = None
        self.unknown_title: Unparsed | None = None
        self.too_old_header: Unparsed | None = None
        self.after_header = False  # the line before was a section header
        self.unparsed: list[Unparsed] = []

    def _flush_pending(self) -> None:
        if self.pending is not None:
            number, text, reason = self.pending
            self.unparsed.append(Unparsed("stdout", number, text, reason))
            self.pending = None

    def feed(self, number: int, line: str) -> None:
        line = line.rstrip()  # trailing blanks carry nothing; a path never ends the line
        after_header, self.after_header = self.after_header, False
        if not line:
            self._flush_pending()
            return
        if self._header(number, line) or self._notice(line):
            self._flush_pending()
            return
        if _OLD_HEADER.match(line):
            self._flush_pending()
            self.too_old_header = Unparsed("stdout", number, line, "the header of lfs before 2.10")
            return
        if after_header and _TITLE_LIKE.match(line):
            self.unknown_title = Unparsed("stdout", number, line, "a column title of a new form")
            return
        try:
            self._row(number, line)
        except _BadCell as error:
            # Not a row; but it may be a label that wrapped (≤2.15), so wait for the next line.
            self._flush_pending()
            self.pending = (number, line, str(error))

    def _header(self, number: int, line: str) -> bool:
        match = _HEADER.match(line)
        if match:
            abbrev, name, letter, qid = match.groups()
            quota_type = QUOTA_TYPE_NAMES[abbrev]
            if letter != _ID_LETTERS[quota_type]:
                return False
            self.sections.append(_Section(quota_type, name, int(qid), number))
            self.after_header = True
            return True
        match = _TITLE.match(line)
        if match:
            self.title_indent = len(match.group(1))
            self.title_release = "2.10" if match.group(2) else "2.17"
            return True
        return False

    def _notice(self, line: str) -> bool:
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
        return False

    def _row(self, number: int, line: str) -> None:
        label, cells = _split(line)
        blocks = _usage(cells[:4], parse_kib)
        inodes = _usage(cells[4:], parse_count)
        if self.title_release == "2.17":
            inodes = _marked_by_numbers(inodes)
        if not self.sections:
            raise _BadCell("a quota row before any header")
        if not label and self.pending is not None:  # the numbers of a wrapped label (≤2.15)
            label = self.pending[1].strip()
            self.pending = None
        self._flush_pending()
        self.sections[-1].rows.append(QuotaRow(label, blocks, inodes, number))

    def finish(self) -> None:
        self._flush_pending()


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
        default_notices=tuple(reader.notices),
        errors_notice=reader.errors_notice,
        errors_notice_flag=reader.errors_flag,
        title_indent=reader.title_indent,
        title_release=reader.title_release,
        unknown_title=reader.unknown_title,
        too_old_header=reader.too_old_header,
        messages=tuple(messages),
        usage_text=usage_text,
        unparsed=tuple(sorted(unparsed, key=lambda u: (u.stream != "stdout", u.line))),
    )
