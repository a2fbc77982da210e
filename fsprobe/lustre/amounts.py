"""Numbers as `lfs` prints them: exact KiB and counts, and the rounded `-h`/`-H` forms.

`lfs quota -h` keeps four significant digits (``1.465G``) and `lfs df -h` one decimal
(``46.6G``), so a value read back from them is only known to a tolerance. `Amount` carries that
tolerance along, so a caller (or a test) can tell an exact count from a rounded one. The
formatting functions are the inverse rules, used by the fake `lfs` of the test suite and by the
round-trip tests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

KIB = 1024


@dataclass(frozen=True)
class Amount:
    """A number read from `lfs`: bytes or a count, known to ± `tolerance`.

    `inaccurate` means it was printed in ``[brackets]``: the server did not vouch for it (a
    target did not answer while usage was collected).
    """

    value: int
    tolerance: int = 0
    inaccurate: bool = False


# --- lfs quota -h: KiB scaled to the largest unit reached, "%5.4g" plus the unit letter.

_QUOTA_SHIFTS = (("P", 40), ("T", 30), ("G", 20), ("M", 10))
_QUOTA_SHIFT_OF = dict(_QUOTA_SHIFTS)
_QUOTA_INTEGER = re.compile(r"^([0-9]+)k?$")
_QUOTA_SCALED = re.compile(r"^([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)([MGTP])$")


def format_quota_kib(kib: int, human: bool = False) -> str:
    """A block value (KiB) as `lfs quota` prints it: ``4194308``, or with -h ``    4G``/``512k``."""
    if not human:
        return str(kib)
    for unit, shift in _QUOTA_SHIFTS:
        if kib >> shift:
            return f"{kib / (1 << shift):5.4g}{unit}"
    return f"{kib}k"


def parse_quota_bytes(token: str) -> Amount | None:
    """A block cell of `lfs quota` (``4194308``, ``512k``, ``1.465G``) in bytes; None if not one.

    Plain numbers and ``k`` values are exact KiB. Scaled values kept four significant digits,
    so they are exact to half a unit of the fourth digit.
    """
    match = _QUOTA_INTEGER.match(token)
    if match:
        return Amount(int(match.group(1)) * KIB)
    match = _QUOTA_SCALED.match(token)
    if not match:
        return None
    try:
        mantissa = Decimal(match.group(1))
    except InvalidOperation:
        return None
    if not mantissa.is_finite():
        return None
    scale = (1 << _QUOTA_SHIFT_OF[match.group(2)]) * KIB
    value = int((mantissa * scale).to_integral_value(ROUND_HALF_EVEN))
    if mantissa == 0:
        return Amount(value)
    quantum = Decimal(1).scaleb(mantissa.adjusted() - 3)
    return Amount(value, math.ceil(quantum / 2 * scale))


def parse_count(token: str) -> Amount | None:
    """An inode cell of `lfs quota`: always a plain integer, even with -h."""
    return Amount(int(token)) if token.isdigit() and token.isascii() else None


# --- lfs df -h / -H: scaled while above the base, "%8.1f" plus a suffix; small values raw.

_DF_SUFFIXES_BINARY = "KMGTPEZY"
_DF_SUFFIXES_SI = "kMGTPEZY"
_DF_SCALED = re.compile(r"^([0-9]+\.[0-9])([KMGTPEZYk])$")


def format_df_value(value: int, cooked: str | None = None) -> str:
    """A byte or inode count as `lfs df` prints it; `cooked` is None, ``"h"`` or ``"H"``."""
    if cooked is None:
        return str(value)
    base, suffixes = (1000, _DF_SUFFIXES_SI) if cooked == "H" else (1024, _DF_SUFFIXES_BINARY)
    scaled, radix = float(value), 0
    while scaled > base and radix < len(suffixes):
        scaled, radix = scaled / base, radix + 1
    if radix == 0:
        return str(value)
    return f"{scaled:8.1f}{suffixes[radix - 1]}"


def parse_df_value(token: str, unit: int = 1, si: bool = False) -> Amount | None:
    """A number cell of `lfs df`: an integer times `unit`, or a -h/-H value; None if not one.

    `unit` is 1024 for the KiB columns of a plain `lfs df` and 1 for bytes (-h) and inodes.
    Whether ``46.6G`` means 1024- or 1000-based cannot be told from the text (only ``K`` and
    ``k`` differ), so the caller says whether it asked for -H with `si`.
    """
    if token.isdigit() and token.isascii():
        return Amount(int(token) * unit)
    match = _DF_SCALED.match(token)
    if not match:
        return None
    suffix = match.group(2)
    if suffix == "k":
        base, radix = 1000, 1
    else:
        base = 1000 if si and suffix != "K" else 1024
        radix = _DF_SUFFIXES_BINARY.index(suffix) + 1
    scale = base**radix
    value = int((Decimal(match.group(1)) * scale).to_integral_value(ROUND_HALF_EVEN))
    return Amount(value, math.ceil(scale / 20))
