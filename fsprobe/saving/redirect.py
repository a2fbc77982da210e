"""Redirected checkpoints: where they land, the manifest that remembers them, and the way back.

When the target directory cannot take a checkpoint, `fsprobe.save` writes it into a fallback
directory instead, at the requested absolute path mirrored under the fallback::

    requested  /lustre/proj/run7/ckpt/last.pt
    fallback   /scratch/me/fallback
    actual     /scratch/me/fallback/lustre/proj/run7/ckpt/last.pt

Mirroring the whole path (not only the file name) keeps two runs that both save ``last.pt`` from
overwriting each other in the fallback, and tells a person at a glance where a file belongs.

Every redirected save appends one JSON line to ``<fallback>/.fsprobe-redirects.jsonl``:
``requested``, ``actual``, ``bytes``, ``sha256``, ``time``, ``host``, ``pid``. A line is written
with a single ``write`` on an ``O_APPEND`` descriptor and fsynced, so concurrent savers never
interleave and a crash leaves either the whole line or none. `sync` copies a pending checkpoint
back once its target is healthy (checksum verified on the copy before it is renamed into place),
removes the fallback copy and rewrites the manifest without the entry. It never overwrites a
checkpoint at the original path that is newer than the redirected one.

The manifest decides what `sync` copies where, so it is trusted like the state file: a regular
file, not writable by group or others, owned by the user running `sync` (root may read anyone's,
for counting); and `sync` only copies a fallback file that is inside that fallback directory and
owned by the user running it.
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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from fsprobe.atomic import fsync_directory, hostname, open_exclusive, temp_name

log = logging.getLogger("fsprobe.redirect")

MANIFEST = ".fsprobe-redirects.jsonl"
FALLBACK_ENV = "FSPROBE_FALLBACK_DIRS"
_READ_CHUNK = 4 * 1024 * 1024
#: Manifest lines are appended as one write each; a line is a few hundred bytes.
_MANIFEST_MODE = 0o644


def fallback_dirs_from_env(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """``FSPROBE_FALLBACK_DIRS``, colon-separated like ``PATH``; empty items are ignored."""
    return tuple(item for item in environ.get(FALLBACK_ENV, "").split(":") if item)


def all_fallback_dirs(
    given: Iterable[str] = (), environ: Mapping[str, str] = os.environ
) -> tuple[str, ...]:
    """The caller's fallback directories, then those of the environment, each once, absolute."""
    if not given and not environ.get(FALLBACK_ENV):
        return ()  # the common case, on the path of every save
    seen: dict[str, None] = {}
    for directory in (*given, *fallback_dirs_from_env(environ)):
        seen.setdefault(os.path.abspath(os.fspath(directory)), None)
    return tuple(seen)


def redirect_path(fallback: str, requested: str) -> str:
    """Where a save of `requested` lands in `fallback`: its absolute path mirrored beneath."""
    return os.path.join(os.path.abspath(fallback), os.path.abspath(requested).lstrip("/"))


def prepare_directory(fallback: str, actual: str) -> None:
    """Create the mirrored directories of `actual` inside `fallback`, never `fallback` itself.

    A fallback directory that does not exist is a configuration mistake (a typo, an unmounted
    scratch); creating it would hide that, so it fails with ENOENT like any other missing dir.
    """
    if not os.path.isdir(fallback):
        raise FileNotFoundError(errno.ENOENT, "fallback directory does not exist", fallback)
    os.makedirs(os.path.dirname(actual), exist_ok=True)


def sha256_of(path: str) -> str:
    # Imported here: hashlib loads OpenSSL (several MiB), and this module is imported by every
    # preflight, also in the probe worker, while only a redirect or a sync ever hashes.
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(_READ_CHUNK):
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


def _rewrite(fallback: str, remove: set[Entry]) -> None:
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


# -- pending entries --------------------------------------------------------------------------


def _latest_per_file(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """(live, replaced): a later save to the same fallback file replaced the earlier ones."""
    latest: dict[str, Entry] = {}
    for entry in entries:  # manifest order is write order
        latest[entry.actual] = entry
    live = list(latest.values())
    return live, [entry for entry in entries if latest[entry.actual] is not entry]


def _is_under(path: str, directory: str) -> bool:
    directory = os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def pending(fallback_dirs: Iterable[str]) -> list[Entry]:
    """The redirected checkpoints not yet copied back, newest first.

    Untrusted manifests are skipped with a warning. An entry replaced by a later save to the
    same fallback file is not pending (its bytes are gone).
    """
    entries: list[Entry] = []
    for fallback in fallback_dirs:
        try:
            entries += _latest_per_file(read_manifest(fallback))[0]
        except (UntrustedManifest, OSError) as error:
            log.warning("skipping the redirect manifest in %s: %s", fallback, error)
    return sorted(entries, key=lambda entry: entry.time, reverse=True)


def pending_bytes(fallback_dirs: Iterable[str], under: str) -> int:
    """Bytes of redirected checkpoints waiting to go back to `under` (a target directory)."""
    return sum(entry.bytes for entry in pending(fallback_dirs) if _is_under(entry.requested, under))


def pending_after_sync(target: str, fallback_dirs: Iterable[str], sync_back: bool) -> int:
    """The daemon's redirect probe: sync back what `target` can take now (if asked), then count.

    Returns the bytes still waiting in the fallback directories to go back to `target`.
    """
    if sync_back:
        sync(fallback_dirs, under=target)
    return pending_bytes(fallback_dirs, under=target)


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
        if entry.requested != requested or not os.path.isfile(entry.actual):
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
                _is_under(entry.actual, fallback)
                and stat.S_ISREG(info.st_mode)
                and info.st_uid == os.geteuid()
            ):
                os.unlink(entry.actual)
                remove_mirrored_dirs(fallback, entry.actual)
                removed.append(entry.actual)
        if entries:
            _rewrite(fallback, set(entries))
    return removed


# -- sync ---------------------------------------------------------------------------------------

#: Outcomes after which the entry leaves the manifest.
_DONE = frozenset({"synced", "pruned", "replaced", "missing"})


@dataclass(frozen=True)
class SyncOutcome:
    """What `sync` did with one entry; `action` is one of:

    ``synced``, ``would_sync`` (dry run), ``waiting`` (the target cannot take it yet),
    ``superseded`` (a newer checkpoint is at the original path; both kept), ``pruned``
    (superseded, and the copy removed), ``replaced`` (a later save overwrote that fallback file),
    ``missing`` (the fallback file is gone), ``checksum_mismatch``, ``skipped`` (not ours to
    touch), ``failed`` (the copy failed).
    """

    entry: Entry
    action: str
    message: str

    @property
    def done(self) -> bool:
        """The entry is settled and leaves the manifest (unless it was a dry run)."""
        return self.action in _DONE

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(self.entry)
        return {**fields, "action": self.action, "message": self.message}


class ChecksumMismatch(Exception):
    """The copy does not have the bytes the manifest recorded; it is not renamed into place."""


class Superseded(Exception):
    """A newer checkpoint appeared at the original path while the copy was being made."""


def _is_superseded(entry: Entry) -> bool:
    """Whether the original path holds a checkpoint written after the redirected one."""
    try:
        return os.stat(entry.requested).st_mtime > entry.time
    except FileNotFoundError:
        return False


def _copy_verified(entry: Entry):
    """A write callback for `atomic_write`: copy the fallback file back, verify, re-check.

    The copy is verified by re-reading it; and since copying gigabytes takes a while, during
    which the trainer may have saved a newer checkpoint to the original path, that is checked
    again last, just before `atomic_write` renames the copy into place.
    """

    def write(stream) -> None:
        with open(entry.actual, "rb", buffering=0) as origin:
            while chunk := origin.read(_READ_CHUNK):
                stream.write(chunk)
        stream.flush()
        os.fsync(stream.fileno())
        copied = sha256_of(stream.name)
        if copied != entry.sha256:
            raise ChecksumMismatch(
                f"the copy of {entry.actual} has sha256 {copied}, the manifest says {entry.sha256}"
            )
        if _is_superseded(entry):
            raise Superseded(f"{entry.requested} was saved anew during the copy; kept it")

    return write


def remove_mirrored_dirs(fallback: str, actual: str) -> None:
    """Remove the now empty mirrored directories of `actual`, up to (not including) `fallback`."""
    directory = os.path.dirname(actual)
    root = os.path.abspath(fallback)
    while _is_under(directory, root) and directory != root:
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty (another checkpoint, a user's file) or not ours to remove
        directory = os.path.dirname(directory)


def _sync_one(
    entry: Entry,
    *,
    dry_run: bool,
    prune_superseded: bool,
    state_dir: str | None,
    timeout: float,
) -> SyncOutcome:
    from fsprobe.saving.file import SaveError, atomic_write
    from fsprobe.saving.preflight import preflight  # both import this module at their top

    def outcome(action: str, message: str) -> SyncOutcome:
        return SyncOutcome(entry, action, message)

    if not _is_under(entry.actual, entry.fallback) or entry.actual == entry.fallback:
        return outcome("skipped", f"{entry.actual} is outside its fallback {entry.fallback}")
    try:
        info = os.lstat(entry.actual)
    except FileNotFoundError:
        return outcome("missing", f"{entry.actual} is gone; nothing to copy back")
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return outcome(
            "skipped",
            f"{entry.actual} is not a regular file of yours (uid {info.st_uid}); "
            "run fsprobe sync as its owner",
        )
    # The target may be the hung mount: ask the bounded preflight before touching it.
    decision = preflight(
        entry.requested,
        need_bytes=entry.bytes,
        redirect=False,
        on_unhealthy="fail",
        state_dir=state_dir,
        timeout=timeout,
    )
    if decision.action == "fail":
        return outcome("waiting", f"{entry.requested} not ready: {decision.summary()}")
    if _is_superseded(entry):
        if not prune_superseded:
            return outcome(
                "superseded",
                f"{entry.requested} is newer than the redirected copy; kept both "
                "(--prune-superseded removes the copy)",
            )
        if dry_run:
            return outcome("superseded", f"would remove {entry.actual}: the original is newer")
        os.unlink(entry.actual)
        remove_mirrored_dirs(entry.fallback, entry.actual)
        return outcome("pruned", f"removed {entry.actual}: {entry.requested} is newer")
    if dry_run:
        return outcome("would_sync", f"would copy {entry.actual} back to {entry.requested}")
    try:
        atomic_write(
            entry.requested,
            _copy_verified(entry),
            attempts=3,
            preflight=False,
            redirect=False,
        )
    except ChecksumMismatch as error:
        return outcome("checksum_mismatch", f"{error}; {entry.requested} left as it was")
    except Superseded as error:
        return outcome("superseded", str(error))
    except SaveError as error:
        return outcome("failed", f"copying back to {entry.requested} failed: {error}")
    os.unlink(entry.actual)
    remove_mirrored_dirs(entry.fallback, entry.actual)
    return outcome("synced", f"copied {entry.actual} back to {entry.requested} (sha256 verified)")


def sync(
    fallback_dirs: Iterable[str],
    *,
    dry_run: bool = False,
    prune_superseded: bool = False,
    state_dir: str | None = None,
    timeout: float = 10.0,
    under: str | None = None,
) -> list[SyncOutcome]:
    """Copy pending redirected checkpoints back to where they were asked to go.

    Newest first, so that an older redirected copy of the same path finds the newer one already
    in place and is reported as superseded instead of overwriting it. Settled entries (synced,
    pruned, replaced, missing) leave the manifest; the rest stay for the next run. With `under`,
    only the checkpoints that were meant for that directory (or below it) are handled.
    """
    outcomes: list[SyncOutcome] = []
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        try:
            live, replaced = _latest_per_file(read_manifest(fallback))
        except (UntrustedManifest, OSError) as error:
            log.warning("skipping the redirect manifest in %s: %s", fallback, error)
            continue
        if under is not None:
            live = [entry for entry in live if _is_under(entry.requested, under)]
            replaced = [entry for entry in replaced if _is_under(entry.requested, under)]
        outcomes += [
            SyncOutcome(entry, "replaced", f"{entry.actual} was overwritten by a later save")
            for entry in replaced
        ]
        for entry in sorted(live, key=lambda e: e.time, reverse=True):
            try:
                result = _sync_one(
                    entry,
                    dry_run=dry_run,
                    prune_superseded=prune_superseded,
                    state_dir=state_dir,
                    timeout=timeout,
                )
            except OSError as error:
                result = SyncOutcome(entry, "failed", f"{entry.actual}: {error}")
            log.log(
                logging.WARNING
                if result.action in ("failed", "checksum_mismatch")
                else logging.INFO,
                "sync %s: %s",
                result.action,
                result.message,
            )
            outcomes.append(result)
        settled = {o.entry for o in outcomes if o.done and o.entry.fallback == fallback}
        if settled and not dry_run:
            _rewrite(fallback, settled)
    return outcomes


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
