"""One call at a time per key, its result shared with whoever asks meanwhile and reused a while.

Expected failures are returned as data, so they are shared and cached like results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Flight(Generic[T]):
    done: threading.Event = field(default_factory=threading.Event)
    value: T | None = None
    error: BaseException | None = None
    finished: float = 0.0
    ttl: float = 0.0  # how long its owner wants the result kept


class SingleFlight(Generic[T]):
    """Results by key, computed at most once at a time and kept for `ttl` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight[T]] = {}

    def get(self, key: Hashable, compute: Callable[[], T], *, ttl: float, wait: float) -> T:
        """The fresh result for `key`: reused, awaited, or computed by this caller.

        Raises TimeoutError when another caller's computation is still running after `wait`
        seconds; an exception of the computation itself (a bug) reaches every waiting caller
        and is not kept.
        """
        with self._lock:
            now = self._clock()
            self._forget_expired(now)
            flight = self._flights.get(key)
            if flight is not None and flight.done.is_set() and now - flight.finished >= ttl:
                flight = None  # too old for this caller
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight(ttl=ttl)
        if owner:
            return self._compute(key, flight, compute)
        if not flight.done.wait(max(0.0, wait)):
            raise TimeoutError(f"still waiting for the running query of {key!r}")
        if flight.error is not None:
            raise flight.error
        return flight.value  # type: ignore[return-value]

    def _compute(self, key: Hashable, flight: _Flight[T], compute: Callable[[], T]) -> T:
        try:
            flight.value = compute()
        except BaseException as error:
            flight.error = error
            with self._lock:
                self._flights.pop(key, None)
            raise
        finally:
            flight.finished = self._clock()
            flight.done.set()
        return flight.value

    def _forget_expired(self, now: float) -> None:
        expired = [
            key
            for key, flight in self._flights.items()
            if flight.done.is_set() and now - flight.finished >= flight.ttl
        ]
        for key in expired:
            del self._flights[key]

    def clear(self) -> None:
        """Forget every finished result (in-flight calls finish and are forgotten too)."""
        with self._lock:
            self._flights.clear()
