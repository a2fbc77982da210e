"""The `-h`/`-H` number rules and grace countdowns of `lfs`, both ways (reference 1.5, 3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsprobe.lustre.amounts import (
    KIB,
    format_df_value,
    format_quota_kib,
    parse_count,
    parse_df_value,
    parse_quota_bytes,
)
from fsprobe.lustre.grace import format_countdown, parse_countdown, parse_grace

KIB_VALUES = st.integers(min_value=0, max_value=2**62)


@pytest.mark.parametrize(
    ("kib", "printed"),
    [
        (4 * 2**20, "    4G"),
        (int(2.25 * 2**20), " 2.25G"),
        (1536164, "1.465G"),
        (19402650583, "18.07T"),
        (5012, "4.895M"),
        (2**20 - 1, " 1024M"),
        (30 * 1024, "   30M"),
        (3 * 2**30, "    3T"),
        (0, "0k"),
        (512, "512k"),
        (10000 * 2**40, "1e+04P"),
    ],
)
def test_quota_human_examples_of_the_reference(kib: int, printed: str):
    assert format_quota_kib(kib, human=True) == printed
    parsed = parse_quota_bytes(printed.strip())
    assert parsed is not None
    assert abs(parsed.value - kib * KIB) <= parsed.tolerance


@given(KIB_VALUES)
def test_quota_human_round_trip_within_four_digits(kib: int):
    text = format_quota_kib(kib, human=True)
    parsed = parse_quota_bytes(text.strip())
    assert parsed is not None
    assert abs(parsed.value - kib * KIB) <= parsed.tolerance
    assert parsed.tolerance <= kib * KIB * 0.0005 + 1
    if kib < 1024:
        assert (text, parsed.tolerance) == (f"{kib}k", 0)
    else:
        assert len(text) >= 6, "the number is left-padded to 5 before the unit"


@given(KIB_VALUES)
def test_quota_plain_numbers_are_exact_kib(kib: int):
    parsed = parse_quota_bytes(format_quota_kib(kib))
    assert parsed is not None
    assert (parsed.value, parsed.tolerance) == (kib * KIB, 0)


@pytest.mark.parametrize("token", ["", "k", "1.5", "1.5k", "12X", "-3", "1,5G", "G", "nanG", "∞G"])
def test_quota_tokens_that_are_not_numbers(token: str):
    assert parse_quota_bytes(token) is None


def test_inode_cells_are_plain_integers_only():
    assert parse_count("930000").value == 930000
    assert parse_count("1.2M") is None
    assert parse_count("١٢") is None  # digits of another script are not lfs output


@pytest.mark.parametrize(
    ("value", "cooked", "printed"),
    [
        (1024, "h", "1024"),
        (1025, "h", "     1.0K"),
        (50036977664, "h", "    46.6G"),
        (1073741824, "h", "  1024.0M"),
        (2560000, "H", "     2.6M"),
        (25100, "H", "    25.1k"),
    ],
)
def test_df_human_examples(value: int, cooked: str, printed: str):
    assert format_df_value(value, cooked) == printed
    parsed = parse_df_value(printed.strip(), si=cooked == "H")
    assert parsed is not None
    assert abs(parsed.value - value) <= parsed.tolerance


@given(st.integers(min_value=0, max_value=2**64), st.sampled_from(["h", "H"]))
def test_df_human_round_trip_within_one_decimal(value: int, cooked: str):
    parsed = parse_df_value(format_df_value(value, cooked).strip(), si=cooked == "H")
    assert parsed is not None
    assert abs(parsed.value - value) <= parsed.tolerance
    assert parsed.tolerance <= value * 0.05 + 1  # one decimal of a unit the value exceeds


@given(st.integers(min_value=0, max_value=2**64))
def test_df_plain_numbers_are_exact(value: int):
    parsed = parse_df_value(format_df_value(value), 1024)
    assert parsed is not None
    assert (parsed.value, parsed.tolerance) == (value * 1024, 0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1w6d23h59m59s", 1209599), ("6d23h2m11s", 601331), ("2d4h", 187200), ("45s", 45),
     ("1w", 604800), ("0s", 0)],
)  # fmt: skip
def test_countdown_examples(text: str, seconds: int):
    assert parse_countdown(text) == seconds
    assert format_countdown(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_countdown_round_trip(seconds: int):
    assert parse_countdown(format_countdown(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "4", "1x", "h", "2h1d", "1d 2h", "-1s", "1.5h"])
def test_not_countdowns(text: str):
    assert parse_countdown(text) is None
    assert parse_grace(text) is None


def test_grace_cells():
    assert parse_grace("-").running is False
    assert parse_grace("none").expired and parse_grace("expired").expired
    assert parse_grace("2d4h").remaining == 187200
