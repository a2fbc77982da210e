"""A child process that makes the filesystem calls, so that a hung mount cannot hold ours.

Why a process (docs/design.md §4, "Running a probe"), and why it is started isolated
(docs/security.md, "The probe worker runs no code from the working directory").
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import io
import itertools
import logging
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, cast

from fsprobe.model import ProbeResult
from fsprobe.probing.runner import ProbeRunner, Work

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
#: Larger than any answer of a real probe or task (a sync of thousands of checkpoints is a few
#: MiB); a message that says it is longer is not one of ours.
MAX_MESSAGE = 64 * 1024 * 1024

#: A worker that has answered everything and been asked nothing for this long is let go
#: (with the parent's reader thread); the next probe starts a new one. A training job that
#: probes once at its first save keeps no process or thread for the rest of its run.
IDLE_SECONDS = 60.0

#: Where the parent imported fsprobe from; the isolated worker imports the same code, from there.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: What the isolated interpreter runs: `sys.path` has only the standard library and
#: site-packages, then the package root is appended (last, so that it shadows nothing).
_BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from fsprobe.probing.worker_process import main; main(sys.argv[2:])"
)


def worker_command(channel_fd: int) -> list[str]:
    """The argv of an isolated worker that talks over the inherited socket `channel_fd`."""
    return [sys.executable, "-I", "-c", _BOOTSTRAP, _PACKAGE_ROOT, str(channel_fd)]


class NotAResult(pickle.UnpicklingError):
    """The worker sent something that no probe of ours returns."""


class ResultUnpickler(pickle.Unpickler):
    """Rebuilds a worker's answer from fsprobe's own values (data classes, enums) and plain
    data; a message that names anything else, a function above all, is refused unread.

    A worker runs as the user of the process it serves, and is usually no less trusted. Except
    in one case: a run of ``fsprobe sync`` that root starts as a user gives up root itself, so
    that the user cannot trace it (`fsprobe.redirect.delegate`), while its worker, started with
    ``exec``, is the user's own process. A pickle naming ``os.system`` would run it in the run.
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member  # how some Python releases (3.11.2) pickle an enum member
        # Only what is already imported: naming a module must not import (and so run) it.
        loaded = sys.modules.get(module) if module.startswith("fsprobe.") else None
        found = getattr(loaded, name, None)
        if isinstance(found, type) and (
            dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
        ):
            return found
        raise NotAResult(f"the probe worker sent {module}.{name}, which no probe returns")


def _enum_member(cls: object, name: object) -> enum.Enum:
    """``getattr(cls, name)`` as an unpickled enum member asks it, and nothing else: `cls` is
    already one of ours (`ResultUnpickler.find_class`), `name` must be one of its members."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__:
        return cls.__members__[name]  # type: ignore[index]
    raise NotAResult(f"the probe worker asked for {name!r} of {cls!r}, which is no enum member")


class Channel:
    """Pickled messages over a socket pair, each preceded by its length.

    `multiprocessing.connection` would do the same, but it imports `hmac`, which loads
    OpenSSL: several MiB in every worker beside every training job, for a pipe between two of
    our own processes. The worker unpickles what its parent sends (functions to run); the
    parent only what `unpickler` lets through.
    """

    def __init__(
        self, sock: socket.socket, unpickler: type[pickle.Unpickler] = pickle.Unpickler
    ) -> None:
        self.sock = sock
        # Unbuffered: nothing of a message waits in our memory while `readable` polls the socket.
        self._reader = sock.makefile("rb", buffering=0)
        self._unpickler = unpickler

    def readable(self, timeout: float) -> bool:
        """Whether a message (or the end) arrives within `timeout` seconds."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))

    def _read(self, size: int) -> bytes:
        """`size` bytes, fewer only at the end of the stream."""
        chunks, missing = [], size
        while missing:
            chunk = self._reader.read(missing)
            if not chunk:
                break
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def send(self, message: object) -> None:
        payload = pickle.dumps(message)
        self.sock.sendall(_LENGTH.pack(len(payload)) + payload)

    def recv(self) -> object:
        header = self._read(_LENGTH.size)
        if len(header) < _LENGTH.size:
            raise EOFError("the other end closed the channel")
        (length,) = _LENGTH.unpack(header)
        if length > MAX_MESSAGE:
            raise NotAResult(f"a message of {length} bytes is longer than any of ours")
        payload = self._read(length)
        if len(payload) < length:
            raise EOFError("the channel closed in the middle of a message")
        return self._unpickler(io.BytesIO(payload)).load()

    def close(self) -> None:
        self._reader.close()
        self.sock.close()


class _Reader(threading.Thread):
    """The thread that reads one worker's answers. `stop()` lets the worker go and returns once
    this thread has ended: what hosts that stop leftover daemon threads call (Lightning's test
    suite does, between tests)."""

    def __init__(self, executor: ProcessExecutor, connection: Channel, process: subprocess.Popen):
        super().__init__(
            target=executor._read_results,
            args=(connection, process),
            name="fsprobe-worker-reader",
            daemon=True,
        )
        self._executor = executor

    def stop(self, timeout: float = 5.0) -> None:
        self._executor.close()
        self.join(timeout)


class ProcessExecutor:
    """Runs probe functions in the worker process; they must be picklable (module functions).

    The worker starts on the first probe and ends after `idle_seconds` with nothing asked or
    owed (`IDLE_SECONDS`); a probe after that starts a new one.
    """

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, tuple[str, Future]] = {}
        self._connection: Channel | None = None
        self._process: subprocess.Popen | None = None

    def submit(self, probe: str, work: Work) -> Future:
        future: Future = Future()
        with self._lock:
            job = next(self._ids)
            self._pending[job] = (probe, future)
            try:
                self._ensure_worker().send((job, probe, work))
            except (OSError, ValueError, TypeError, AttributeError, pickle.PicklingError) as error:
                del self._pending[job]
                future.set_result(_lost(probe, f"cannot hand the probe to the worker: {error}"))
        return future

    def _ensure_worker(self) -> Channel:
        if self._connection is not None:
            return self._connection
        parent_end, theirs = socket.socketpair()
        ours = Channel(parent_end, ResultUnpickler)
        try:
            self._process = subprocess.Popen(
                worker_command(theirs.fileno()),
                pass_fds=[theirs.fileno()],
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a ^C meant for us must not kill a probe mid-write
            )
        finally:
            theirs.close()
        self._connection = ours
        _Reader(self, ours, self._process).start()
        return ours

    def _read_results(self, connection: Channel, process: subprocess.Popen) -> None:
        refused = None
        while True:
            if not connection.readable(self.idle_seconds) and self._retire_if_idle(connection):
                connection.close()  # the worker reads the end and exits
                _reap(process)
                return
            try:
                job, result = cast(tuple[int, Any], connection.recv())
            except (EOFError, OSError):
                break
            except Exception as error:  # a message that does not unpickle: not our worker's
                refused = f"the probe worker sent what no probe returns ({error}); killed it"
                process.kill()
                break
            with self._lock:
                entry = self._pending.pop(job, None)
            if entry is not None:
                entry[1].set_result(result)
        self._worker_lost(connection, process, refused)

    def _retire_if_idle(self, connection: Channel) -> bool:
        """Whether `connection`'s worker, owed nothing, is let go (the next probe starts anew)."""
        with self._lock:
            if self._pending or self._connection is not connection:
                return False
            self._connection, self._process = None, None
            return True

    def _worker_lost(
        self, connection: Channel, process: subprocess.Popen, refused: str | None = None
    ) -> None:
        """Fail what the dead worker still owed; the next submission starts a new one."""
        status = process.poll()
        with self._lock:
            unexpected = self._connection is connection
            if unexpected:
                self._connection, self._process = None, None
            owed, self._pending = self._pending, {}
        connection.close()
        why = refused or f"the probe worker exited unexpectedly ({status})"
        if unexpected:
            log.warning("probe worker %d: %s; %d probes lost", process.pid, why, len(owed))
        for probe, future in owed.values():
            future.set_result(_lost(probe, why))

    def close(self) -> None:
        """Let the worker go: it exits as soon as no probe of it is blocked any more."""
        with self._lock:
            connection, self._connection, self._process = self._connection, None, None
        if connection is not None:
            connection.sock.shutdown(socket.SHUT_RDWR)  # wakes our reader, and the worker

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None


_shared: ProbeRunner | None = None
_shared_lock = threading.Lock()


def shared_runner() -> ProbeRunner:
    """The probe runner of this process, with its one worker process (started on first use).

    Shared by `fsprobe.check`, the save hook and the daemon, so that a target already hung is
    not probed again by anyone in this process: one blocked call per target, whoever asks.
    """
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ProbeRunner(ProcessExecutor())
        return _shared


def _reap(process: subprocess.Popen) -> None:
    """Collect a worker that was let go (it exits as soon as it reads the end of the channel)."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: exits later
        process.wait(timeout=5.0)


def share_runner(runner: ProbeRunner) -> None:
    """Make `runner` this process's shared runner (`fsprobe.probing.threads.probe_in_threads`)."""
    global _shared
    with _shared_lock:
        _shared = runner


def _lost(probe: str, message: str) -> ProbeResult:
    return ProbeResult(probe, time.time(), 0.0, error="EUNKNOWN", message=message)
