"""Numbers as `lfs` prints them without ``-h``: KiB for space, plain counts for inodes.

fsprobe never asks for the rounded ``-h``/``-H`` forms: it needs the exact numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class Amount:
    """A number read from `lfs`: bytes or a count.

    `inaccurate` means it was printed in ``[brackets]``: the server did not vouch for it (a
    target did not answer while usage was collected).
    """

    value: int
    inaccurate: bool = False


def _integer(token: str) -> int | None:
    return int(token) if token.isdigit() and token.isascii() else None


def parse_kib(token: str) -> Amount | None:
    """A block cell of `lfs quota` (KiB) in bytes; None if it is not one."""
    number = _integer(token)
    return None if number is None else Amount(number * KIB)


def parse_count(token: str) -> Amount | None:
    """An inode cell of `lfs quota`: a plain integer; None if it is not one."""
    number = _integer(token)
    return None if number is None else Amount(number)


def parse_df_value(token: str, unit: int = 1) -> Amount | None:
    """A number cell of `lfs df`, times `unit` (1024 for its KiB columns, 1 for inodes)."""
    number = _integer(token)
    return None if number is None else Amount(number * unit)
