"""The state file: how the daemon tells the save hook in the trainer what it last saw.

Parsed once per file identity (one `lstat` per read); trusted only when it and its directory
belong to the reader or root and nobody else may write them.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsprobe import __version__
from fsprobe.codec import Form, FormatError
from fsprobe.model import Reason, SaveAnswer
from fsprobe.posix.atomic import lock_within
from fsprobe.posix.outputdir import OutputDirectory

SCHEMA = 1
STATE_FILE = "state.json"
#: A state file of a node daemon with 100 targets is about 500 KiB; one beyond this is not ours.
MAX_STATE_BYTES = 16 << 20
#: How many paths a `StateFile` remembers the watched target and answer of (`watching`): more
#: than a run saving into a new ``epoch-<n>/`` directory every few minutes meets in one file's
#: life.
TARGETS_REMEMBERED = 1024


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
    # /tmp itself, as documented, not $TMPDIR: the daemon and the save hook meet here, and a
    # per-job $TMPDIR that only one of them sees must not move it (gettempdir() would also
    # answer from os.environ, not from `environ`).
    return os.path.join("/tmp", f"fsprobe-{os.getuid()}")


def ensure_state_dir(state_dir: str) -> None:
    """Create the state dir (writable by its owner only), or check that an existing one is.

    In a shared /tmp another user could create ``/tmp/fsprobe-<uid>`` first; writing into it
    would hand them our state, so that is refused rather than worked around.
    """
    open_state_dir(state_dir).close()


def open_state_dir(state_dir: str) -> OutputDirectory:
    """The state dir, created if missing, opened once and checked (`UntrustedStateFile`)."""
    return OutputDirectory(state_dir, "state directory", create=True, refusal=UntrustedStateFile)


#: The lock file of a state dir's one writer; never removed (a new file would be a new lock).
LOCK_FILE = "writer.lock"
#: A reader that tests the lock holds it for microseconds; a writer that finds it taken tries
#: again for this long before it concludes that another writer holds it.
LOCK_PATIENCE_SECONDS = 0.5


class StateDirBusy(StateFileError):
    """Another live process writes the state dir; the message names it."""


def _open_in_state_dir(state_dir: str, name: str, what: str, flags: int, mode: int = 0o644) -> int:
    """Open `name` inside the (trusted) state dir, never through a symlink, never a fifo.

    Relative to a descriptor of the directory, so that a rename of the path in between cannot
    send us elsewhere; O_NONBLOCK so that a fifo planted there cannot block the open.
    """
    with OutputDirectory(state_dir, "state directory", refusal=UntrustedStateFile) as directory:
        return directory.open(name, flags, what, mode)


class WriterLock:
    """The lock that makes one process the only writer of a state dir, for its whole life.

    An `flock` on ``<state-dir>/writer.lock``, held by the daemon (or a `--once` run) until it
    exits. The kernel drops the lock when the process ends, however it ends, so a lock that
    nobody holds proves the writer gone, where a pid can only be guessed at (pids are reused,
    and another host's are not ours to check). The file holds the holder's pid, for the
    message a second writer gets.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None
        #: The state dir, opened once when the lock is taken: the writer writes its state
        #: file relative to it for as long as it holds the lock.
        self.directory: OutputDirectory | None = None

    def acquire(self) -> None:
        """Take the lock; `StateDirBusy` if another process holds it."""
        directory = open_state_dir(self.state_dir)
        try:
            # Readable by its owner only: anyone who can open it can hold a lock on it, and a
            # shared lock held by another user would keep the daemon from ever starting again.
            fd = directory.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, "lock file", mode=0o600)
        except BaseException:
            directory.close()
            raise
        if not lock_within(fd, LOCK_PATIENCE_SECONDS, 0.02):
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            directory.close()
            raise StateDirBusy(
                f"{self.state_dir} is the state dir of another running fsprobe "
                f"(pid {holder or 'unknown'}), which writes its {STATE_FILE}: stop that "
                "one first, or give this one a state dir of its own (--state-dir)"
            )
        os.fchmod(fd, 0o600)  # also one left behind by an earlier, laxer writer
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        self.directory = directory

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None
        if self.directory is not None:
            self.directory.close()
            self.directory = None


def writer_running(state_dir: str) -> bool | None:
    """Whether a process holds the writer lock of `state_dir`; None when there is no lock
    file this process can use (a writer that takes no lock, or another user's writer)."""
    try:
        fd = _open_in_state_dir(state_dir, LOCK_FILE, "lock file", os.O_RDONLY)
    except (OSError, StateFileError):  # none, or not one a writer of ours could hold
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops our shared lock, if we got it
    return False


def write_state(
    state_dir: str | OutputDirectory,
    generated_at: float,
    writer: Writer,
    targets: Mapping[str, str],
) -> str:
    """Replace the state file atomically: a reader sees the old file or the new, never half.

    `state_dir` is the writer's open state dir (`WriterLock.directory`), or a path to open for
    this one write. `targets` maps each target path to its `TargetState` as JSON text: the
    daemon rewrites the file after every probe result, yet only one target changed, so it
    keeps each target's text until that target changes (at 100 targets, encoding them all
    every time would cost milliseconds; joining their texts costs microseconds).
    """
    head = json.dumps(
        {"schema": SCHEMA, "generated_at": generated_at, **WRITER.encode(writer)},
        separators=(",", ":"),
    )
    body = ",".join(f"{json.dumps(path)}:{text}" for path, text in targets.items())
    data = f'{head[:-1]},"targets":{{{body}}}}}'.encode()
    if isinstance(state_dir, OutputDirectory):
        return state_dir.publish(STATE_FILE, data)  # world-readable: root's daemon serves all
    with open_state_dir(state_dir) as directory:
        return directory.publish(STATE_FILE, data)


REASON = Form(Reason, "code severity message transient errno")
#: A target's answer to a save (`SaveAnswer`), under `ANSWER_KEY` in its entry beside the report.
ANSWER = Form(
    SaveAnswer,
    "status can_take_save worth_waiting acceptable_destination headroom_bytes headroom_inodes"
    " bytes_limited_by inodes_limited_by exists errno fresh_until reasons",
    name="answer",
)
ANSWER_KEY = "answer"


@dataclass(frozen=True)
class Writer:
    """Who wrote the state file: host, pid and version, whether it was a one-off `--once`
    run, when it stopped if it stopped cleanly, and why it is not probing if it is not (its
    scheduler died or stalled: `failure`, absent from files of earlier versions)."""

    host: str | None
    pid: int | None
    version: str | None
    once: bool = False
    stopped_at: float | None = None
    failure: str | None = None


@dataclass(frozen=True)
class _Head:
    """The state file's top level: when, and who wrote it (keys absent in earlier versions)."""

    generated_at: float
    writer: Writer


WRITER = Form(Writer, "host? pid? version? once? stopped_at? failure?")
HEAD = Form(_Head, "generated_at", name="state file")


class StateFile:
    """A trusted state file. What a save asks, one target's `SaveAnswer`, is read when first
    asked for, and only that (`answer`): not the top level, not the report beside it, not the
    hundred other targets a node daemon watches. The top level is read when asked for too.

    Every accessor raises `CorruptStateFile` for content that does not read.
    """

    def __init__(self, path: str, document: Mapping[str, Any]) -> None:
        self.path = path
        targets = document.get("targets", {})
        if not isinstance(targets, dict):
            raise CorruptStateFile(f"state file {path}: 'targets' is not an object")
        self._document = document
        self._documents: Mapping[str, Any] = targets
        self._answers: dict[str, SaveAnswer | None] = {}
        self._watching: dict[str, tuple[str, SaveAnswer | None] | None] = {}  # by absolute path

    @functools.cached_property
    def _head(self) -> _Head:
        try:
            return HEAD.decode(self._document, writer=WRITER.decode(self._document))
        except FormatError as error:
            raise CorruptStateFile(f"state file {self.path} does not read: {error}") from None

    @property
    def generated_at(self) -> float:
        return self._head.generated_at

    @property
    def writer(self) -> Writer:
        return self._head.writer

    @property
    def names(self) -> list[str]:
        """The watched targets, sorted."""
        return sorted(self._documents)

    def entry(self, name: str) -> Any:
        """The document of the watched target `name`, as it was read (KeyError if it is not
        watched): `fsprobe.report.TargetState.read` reads the whole of it."""
        return self._documents[name]

    def corrupt(self, error: FormatError) -> CorruptStateFile:
        """The error for a target's entry that does not read, naming who wrote it."""
        version = self._document.get("version")
        written_by = version if isinstance(version, str) else "of an unknown version"
        return CorruptStateFile(
            f"state file {self.path} does not read: {error} (written by fsprobe "
            f"{written_by}; this is {__version__})"
        )

    def answer(self, name: str) -> SaveAnswer | None:
        """The answer of the watched target `name` to a save (KeyError if it is not watched);
        None when its entry carries none (a state file of a version before it)."""
        if name in self._answers:
            return self._answers[name]
        document = self._documents[name]
        if not isinstance(document, dict):
            raise self.corrupt(FormatError(f"targets[{name!r}]: expected an object"))
        found = document.get(ANSWER_KEY)
        try:
            answer = None if found is None else ANSWER.decode(found, f"targets[{name!r}].answer")
        except FormatError as error:
            raise self.corrupt(error) from None
        self._answers[name] = answer  # a race only reads it twice
        return answer

    def target_for(self, path: str) -> str | None:
        """The watched target that is `path` or its closest ancestor.

        A save into ``ckpt/epoch-5/`` is judged by the daemon's view of ``ckpt/``: same
        filesystem, same quota. Targets are absolute paths (the daemon's configuration makes
        them so): `path` and its ancestors are looked up, nearest first.
        """
        path = os.path.abspath(path)
        while path not in self._documents:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent
        return path

    def watching(self, path: str) -> tuple[str, SaveAnswer | None] | None:
        """The watched target that judges `path` (`target_for`) and its answer, or None; found
        once per absolute `path` (`TARGETS_REMEMBERED`): the same one is asked before every
        save."""
        try:
            return self._watching[path]
        except KeyError:
            pass
        target = self.target_for(path)
        found = None if target is None else (target, self.answer(target))
        if path == os.path.abspath(path):  # a relative path's depends on the working directory
            if len(self._watching) >= TARGETS_REMEMBERED:
                self._watching.clear()
            self._watching[path] = found
        return found


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
        state = self._parse()
        self._cache = (identity, state)
        return state

    def _parse(self) -> StateFile:
        try:
            fd = _open_in_state_dir(self.state_dir, STATE_FILE, "state file", os.O_RDONLY)
        except StateFileError:
            raise
        except OSError as error:
            raise UntrustedStateFile(f"cannot open state file {self.path}: {error}") from error
        with os.fdopen(fd, "rb") as stream:
            raw = stream.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            raise CorruptStateFile(
                f"state file {self.path} is larger than {MAX_STATE_BYTES >> 20} MiB: not ours"
            )
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as error:  # RecursionError: nested too deep
            raise CorruptStateFile(
                f"state file {self.path} is not valid JSON ({error}); it is rewritten by "
                "`fsprobe run` after every probe"
            ) from error
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            schema = document.get("schema") if isinstance(document, dict) else None
            raise CorruptStateFile(
                f"state file {self.path} has schema {schema!r}, this fsprobe reads {SCHEMA}"
            )
        return StateFile(self.path, document)
