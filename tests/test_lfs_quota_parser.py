"""The `lfs quota` parser against the fixtures of every version family (tests/fixtures/lfs/quota).

Each fixture is a sample built from the reference rules it names, with the parse expected by
hand (block values in KiB, as printed without -h). Where a fixture also holds the -h form of
the same sample, that form must give the same values, within the tolerance that four
significant digits allow, and say so through `Amount.tolerance`.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.quota_parser import QuotaOutput, Usage, parse_quota
from tests.fakes.fake_lfs import load_fixtures

CASES = load_fixtures("quota")
HUMAN_CASES = [(name, case) for name, case in CASES if "human" in case]
VERSIONS = {"2.12", "2.14", "2.15", "2.16"}


def close(amount: Amount | None, expected: int | None, unit: int, where: str) -> None:
    """`amount` is `expected` (in `unit`s), exactly or within its stated -h tolerance."""
    if expected is None:
        assert amount is None, where
        return
    assert amount is not None, where
    want = expected * unit
    assert abs(amount.value - want) <= amount.tolerance, f"{where}: {amount} != {want}"
    # Four significant digits: half a unit of the fourth digit, at most 0.05 % of the value.
    assert amount.tolerance <= want * 0.0005 + 1, f"{where}: tolerance {amount.tolerance}"


def check_usage(parsed: Usage | None, expected: dict[str, Any] | None, unit: int, where: str):
    if expected is None:
        assert parsed is None, where
        return
    assert parsed is not None, where
    close(parsed.used, expected["used"], unit, f"{where} used")
    close(parsed.soft, expected["soft"], unit, f"{where} soft")
    close(parsed.hard, expected["hard"], unit, f"{where} hard")
    assert parsed.over == expected["over"], f"{where} over"
    assert parsed.used.inaccurate == expected["inaccurate"], f"{where} used brackets"
    limits = [a for a in (parsed.soft, parsed.hard) if a is not None]
    want_limits = expected.get("inaccurate_limits", False)
    assert all(a.inaccurate == want_limits for a in limits), f"{where} limit brackets"
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
        assert (section.form, section.type, section.name, section.id) == (
            want["form"],
            want["type"],
            want["name"],
            want["id"],
        ), where
        assert len(section.rows) == len(want["rows"]), where
        for row, want_row in zip(section.rows, want["rows"]):
            at = f"{where} row {row.line}"
            assert row.label == want_row["label"], at
            assert row.quota_id == want_row.get("quota_id"), at
            assert row.pool == want_row.get("pool"), at
            check_usage(row.blocks, want_row["blocks"], 1024, f"{at} blocks")
            check_usage(row.inodes, want_row["inodes"], 1, f"{at} inodes")
            assert len(row.targets) == len(want_row["targets"]), at
            for target, want_target in zip(row.targets, want_row["targets"]):
                tat = f"{at} target {target.name}"
                assert (target.name, target.kind, target.index, target.inactive) == (
                    want_target["name"],
                    want_target["kind"],
                    want_target["index"],
                    want_target["inactive"],
                ), tat
                check_usage(target.blocks, want_target["blocks"], 1024, f"{tat} blocks")
                check_usage(target.inodes, want_target["inodes"], 1, f"{tat} inodes")
            total = want_row["total_allocated"]
            if total is None:
                assert row.total_allocated is None, at
            else:
                assert row.total_allocated is not None, at
                assert row.total_allocated.inodes == total["inodes"], at
                close(row.total_allocated.bytes, total["block_kib"], 1024, f"{at} total")
        want_defaults = want.get("default_rows", [])
        assert len(section.default_rows) == len(want_defaults), where
        for row, want_row in zip(section.default_rows, want_defaults):
            assert row.label == want_row["label"]
            for parsed, wanted, unit in (
                (row.blocks, want_row["blocks"], 1024),
                (row.inodes, want_row["inodes"], 1),
            ):
                close(parsed.soft, wanted["soft"], unit, f"{where} default soft")
                close(parsed.hard, wanted["hard"], unit, f"{where} default hard")
                assert parsed.grace_seconds == wanted["grace"], where

    notices = [[n.type, n.id, n.resource] for n in output.default_notices]
    assert notices == expect["notices"]
    assert output.errors_notice == expect["errors_notice"]
    assert output.errors_notice_flag == expect["errors_notice_flag"]
    assert [[m.kind, m.text] for m in output.messages] == expect["messages"]
    grace_times = [
        [(g.seconds, g.notify, g.inaccurate) for g in (times.block, times.inode)]
        for times in output.grace_times
    ]
    assert grace_times == [[_grace_period(g) for g in pair] for pair in expect["grace_times"]]
    assert [[u.stream, u.line] for u in output.unparsed] == expect["unparsed"]
    assert bool(output.usage_text) == expect["usage"]


def _grace_period(expected: int | dict[str, Any]) -> tuple[int | None, bool, bool]:
    if isinstance(expected, int):
        return expected, False, False
    return expected.get("seconds"), expected.get("notify", False), expected.get("inaccurate", False)


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


@pytest.mark.parametrize(("name", "case"), HUMAN_CASES, ids=[name for name, _ in HUMAN_CASES])
def test_human_form_gives_the_same_values(name: str, case: dict[str, Any]):
    human = case["human"]
    assert human["command"].split()[:3] == ["lfs", "quota", "-h"]
    output = parse_quota(_text(human["stdout"]), _text(human["stderr"]), human["status"])
    check_output(output, case["expect"])
    blocks = [row.blocks for s in output.sections for row in s.rows]
    assert any(b.used.tolerance or (b.soft and b.soft.tolerance) for b in blocks) or all(
        b.used.value < 1024 * 1024 for b in blocks
    ), "a -h sample with values of a MiB or more reads back as rounded"


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
