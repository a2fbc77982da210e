"""`fsprobe.SaveOptions`: every choice the caller of a save makes, apart from what to write.

One frozen value, checked when it is made (a wrong type or value raises here, naming the option,
before anything is written); each public save takes it as ``options=`` and keyword overrides of
its fields (`SaveOverrides`), applied once by `save_options`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsprobe.model import NEED_INODES
from fsprobe.redirect.fallback import FALLBACK_ENV, all_fallback_dirs
from fsprobe.units import check_number

if TYPE_CHECKING:  # typing_extensions is not a dependency: these exist for type checkers only
    from collections.abc import Iterable
    from typing import TypedDict

    class SaveOverrides(TypedDict, total=False):
        """The keyword arguments of a public save: any field of `SaveOptions`."""

        attempts: int
        backoff: Backoff | None
        fallback_dirs: Iterable[str | os.PathLike[str]]
        max_wait: float
        need_bytes: int | None
        need_inodes: int | None
        preflight: bool
        fsync: bool
        redirect: bool
        on_unhealthy: str
        state_dir: str | os.PathLike[str] | None
        timeout: float
        save_timeout: float | None

    class SaveKeywords(SaveOverrides, total=False):
        """The keyword arguments of `fsprobe.save`: the save options, and `torch.save`'s own."""

        pickle_module: Any
        pickle_protocol: int
        _use_new_zipfile_serialization: bool
        _disable_byteorder_record: bool


DEFAULT_ATTEMPTS = 5
#: How long the preflight may take, its probes included (a hung mount costs this much).
DEFAULT_TIMEOUT = 10.0
ON_UNHEALTHY = ("proceed", "fail")


def _number(name: str, value: object, minimum: float, inclusive: bool) -> None:
    """A number of seconds at least (or, not `inclusive`, above) `minimum`, named in the error."""
    try:
        check_number(value, minimum, above=not inclusive, kind="a number of seconds")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{name} takes {error}, not {value!r}") from None


def _count(name: str, value: object, minimum: int, optional: bool) -> None:
    """A whole number at least `minimum` (or None when `optional`), named in the error."""
    if value is None and optional:
        return
    try:
        check_number(value, minimum, whole=True)
    except (TypeError, ValueError) as error:
        alternative = " or None" if optional else ""
        raise type(error)(f"{name} takes {error}{alternative}, not {value!r}") from None


def _flag(name: str, value: object) -> None:
    if value is not True and value is not False:
        raise TypeError(f"{name} takes True or False, not {value!r}")


def _path(name: str, value: object) -> str:
    """`value` as a path string; TypeError unless it is a str or an os.PathLike of one."""
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if isinstance(path, str):
            if not path:
                raise ValueError(f"{name} takes a non-empty path, not {value!r}")
            return path
    raise TypeError(f"{name} takes a path (str or os.PathLike), not {value!r}")


def _paths(name: str, value: object) -> tuple[str, ...]:
    """A list of directories as a tuple of path strings; TypeError for anything else (a single
    path included: a string would read as a list of one-letter directories)."""
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"{name} takes a list of directories, not one: {value!r}")
    try:
        given: tuple[object, ...] = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} takes a list of directories, not {value!r}") from None
    return tuple(_path(name, directory) for directory in given)


def _uniform() -> float:
    """A uniform draw from the operating system, never from the `random` module's own state:
    trainers save and restore that with their checkpoints, and a retry must not change a run."""
    import random  # here: a save that is never retried does not load it

    return random.SystemRandom().random()


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
    random: Callable[[], float] = _uniform

    def __post_init__(self) -> None:
        _number("Backoff.base", self.base, 0.0, inclusive=True)
        _number("Backoff.cap", self.cap, 0.0, inclusive=True)
        for name in ("sleep", "random"):
            if not callable(getattr(self, name)):
                raise TypeError(f"Backoff.{name} takes a function, not {getattr(self, name)!r}")

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failed attempt."""
        return self.random() * min(self.cap, self.base * 2.0 ** (failures - 1))


_DEFAULT_BACKOFF = Backoff()


@dataclass(frozen=True)
class SaveOptions:
    """The options of any save (`fsprobe.save`, `atomic_write`, `save_dir`, the collective
    `fsprobe.distributed.save_dir`, `save_async`, `preflight`, DCP's writer).

    - `attempts`: attempts in all (at least 1); `backoff`: a `Backoff`, the wait between them.
    - `fallback_dirs`: where the save may be redirected, in order (``FSPROBE_FALLBACK_DIRS``
      is added by `resolved`); `redirect=False` never redirects.
    - `max_wait`: how long the preflight may wait for a transiently unhealthy target.
    - `need_bytes`, `need_inodes`: what the save needs (bytes default to the last save there
      times 1.1; inodes to one file); `preflight=False` skips the preflight.
    - `on_unhealthy`: ``"proceed"`` attempts a save to an unhealthy target anyway, ``"fail"``
      refuses it; `state_dir`: the daemon's state directory; `timeout`: the preflight's bound.
    - `save_timeout`: bounds each attempt at writing (past it the attempt is abandoned to a
      fallback, or the save fails with ``TIMEOUT``); `fsync`: make each attempt durable.

    A wrong type is a TypeError, a wrong value a ValueError, when the options are made.
    """

    attempts: int = DEFAULT_ATTEMPTS
    backoff: Backoff = _DEFAULT_BACKOFF
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
        _count("attempts", self.attempts, 1, optional=False)
        if self.backoff is None:  # `backoff=None` as a keyword: the default
            object.__setattr__(self, "backoff", _DEFAULT_BACKOFF)
        elif not isinstance(self.backoff, Backoff):
            raise TypeError(f"backoff takes a fsprobe.saving.options.Backoff, not {self.backoff!r}")
        if self.fallback_dirs != ():
            object.__setattr__(self, "fallback_dirs", _paths("fallback_dirs", self.fallback_dirs))
        _number("max_wait", self.max_wait, 0.0, inclusive=True)
        _count("need_bytes", self.need_bytes, 0, optional=True)
        _count("need_inodes", self.need_inodes, 0, optional=True)
        _flag("preflight", self.preflight)
        _flag("fsync", self.fsync)
        _flag("redirect", self.redirect)
        if self.on_unhealthy not in ON_UNHEALTHY:
            kind = ValueError if isinstance(self.on_unhealthy, str) else TypeError
            raise kind(f"on_unhealthy takes one of {ON_UNHEALTHY}, not {self.on_unhealthy!r}")
        if self.state_dir is not None:
            object.__setattr__(self, "state_dir", _path("state_dir", self.state_dir))
        _number("timeout", self.timeout, 0.0, inclusive=False)
        if self.save_timeout is not None:
            _number("save_timeout", self.save_timeout, 0.0, inclusive=False)

    def resolved(self, environ: Mapping[str, str] = os.environ) -> SaveOptions:
        """These options with the environment's added: the fallback directories of
        ``FSPROBE_FALLBACK_DIRS`` after the caller's (none at all when `redirect` is False),
        each absolute."""
        if not self.fallback_dirs and not environ.get(FALLBACK_ENV):
            return self  # the common case, on the path of every save
        fallbacks = all_fallback_dirs(self.fallback_dirs, environ) if self.redirect else ()
        if fallbacks == self.fallback_dirs:
            return self
        return dataclasses.replace(self, fallback_dirs=fallbacks)


def save_options(
    options: SaveOptions | None,
    overrides: Mapping[str, Any],
    unhonoured: Collection[str] = (),
    by: str = "this save",
) -> SaveOptions:
    """The resolved options of one save: `options` (the defaults if None) with the keyword
    `overrides` of a public save applied once; an unknown keyword is a TypeError naming it, and
    so is one of the `unhonoured` options (what the save `by` cannot do) set to anything but
    its default, as a keyword or in `options`. The environment is read once, here."""
    environment = os.environ.get(FALLBACK_ENV)
    if options is None and not unhonoured:
        key = _plain(overrides, environment)
        if key is not None:
            return _made(key)
    return _resolve(options, overrides, unhonoured, by, environment)


def _resolve(
    options: SaveOptions | None,
    overrides: Mapping[str, Any],
    unhonoured: Collection[str],
    by: str,
    environment: str | None,
) -> SaveOptions:
    """`save_options` with the value of ``FSPROBE_FALLBACK_DIRS`` read (None: not set)."""
    unknown = sorted(set(overrides) - OPTION_NAMES)
    if unknown:
        raise TypeError(f"not a save option: {', '.join(unknown)} (see fsprobe.SaveOptions)")
    if options is None:
        chosen = SaveOptions(**overrides) if overrides else _DEFAULTS
    elif not isinstance(options, SaveOptions):
        raise TypeError(f"options takes a fsprobe.SaveOptions, not {options!r}")
    else:
        chosen = dataclasses.replace(options, **overrides) if overrides else options
    refused = [n for n in unhonoured if getattr(chosen, n) != getattr(_DEFAULTS, n)]
    if refused:
        raise TypeError(f"{by} does not take {', '.join(refused)} (see its docstring)")
    return chosen.resolved({FALLBACK_ENV: environment} if environment else {})


def split_keywords(keywords: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keywords of `fsprobe.save` split into the save options and the rest (`torch.save`'s)."""
    overrides = {k: v for k, v in keywords.items() if k in OPTION_NAMES}
    return overrides, {k: v for k, v in keywords.items() if k not in OPTION_NAMES}


#: Keyword values kept with the options made of them (immutable, and equal only when alike).
_PLAIN = frozenset({bool, int, float, str, type(None)})
#: A list of directories given as a keyword (`fallback_dirs`) is kept as the tuple of them.
_SEQUENCES = frozenset({list, tuple})

#: The value of ``FSPROBE_FALLBACK_DIRS``, then name, type and value of each plain keyword,
#: in the order given.
_Key = tuple[Any, ...]


def _plain(overrides: Mapping[str, Any], environment: str | None) -> _Key | None:
    """The key under which the resolved options of these keywords are made once per process
    (a trainer passes the same ones to every save: ``max_wait=120``), or None when they cannot
    be kept: a value neither plain nor a list of plain paths, or a relative fallback directory
    (made absolute against the working directory of the moment)."""
    key: list[Any] = [environment]
    for name, value in overrides.items():
        kind = type(value)  # part of the key: True, 1 and 1.0 are equal, not the same option
        if kind not in _PLAIN:
            if kind not in _SEQUENCES:
                return None
            for item in value:
                if type(item) is not str or item[:1] != "/":
                    return None
            value = tuple(value)
        key += (name, kind, value)
    if environment and not all(item[:1] == "/" for item in environment.split(":") if item):
        return None
    return tuple(key)


@functools.lru_cache(maxsize=64)
def _made(key: _Key) -> SaveOptions:
    """The options of a `_plain` key, the same for the same keywords in any order."""
    given = [key[i : i + 3] for i in range(1, len(key), 3)]
    ordered = sorted(given)  # by name: no two are alike
    if ordered != given:
        return _made((key[0], *itertools.chain.from_iterable(ordered)))
    return _resolve(None, {name: value for name, _, value in given}, (), "this save", key[0])


#: The name of every field of `SaveOptions`: the keywords a public save takes as options.
OPTION_NAMES = frozenset(field.name for field in dataclasses.fields(SaveOptions))
_DEFAULTS = SaveOptions()
