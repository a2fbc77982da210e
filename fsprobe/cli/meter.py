"""A copy back's progress on a terminal, as `rsync --info=progress2` or `pv` show one: bytes,
percent, rate and time left on one line redrawn in place, and gone once the copy is over."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from fsprobe.posix.paths import escaped
from fsprobe.units import format_bytes, format_duration

#: A copy shorter than this shows nothing: the outcome line follows at once anyway.
QUIET_SECONDS = 1.0
#: The line is redrawn at most this often.
REDRAW_SECONDS = 0.25


class TerminalMeter:
    """`fsprobe.redirect.sync.CopyMeter` drawing on `stream` (a terminal's stderr)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream = stream
        self._clock = clock
        self._path = ""
        self._total = self._done = 0
        self._started = self._drawn_at = 0.0
        self._shown = False

    def begin(self, path: str, total: int) -> None:
        self._path, self._total, self._done = escaped(path), total, 0
        self._started = self._drawn_at = self._clock()
        self._shown = False

    def copied(self, nbytes: int) -> None:
        self._done += nbytes
        now = self._clock()
        if now - self._started < QUIET_SECONDS or now - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = now
        self._shown = True
        self._stream.write("\r\x1b[K" + self.line(now))
        self._stream.flush()

    def end(self) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
        self._shown = False

    def line(self, now: float) -> str:
        """What the meter shows at `now`, as
        ``1.50 GiB / 40 GiB  3%  512 MiB/s  1 minute 17 seconds left  /path``."""
        elapsed = max(now - self._started, 1e-9)
        rate = self._done / elapsed
        percent = 100 * self._done // self._total if self._total else 100
        left = (self._total - self._done) / rate if rate > 0 else None
        eta = f"{format_duration(left)} left" if left is not None else "stalled"
        return (
            f"{format_bytes(self._done)} / {format_bytes(self._total)}  {percent}%  "
            f"{format_bytes(int(rate))}/s  {eta}  {self._path}"
        )
