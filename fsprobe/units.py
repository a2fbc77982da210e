"""Sizes and durations as people write and read them: ``50G``, ``1.5TiB``, ``3 days 4 hours``;
and the one check of a number someone gives (`check_number`: options, configuration, events).
"""

from __future__ import annotations

import math
import re
import time

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtpe]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def check_number(
    value: object,
    low: float,
    high: float = math.inf,
    *,
    above: bool = False,
    whole: bool = False,
    kind: str | None = None,
) -> None:
    """A finite number from `low` (above it when `above`) to `high`, or a TypeError when `value`
    is no real number (a bool is not; nor a float when `whole`), a ValueError when it is out of
    that range (NaN is). Either message is what was expected (``a number of seconds above 0``:
    `kind` names the number), for the caller to frame with the name of what was given."""
    if not _is_real(value, whole):
        raise TypeError(_expected(low, high, above, whole, kind))
    number: float = value  # type: ignore[assignment]  # a real number: ordered, convertible
    if not (low < number <= high if above else low <= number <= high) or not math.isfinite(number):
        raise ValueError(_expected(low, high, above, whole, kind))


def _expected(low: float, high: float, above: bool, whole: bool, kind: str | None) -> str:
    """What `check_number` expected, in words (made only for the error: a save checks its
    options every time, and nearly always they are fine)."""
    expected = kind or ("a whole number" if whole else "a number")
    if above:
        expected += f" above {_plain(low)}"
        return expected + ("" if high == math.inf else f" and at most {_plain(high)}")
    if high == math.inf:
        return expected + f" at least {_plain(low)}"
    return expected + f" from {_plain(low)} to {_plain(high)}"


def _plain(bound: float) -> str:
    """A bound as written: ``4294967294``, ``0.1``, never ``4.29497e+09``."""
    return str(int(bound)) if bound == int(bound) else f"{bound:g}"


def _is_real(value: object, whole: bool) -> bool:
    """Whether `value` is a real number (not a bool), an int when `whole`."""
    if type(value) is int or (type(value) is float and not whole):  # the usual case, fast
        return True
    if whole or isinstance(value, bool):
        return isinstance(value, int) and not isinstance(value, bool)
    import numbers  # here: only a number that is neither float nor int needs it

    return isinstance(value, numbers.Real)


def parse_size(text: str) -> int:
    """``"20G"``, ``"1.5TiB"``, ``"512M"``, ``"4096"`` → bytes. Multiples are binary (1024).

    Raises `ValueError` with the offending text, so a CLI can show it as a usage error.
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r} (try 512M, 20G or 1.5TiB)")
    number, prefix, _suffix = match.groups()
    return int(float(number) * 1024 ** _POWERS[prefix.lower()])


def format_bytes(value: float) -> str:
    """Bytes for a person: ``1536`` → ``"1.50 KiB"``, three significant digits; a whole number
    without decimals (``"64 MiB"``, not ``"64.0 MiB"``)."""
    if value < 0:
        return "-" + format_bytes(-value)
    if value < 1024:
        return f"{int(value)} B"
    exponent, scaled = 0, float(value)
    while scaled >= 1024 and exponent < len(_UNITS) - 1:
        exponent, scaled = exponent + 1, scaled / 1024
    if scaled >= 1023.5 and exponent < len(_UNITS) - 1:  # not "1024 MiB" but "1 GiB"
        exponent, scaled = exponent + 1, scaled / 1024
    digits = 0 if round(scaled, 1) >= 100 else 1 if round(scaled, 2) >= 10 else 2
    number = f"{scaled:.{digits}f}"
    whole, _, decimals = number.partition(".")
    return f"{whole if not decimals.strip('0') else number} {_UNITS[exponent]}"


def format_count(value: float) -> str:
    """Counts of inodes for a person: ``1234567`` → ``"1.23M"``."""
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= divisor:
            return f"{value / divisor:.3g}{suffix}"
    return str(int(value))


def format_percent(ratio: float) -> str:
    """``0.0712`` → ``"7.1 %"``; keeps one decimal below 10 % where it matters."""
    percent = ratio * 100
    return f"{percent:.1f} %" if percent < 10 else f"{percent:.0f} %"


_DURATION_UNITS = (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def format_duration(seconds: float, parts: int = 2) -> str:
    """``93784`` → ``"1 day 2 hours"``: the largest `parts` units, for humans, not parsers."""
    remaining = round(abs(seconds))
    if remaining == 0:
        return "0 seconds"
    words: list[str] = []
    for name, size in _DURATION_UNITS:
        count, remaining = divmod(remaining, size)
        if count and len(words) < parts:
            words.append(f"{count} {name}{'s' if count != 1 else ''}")
    return " ".join(words)


def format_seconds(seconds: float) -> str:
    """A latency for a person: ``0.0042`` → ``"4.2 ms"``, ``12.5`` → ``"12.5 s"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.1f} s"


def format_clock(at: float, now: float) -> str:
    """A moment for a person, in local time: ``"14:02"`` within the last day, else with its date
    (``"2026-11-30 14:02"``)."""
    layout = "%H:%M" if 0 <= now - at < 86400 else "%Y-%m-%d %H:%M"
    return time.strftime(layout, time.localtime(at))
