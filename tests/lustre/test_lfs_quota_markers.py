"""The marks `lfs quota` puts on its numbers, each read for exactly what it says (reference
1.5): ``[...]`` inaccurate on any cell, ``*`` over a limit. Each case differs from a neighbour
by one mark, so that reading a mark too widely or too narrowly fails here."""

from __future__ import annotations

import pytest

from fsprobe.lustre.quota_parser import parse_quota

HEADER = (
    "Disk quotas for usr 1000 (uid 1000):\n"
    "      Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n"
)
MAIN = "     /mnt/lustre 5368712 10485760 12582912       -  930000  1000000 1000000       -\n"


def rows(*lines: str, errors_notice: bool = False):
    notice = (
        "1 Some errors happened when getting quota info. Some devices may be not working or "
        'deactivated. The data in "[]" is inaccurate.\n'
    )
    stdout = HEADER + "".join(lines) + (notice if errors_notice else "")
    output = parse_quota(stdout, "", 0)
    assert output.unparsed == (), output.unparsed
    return output


@pytest.mark.parametrize(
    ("cells", "inaccurate"),
    [
        ("5368712 10485760 12582912 -", False),
        ("[5368712] 10485760 12582912 -", True),
        ("5368712 [10485760] 12582912 -", True),
        ("5368712 10485760 [12582912] -", True),
    ],
    ids=["none", "used", "soft", "hard"],
)
def test_brackets_on_any_block_cell_make_the_row_inaccurate(cells, inaccurate):
    output = rows(f"     /mnt/lustre {cells}  930000  1000000 1000000       -\n")
    (row,) = output.sections[0].rows
    assert row.blocks.inaccurate is inaccurate
    assert row.inaccurate is inaccurate
    assert output.inaccurate is inaccurate


def test_brackets_on_an_inode_cell_make_the_row_inaccurate():
    output = rows(
        "     /mnt/lustre 5368712 10485760 12582912       -  [930000]  1000000 1000000 -\n"
    )
    (row,) = output.sections[0].rows
    assert (row.blocks.inaccurate, row.inodes.inaccurate, row.inaccurate) == (False, True, True)


def test_a_row_without_inode_cells_is_reported_not_read():
    """Only -v target rows have no inode cells, and fsprobe never runs -v."""
    output = parse_quota(HEADER + "     /mnt/lustre 5368712 10485760 12582912 - - - - -\n")
    assert output.sections[0].rows == ()
    assert [(u.stream, u.line) for u in output.unparsed] == [("stdout", 3)]


def test_one_inaccurate_row_of_several_makes_the_output_inaccurate():
    output = rows(MAIN, "     /scratch/other [1] 10485760 12582912 - 1 1000000 1000000 -\n")
    first, second = output.sections[0].rows
    assert (first.inaccurate, second.inaccurate) == (False, True)
    assert output.inaccurate is True


def test_the_errors_notice_alone_makes_the_output_inaccurate():
    output = rows(MAIN, errors_notice=True)
    assert output.sections[0].rows[0].inaccurate is False
    assert output.inaccurate is True
