"""The write probe: rehearse an atomic checkpoint save in the target directory, step by step.

Relative to the target's descriptor, as who probes; it removes only what it created.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

from fsprobe.errors import NOT_AS_ROOT, ProbeFailure, name_of
from fsprobe.model import WriteProbeResult
from fsprobe.posix.atomic import TempFile, temp_name
from fsprobe.probing.credentials import acting_as
from fsprobe.probing.plan import DEFAULT_WRITE_BYTES
from fsprobe.probing.target import OWNER, OpenedTarget, open_target, root_write_refusal


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _Rehearsal:
    """One run of the sequence: remembers what exists, so that cleanup removes exactly that."""

    def __init__(self, directory: OpenedTarget, data: bytes) -> None:
        self.directory = directory
        self.data = data
        self.latency: dict[str, float] = {}
        self.temp: TempFile | None = None  # our file, wherever it is now; locked while it lives

    def timed(self, step: str, action: Callable[[], object]) -> object:
        start = time.monotonic()
        try:
            return action()
        finally:
            self.latency[step] = time.monotonic() - start

    def run(self) -> None:
        first = temp_name("write-probe")
        renamed = temp_name("write-probe-renamed")

        self.timed("create", lambda: self.create(first))
        temp = self.temp
        assert temp is not None
        self.timed("write", lambda: _write_all(temp.fd, self.data))
        self.timed("fsync", lambda: os.fsync(temp.fd))
        self.timed("rename", lambda: temp.rename(renamed))
        self.timed("fsync_dir", self.fsync_directory)
        self.timed("unlink", temp.remove)
        self.temp = None
        try:
            _empty_if_kept(temp)
        finally:
            temp.release()

    def fsync_directory(self) -> None:
        fd = self.directory.open_directory()
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def create(self, name: str) -> None:
        self.temp = TempFile(self.directory.fd, name)

    def clean_up(self) -> str:
        """Remove what this run created; returns a note if that failed too."""
        if self.temp is None:
            return ""
        try:
            self.temp.remove()
            _empty_if_kept(self.temp)
        except OSError as error:
            return f"; removing the probe file {self.temp.name} failed too: {error}"
        finally:
            self.temp.release()
        return ""


def _empty_if_kept(temp: TempFile) -> None:
    """Empty the probe file if it still has a name after its removal: someone who may rename
    in the directory moved it away (the probe then removes only what still is its own name).
    Probing as root, that file is root's and beyond every quota; emptied, it costs an inode,
    not `size` bytes a probe. A file system that cannot look at a removed file any more
    (ESTALE, ENOENT: a FUSE server that works on names) has no name left for it either."""
    try:
        links = os.fstat(temp.fd).st_nlink
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ESTALE):
            return
        raise
    if links > 0:
        os.ftruncate(temp.fd, 0)


def probe_write(
    target: str, size: int = DEFAULT_WRITE_BYTES, probe_as: str = OWNER
) -> WriteProbeResult:
    """Rehearse an atomic save of `size` bytes in `target` (or its nearest existing ancestor),
    as `probe_as` (`fsprobe.probing.target.probing_identity`).

    When the target does not exist yet, its nearest existing ancestor is where the first save
    will have to create it, so that is where writing is tested. Raises ProbeFailure
    ``UNTRUSTED`` for a symlink on the way that is not to be followed, and ``NOT_AS_ROOT``,
    creating nothing, where root would probe as root in a directory others may rename in.
    """
    start = time.monotonic()
    try:
        directory = open_target(target, probe_as)
    except OSError as error:  # a symlink loop, a directory we may not search: no file to create
        raise _failure(error, "create", size, {"total": time.monotonic() - start}) from error
    with directory:
        refusal = root_write_refusal(directory, probe_as)
        if refusal:
            raise ProbeFailure(NOT_AS_ROOT, refusal)
        # Incompressible data, made before the clock starts: no filesystem can shortcut it.
        rehearsal = _Rehearsal(directory, os.urandom(size))
        start = time.monotonic()
        note = ""
        try:
            with acting_as(directory.identity):
                try:
                    rehearsal.run()
                finally:
                    note = rehearsal.clean_up()  # as the identity too: its file, its directory
        except OSError as error:
            step = list(rehearsal.latency)[-1] if rehearsal.latency else "create"
            rehearsal.latency["total"] = time.monotonic() - start
            raise _failure(error, step, size, rehearsal.latency, note) from error
    rehearsal.latency["total"] = time.monotonic() - start
    return WriteProbeResult(ok=True, bytes=size, latency_seconds=rehearsal.latency)


def _failure(
    error: OSError, step: str, size: int, latency: dict[str, float], note: str = ""
) -> ProbeFailure:
    errno = name_of(error)
    message = f"test write failed at {step}: {error.strerror or error} ({errno}){note}"
    result = WriteProbeResult(
        ok=False, bytes=size, latency_seconds=latency, step=step, errno=errno, message=message
    )
    return ProbeFailure(errno, message, value=result)
