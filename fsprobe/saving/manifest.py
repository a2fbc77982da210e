"""The manifest of a fallback directory: one JSON line per redirected checkpoint.

Every redirected save appends one line to ``<fallback>/.fsprobe-redirects.jsonl``:
``requested``, ``actual``, ``bytes``, ``sha256``, ``time``, ``host``, ``pid``. A line is written
with a single ``write`` on an ``O_APPEND`` descriptor and fsynced, so concurrent savers never
interleave and a crash leaves either the whole line or none.

The manifest decides what `fsprobe sync` copies where, so it is trusted like the state file: a
regular file, not writable by group or others, owned by the user running `sync` (root may read
anyone's, for counting).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

from fsprobe.atomic import fsync_directory, hostname, open_exclusive, temp_name
from fsprobe.paths import is_under
from fsprobe.saving.fallback import remove_mirrored_dirs

log = logging.getLogger("fsprobe.redirect")

MANIFEST = ".fsprobe-redirects.jsonl"
READ_CHUNK = 4 * 1024 * 1024
#: Manifest lines are appended as one write each; a line is a few hundred bytes.
_MANIFEST_MODE = 0o644


def sha256_of(path: str) -> str:
    # Imported here: hashlib loads OpenSSL (several MiB), and this module is imported by every
    # preflight, also in the probe worker, while only a redirect or a sync ever hashes.
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Entry:
    """One redirected save, as one line of a manifest says it."""

    fallback: str
    requested: str
    actual: str
    bytes: int
    sha256: str
    time: float
    host: str = ""
    pid: int = 0

    def to_line(self) -> bytes:
        fields = asdict(self)
        del fields["fallback"]  # implied by where the manifest is
        return json.dumps(fields, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, fallback: str, line: bytes) -> Entry:
        """Parse one line; ValueError (or a subclass) when it is not an entry."""
        fields = json.loads(line)
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        return cls(
            fallback=fallback,
            requested=str(fields["requested"]),
            actual=str(fields["actual"]),
            bytes=int(fields["bytes"]),
            sha256=str(fields["sha256"]),
            time=float(fields["time"]),
            host=str(fields.get("host", "")),
            pid=int(fields.get("pid", 0)),
        )


def new_entry(fallback: str, requested: str, actual: str, nbytes: int, sha256: str) -> Entry:
    return Entry(
        fallback=os.path.abspath(fallback),
        requested=os.path.abspath(requested),
        actual=actual,
        bytes=nbytes,
        sha256=sha256,
        time=time.time(),
        host=hostname(),
        pid=os.getpid(),
    )


def manifest_path(fallback: str) -> str:
    return os.path.join(os.path.abspath(fallback), MANIFEST)


@contextlib.contextmanager
def _locked_manifest(fallback: str, create: bool) -> Iterator[int | None]:
    """The manifest opened for appending and exclusively locked; None if absent and not created.

    The rewrite in `sync` replaces the file, so a lock taken on the old inode would protect
    nothing: after locking, the descriptor must still be the file at the path, else retry.
    Filesystems without `flock` (Lustre mounted without it) go on unlocked, with a warning once.
    """
    path = manifest_path(fallback)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = os.open(path, flags, _MANIFEST_MODE)
        except FileNotFoundError:
            yield None
            return
        try:
            _lock(fd, path)
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(path))
            except FileNotFoundError:
                same = False
            if same:
                yield fd
                return
        finally:
            os.close(fd)  # releases the lock


_LOCK_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


_warned_unlocked: set[str] = set()


def _lock(fd: int, path: str) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as error:
        if error.errno not in _LOCK_UNSUPPORTED:
            raise
        if path not in _warned_unlocked:
            _warned_unlocked.add(path)
            log.warning("cannot lock %s (%s): concurrent updates are not serialised", path, error)


def record(entry: Entry) -> None:
    """Append `entry` to its fallback's manifest: one write of one line, then fsync."""
    line = entry.to_line()
    with _locked_manifest(entry.fallback, create=True) as fd:
        if fd is None:  # only possible without create; keeps the type checker honest
            raise FileNotFoundError(
                errno.ENOENT, "manifest vanished", manifest_path(entry.fallback)
            )
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(errno.EIO, f"short append to {manifest_path(entry.fallback)}")
        os.fsync(fd)


class UntrustedManifest(Exception):
    """The manifest could have been written by someone else; acting on it is refused."""


def _check_manifest(info: os.stat_result, path: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedManifest(f"{path} is not a regular file")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedManifest(f"{path} is writable by group or others")
    if info.st_uid != os.geteuid() and os.geteuid() != 0:
        raise UntrustedManifest(f"{path} belongs to uid {info.st_uid}, not to you")


def read_manifest(fallback: str) -> list[Entry]:
    """Every entry of a fallback's manifest, in the order written; [] when there is none.

    Raises `UntrustedManifest`. A line that cannot be parsed (a torn write on a filesystem
    that broke O_APPEND) is skipped with a warning, never guessed at.
    """
    path = manifest_path(fallback)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UntrustedManifest(f"{path} is a symbolic link") from error
        raise
    with os.fdopen(fd, "rb") as stream:
        _check_manifest(os.fstat(stream.fileno()), path)
        lines = stream.read().splitlines()
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entries.append(Entry.from_line(os.path.abspath(fallback), line))
        except (ValueError, KeyError, TypeError) as error:
            log.warning("%s line %d is not a redirect entry (%s); ignored", path, number, error)
    return entries


def rewrite(fallback: str, remove: set[Entry]) -> None:
    """Drop `remove` from the manifest, atomically; unlink the manifest once it is empty.

    Re-read under the lock, so that lines appended by a saver since `sync` read the manifest
    are kept.
    """
    path = manifest_path(fallback)
    with _locked_manifest(fallback, create=False) as fd:
        if fd is None:
            return
        kept = [entry for entry in read_manifest(fallback) if entry not in remove]
        if not kept:
            os.unlink(path)
            return
        temporary = os.path.join(os.path.dirname(path), temp_name(MANIFEST))
        out = open_exclusive(temporary, _MANIFEST_MODE)
        try:
            with os.fdopen(out, "wb") as stream:
                stream.write(b"".join(entry.to_line() for entry in kept))
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        fsync_directory(os.path.dirname(path))


def latest_per_file(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """(live, replaced): a later save to the same fallback file replaced the earlier ones."""
    latest: dict[str, Entry] = {}
    for entry in entries:  # manifest order is write order
        latest[entry.actual] = entry
    live = list(latest.values())
    return live, [entry for entry in entries if latest[entry.actual] is not entry]


def pending(fallback_dirs: Iterable[str]) -> list[Entry]:
    """The redirected checkpoints not yet copied back, newest first.

    Untrusted manifests are skipped with a warning. An entry replaced by a later save to the
    same fallback file is not pending (its bytes are gone).
    """
    entries: list[Entry] = []
    for fallback in fallback_dirs:
        try:
            entries += latest_per_file(read_manifest(fallback))[0]
        except (UntrustedManifest, OSError) as error:
            log.warning("skipping the redirect manifest in %s: %s", fallback, error)
    return sorted(entries, key=lambda entry: entry.time, reverse=True)


def pending_bytes(fallback_dirs: Iterable[str], under: str) -> int:
    """Bytes of redirected checkpoints waiting to go back to `under` (a target directory)."""
    return sum(entry.bytes for entry in pending(fallback_dirs) if is_under(entry.requested, under))


def newest_copy(requested: str, fallback_dirs: Iterable[str]) -> str:
    """The path holding the newest checkpoint saved as `requested`: itself or a redirected copy.

    What a trainer resuming from `requested` should load: a save that was redirected after the
    original was last written is newer than the original (which may not even exist).
    """
    requested = os.path.abspath(requested)
    try:
        original_mtime: float | None = os.stat(requested).st_mtime
    except FileNotFoundError:
        original_mtime = None
    for entry in pending(fallback_dirs):  # newest first
        if entry.requested != requested or not os.path.exists(entry.actual):
            continue
        if original_mtime is None or original_mtime < entry.time:
            return entry.actual
        break
    return requested


def forget(requested: str, fallback_dirs: Iterable[str]) -> list[str]:
    """Remove the redirected copies of `requested` and their manifest entries (it was deleted).

    A trainer that deletes an old checkpoint (Lightning's top-k) deletes its redirected copy
    too, or `sync` would bring it back later. Returns the fallback files removed.
    """
    requested = os.path.abspath(requested)
    removed = []
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        try:
            entries = [e for e in read_manifest(fallback) if e.requested == requested]
        except (UntrustedManifest, OSError) as error:
            log.warning("skipping the redirect manifest in %s: %s", fallback, error)
            continue
        for entry in entries:
            try:
                info = os.lstat(entry.actual)
            except FileNotFoundError:
                continue
            if (
                is_under(entry.actual, fallback)
                and stat.S_ISREG(info.st_mode)
                and info.st_uid == os.geteuid()
            ):
                os.unlink(entry.actual)
                remove_mirrored_dirs(fallback, entry.actual)
                removed.append(entry.actual)
        if entries:
            rewrite(fallback, set(entries))
    return removed
