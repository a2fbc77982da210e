"""`fsprobe.atomic_write()` and `fsprobe.save()`: one file, written beside the checkpoint through
a Python file object that keeps the first `OSError` (and an interrupt) that torch would hide;
one attempt is docs/design.md §7.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, BinaryIO

from fsprobe.extras import import_extra
from fsprobe.posix.atomic import CLAIMS, TempFile, fsync_directory, temp_name
from fsprobe.redirect.manifest import sha256_of
from fsprobe.saving.context import SaveContext
from fsprobe.saving.deadline import Progress, bounded
from fsprobe.saving.options import SaveOptions, save_options, split_keywords
from fsprobe.saving.retry import (
    INTERRUPTS,
    FailedAttempt,
    SaveResult,
    SaveSteps,
    failure_of,
    run_attempts,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.options import SaveKeywords, SaveOverrides

log = logging.getLogger("fsprobe.save")

#: A new file gets what `open()` would give it: 0o666 less the umask (checkpoints are often
#: shared with the group; the temp file's mode is the checkpoint's mode after the rename).
FILE_MODE = 0o666


class AtomicFile:
    """The binary file that `write` gets: the temp file, remembering the first OSError raised
    and any interrupt (KeyboardInterrupt, SystemExit) that passed through it.

    `name` is the temp file's path (not the final one), as for any file object. The stream is
    a duplicate of the temp file's own descriptor, so a writer may close it: the file stays
    open (and locked) until the attempt is over, and is never reopened by its name.
    """

    def __init__(self, temp: TempFile, progress: Progress) -> None:
        self.name = temp.name
        self._temp_fd = temp.fd
        self._file: BinaryIO = open(os.dup(temp.fd), "wb", closefd=True)  # noqa: SIM115
        self._progress = progress
        self.first_error: OSError | None = None
        self.first_error_step: str | None = None
        self.interrupt: BaseException | None = None

    def _record(self, error: OSError, step: str) -> None:
        if self.first_error is None:
            self.first_error, self.first_error_step = error, step

    def _call(self, step: str, action: Callable[[], Any]) -> Any:
        """`action()`; an OSError or an interrupt that passes through is recorded (the writer
        may surface another)."""
        try:
            return action()
        except OSError as error:
            self._record(error, step)
            raise
        except INTERRUPTS as interrupt:
            self.interrupt = self.interrupt or interrupt
            raise

    def write(self, data: Any) -> int:
        if self._progress.abandoned.is_set() or self._progress.stop.is_set():  # no further
            self._progress.go_on()
        return int(self._call("write", lambda: self._file.write(data)))

    def writelines(self, lines: Iterable[Any]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._call("flush", self._file.flush)

    def fileno(self) -> int:
        return self._file.fileno()

    def tell(self) -> int:
        return self._file.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        return int(self._call("write", lambda: self._file.truncate(size)))

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        """Close; on NFS a deferred write error may surface only here."""
        if not self._file.closed:
            self._call("close", self._file.close)

    def sync(self) -> None:
        """flush and fsync: the data is on stable storage before the rename makes it visible."""
        if not self._file.closed:
            self.flush()
        self._call("fsync", lambda: os.fsync(self._temp_fd))

    def size(self) -> int:
        if not self._file.closed:
            self.flush()
        return os.fstat(self._temp_fd).st_size

    def discard(self) -> None:
        """Close after a failure: errors now are echoes of the first, recorded but not raised."""
        with contextlib.suppress(OSError):
            self.close()


def _io_failure(error: BaseException, stream: AtomicFile) -> FailedAttempt | None:
    """What `write` raising `error` means for the save; None if it is not an I/O failure. An
    interrupt that passed through the file object is raised, whatever the writer made of it."""
    if stream.interrupt is not None:
        raise stream.interrupt from None
    if stream.first_error is not None:
        return FailedAttempt.of(stream.first_error, stream.first_error_step or "write")
    return failure_of(error, "write")


def _write_once(
    final: str, write: Callable[[AtomicFile], object], fsync: bool, progress: Progress
) -> int:
    """One attempt: temp file, write, fsync, rename, fsync dir. Returns the bytes written.

    Raises `FailedAttempt` for an I/O failure; anything else `write` raises (a pickling error, a
    bug) is re-raised as it is. The temp file is locked while it lives (another process's
    cleanup leaves it alone) and removed on every way out but success.
    """
    directory = os.path.dirname(final)
    try:
        temp = TempFile(
            None, os.path.join(directory, temp_name(os.path.basename(final))), FILE_MODE
        )
    except OSError as error:
        raise FailedAttempt.of(error, "create") from error
    stream: AtomicFile | None = None
    try:
        progress.made(temp.remove)
        stream = AtomicFile(temp, progress)
        try:
            progress.step = "write"
            write(stream)
        except Exception as error:
            failure = _io_failure(error, stream)
            if failure is None:
                raise
            try:
                raise failure from error
            finally:  # no reference cycle through this frame (`fsprobe.saving.stale`)
                del failure
        if fsync:
            progress.step = "fsync"
            stream.sync()
        progress.step = "close"
        size = stream.size()
        stream.close()
        progress.publishing()
        progress.step = "rename"
        temp.rename(final)
        if fsync:
            progress.step = "fsync_dir"
            fsync_directory(directory)
        return size
    except OSError as error:
        if stream is not None and stream.first_error is not None:
            raise FailedAttempt.of(
                stream.first_error, stream.first_error_step or progress.step
            ) from error
        raise FailedAttempt.of(error, progress.step) from error
    finally:
        if not temp.renamed:
            if stream is not None:
                stream.discard()
            _remove_temp(temp)
        temp.release()


def _remove_temp(temp: TempFile) -> None:
    """Remove, then close, a temp file that will not be published; each failure is said as
    what it is (after an EIO the handle's close fails too, once the file is already gone)."""
    try:
        temp.remove()
    except OSError as error:  # the next attempt there removes it (`fsprobe.saving.stale`)
        log.warning("could not remove the temp file %s: %s", temp.name, error)
        CLAIMS.abandon(temp.identity, os.path.dirname(temp.name))
        removed = False
    else:
        removed = True
    try:
        temp.release()
    except OSError as error:
        if removed:
            log.warning("removed the temp file %s; closing it failed: %s", temp.name, error)
        else:
            log.warning("closing the temp file %s failed too: %s", temp.name, error)


def atomic_write(
    path: str | os.PathLike[str],
    write: Callable[[AtomicFile], object],
    *,
    options: SaveOptions | None = None,
    context: SaveContext | None = None,
    **overrides: Unpack[SaveOverrides],
) -> SaveResult:
    """Write `path` atomically through `write(fileobj)`, retrying and redirecting on failure.

    `path` is the file to write (the checkpoint itself, not its directory); the preflight
    judges the directory that holds it, where the temp file goes. `write` gets a binary file
    object (the temp file) and writes the whole content; it is called again from scratch on
    every attempt. `options` (a `SaveOptions`), with any of its fields given as keywords
    over it, say how: attempts, backoff, fallbacks, preflight, fsync, `save_timeout` (past it
    an attempt is abandoned: `fsprobe.saving.deadline`). `context` is what the process keeps
    between saves (`default_context()` unless given). Raises `SaveError` when every attempt
    failed, or at once for a permanent error with nowhere to redirect; the file at `path` is
    then as it was before.
    """
    return write_file(path, write, save_options(options, overrides), context)


def write_file(
    path: str | os.PathLike[str],
    write: Callable[[AtomicFile], object],
    options: SaveOptions,
    context: SaveContext | None = None,
    stop: threading.Event | None = None,
) -> SaveResult:
    """`atomic_write` with resolved `options` (`fsprobe.saving.options.save_options`); once
    another thread sets `stop`, the save ends with KeyboardInterrupt at its next write."""
    return run_attempts(
        path,
        options,
        SaveSteps(
            write=functools.partial(
                bounded,
                options.save_timeout,
                lambda destination, progress: _write_once(
                    destination, write, options.fsync, progress
                ),
                stop=stop,
            ),
            digest=sha256_of,
        ),
        context,
    )


def save(
    obj: object,
    path: str | os.PathLike[str] | BinaryIO,
    *,
    options: SaveOptions | None = None,
    context: SaveContext | None = None,
    **kwargs: Unpack[SaveKeywords],
) -> SaveResult:
    """`torch.save(obj, path, **torch_save_kwargs)`, made atomic, retried and redirectable.

    `path` is the checkpoint file (``ckpt/model.pt``), as for `torch.save`. A drop-in for
    `torch.save`: keywords that are fields of `SaveOptions` are save options (see
    `atomic_write`), the others go to `torch.save`. Given a writable file object instead of a
    path (an ``io.BytesIO``, an open file), it is `torch.save` and nothing more: there is no
    file of fsprobe's to make atomic, retry or redirect, so the options are checked and
    ignored; `SaveResult.bytes` is what the stream's position moved by. Without PyTorch it
    raises `fsprobe.extras.MissingExtra` naming ``fsprobe[torch]``.
    """
    # Imported on use: `import fsprobe` must not import torch; once it is, it is looked up.
    torch = sys.modules.get("torch") or import_extra("torch", "torch", "fsprobe.save")
    overrides, torch_save_kwargs = split_keywords(kwargs)
    chosen = save_options(options, overrides)
    if not isinstance(path, (str, os.PathLike)):  # what torch.save itself takes for a path
        return _save_to_stream(torch, obj, path, torch_save_kwargs)
    return write_file(
        path, lambda stream: torch.save(obj, stream, **torch_save_kwargs), chosen, context
    )


def _save_to_stream(
    torch: Any, obj: object, stream: BinaryIO, kwargs: dict[str, Any]
) -> SaveResult:
    """`torch.save` into a caller's file object, as it is; what it did, as a `SaveResult`."""
    start = time.monotonic()
    before = _position(stream)
    torch.save(obj, stream, **kwargs)
    after = _position(stream)
    name = str(getattr(stream, "name", "<stream>"))
    return SaveResult(
        path=name,
        requested_path=name,
        redirected=False,
        attempts=1,
        bytes=after - before if before is not None and after is not None else 0,
        seconds=time.monotonic() - start,
    )


def _position(stream: BinaryIO) -> int | None:
    try:
        return stream.tell()
    except (OSError, AttributeError, ValueError):  # a pipe, a socket: no position to tell
        return None
