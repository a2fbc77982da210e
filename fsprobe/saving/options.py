"""`fsprobe.SaveOptions`: every choice the caller of a save makes, apart from what to write.

One frozen value, checked when it is made, so that a save carries its options as one thing
from the public function down to each attempt (in the manner of Orbax's options classes).
`resolved()` adds what the environment says (``FSPROBE_FALLBACK_DIRS``) once, at the start of
a save: nothing below it reads the environment again.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fsprobe.policy import NEED_INODES
from fsprobe.redirect.fallback import all_fallback_dirs

DEFAULT_ATTEMPTS = 5
#: How long the preflight may take, its probes included (a hung mount costs this much).
DEFAULT_TIMEOUT = 10.0
ON_UNHEALTHY = ("proceed", "fail")

__all__ = [
    "DEFAULT_ATTEMPTS",
    "DEFAULT_TIMEOUT",
    "NEED_INODES",
    "ON_UNHEALTHY",
    "Backoff",
    "SaveOptions",
    "save_options",
]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: before retry n, sleep U(0, min(cap, base·2ⁿ⁻¹)).

    The defaults give 5 attempts about 30 s in all at most (2 + 4 + 8 + 15 s, half that on
    average). Jitter keeps the hundreds of ranks that hit the same hiccup from retrying in
    lockstep. `sleep` and `random` are injectable for tests.
    """

    base: float = 2.0
    cap: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = random.random

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failed attempt."""
        return self.random() * min(self.cap, self.base * 2.0 ** (failures - 1))


@dataclass(frozen=True)
class SaveOptions:
    """The options of any save (`fsprobe.save`, `atomic_write`, `save_dir`, the collective
    `fsprobe.distributed.save_dir`, `save_async`); each public save takes them as keyword
    arguments, or as one `options=SaveOptions(...)`.

    - `attempts`: attempts in all (at least 1); `backoff`: the wait between them.
    - `fallback_dirs`: where the save may be redirected, in order (``FSPROBE_FALLBACK_DIRS``
      is added by `resolved`); `redirect=False` never redirects.
    - `max_wait`: how long the preflight may wait for a transiently unhealthy target.
    - `need_bytes`, `need_inodes`: what the save needs (bytes default to the last save there
      times 1.1; inodes to one file); `preflight=False` skips the preflight.
    - `on_unhealthy`: ``"proceed"`` attempts a save to an unhealthy target anyway, ``"fail"``
      refuses it; `state_dir`: the daemon's state directory; `timeout`: the preflight's bound.
    - `save_timeout`: bounds each attempt at writing (past it the attempt is abandoned to a
      fallback, or the save fails with ``TIMEOUT``); `fsync`: make each attempt durable.
    """

    attempts: int = DEFAULT_ATTEMPTS
    backoff: Backoff = Backoff()
    fallback_dirs: tuple[str, ...] = ()
    max_wait: float = 0.0
    need_bytes: int | None = None
    need_inodes: int | None = NEED_INODES
    preflight: bool = True
    fsync: bool = True
    redirect: bool = True
    on_unhealthy: str = "proceed"
    state_dir: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    save_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.save_timeout is not None and not self.save_timeout > 0:
            raise ValueError("save_timeout must be a positive number of seconds")
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.on_unhealthy not in ON_UNHEALTHY:
            raise ValueError(
                f"on_unhealthy must be one of {ON_UNHEALTHY}, not {self.on_unhealthy!r}"
            )
        if self.backoff is None:  # `backoff=None` in the public functions: the default
            object.__setattr__(self, "backoff", Backoff())
        object.__setattr__(self, "fallback_dirs", tuple(map(os.fspath, self.fallback_dirs)))

    def resolved(self, environ: Mapping[str, str] = os.environ) -> SaveOptions:
        """These options with the environment's added: the fallback directories of
        ``FSPROBE_FALLBACK_DIRS`` after the caller's (none at all when `redirect` is False)."""
        fallbacks = all_fallback_dirs(self.fallback_dirs, environ) if self.redirect else ()
        return dataclasses.replace(self, fallback_dirs=fallbacks)


def save_options(options: SaveOptions | None, **arguments: object) -> SaveOptions:
    """The resolved options of a public save: `options` as given, or else built from the
    keyword arguments; giving both is a TypeError (which of them would count?)."""
    from_arguments = SaveOptions(**arguments)  # type: ignore[arg-type]
    if options is None:
        return from_arguments.resolved()
    if from_arguments != SaveOptions():
        raise TypeError("give the save options either as options=SaveOptions(...) or as keywords")
    return options.resolved()
