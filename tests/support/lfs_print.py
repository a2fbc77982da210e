"""How `lfs quota` prints a grace countdown, written from the reference (1.5) for the tests
that check the parser against the rule rather than against itself."""

from __future__ import annotations

_UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def countdown(seconds: int) -> str:
    """``93784`` → ``"1d2h3m4s"``: largest units first, zero units left out; zero is ``0s``."""
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
