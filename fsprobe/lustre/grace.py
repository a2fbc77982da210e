"""Grace periods as `lfs quota` prints them: ``1w6d23h59m59s``, ``-``, ``none``, ``expired``.

A countdown is the time left when lfs ran; the caller adds it to that time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_COUNTDOWN = re.compile(r"^(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")

#: What an expired timer prints: "none" up to 2.15, "expired" from 2.16.
EXPIRED_WORDS = ("none", "expired")


@dataclass(frozen=True)
class Grace:
    """A grace cell: no timer (``-``), a running timer with `remaining` seconds, or expired."""

    remaining: int | None = None
    expired: bool = False

    @property
    def running(self) -> bool:
        return self.remaining is not None


NO_TIMER = Grace()


def parse_countdown(text: str) -> int | None:
    """``"2d4h"`` → ``187200``; None for anything that is not a countdown."""
    match = _COUNTDOWN.match(text)
    if not text or not match:
        return None
    return sum(int(count) * size for count, (_, size) in zip(match.groups(), _UNITS) if count)


def parse_grace(text: str) -> Grace | None:
    """A grace cell of a data row; None when the text is not one."""
    if text == "-":
        return NO_TIMER
    if text in EXPIRED_WORDS:
        return Grace(expired=True)
    remaining = parse_countdown(text)
    return None if remaining is None else Grace(remaining=remaining)
