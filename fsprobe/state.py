"""The state file: how the daemon tells the save hook in the trainer what it last saw.

The daemon (often a sidecar, another process) writes ``<state-dir>/state.json`` atomically after
every probe; the hook reads it before every save. Reading must cost microseconds, so the parse
is cached and reused while the file's identity (inode, size, mtime) is unchanged: one `lstat`.

The hook acts on what the file says (delay a save, move it elsewhere), so it trusts the file only
when the file and its directory belong to the reader or to root and nobody else can write them.
Redirect destinations never come from this file; they are always the caller's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsprobe.atomic import publish_file
from fsprobe.paths import is_under

SCHEMA = 1
STATE_FILE = "state.json"


class StateFileError(Exception):
    """The state file cannot be used; the message says why and what to do."""


class UntrustedStateFile(StateFileError):
    """The state file or its directory could have been written by someone else."""


class CorruptStateFile(StateFileError):
    """The state file is not valid JSON of a known schema (truncated, edited, another version)."""


def default_state_dir(environ: Mapping[str, str] = os.environ) -> str:
    """`FSPROBE_STATE_DIR`, else ``$XDG_RUNTIME_DIR/fsprobe``, else ``/tmp/fsprobe-<uid>``."""
    if environ.get("FSPROBE_STATE_DIR"):
        return environ["FSPROBE_STATE_DIR"]
    if environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(environ["XDG_RUNTIME_DIR"], "fsprobe")
    return os.path.join(tempfile.gettempdir(), f"fsprobe-{os.getuid()}")


def ensure_state_dir(state_dir: str) -> None:
    """Create the state dir (writable by its owner only), or check that an existing one is.

    In a shared /tmp another user could create ``/tmp/fsprobe-<uid>`` first; writing into it
    would hand them our state, so that is refused rather than worked around.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(state_dir, 0o755)
    _check_trusted(os.lstat(state_dir), state_dir, "state directory", directory=True)


def _check_trusted(info: os.stat_result, path: str, what: str, directory: bool) -> None:
    expected = stat.S_ISDIR if directory else stat.S_ISREG
    if not expected(info.st_mode):
        raise UntrustedStateFile(f"{what} {path} is not a {'directory' if directory else 'file'}")
    if info.st_uid not in (os.getuid(), 0):
        raise UntrustedStateFile(
            f"{what} {path} belongs to uid {info.st_uid}, not to you ({os.getuid()}) or root"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedStateFile(
            f"{what} {path} is writable by group or others (mode {stat.filemode(info.st_mode)})"
        )


def write_state(state_dir: str, document: Mapping[str, Any]) -> str:
    """Replace the state file atomically: a reader sees the old file or the new, never half."""
    data = json.dumps({"schema": SCHEMA, **document}, separators=(",", ":"))
    return replace_state_file(state_dir, data.encode("utf-8"))


def write_state_targets(
    state_dir: str, header: Mapping[str, Any], targets: Mapping[str, str]
) -> str:
    """`write_state` for a writer that keeps each target's JSON text between writes.

    The daemon rewrites the file after every probe result, yet only one target changed: with
    100 targets, encoding them all again would cost milliseconds each time, joining their
    cached texts costs microseconds. `header` holds the top-level keys except "targets";
    `targets` maps each target path to its JSON object as text.
    """
    head = json.dumps({"schema": SCHEMA, **header}, separators=(",", ":"))
    body = ",".join(f"{json.dumps(path)}:{text}" for path, text in targets.items())
    return replace_state_file(state_dir, f'{head[:-1]},"targets":{{{body}}}}}'.encode())


def replace_state_file(state_dir: str, data: bytes) -> str:
    """Write `data` as the state file, atomically (temporary file in the same dir, rename)."""
    ensure_state_dir(state_dir)
    path = os.path.join(state_dir, STATE_FILE)
    publish_file(path, data, 0o644)  # world-readable: a node daemon running as root serves all
    return path


@dataclass(frozen=True)
class StateFile:
    """A parsed, trusted state file."""

    path: str
    document: Mapping[str, Any]

    @property
    def generated_at(self) -> float:
        return float(self.document.get("generated_at", 0.0))

    @property
    def targets(self) -> Mapping[str, Mapping[str, Any]]:
        return self.document.get("targets", {})

    def target_for(self, path: str) -> tuple[str, Mapping[str, Any]] | None:
        """The watched target that is `path` or its closest ancestor, with its report.

        A save into ``ckpt/epoch-5/`` is judged by the daemon's view of ``ckpt/``: same
        filesystem, same quota.
        """
        path = os.path.abspath(path)
        best = None
        for target in self.targets:
            if is_under(path, target) and (best is None or len(target) > len(best)):
                best = target
        return (best, self.targets[best]) if best is not None else None


class StateReader:
    """Reads the state file with the trust checks, re-parsing only when the file changed.

    The cache is one (identity, parsed file) pair held in a single attribute: replacing it is
    atomic, so readers in several threads need no lock on the path every save takes.
    """

    def __init__(self, state_dir: str | None = None) -> None:
        self.state_dir = state_dir or default_state_dir()
        self.path = os.path.join(self.state_dir, STATE_FILE)
        self._cache: tuple[tuple[int, ...], StateFile] | None = None

    def read(self) -> StateFile | None:
        """The trusted state, or None when there is no state file (no daemon running).

        Raises `UntrustedStateFile` or `CorruptStateFile` with a message that says why.
        """
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return None
        identity = (info.st_mtime_ns, info.st_ino, info.st_size, info.st_uid, info.st_mode)
        cache = self._cache
        if cache is not None and cache[0] == identity:
            return cache[1]
        _check_trusted(os.lstat(self.state_dir), self.state_dir, "state directory", True)
        state = self._parse()
        self._cache = (identity, state)
        return state

    def _parse(self) -> StateFile:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as error:
            raise UntrustedStateFile(f"cannot open state file {self.path}: {error}") from error
        with os.fdopen(fd, "rb") as stream:
            _check_trusted(os.fstat(stream.fileno()), self.path, "state file", directory=False)
            raw = stream.read()
        try:
            document = json.loads(raw)
        except ValueError as error:
            raise CorruptStateFile(
                f"state file {self.path} is not valid JSON ({error}); it is rewritten by "
                "`fsprobe run` after every probe"
            ) from error
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            schema = document.get("schema") if isinstance(document, dict) else None
            raise CorruptStateFile(
                f"state file {self.path} has schema {schema!r}, this fsprobe reads {SCHEMA}"
            )
        if not isinstance(document.get("targets", {}), dict):
            raise CorruptStateFile(f"state file {self.path}: 'targets' is not an object")
        return StateFile(self.path, document)
