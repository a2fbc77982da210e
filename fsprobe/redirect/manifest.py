"""The manifest of a user's area in a fallback directory: one JSON line per redirected save.

One fsynced ``write`` per line on an ``O_APPEND`` descriptor under a lock; trusted only as
provably its user's (docs/security.md, "Fallback directories").
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import errno
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fsprobe.codec import Form
from fsprobe.posix.atomic import TempFile, hostname, lock_within, temp_name
from fsprobe.posix.owned import NotTrusted, check_owned, components, open_file, walk
from fsprobe.posix.paths import is_under
from fsprobe.posix.tree import (
    EntryBudget,
    TooManyEntries,
    digest_tree,
    measure_tree,
    open_directory,
    opened,
    remove_tree,
    tree_digest,
)
from fsprobe.redirect.areas import (
    AREA_NAME,
    MAX_AREA_NAMES,
    Area,
    CrowdedFallback,
    area_name,
    directory_of,
    fallback_entries,
    mirrored,
    own_area,
    remove_area_if_empty,
    remove_empty_parents,
)

log = logging.getLogger("fsprobe.redirect")

MANIFEST = ".fsprobe-redirects.jsonl"
READ_CHUNK = 4 * 1024 * 1024
#: A line is about 300 bytes: this is some 14,000 redirected saves waiting to go back. Root's
#: daemon reads every user's manifest every minute, in a worker that shares a memory limit of
#: 128-256 MiB with it (deploy/); parsed, a manifest takes about 6 times its size.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: A save that appends to a manifest larger than this drops the lines of copies that a later
#: save to the same file replaced: a trainer saving ``last.pt`` every few minutes through a long
#: outage adds a line each time, and would otherwise reach the cap.
COMPACT_BYTES = MAX_MANIFEST_BYTES // 4
#: Readable by its user only: nobody else can hold its lock (and so block a save).
_MANIFEST_MODE = 0o600
#: Opening a directory checkpoint's copy: never through a symlink.
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Entries (files, directories) of its directory copies that one user's area may have walked in
#: one round of the daemon's count or of a sync: a directory copy someone filled with a million
#: empty files was listed whole into memory (538 MiB, the worker OOM-killed). Past it the copy is
#: neither counted nor synced nor deleted, and the daemon logs the area once.
MAX_AREA_ENTRIES = 100_000
#: How long a save waits for the manifest's lock (held by its user's other savers and syncs).
LOCK_TIMEOUT = 30.0
_LOCK_POLL = 0.05


def sha256_of_fd(fd: int) -> str:
    """The sha256 of everything an open file holds, read from its start."""
    # Imported here: hashlib loads OpenSSL (several MiB), and this module is imported by every
    # preflight, also in the probe worker, while only a redirect, a sync or a resume hashes.
    import hashlib

    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, READ_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def sha256_of(path: str) -> str:
    """The sha256 of the regular file at `path` (never through a symlink, never a FIFO)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotTrusted(f"{path} is not a regular file")
        return sha256_of_fd(fd)
    finally:
        os.close(fd)


def sha256_of_directory(path: str) -> str:
    """The sha256 of the directory at `path` as a manifest records it: of its whole tree."""
    with opened(open_directory(path)) as fd:
        return tree_digest(digest_tree(fd))


@dataclass(frozen=True)
class Entry:
    """One redirected save, as one line of a manifest in `area` says it."""

    area: Area
    requested: str
    actual: str
    bytes: int
    sha256: str
    time: float
    host: str = ""
    pid: int = 0

    @property
    def fallback(self) -> str:
        return self.area.fallback

    def to_line(self) -> builtins.bytes:
        return json.dumps(ENTRY.encode(self), separators=(",", ":")).encode() + b"\n"

    def to_dict(self) -> dict[str, Any]:
        """The entry for people and scripts: the line's fields, its fallback and its owner."""
        where = {"fallback": self.fallback, "area": self.area.path, "owner": self.area.owner}
        return {**where, **ENTRY.encode(self)}

    @classmethod
    def from_line(cls, area: Area, line: builtins.bytes) -> Entry:
        """Parse one line; ValueError (or a subclass) when it is not an entry."""
        return cls.from_fields(area, json.loads(line))

    @classmethod
    def from_fields(cls, area: Area, fields: object) -> Entry:
        """The entry these JSON fields describe; `FormatError` (a ValueError) if none."""
        return ENTRY.decode(fields, area=area)

    def names(self) -> list[str]:
        """The names leading from the area to the copy; NotTrusted unless the line is sound.

        Sound means: `requested` is absolute and normalised, and `actual` is exactly its
        mirrored path in this area. Nothing else a line says is ever used as a path.
        """
        if not os.path.isabs(self.requested) or os.path.normpath(self.requested) != (
            self.requested
        ):
            raise NotTrusted(f"{self.requested!r} is not an absolute, normalised path")
        expected = os.path.join(self.area.path, mirrored(self.requested))
        if self.actual != expected:
            raise NotTrusted(f"{self.actual} is not where {self.requested} is kept ({expected})")
        return components(mirrored(self.requested))


#: A manifest line; host and pid are absent from the lines of early versions.
ENTRY = Form(Entry, "requested actual bytes sha256 time host? pid?")


def new_entry(fallback: str, requested: str, actual: str, nbytes: int, sha256: str) -> Entry:
    """The entry of a save of `requested` that this user redirected to `actual` in `fallback`."""
    return Entry(
        area=own_area(fallback),
        requested=os.path.abspath(requested),
        actual=actual,
        bytes=nbytes,
        sha256=sha256,
        time=time.time(),
        host=hostname(),
        pid=os.getpid(),
    )


#: Areas of one user in one fallback directory, at most: ``uid-<uid>`` and a private area for
#: each squat found there. More are that user's own making (any user may make directories
#: ``uid-<own uid>.<16 hex digits>``), and each would cost root a manifest read every round.
MAX_AREAS_PER_USER = 8


@dataclass(frozen=True)
class Areas:
    """The users' areas found in one fallback directory (iterating gives them), and
    `crowded`: why some were left out ("" when none was)."""

    found: tuple[Area, ...]
    crowded: str = ""

    def __iter__(self) -> Iterator[Area]:
        return iter(self.found)


def areas(fallback: str, max_names: int = MAX_AREA_NAMES) -> Areas:
    """Every user's area in `fallback`: a directory ``uid-<uid>`` that this uid owns.

    Opening an area still proves whose it is; this only keeps root from acting for an
    account because of a name: anyone who may write a shared fallback can make a directory
    called ``uid-<any uid>``, and root runs a sync as the user of every area it finds. A
    manifest directly in the fallback directory, as fsprobe wrote them before areas existed,
    counts as an area of the manifest's owner. Bounded: at most `max_names` names looked at
    (streamed), and `MAX_AREAS_PER_USER` areas of one user (``uid-<uid>`` first, then by
    name: the private area a squatted user's saves use); what is left out is `crowded`.
    """
    fallback = os.path.abspath(fallback)
    found: dict[int, list[str]] = {}  # uid -> names of their areas, sorted, capped
    legacy: list[Area] = []
    crowded: list[str] = []
    try:
        for item in fallback_entries(fallback, max_names):
            match = AREA_NAME.match(item.name)
            if match is not None:
                uid = int(match["uid"])
                canonical = item.name.split(".")[0] == area_name(uid)  # no uid-007
                if canonical and directory_of(item, uid):
                    names = found.setdefault(uid, [])
                    bisect.insort(names, item.name)
                    if len(names) > MAX_AREAS_PER_USER:
                        names.pop()
                        crowded.append(
                            f"{fallback}: uid {uid} has more than {MAX_AREAS_PER_USER} areas "
                            "there (the rest are neither counted nor synced by root)"
                        )
            elif item.name == MANIFEST:
                with contextlib.suppress(OSError):
                    owner = item.stat(follow_symlinks=False).st_uid
                    legacy.append(Area(fallback, fallback, owner))
    except CrowdedFallback as error:
        crowded.append(f"{fallback}: {error.strerror}")
    listed = [
        Area(fallback, os.path.join(fallback, name), uid)
        for uid, names in found.items()
        for name in names
    ]
    ordered = sorted(listed + legacy, key=lambda area: (area.owner, area.legacy))
    return Areas(tuple(ordered), "; ".join(dict.fromkeys(crowded)))


@dataclass(frozen=True)
class FallbackCount:
    """What the daemon's count task finds in a target's fallback directories."""

    pending_bytes: int
    squatted: tuple[str, ...]  # `squatted_areas`
    too_many_entries: tuple[str, ...] = ()  # areas past their `MAX_AREA_ENTRIES`
    crowded: tuple[str, ...] = ()  # why areas were left out of a listing (`Areas.crowded`)


def count_fallbacks(
    fallback_dirs: Iterable[str],
    under: str,
    max_entries: int,
    judged: Iterable[str] | None = None,
    writes: Callable[[int], bool] | None = None,
) -> FallbackCount:
    """The pending bytes of the copies meant for `under` (of the areas whose owner `writes`
    it, if given), and of the fallbacks `judged` (all unless given) the squatted areas, the
    areas whose copies hold more than `max_entries` entries (`MAX_AREA_ENTRIES`; not counted)
    and the crowded listings."""
    fallback_dirs = tuple(fallback_dirs)
    judged = fallback_dirs if judged is None else tuple(dict.fromkeys(judged))
    crowded: list[str] = []
    total, too_many = measure_pending(judged, under, max_entries, crowded, writes)
    others = tuple(fallback for fallback in fallback_dirs if fallback not in judged)
    total += measure_pending(others, under, max_entries, None, writes)[0] if others else 0
    return FallbackCount(total, tuple(squatted_areas(judged)), too_many, tuple(crowded))


def squatted_areas(fallback_dirs: Iterable[str]) -> list[str]:
    """The paths ``<fallback>/uid-<uid>`` that are not that user's own directory: someone
    else made them (a squat: that user's saves go to a private area, `claim_area`)."""
    found = []
    for fallback in fallback_dirs:
        with contextlib.suppress(OSError):  # crowded: the squats among the names looked at
            for item in fallback_entries(fallback):
                match = AREA_NAME.match(item.name)
                if match is None or item.name != area_name(int(match["uid"])):
                    continue
                if not directory_of(item, int(match["uid"])):
                    found.append(item.path)
    return found


def own_areas(fallback: str) -> list[Area]:
    """This user's areas in `fallback`: theirs, and a legacy manifest of theirs."""
    uid = os.geteuid()
    try:
        found = [area for area in areas(fallback) if area.owner == uid]
    except FileNotFoundError:
        return []
    mine = own_area(fallback)
    return found if mine in found else [mine, *found]


def _open_manifest(area_fd: int, area: Area, flags: int) -> int:
    return open_file(area_fd, MANIFEST, flags, area.owner, mode=_MANIFEST_MODE, where=area.path)


def _lock(fd: int, path: str, timeout: float) -> bool:
    """Take the manifest's exclusive lock, waiting at most `timeout`; ETIMEDOUT past it.

    False on filesystems without `flock` (Lustre mounted with ``noflock``), which go on
    unlocked: concurrent rewrites are then not serialised, appends still are by O_APPEND.
    """
    try:
        locked = lock_within(fd, timeout, _LOCK_POLL)
    except OSError as error:
        if error.errno not in _LOCK_UNSUPPORTED:
            raise
        return False
    if not locked:
        raise OSError(errno.ETIMEDOUT, f"the manifest stayed locked for {timeout:g} s", path)
    return True


_LOCK_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)

#: What `record` and `rewrite` returning False means, for their callers to say.
UNLOCKED = "cannot lock the redirect manifest in {}: concurrent updates are not serialised"


@contextlib.contextmanager
def _locked_manifest(area_fd: int, area: Area, create: bool) -> Iterator[tuple[int, bool] | None]:
    """The manifest opened for appending and exclusively locked, with whether the filesystem
    could lock it (`_lock`); None if absent and not created.

    `rewrite` replaces the file, so a lock taken on the old inode would protect nothing: after
    locking, the descriptor must still be the file of that name, else take the new one.
    """
    path = os.path.join(area.path, MANIFEST)
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0)
    while True:
        try:
            fd = _open_manifest(area_fd, area, flags)
        except FileNotFoundError:
            yield None
            return
        try:
            locked = _lock(fd, path, LOCK_TIMEOUT)
            try:
                named = os.stat(MANIFEST, dir_fd=area_fd, follow_symlinks=False)
                same = os.path.samestat(os.fstat(fd), named)
            except FileNotFoundError:
                same = False
            if same:
                yield fd, locked
                return
        finally:
            os.close(fd)  # releases the lock


def record(entry: Entry) -> bool:
    """Append `entry` to its area's manifest: one write of one line, then fsync. False when
    the filesystem could not lock the manifest (`UNLOCKED`): the line is in all the same.

    A manifest grown past `COMPACT_BYTES` is then compacted (best effort: the line is in).
    """
    line = entry.to_line()
    area_fd = entry.area.open(create=True)
    try:
        with _locked_manifest(area_fd, entry.area, create=True) as opened:
            if opened is None:  # only possible without create; keeps the type checker honest
                raise FileNotFoundError(errno.ENOENT, "manifest vanished", entry.area.path)
            fd, locked = opened
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.EIO, f"short append to the manifest in {entry.area.path}")
            os.fsync(fd)
            size = os.fstat(fd).st_size
    finally:
        os.close(area_fd)
    if size > COMPACT_BYTES:
        try:
            replaced = latest_per_file(read_manifest(entry.area))[1]
            if replaced:
                rewrite(entry.area, set(replaced))
        except OSError as error:
            log.warning("could not compact the manifest in %s: %s", entry.area.path, error)
    return locked


def _read(area_fd: int, area: Area) -> list[Entry]:
    path = os.path.join(area.path, MANIFEST)
    try:
        fd = _open_manifest(area_fd, area, os.O_RDONLY)
    except FileNotFoundError:
        return []
    entries: list[Entry] = []
    unread = 0
    first_unread: tuple[int, BaseException] | None = None
    left = MAX_MANIFEST_BYTES
    with os.fdopen(fd, "rb") as stream:
        if os.fstat(fd).st_size > left:  # refused unread; the loop below bounds one that grows
            raise NotTrusted(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes; not read")
        number = 0
        while line := stream.readline(left + 1):  # never more than the cap, even in one line
            number += 1
            left -= len(line)
            if left < 0:
                raise NotTrusted(f"{path} is larger than {MAX_MANIFEST_BYTES} bytes; not read")
            if not line.strip():
                continue
            try:
                entries.append(Entry.from_line(area, line))
            except (ValueError, KeyError, TypeError, RecursionError) as error:  # nested too deep
                unread += 1
                first_unread = first_unread or (number, error)
    if first_unread is not None:  # one warning, however many lines: the manifest may be anyone's
        number, reason = first_unread
        more = f", and {unread - 1} more lines like it" if unread > 1 else ""
        log.warning(
            "%s line %d is not a redirect entry (%s); ignored%s", path, number, reason, more
        )
    return entries


def read_manifest(area: Area) -> list[Entry]:
    """Every entry of an area's manifest, in the order written; [] when there is none.

    Raises `NotTrusted` for a manifest or area that is not provably the area's user's. A
    line that cannot be parsed (a torn write on a filesystem that broke O_APPEND) is skipped
    with a warning, never guessed at.
    """
    try:
        area_fd = area.open()
    except FileNotFoundError:
        return []
    try:
        return _read(area_fd, area)
    finally:
        os.close(area_fd)


def rewrite(area: Area, remove: set[Entry]) -> bool:
    """Drop `remove` from the area's manifest, atomically; unlink the manifest once empty.
    False when the filesystem could not lock the manifest (`UNLOCKED`).

    Re-read under the lock, so that lines appended by a saver since `sync` read the manifest
    are kept.
    """
    area_fd = area.open()
    try:
        with _locked_manifest(area_fd, area, create=False) as opened:
            if opened is None:
                return True
            locked = opened[1]
            kept = [entry for entry in _read(area_fd, area) if entry not in remove]
            if not kept:
                os.unlink(MANIFEST, dir_fd=area_fd)
                with contextlib.suppress(OSError):  # copies still there, or a save began
                    remove_area_if_empty(area)
            else:
                with TempFile(area_fd, temp_name(MANIFEST), _MANIFEST_MODE) as temporary:
                    with os.fdopen(os.dup(temporary.fd), "wb") as stream:
                        stream.write(b"".join(entry.to_line() for entry in kept))
                        stream.flush()
                        os.fsync(stream.fileno())
                    temporary.rename(MANIFEST)
            os.fsync(area_fd)
    finally:
        os.close(area_fd)
    return locked


def latest_per_file(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """(live, replaced): a later save to the same fallback file replaced the earlier ones."""
    latest: dict[str, Entry] = {}
    for entry in entries:  # manifest order is write order
        latest[entry.actual] = entry
    live = list(latest.values())
    return live, [entry for entry in entries if latest[entry.actual] is not entry]


class OpenCopy:
    """An entry's copy, opened through its user's own directories as that user's own.

    Every directory from the area down is walked without following symlinks and must belong to
    the area's user and be writable by nobody else; the copy must be that user's regular file
    (opened without blocking) or, for a directory checkpoint, that user's directory. Raises
    FileNotFoundError when it is gone, `NotTrusted` when it is not provably the user's. `fd`
    is open for reading; `directory` holds it as `name`.
    """

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        *directories, self.name = entry.names()
        owner, where = entry.area.owner, entry.area.path
        area_fd = entry.area.open()
        try:
            self.directory = walk(area_fd, directories, owner, where=where)
        finally:
            os.close(area_fd)
        try:
            self.fd, self.is_directory = self._open(owner)
        except BaseException:
            os.close(self.directory)
            raise

    def _open(self, owner: int) -> tuple[int, bool]:
        what = self.entry.actual
        try:
            return open_file(self.directory, self.name, os.O_RDONLY, owner, private=False), False
        except NotTrusted:
            info = os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                raise
        fd = os.open(self.name, _DIRECTORY_FLAGS, dir_fd=self.directory)
        try:
            check_owned(os.fstat(fd), owner, what, private=False)
        except BaseException:
            os.close(fd)
            raise
        return fd, True

    def digest(self) -> str:
        """The sha256 as a manifest records it: of the file, or of the directory's tree."""
        if self.is_directory:
            return tree_digest(digest_tree(self.fd))
        return sha256_of_fd(self.fd)

    def size(self, budget: EntryBudget | None = None) -> int:
        """Its bytes; a directory's walk charges each entry to `budget`."""
        if self.is_directory:
            return measure_tree(self.fd, budget).bytes
        return os.fstat(self.fd).st_size

    def remove(self) -> bool:
        """Remove the copy if its name still is what was opened; tidy up the empty directories."""
        named = os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)
        if not os.path.samestat(os.fstat(self.fd), named):
            return False
        if self.is_directory:
            if not remove_tree(self.directory, self.name):
                return False
        else:
            os.unlink(self.name, dir_fd=self.directory)
        with contextlib.suppress(OSError):
            remove_empty_parents(self.entry.area, self.entry.names())
        return True

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.directory)

    def __enter__(self) -> OpenCopy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def pending(
    fallback_dirs: Iterable[str], mine: bool = False, crowded: list[str] | None = None
) -> list[Entry]:
    """The redirected checkpoints not yet copied back, newest first (only this user's if `mine`).

    Untrusted manifests are skipped with a warning (other users' manifests that this user may
    not read, quietly). An entry replaced by a later save to the same fallback file is not
    pending (its bytes are gone). Why a listing of areas left some out goes to `crowded`.
    """
    entries: list[Entry] = []
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        try:
            found: Iterable[Area]
            if mine:
                found = own_areas(fallback)
            else:
                listing = areas(fallback)
                found = listing
                if listing.crowded and crowded is not None:
                    crowded.append(listing.crowded)
        except OSError as error:
            log.warning("cannot list the fallback directory %s: %s", fallback, error)
            continue
        for area in found:
            try:
                entries += latest_per_file(read_manifest(area))[0]
            except OSError as error:
                # Another user's manifest is theirs alone to read (0600): nothing to report.
                private = area.owner != os.geteuid() and type(error) is PermissionError
                log.log(
                    logging.DEBUG if private else logging.WARNING,
                    "skipping the redirect manifest in %s: %s",
                    area.path,
                    error,
                )
    return sorted(entries, key=lambda entry: entry.time, reverse=True)


def is_superseded(entry: Entry, original: os.stat_result | None) -> bool:
    """Whether the checkpoint at the requested path (`original`, None if there is none) is
    newer than the redirected copy `entry`: sync keeps both, and brings nothing home."""
    return original is not None and original.st_mtime > entry.time


def _superseded_now(entry: Entry) -> bool:
    try:
        return is_superseded(entry, os.lstat(entry.requested))
    except OSError:
        return False


def measure_pending(
    fallback_dirs: Iterable[str],
    under: str,
    max_entries: int = MAX_AREA_ENTRIES,
    crowded: list[str] | None = None,
    writes: Callable[[int], bool] | None = None,
) -> tuple[int, tuple[str, ...]]:
    """Bytes of redirected checkpoints waiting to go back to `under` (a target directory),
    and the areas whose directory copies hold more than `max_entries` entries in all; only
    the copies of areas whose owner `writes` `under`, if given (no one else's sync brings
    them home).

    What is counted is the size of each copy that is really there and provably its user's,
    not what a manifest line claims, and only what a sync will bring home: a copy superseded
    by a newer checkpoint at its requested path is kept, but not pending (it kept
    FsprobeRedirectedCheckpointsPending firing for good). Directory copies are walked
    streaming, at most `max_entries` entries per area: a copy past that is not counted. Why
    areas were left out of a listing goes to `crowded` (`Areas.crowded`).
    """
    total = 0
    budgets: dict[str, EntryBudget] = {}
    too_many: dict[str, None] = {}
    for entry in pending(fallback_dirs, crowded=crowded):
        if not is_under(entry.requested, under) or _superseded_now(entry):
            continue
        if writes is not None and not writes(entry.area.owner):
            continue  # a superseded copy is kept, but no sync will bring it home
        budget = budgets.setdefault(entry.area.path, EntryBudget(max_entries))
        try:
            with OpenCopy(entry) as copy:
                total += copy.size(budget)
        except TooManyEntries:
            too_many[entry.area.path] = None
            log.debug("not counting %s: its area has over %d entries", entry.actual, max_entries)
        except OSError as error:
            log.debug("not counting %s: %s", entry.actual, error)
    return total, tuple(too_many)


def newest_copy(requested: str, fallback_dirs: Iterable[str]) -> str:
    """The path holding the newest checkpoint saved as `requested`: itself or a redirected copy.

    What a trainer resuming from `requested` should load: a save that was redirected after the
    original was last written is newer than the original (which may not even exist). A copy is
    returned only if it is this user's own (a regular file, or a directory checkpoint), reached
    through this user's own directories, and still has the sha256 recorded when it was saved:
    a file someone swapped in, or one that rotted, is passed over with a warning. Nobody but
    this user (and root) can change the copy at that path afterwards.
    """
    requested = os.path.abspath(requested)
    try:
        original_mtime: float | None = os.stat(requested).st_mtime
    except FileNotFoundError:
        original_mtime = None
    for entry in pending(fallback_dirs, mine=True):  # newest first
        if entry.requested != requested:
            continue
        if original_mtime is not None and original_mtime >= entry.time:
            break
        try:
            with OpenCopy(entry) as copy:
                digest = copy.digest()
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("not loading the redirected copy %s: %s", entry.actual, error)
            continue
        if digest == entry.sha256:
            return entry.actual
        log.warning(
            "not loading the redirected copy %s: its sha256 is %s, the manifest says %s",
            entry.actual,
            digest,
            entry.sha256,
        )
    return requested


def forget(requested: str, fallback_dirs: Iterable[str]) -> list[str]:
    """Remove this user's redirected copies of `requested` and their entries (it was deleted).

    A trainer that deletes an old checkpoint (Lightning's top-k) deletes its redirected copy
    too, or `sync` would bring it back later. Returns the fallback files removed.
    """
    requested = os.path.abspath(requested)
    removed = []
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        for area in own_areas(fallback):
            try:
                entries = [e for e in read_manifest(area) if e.requested == requested]
            except OSError as error:
                log.warning("skipping the redirect manifest in %s: %s", area.path, error)
                continue
            for entry in entries:
                try:
                    with OpenCopy(entry) as copy:
                        if copy.remove():
                            removed.append(entry.actual)
                except FileNotFoundError:
                    continue
                except OSError as error:
                    log.warning("not removing %s: %s", entry.actual, error)
            if entries and not rewrite(area, set(entries)):
                log.warning(UNLOCKED.format(area.path))
    return removed
