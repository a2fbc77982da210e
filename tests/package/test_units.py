"""Sizes and durations as people write and read them, and the one check of a number given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsprobe.units import check_number, format_bytes, format_duration, format_seconds, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20G", 20 * 1024**3),
        ("1.5TiB", int(1.5 * 1024**4)),
        ("512M", 512 * 1024**2),
        ("512m", 512 * 1024**2),
        ("4096", 4096),
        ("1k", 1024),
        ("2 GB", 2 * 1024**3),
        (".5G", 512 * 1024**2),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "5X", "-1G", "1.2.3G", "10 apples"])
def test_parse_size_rejects_with_the_text(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.50 KiB"),
        (64 * 1024**2, "64 MiB"),
        (int(10.5 * 1024**2), "10.5 MiB"),
        (50 * 1024**3, "50 GiB"),
        (1023.6 * 1024**2, "1 GiB"),
    ],
)
def test_format_bytes(value, expected):
    assert format_bytes(value) == expected


@given(st.integers(min_value=0, max_value=2**62))
def test_format_bytes_round_trips_within_its_precision(value):
    text = format_bytes(value)
    number, unit = text.split(" ")
    back = parse_size(number + unit[0]) if unit != "B" else int(number)
    assert abs(back - value) <= max(1, value * 0.006)


def test_format_duration_words():
    assert format_duration(93784) == "1 day 2 hours"
    assert format_duration(60) == "1 minute"
    assert format_duration(0) == "0 seconds"
    assert format_duration(8 * 86400) == "1 week 1 day"


def test_format_seconds():
    assert format_seconds(0.0000042) == "4 µs"
    assert format_seconds(0.0042) == "4.2 ms"
    assert format_seconds(12.5) == "12.5 s"


@pytest.mark.parametrize(
    ("value", "bounds", "error", "expected"),
    [
        ("1", {"low": 0}, TypeError, "a number at least 0"),
        (True, {"low": 0}, TypeError, "a number at least 0"),  # a bool is no number
        (1.5, {"low": 0, "whole": True}, TypeError, "a whole number at least 0"),
        (-1, {"low": 0}, ValueError, "a number at least 0"),
        (float("inf"), {"low": 0}, ValueError, "a number at least 0"),
        (float("nan"), {"low": 0, "high": 1}, ValueError, "a number from 0 to 1"),
        (0, {"low": 0, "above": True}, ValueError, "a number above 0"),
        (11, {"low": 0, "high": 10, "above": True}, ValueError, "a number above 0 and at most 10"),
        (
            2**32,
            {"low": 0, "high": 2**32 - 2, "whole": True, "kind": "a numeric ID"},
            ValueError,
            "a numeric ID from 0 to 4294967294",  # a bound as written, never 4.29497e+09
        ),
        (
            0.05,
            {"low": 0.1, "high": 3600, "kind": "a number of seconds"},
            ValueError,
            "a number of seconds from 0.1 to 3600",
        ),
    ],
)
def test_a_number_given_is_finite_and_in_its_range_or_says_what_was_expected(
    value, bounds, error, expected
):
    """`check_number`, the one check of options, configuration and events: the message is
    what was expected, which each caller frames with the name of what was given."""
    with pytest.raises(error) as raised:
        check_number(value, **bounds)
    assert str(raised.value) == expected


@pytest.mark.parametrize("value", [0, 1, 0.5, 10**3, 2.0])
def test_a_number_in_its_range_passes(value):
    check_number(value, 0, 1000)
