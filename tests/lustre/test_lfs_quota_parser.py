"""The `lfs quota` parser against the fixtures of every version family (tests/fixtures/lfs/quota).

Each fixture is a sample of the one form fsprobe runs, ``lfs quota -u|-g|-p ID DIR``, built
from the reference rules it names, with the parse expected by hand (block values in KiB).
"""

from __future__ import annotations

from typing import Any

import pytest

from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.quota_parser import QuotaOutput, Usage, parse_quota
from tests.support.fakes.fake_lfs import load_fixtures

CASES = load_fixtures("quota")
VERSIONS = {"2.9", "2.12", "2.14", "2.15", "2.16", "2.17"}


def exact(amount: Amount, expected: int, unit: int, where: str) -> None:
    assert amount.value == expected * unit, f"{where}: {amount} != {expected * unit}"


def check_usage(parsed: Usage, expected: dict[str, Any], unit: int, where: str):
    exact(parsed.used, expected["used"], unit, f"{where} used")
    exact(parsed.soft, expected["soft"], unit, f"{where} soft")
    exact(parsed.hard, expected["hard"], unit, f"{where} hard")
    assert parsed.over == expected["over"], f"{where} over"
    assert parsed.used.inaccurate == expected["inaccurate"], f"{where} used brackets"
    want_limits = expected.get("inaccurate_limits", False)
    assert parsed.soft.inaccurate == parsed.hard.inaccurate == want_limits, f"{where} limits"
    assert parsed.remote_error == expected.get("remote_error", False), f"{where} remote"
    grace = expected["grace"]
    if grace == "-":
        assert not parsed.grace.running and not parsed.grace.expired, f"{where} grace"
    elif grace == "expired":
        assert parsed.grace.expired and not parsed.grace.running, f"{where} grace"
    else:
        assert parsed.grace.remaining == grace, f"{where} grace"


def check_output(output: QuotaOutput, expect: dict[str, Any]) -> None:
    assert len(output.sections) == len(expect["sections"])
    for number, (section, want) in enumerate(zip(output.sections, expect["sections"])):
        where = f"section {number}"
        assert want["form"] == "id", f"{where}: fsprobe always names one ID"
        assert (section.type, section.name, section.id) == (
            want["type"],
            want["name"],
            want["id"],
        ), where
        assert len(section.rows) == len(want["rows"]), where
        for row, want_row in zip(section.rows, want["rows"]):
            at = f"{where} row {row.line}"
            assert row.label == want_row["label"], at
            assert want_row["targets"] == [] and want_row["total_allocated"] is None, "no -v"
            check_usage(row.blocks, want_row["blocks"], 1024, f"{at} blocks")
            check_usage(row.inodes, want_row["inodes"], 1, f"{at} inodes")
    notices = [[n.type, n.id, n.resource] for n in output.default_notices]
    assert notices == expect["notices"]
    assert output.errors_notice == expect["errors_notice"]
    assert output.errors_notice_flag == expect["errors_notice_flag"]
    assert [[m.kind, m.text] for m in output.messages] == expect["messages"]
    assert expect["grace_times"] == [], "fsprobe never runs -t"
    assert [[u.stream, u.line] for u in output.unparsed] == expect["unparsed"]
    assert bool(output.usage_text) == expect["usage"]


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def test_every_version_family_has_fixtures():
    versions = {name.split("/")[0] for name, _ in CASES}
    assert versions == VERSIONS
    assert all(case["rules"] for _, case in CASES), "every fixture names the rules it covers"


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_fixture_parses_as_expected(name: str, case: dict[str, Any]):
    output = parse_quota(_text(case["stdout"]), _text(case["stderr"]), case["status"])
    assert output.status == case["status"]
    check_output(output, case["expect"])


def test_title_indent_tells_the_layout_apart():
    legacy = parse_quota(
        "Disk quotas for usr 1 (uid 1):\n"
        "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n"
    )
    current = parse_quota(
        "Disk quotas for usr 1 (uid 1):\n"
        "      Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n"
    )
    assert (legacy.title_indent, current.title_indent) == (5, 6)


def test_a_217_fixture_reads_as_its_216_twin():
    """2.17's titles and widths (1.11) give the parse of the same inputs printed by 2.16."""
    twins = dict(CASES)
    pairs = [(n, twins[n.replace("2.17/", "2.16/")]) for n in twins if n.startswith("2.17/")]
    assert len(pairs) >= 8
    for name, twin in pairs:
        case = twins[name]
        assert case["state"] == twin["state"] and case["command"] == twin["command"], name
        output = parse_quota(_text(case["stdout"]), _text(case["stderr"]), case["status"])
        check_output(output, twin["expect"])
        if case["stdout"][1:]:
            assert (output.title_release, output.unknown_title) == ("2.17", None), name


def test_217_marks_the_inode_used_value_with_the_block_state_so_the_numbers_decide():
    """lfs.c v2_17_0 prints the inode used value with `bover`: ``930000*`` under a limit of
    1,000,000 is the blocks' grace timer, not a hard limit reached (1.11)."""
    text = _text(dict(CASES)["2.17/user_over_soft"]["stdout"])
    assert "930000* 1000000 1000000       - " in text
    (row,) = parse_quota(text).sections[0].rows
    assert row.blocks.over and not row.inodes.over


def test_an_unknown_title_above_readable_rows_is_kept_apart_from_unreadable_lines():
    text = (
        "Disk quotas for usr 1000 (uid 1000):\n"
        "     Filesystem    used   bsoft   bhard  bgrace   files   isoft   ihard  igrace\n"
        "    /mnt/lustre      40       0       0       -       3       0       0       -\n"
    )
    output = parse_quota(text)
    assert output.unparsed == ()
    assert output.unknown_title is not None and output.unknown_title.line == 2
    (row,) = output.sections[0].rows
    assert (row.blocks.used.value, row.inodes.used.value) == (40960, 3)
    unreadable = "    /mnt/lustre      40       0  zero       -       3   0   0   -\n"
    broken = parse_quota(text + unreadable)
    assert [u.line for u in broken.unparsed] == [4]


def test_the_header_of_lfs_before_210_is_named_not_read():
    (name, case) = next((n, c) for n, c in CASES if n.startswith("2.9/"))
    output = parse_quota(_text(case["stdout"]))
    assert output.sections == () and output.too_old_header is not None, name
    assert output.too_old_header.line == 1


def test_header_letter_must_match_type():
    output = parse_quota("Disk quotas for usr 1 (gid 1):\n")
    assert output.sections == ()
    assert [u.line for u in output.unparsed] == [1]


def test_crlf_and_trailing_spaces_are_tolerated():
    text = (
        "Disk quotas for usr 1000 (uid 1000):\r\n"
        "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace  \r\n"
        "    /mnt/lustre      40       0       0       -       3       0       0       -  \r\n"
    )
    output = parse_quota(text)
    assert output.unparsed == ()
    (row,) = output.sections[0].rows
    assert (row.label, row.blocks.used.value, row.inodes.used.value) == ("/mnt/lustre", 40960, 3)


def test_wrapped_label_waits_for_its_numbers_and_is_named_when_none_follow():
    output = parse_quota("Disk quotas for usr 1 (uid 1):\n/mnt/lustre/some/long/path\n\n")
    assert output.sections[0].rows == ()
    assert [(u.line, u.text) for u in output.unparsed] == [(2, "/mnt/lustre/some/long/path")]


def test_rows_of_options_fsprobe_never_runs_are_reported_not_guessed():
    output = parse_quota(
        "Disk quotas for usr 1000 (uid 1000):\n"
        "     Filesystem  kbytes   quota   limit   grace   files   quota   limit   grace\n"
        "    /mnt/lustre      40       0       0       -       3       0       0       -\n"
        "lustre-OST0000_UUID\n"
        "                     40       -    1024       -       -       -       -       -\n"
        "Total allocated inode limit: 0, total allocated block limit: 1024\n"
    )
    (row,) = output.sections[0].rows
    assert row.blocks.used.value == 40 * 1024
    assert [u.line for u in output.unparsed] == [4, 5, 6]


@pytest.mark.parametrize(
    "cells",
    ["4x 0 0 -", "[4x] 0 0 -", "4 0y 0 -", "4 [0y] 0 -", "4 0 z -", "4 0 0 -1"],
    ids=["used", "bracketed-used", "soft", "bracketed-soft", "hard", "grace"],
)
def test_a_cell_that_is_not_a_number_makes_the_line_unread(cells):
    output = parse_quota(f"Disk quotas for usr 1 (uid 1):\n    /mnt/lustre {cells} 1 0 0 -\n")
    assert output.sections[0].rows == ()
    assert [(u.stream, u.line) for u in output.unparsed] == [("stdout", 2)]


def test_a_line_that_is_no_row_never_labels_a_later_row():
    """It may be a wrapped label only for the very next row; a row with its own label in
    between reports it as unread at once."""
    output = parse_quota(
        "Disk quotas for usr 1 (uid 1):\n"
        "??? garbage\n"
        "    /mnt/lustre 1 0 0 - 1 0 0 -\n"
        "                2 0 0 - 2 0 0 -\n"
    )
    labels = [row.label for row in output.sections[0].rows]
    assert labels == ["/mnt/lustre", ""]
    assert [u.line for u in output.unparsed] == [2]
