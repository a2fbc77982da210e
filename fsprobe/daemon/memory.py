"""What the daemon knows of the saves across its restart: ``<state dir>/memory.json``.

Per target: the processes expected to save (`daemon.savers`), the times of the last successful
saves (the save interval), the last save and the latest problem of each outcome; per Lustre
target, what the imports' history forgets (`daemon.lustre_memory`). Written
atomically beside the state file by the state dir's one writer; read once at start, bounded
and checked field by field: a file that does not read is logged and forgotten, never trusted
(docs/design.md §8, "The daemon's memory").
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsprobe.codec import Form, FormatError
from fsprobe.daemon.logs import event
from fsprobe.daemon.lustre_memory import MAX_EVICTIONS
from fsprobe.daemon.lustre_memory import Remembered as LustreRemembered
from fsprobe.daemon.savers import MAX_SAVERS, Saver
from fsprobe.events.event import (
    BOUNDS,
    ERRNO_NAMES,
    MAX_FAILURES,
    MAX_HOST,
    MAX_PATH,
    OUTCOMES,
    REASONS,
    STEP_NAME,
)
from fsprobe.exporters.view import SaveProblem
from fsprobe.model import LastSave
from fsprobe.posix.outputdir import OutputDirectory, UntrustedOutput
from fsprobe.report import LAST_SAVE
from fsprobe.state import StateFileError, open_state_dir

SCHEMA = 1
MEMORY_FILE = "memory.json"
#: The most one target's part can take as written: JSON escapes a character beyond the BMP
#: in 12 bytes, its savers' hosts and its 8 paths (the last save's two, each problem's two) are
#: the senders' to choose within their bounds, and the rest of each record is numbers and names.
MAX_TARGET_BYTES = 12 * (MAX_SAVERS * MAX_HOST + MAX_HOST + 8 * MAX_PATH) + 256 * (MAX_SAVERS + 8)
#: The rest (the boot id, what the Lustre targets left): a larger file is not one we wrote.
MAX_MEMORY_BYTES = 8 << 20
#: The successful saves whose times are kept per target (`daemon.store.INTERVAL_SAVES`).
MAX_SAVE_TIMES = 9
#: Where this boot's id is: a saver remembered from another boot died with it.
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_FALLBACKS = ("none", "tried", "landed")
#: A Lustre target's name (`lustre.imports`): the filesystem's, then MDT or OST and its index.
LUSTRE_NAME = re.compile(r"[A-Za-z0-9_-]{1,8}-(?:MDT|OST)[0-9a-f]{4}")


@dataclass(frozen=True)
class Remembered:
    """What one target's saves left the daemon knowing (a last save is read and written by
    its form in `fsprobe.report`, `LAST_SAVE`)."""

    savers: tuple[Saver, ...] = ()
    save_times: tuple[float, ...] = ()  # of the last successful saves, oldest first
    last: LastSave | None = None
    last_success_at: float | None = None
    problems: Mapping[str, SaveProblem] = field(default_factory=dict)  # outcome -> the latest


@dataclass(frozen=True)
class _Document:
    """The file: the boot it was written in, each target's memory by path, and each Lustre
    target's by name."""

    boot_id: str
    targets: Mapping[str, Remembered]
    lustre: Mapping[str, LustreRemembered] = field(default_factory=dict)


SAVER = Form(Saver, "uid host pid started heard_at")
SAVE_PROBLEM = Form(SaveProblem, "at file uid errno step fallback landed reason?")
#: A last save is read and written by the form `fsprobe.report` made for it (a form registers
#: itself for every field of its class): imported here, not left to whichever module loaded it.
assert LAST_SAVE.cls is LastSave
REMEMBERED = Form(Remembered, "savers save_times last last_success_at problems")
LUSTRE_TARGET = Form(LustreRemembered, "lost_at lost_before evictions")
DOCUMENT = Form(_Document, "boot_id targets lustre?", name="memory file")


def boot_id(path: str = BOOT_ID) -> str:
    """This boot's id ("" where the kernel does not say)."""
    try:
        with open(path, encoding="ascii") as stream:
            return stream.read(64).strip()
    except (OSError, ValueError):
        return ""


def write_memory(
    state_dir: str | OutputDirectory,
    targets: Mapping[str, Remembered],
    boot: str,
    lustre: Mapping[str, LustreRemembered] | None = None,
) -> str:
    """Replace the memory file atomically (the writer lock's open state dir, or a path to
    open for this one write); readable by its writer only: it names other users' files."""
    document = {"schema": SCHEMA, **DOCUMENT.encode(_Document(boot, targets, lustre or {}))}
    data = json.dumps(document, separators=(",", ":"), allow_nan=False).encode()
    if isinstance(state_dir, OutputDirectory):
        return state_dir.publish(MEMORY_FILE, data, mode=0o600)
    with open_state_dir(state_dir) as directory:
        return directory.publish(MEMORY_FILE, data, mode=0o600)


Memory = tuple[str, dict[str, Remembered], dict[str, LustreRemembered]]


def read_memory(directory: OutputDirectory, targets: int) -> Memory:
    """The boot id, the targets' memory and the Lustre targets' in the state dir, read up to
    what a daemon of `targets` targets writes; ``("", {}, {})`` when there is none, and, logged
    as ``event=memory_unreadable``, when it does not read or is not to be trusted."""
    limit = MAX_MEMORY_BYTES + targets * MAX_TARGET_BYTES
    try:
        fd = directory.open(MEMORY_FILE, os.O_RDONLY, "memory file")
    except FileNotFoundError:
        return "", {}, {}
    except (OSError, UntrustedOutput, StateFileError) as error:
        return _forget(error)
    try:
        with open(fd, "rb") as stream:
            data = stream.read(limit + 1)
        if len(data) > limit:
            raise FormatError(f"more than {limit} bytes")
        document = json.loads(data, parse_constant=_no_constant)
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            raise FormatError(f"not a memory file of schema {SCHEMA}")
        read = DOCUMENT.decode(document)
        for path, remembered in read.targets.items():
            _check(path, remembered)
        for name, target in read.lustre.items():
            _check_lustre(name, target)
    except (OSError, ValueError, RecursionError) as error:  # FormatError is a ValueError
        return _forget(error)
    return read.boot_id, dict(read.targets), dict(read.lustre)


def _forget(error: BaseException) -> Memory:
    event(
        logging.ERROR,
        "memory_unreadable",
        file=MEMORY_FILE,
        message=f"{error}; starting with no memory of savers and saves",
    )
    return "", {}, {}


def _no_constant(name: str) -> Any:
    raise FormatError(f"{name} is not a number")


def _check(path: str, remembered: Remembered) -> None:
    """Every bound an event had to keep when it was heard of, and the store's own."""
    where = f"targets.{json.dumps(path)}"
    _require(_is_path(path) and len(remembered.savers) <= MAX_SAVERS, where, "too many savers")
    for saver in remembered.savers:
        _require(
            len(saver.host) <= MAX_HOST
            and _within("pid", saver.pid)
            and 0 <= saver.uid < 2**32
            and (saver.started is None or saver.started >= 0)
            and _time(saver.heard_at),
            where,
            "a saver out of bounds",
        )
    times = remembered.save_times
    _require(
        len(times) <= MAX_SAVE_TIMES and all(map(_time, times)), where, "save times out of bounds"
    )
    _require(remembered.last_success_at is None or _time(remembered.last_success_at), where, "")
    last = remembered.last
    if last is not None:
        _require(
            _time(last.at)
            and last.outcome in OUTCOMES
            and _is_path(last.requested)
            and (last.landed is None or _is_path(last.landed))
            and len(last.host) <= MAX_HOST
            and _within("pid", last.pid)
            and _within("ranks", last.ranks)
            and _within("bytes", last.bytes)
            and _within("seconds", last.seconds)
            and 0 <= last.uid < 2**32
            and len(last.failures) <= MAX_FAILURES
            and all(_errno(e) and _step(s) for e, s in last.failures),
            where,
            "the last save out of bounds",
        )
    for outcome, problem in remembered.problems.items():
        _require(
            outcome in OUTCOMES[1:]
            and _time(problem.at)
            and _is_path(problem.file)
            and (problem.landed is None or _is_path(problem.landed))
            and 0 <= problem.uid < 2**32
            and _errno(problem.errno)
            and _step(problem.step)
            and problem.fallback in _FALLBACKS
            and (problem.reason == "none" or problem.reason in REASONS),
            where,
            f"the {outcome} problem out of bounds",
        )


def _check_lustre(name: str, target: LustreRemembered) -> None:
    """A Lustre target's name as lctl prints it (``FSNAME-OST0007``), times that can be."""
    where = f"lustre.{json.dumps(name)}"
    times = [t for t in (target.lost_at, target.lost_before) if t is not None]
    _require(
        LUSTRE_NAME.fullmatch(name) is not None
        and len(target.evictions) <= MAX_EVICTIONS
        and all(map(_time, [*times, *target.evictions])),
        where,
        "a Lustre target out of bounds",
    )


def _require(holds: bool, where: str, what: str) -> None:
    if not holds:
        raise FormatError(f"{where}: {what or 'a value out of bounds'}")


def _is_path(text: str) -> bool:
    return text.startswith("/") and len(text) <= MAX_PATH and "\0" not in text


def _within(key: str, value: float) -> bool:
    low, high = BOUNDS[key]
    return low <= value <= high


def _time(value: float) -> bool:
    return math.isfinite(value) and 0 <= value <= BOUNDS["finished_at"][1]


def _errno(name: str) -> bool:
    return name in ERRNO_NAMES


def _step(name: str) -> bool:
    return name == "unknown" or STEP_NAME.fullmatch(name) is not None
