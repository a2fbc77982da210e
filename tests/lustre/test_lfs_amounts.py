"""Numbers and grace countdowns as `lfs` prints them without -h (reference 1.5, 3)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsprobe.lustre.amounts import KIB, parse_count, parse_df_value, parse_kib
from fsprobe.lustre.grace import parse_countdown, parse_grace
from tests.support.lfs_print import countdown


@given(st.integers(min_value=0, max_value=2**62))
def test_block_cells_are_exact_kib(kib: int):
    assert parse_kib(str(kib)).value == kib * KIB
    assert parse_count(str(kib)).value == kib
    assert parse_df_value(str(kib), 1024).value == kib * 1024


@pytest.mark.parametrize(
    "token", ["", "k", "512k", "1.5", "1.465G", "12X", "-3", "1,5G", "G", "nan", "١٢", "[4]"]
)
def test_tokens_that_are_not_plain_numbers(token: str):
    """-h forms (512k, 1.465G) included: fsprobe never asks for them, so they are not data."""
    assert parse_kib(token) is None
    assert parse_count(token) is None
    assert parse_df_value(token) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1w6d23h59m59s", 1209599), ("6d23h2m11s", 601331), ("2d4h", 187200), ("45s", 45),
     ("1w", 604800), ("0s", 0)],
)  # fmt: skip
def test_countdown_examples(text: str, seconds: int):
    assert parse_countdown(text) == seconds
    assert countdown(seconds) == text


@given(st.integers(min_value=0, max_value=10**9))
def test_countdown_round_trip(seconds: int):
    assert parse_countdown(countdown(seconds)) == seconds


@pytest.mark.parametrize("text", ["", "4", "1x", "h", "2h1d", "1d 2h", "-1s", "1.5h"])
def test_not_countdowns(text: str):
    assert parse_countdown(text) is None
    assert parse_grace(text) is None


def test_grace_cells():
    assert parse_grace("-").running is False
    assert parse_grace("none").expired and parse_grace("expired").expired
    assert parse_grace("2d4h").remaining == 187200
