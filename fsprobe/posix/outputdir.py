"""A directory fsprobe publishes into (the state dir, the textfile dir), opened once.

Files are created and renamed relative to its descriptor (docs/security.md, "The directories
root writes into").
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from fsprobe.posix.atomic import TempFile, temp_name

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedOutput(Exception):
    """An output directory (or a file in it) that someone else could have written."""


def check_trusted(
    info: os.stat_result,
    path: str,
    what: str,
    directory: bool,
    refusal: type[Exception] = UntrustedOutput,
) -> None:
    """Refuse (raise `refusal`) unless `info` is a directory (or a regular file) of ours or
    root's that nobody else may write."""
    expected = stat.S_ISDIR if directory else stat.S_ISREG
    if not expected(info.st_mode):
        raise refusal(f"{what} {path} is not a {'directory' if directory else 'file'}")
    if info.st_uid not in (os.getuid(), 0):
        raise refusal(
            f"{what} {path} belongs to uid {info.st_uid}, not to you ({os.getuid()}) or root"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise refusal(
            f"{what} {path} is writable by group or others (mode {stat.filemode(info.st_mode)})"
        )


class OutputDirectory:
    """`path`, opened once and checked; closed by `close` (or as a context manager)."""

    def __init__(
        self,
        path: str,
        what: str,
        create: bool = False,
        refusal: type[Exception] = UntrustedOutput,
    ) -> None:
        """`what` names the directory in errors ("state directory"); with `create`, a missing
        directory is made (mode 0755). OSError, or `refusal` with the reason."""
        self.path = path
        self._refusal = refusal
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o755)
        try:
            self.fd = os.open(path, _DIRECTORY_FLAGS)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                raise error from None
            kind = "a symbolic link; not following it" if stat.S_ISLNK(mode) else "not a directory"
            raise refusal(f"{what} {path} is {kind}") from None
        try:
            check_trusted(os.fstat(self.fd), path, what, True, refusal)
        except BaseException:
            self.close()
            raise

    def open(self, name: str, flags: int, what: str, mode: int = 0o644) -> int:
        """Open the regular file `name` in the directory: never through a symlink, never
        blocking on a FIFO, and refused unless it is ours or root's and private to its owner."""
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        fd = os.open(name, flags, mode, dir_fd=self.fd)
        try:
            where = os.path.join(self.path, name)
            check_trusted(os.fstat(fd), where, what, False, self._refusal)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def publish(self, name: str, data: bytes, mode: int = 0o644) -> str:
        """Replace `name` with `data` so that a reader sees the old content or the new, never
        half (a temp file of ours, then a rename, both relative to the directory); returns
        the file's path. No fsync: these files are rewritten every few seconds, and after a
        crash the next round writes them again."""
        with TempFile(self.fd, temp_name(name), mode) as temporary:
            os.fchmod(temporary.fd, mode)  # exactly `mode`, whatever the umask
            with open(temporary.fd, "wb", closefd=False) as stream:
                stream.write(data)
            temporary.rename(name)
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> OutputDirectory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
