"""The parsers never raise, never guess and never lose a line, whatever `lfs` hands them.

Arbitrary text, and the real samples of tests/fixtures/lfs with lines dropped, duplicated,
truncated or swapped: the parsers must return, every line they report (as a row or as
unreadable) must be a line of the input, by its number, and no line may be both read and
unreadable. Rows generated from known values must read back as exactly those values: the used,
soft, hard and grace cells, the ``*`` over-limit marker and the ``[...]`` inaccurate brackets.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from fsprobe.lustre.amounts import KIB
from fsprobe.lustre.df_parser import parse_df
from fsprobe.lustre.grace import NO_TIMER, Grace
from fsprobe.lustre.quota_parser import QuotaOutput, Usage, parse_quota
from tests.support.fakes.fake_lfs import load_fixtures
from tests.support.lfs_print import countdown

REAL = load_fixtures("real")
QUOTA_SAMPLES = [case["stdout"] for _, case in load_fixtures("quota")] + [
    case["stdout"] for name, case in REAL if name.startswith("quota/")
]
DF_SAMPLES = [case["stdout"] for _, case in load_fixtures("df")] + [
    case["stdout"] for name, case in REAL if name.startswith("df/")
]
STATUSES = st.integers(min_value=-64, max_value=300)


@st.composite
def damaged(draw, samples: list[list[str]]) -> list[str]:
    """A real sample with a few lines dropped, duplicated, truncated or swapped."""
    lines = list(draw(st.sampled_from(samples)))
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        if not lines:
            break
        index = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        action = draw(st.sampled_from(["drop", "duplicate", "truncate", "swap", "garble"]))
        if action == "drop":
            del lines[index]
        elif action == "duplicate":
            lines.insert(index, lines[index])
        elif action == "truncate":
            lines[index] = lines[index][: draw(st.integers(0, max(0, len(lines[index]) - 1)))]
        elif action == "swap":
            other = draw(st.integers(min_value=0, max_value=len(lines) - 1))
            lines[index], lines[other] = lines[other], lines[index]
        else:
            position = draw(st.integers(0, len(lines[index])))
            noise = draw(st.text(alphabet="[]*- 0123456789kMGTP.", max_size=4))
            lines[index] = lines[index][:position] + noise + lines[index][position:]
    return lines


def _rows(output: QuotaOutput):
    for section in output.sections:
        yield from (row.line for row in section.rows)


def assert_lines_refer_to_input(stdout: str, output) -> None:
    lines = stdout.splitlines()
    for item in output.unparsed:
        if item.stream == "stdout":
            assert lines[item.line - 1].rstrip() == item.text.rstrip()
    if isinstance(output, QuotaOutput):
        read = list(_rows(output))
        for number in read:
            assert 1 <= number <= len(lines)
        unreadable = {item.line for item in output.unparsed if item.stream == "stdout"}
        assert not unreadable & set(read), "a line both read as a row and reported unreadable"
        assert max(Counter(read).values(), default=1) == 1, "one line read as two rows"


@given(st.text(), st.text(), STATUSES)
def test_quota_parser_never_raises_on_any_text(stdout: str, stderr: str, status: int):
    output = parse_quota(stdout, stderr, status)
    assert_lines_refer_to_input(stdout, output)


@given(st.text(), st.text(), STATUSES)
def test_df_parser_never_raises_on_any_text(stdout: str, stderr: str, status: int):
    output = parse_df(stdout, stderr, status)
    assert_lines_refer_to_input(stdout, output)


@settings(max_examples=300)
@given(damaged(QUOTA_SAMPLES), STATUSES)
def test_quota_parser_survives_damaged_samples(lines: list[str], status: int):
    stdout = "\n".join(lines) + "\n"
    output = parse_quota(stdout, "", status)
    assert_lines_refer_to_input(stdout, output)


@settings(max_examples=300)
@given(damaged(DF_SAMPLES), STATUSES)
def test_df_parser_survives_damaged_samples(lines: list[str], status: int):
    stdout = "\n".join(lines) + "\n"
    output = parse_df(stdout, "", status)
    assert_lines_refer_to_input(stdout, output)


@given(st.lists(st.sampled_from(["[", "]", "*", "-", " ", "4", "G", "k", "none", "1w"])))
def test_quota_row_made_of_cell_fragments_is_read_or_reported_never_dropped(fragments):
    line = "    /mnt/lustre " + " ".join(fragments)
    stdout = f"Disk quotas for usr 1 (uid 1):\n{line}\n"
    output = parse_quota(stdout, "", 0)
    assert_lines_refer_to_input(stdout, output)
    read = [number for number in _rows(output) if number == 2]
    unreadable = [item for item in output.unparsed if (item.stream, item.line) == ("stdout", 2)]
    assert len(read) + len(unreadable) == 1, (read, unreadable)
    for row in (row for section in output.sections for row in section.rows):
        amounts = [row.blocks.used, row.blocks.hard, row.blocks.soft]
        assert all(isinstance(a.value, int) for a in amounts if a is not None), row
        assert isinstance(row.inaccurate, bool) and isinstance(output.inaccurate, bool)


# -- rows made from known values read back as those values ------------------------------------


@st.composite
def usage_cells(draw) -> tuple[list[str], dict]:
    """The four cells of one side of a row, and the values they were made from."""
    used, soft, hard = (draw(st.integers(0, 2**40)) for _ in range(3))
    over, inaccurate = draw(st.booleans()), draw(st.booleans())
    grace = draw(
        st.one_of(
            st.just(("-", NO_TIMER)),
            st.integers(1, 10**8).map(lambda n: (countdown(n), Grace(remaining=n))),
            st.sampled_from([("none", Grace(expired=True)), ("expired", Grace(expired=True))]),
        )
    )

    used_cell = f"[{used}]" if inaccurate else str(used)
    cells = [used_cell + ("*" if over else ""), str(soft), str(hard), grace[0]]
    values = dict(used=used, soft=soft, hard=hard, over=over, inaccurate=inaccurate)
    return cells, {**values, "grace": grace[1]}


def assert_reads_as(usage: Usage, made: dict, unit: int) -> None:
    for name in ("used", "soft", "hard"):
        amount = getattr(usage, name)
        assert amount.value == made[name] * unit, name
    assert usage.over is made["over"]
    assert usage.used.inaccurate is made["inaccurate"]
    assert usage.inaccurate is made["inaccurate"]
    assert usage.grace == made["grace"]


@settings(max_examples=300)
@given(st.data())
def test_a_row_made_from_values_reads_back_as_those_values(data):
    block_cells, blocks = data.draw(usage_cells())
    inode_cells, inodes = data.draw(usage_cells())
    row = "      /mnt/lustre " + " ".join(block_cells + inode_cells)
    stdout = f"Disk quotas for prj 4242 (pid 4242):\n{row}\n"
    output = parse_quota(stdout, "", 0)
    assert output.unparsed == ()
    (parsed,) = output.section("project", 4242).rows
    assert (parsed.label, parsed.line) == ("/mnt/lustre", 2)
    assert_reads_as(parsed.blocks, blocks, KIB)
    assert_reads_as(parsed.inodes, inodes, 1)
    assert parsed.inaccurate is (blocks["inaccurate"] or inodes["inaccurate"])
    assert output.inaccurate is parsed.inaccurate


@st.composite
def df_tables(draw) -> tuple[str, bool, list[dict]]:
    """An `lfs df -v` (or `-i -v`) table made from known rows, and those rows."""
    inodes = draw(st.booleans())
    rows = []
    for kind in ("MDT", "OST"):
        for index in draw(st.sets(st.integers(0, 2000), min_size=1, max_size=4)):
            total = draw(st.integers(1, 2**50))
            used = draw(st.integers(0, total))
            rows.append(
                dict(
                    name=f"scratch-{kind}{index:04x}",
                    kind=kind,
                    index=index,
                    total=total,
                    used=used,
                    available=total - used,
                    percent=-(-used * 100 // total),
                    flags=draw(st.sampled_from(["", "D", "S", "R", "N", "DS"])),
                )
            )
    title = "1K-blocks        Used   Available Use%" if not inodes else "Inodes  IUsed  IFree IUse%"
    lines = [f"UUID                   {title} Mounted on"]
    for row in rows:
        numbers = f"{row['total']} {row['used']} {row['available']} {row['percent']:3d}%"
        where = f"/lustre/scratch[{row['kind']}:{row['index']}]"
        lines.append(f"{row['name']}_UUID {numbers} {where} {row['flags']}".rstrip())
    return "\n".join(lines) + "\n", inodes, rows


@settings(max_examples=200)
@given(df_tables())
def test_a_df_table_made_from_values_reads_back_as_those_values(table):
    stdout, inodes, rows = table
    output = parse_df(stdout, "", 0)
    assert output.unparsed == ()
    (block,) = output.filesystems
    assert block.inodes is inodes
    unit = 1 if inodes else KIB
    read = [
        dict(
            name=t.name,
            kind=t.kind,
            index=t.index,
            total=t.total.value // unit,
            used=t.used.value // unit,
            available=t.available.value // unit,
            percent=t.percent,
            flags=t.flags,
        )
        for t in block.targets
    ]
    assert read == rows
    assert {t.mountpoint for t in block.targets} == {"/lustre/scratch"}
    assert [t.line for t in block.targets] == list(range(2, len(rows) + 2))
