"""The `lfs df` parser against tests/fixtures/lfs/df, and merging two runs into targets."""

from __future__ import annotations

import dataclasses
import errno
from typing import Any

import pytest

from fsprobe.errors import PARSE, ProbeFailure, errno_name
from fsprobe.lustre.amounts import Amount
from fsprobe.lustre.df_parser import DfOutput, parse_df
from fsprobe.lustre.df_targets import merge_targets, pick_block
from fsprobe.model import LustreTarget
from tests.support.fakes.fake_lfs import load_fixtures

CASES = load_fixtures("df")


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def close(amount: Amount, expected: int, where: str) -> None:
    assert amount.value == expected, f"{where}: {amount} != {expected}"


def parse_case(case: dict[str, Any]):
    return parse_df(_text(case["stdout"]), _text(case["stderr"]), case["status"])


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_fixture_parses_as_expected(name: str, case: dict[str, Any]):
    check_output(parse_case(case), case["expect"])


def check_output(output: DfOutput, expect: dict[str, Any]) -> None:
    """`output` is the parse `expect` writes down (values in bytes)."""
    assert len(output.filesystems) == len(expect["filesystems"])
    for block, want in zip(output.filesystems, expect["filesystems"]):
        assert block.inodes == want["inodes"]
        assert len(block.targets) == len(want["targets"])
        for row, want_row in zip(block.targets, want["targets"]):
            where = f"line {row.line}"
            assert row.uuid == want_row["uuid"], where
            assert row.name == want_row["uuid"].removesuffix("_UUID"), where
            assert (row.kind, row.index, row.percent, row.mountpoint, row.flags) == (
                want_row["kind"],
                want_row["index"],
                want_row["percent"],
                want_row["mountpoint"],
                want_row["flags"],
            ), where
            assert row.unknown_state == want_row.get("unknown_state", 0), where
            for key in ("total", "used", "available"):
                close(getattr(row, key), want_row[key], f"{where} {key}")
        if want["summary"] is None:
            assert block.summary is None
        else:
            summary = block.summary
            assert summary is not None
            assert (summary.percent, summary.mountpoint) == (
                want["summary"]["percent"],
                want["summary"]["mountpoint"],
            )
            for key in ("total", "used", "available"):
                close(getattr(summary, key), want["summary"][key], f"summary {key}")
        assert [[i.kind, i.index] for i in block.inactive] == want["inactive"]
        assert [[e.name, e.kind, e.index, e.message] for e in block.errors] == want["errors"]
    assert list(output.not_lustre) == expect["not_lustre"]
    assert [[m.kind, m.text] for m in output.messages] == expect["messages"]
    assert [[u.stream, u.line] for u in output.unparsed] == expect["unparsed"]
    assert bool(output.usage_text) == expect["usage"]


def _block(name: str):
    case = dict(CASES)[name]
    return pick_block(parse_case(case), "/mnt/lustre", case["command"], "/mnt/lustre")


def test_merge_gives_one_target_per_mdt_and_ost_with_both_tables():
    targets = merge_targets(_block("blocks_verbose"), _block("inodes_verbose"))
    by_name = {t.name: t for t in targets}
    assert [t.name for t in targets] == [
        "lustre-MDT0000",
        "lustre-MDT0001",
        "lustre-OST0000",
        "lustre-OST0001",
        "lustre-OST0002",
        "lustre-OST0003",
    ]
    assert by_name["lustre-OST0000"] == LustreTarget(
        name="lustre-OST0000",
        kind="OST",
        index=0,
        size_bytes=41943040 * 1024,
        avail_bytes=1048576 * 1024,
        files=2621440,
        files_free=2588000,
        active=True,
        flags="S",
    )
    assert by_name["lustre-OST0001"].flags == "Df"
    inactive = by_name["lustre-OST0002"]
    assert (inactive.active, inactive.size_bytes, inactive.files) == (False, None, None)
    unreachable = by_name["lustre-OST0003"]
    assert (unreachable.active, unreachable.avail_bytes) == (True, None)


def test_217_tables_read_like_216_with_the_unknown_bits_kept():
    """2.17's two spaces before the mount point and its octal `(%#o)` for status bits it has no
    letter for (showdf at v2_17_0) read into the same targets as 2.16's, those bits kept: an
    unknown bit is no reason to refuse the table."""
    older = merge_targets(_block("blocks_verbose"), _block("inodes_verbose"))
    newer = merge_targets(_block("blocks_verbose_2.17"), _block("inodes_verbose_2.17"))
    assert [dataclasses.replace(t, unknown_state=0) for t in newer] == list(older)
    assert {t.name: t.unknown_state for t in newer if t.unknown_state} == {"lustre-OST0001": 0o2000}
    assert _block("blocks_verbose_2.17").mountpoint == "/mnt/lustre"


@pytest.mark.parametrize(
    ("tail", "flags", "unknown"),
    [("", "", 0), (" (02000)", "", 0o2000), (" DRS(014000)", "DRS", 0o14000), (" a", "a", 0)],
)
def test_217_status_cell_forms(tail: str, flags: str, unknown: int):
    """Letters in `obd_statfs_state_name_find` order, then the bits left without one."""
    title = "UUID                   1K-blocks        Used   Available Use%  Mounted on\n"
    row = f"fs-OST0007_UUID         4096        1024        3072  25%  /lus/fs[OST:7]{tail}\n"
    output = parse_df(title + row)
    assert output.unparsed == ()
    (target,) = output.filesystems[0].targets
    assert (target.mountpoint, target.flags, target.unknown_state) == ("/lus/fs", flags, unknown)


def test_merge_refuses_two_tables_of_the_same_kind():
    with pytest.raises(ProbeFailure) as failure:
        merge_targets(_block("blocks"), _block("blocks_verbose"))
    assert failure.value.error == PARSE


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("not_lustre_2.12", "ENODEV"),
        ("not_lustre_2.16", errno_name(errno.EOPNOTSUPP)),
        ("invalid_path", "ENOENT"),
        ("bad_option_2.16", "EINVAL"),
        ("garbage", PARSE),
    ],
)
def test_no_table_is_a_failure_named_after_the_exit_status(name: str, error: str):
    case = dict(CASES)[name]
    with pytest.raises(ProbeFailure) as failure:
        pick_block(parse_case(case), "/mnt/lustre", case["command"], "/mnt/lustre")
    assert failure.value.error == error
    if error == PARSE:
        assert "stdout line 1" in failure.value.message


def test_the_block_of_the_wanted_mount_is_picked():
    case = dict(CASES)["two_filesystems"]
    block = pick_block(parse_case(case), "/scratch", case["command"], "/scratch")
    assert block.mountpoint == "/scratch"
    assert block.fsname == "scr"
