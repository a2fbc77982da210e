"""`fsprobe sync`: copy redirected checkpoints back once their target can take them again.

Its own user's areas only; as root, each other user's by a run as her (docs/design.md §7, §8).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from fsprobe.codec import Form
from fsprobe.errors import ProbeFailure, name_of
from fsprobe.posix.atomic import TempFile, temp_name
from fsprobe.posix.owned import NotTrusted
from fsprobe.posix.paths import is_under
from fsprobe.posix.staging import Staging
from fsprobe.posix.tree import (
    EntryBudget,
    TooManyEntries,
    digest_tree,
    measure_tree,
    tree_digest,
)
from fsprobe.probing.target import ROOT, open_target
from fsprobe.redirect import delegate
from fsprobe.redirect.areas import AREA_NAME, Area, area_name
from fsprobe.redirect.copies import Copied, copy_bytes, copy_tree
from fsprobe.redirect.manifest import (
    MAX_AREA_ENTRIES,
    UNLOCKED,
    Areas,
    Entry,
    OpenCopy,
    areas,
    is_superseded,
    latest_per_file,
    own_areas,
    read_manifest,
    rewrite,
    sha256_of_fd,
)
from fsprobe.state import default_state_dir

log = logging.getLogger("fsprobe.redirect")

#: Whether the target can take `entry` now: None if it can, else why not. The daemon's sync task
#: answers from its own verdict of the target (it runs in the probe worker, where a preflight
#: that probes inline would have to start a worker of its own); `fsprobe sync` asks a preflight
#: (`fsprobe.saving.preflight.preflight_readiness`): the save path is above this package.
Readiness = Callable[[Entry], Optional[str]]


class CopyMeter(Protocol):
    """Shows a copy back as it goes (`fsprobe.cli.meter` on a terminal)."""

    def begin(self, path: str, total: int) -> None:
        """A copy of `total` bytes back to `path` starts."""

    def copied(self, nbytes: int) -> None:
        """`nbytes` more were copied."""

    def end(self) -> None:
        """The copy is over (done, failed or refused)."""


#: Outcomes after which the entry leaves the manifest.
_DONE = frozenset({"synced", "pruned", "replaced", "missing"})
_ACTIONS = frozenset(
    {
        "would_sync",
        "waiting",
        "superseded",
        "checksum_mismatch",
        "skipped",
        "failed",
        "too_many_entries",
        *_DONE,
    }
)
#: Outcomes not logged as they happen: the caller reports them once (the daemon per area).
_REPORTED_ONCE = frozenset({"too_many_entries"})
#: How long root's sync of all other users' areas may take, by default: each user's run gets an
#: equal share of it (copying gigabytes back is slow, not hung; one user must not take it all).
ROUND_SECONDS = 3600.0


@dataclass(frozen=True)
class SyncOutcome:
    """What `sync` did with one entry; `action` is one of:

    ``synced``, ``would_sync`` (dry run), ``waiting`` (the target cannot take it yet),
    ``superseded`` (a newer checkpoint is at the original path; both kept), ``pruned``
    (superseded, and the copy removed), ``replaced`` (a later save overwrote that fallback file),
    ``missing`` (the fallback file is gone), ``checksum_mismatch``, ``skipped`` (not provably
    the user's to touch), ``failed`` (the copy failed), ``too_many_entries`` (a directory
    copy past its area's entry cap, `MAX_AREA_ENTRIES`: left where it is).
    """

    entry: Entry
    action: str
    message: str

    @property
    def done(self) -> bool:
        """The entry is settled and leaves the manifest (unless it was a dry run)."""
        return self.action in _DONE

    def to_dict(self) -> dict[str, Any]:
        return {**self.entry.to_dict(), **OUTCOME.encode(self)}

    @classmethod
    def from_dict(cls, fields: Any, fallback: str, owner: int) -> SyncOutcome:
        """An outcome that a run as `owner` reported; ValueError (or Key-, TypeError) if none.

        Only root reads these, and only to report them: the run is the user's own process, so
        an outcome can speak for that user's area of `fallback` and for nothing else.
        """
        area = _reported_area(fallback, owner, str(fields["area"]))
        return OUTCOME.decode(fields, entry=Entry.from_fields(area, fields))


@dataclass(frozen=True)
class UnsyncedUser:
    """A user whose areas root could not sync as that user, and why (one per user and
    fallback directory): the run as the user could not start, run or report."""

    uid: int
    fallback: str
    cause: str

    def to_dict(self) -> dict[str, Any]:
        return UNSYNCED.encode(self)


#: Beside its entry's keys in `fsprobe sync --json` (docs/reference.md).
OUTCOME = Form(SyncOutcome, "action message", choices={"action": tuple(sorted(_ACTIONS))})
UNSYNCED = Form(UnsyncedUser, "uid fallback cause")


@dataclass
class SyncReport:
    """What `sync` did: an outcome per entry, and the users it could not act for.

    Reads as its outcomes (iteration, `len`, indexing), which is what most callers want; a
    caller that reports success must look at `failures` too: a user root could not act for is
    an error, never "nothing to sync".
    """

    outcomes: list[SyncOutcome] = field(default_factory=list)
    failures: list[UnsyncedUser] = field(default_factory=list)
    crowded: list[str] = field(default_factory=list)  # root's listings that left areas out
    missing: list[str] = field(default_factory=list)  # fallback directories that do not exist

    def __iter__(self) -> Iterator[SyncOutcome]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    def __getitem__(self, index: int) -> SyncOutcome:
        return self.outcomes[index]


def _reported_area(fallback: str, owner: int, path: str) -> Area:
    """The area of `owner` in `fallback` that `path` names (ValueError if none can be): theirs
    (``uid-<uid>``, or the private one made instead of a squatted one), or a legacy manifest
    of theirs. By name: an area the run emptied is gone by the time its report is read."""
    if path == fallback:
        return Area(fallback, fallback, owner)
    name = os.path.basename(path)
    if os.path.dirname(path) != fallback or not AREA_NAME.match(name):
        raise ValueError(f"{path!r} is not an area of {fallback}")
    if name.split(".")[0] != area_name(owner):
        raise ValueError(f"{path!r} is not an area of uid {owner}")
    return Area(fallback, path, owner)


def _stat_or_none(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _requested_directory(requested: str) -> int:
    """The directory `requested` goes back into, readable, walked from ``/`` as a probe walks
    (`open_target`): a symlink on the way is followed only if root or this process's user owns
    it, else `NotTrusted`. Whoever may rename a directory on the way (a team directory) could
    otherwise send the copy into anyone's directory, over their file. FileNotFoundError if it
    is gone."""
    directory = os.path.dirname(requested)
    try:
        opened = open_target(directory, ROOT)
    except ProbeFailure as error:
        raise NotTrusted(f"{error.message}; not copying back") from None
    with opened:
        if not opened.exists:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), directory)
        return opened.open_directory()


def _copy_back(
    copy: OpenCopy, target_dir: int, final: str, seen: os.stat_result | None, copied: Copied | None
) -> str:
    """Steps 5 and 6: the verified copy beside the original, then its conditional publish.

    Returns ``synced``, ``superseded`` (the original changed meanwhile) or ``checksum_mismatch``.
    """
    with TempFile(target_dir, temp_name(final), 0o600, readable=True) as temp:
        os.fchmod(temp.fd, os.fstat(copy.fd).st_mode & 0o777)  # the checkpoint's own mode
        copy_bytes(copy.fd, temp.fd, copy.entry.bytes, copied)
        os.fsync(temp.fd)
        if sha256_of_fd(temp.fd) != copy.entry.sha256:  # the copy, as it was written
            return "checksum_mismatch"
        if not temp.replace_if_unchanged(final, seen):
            return "superseded"
    os.fsync(target_dir)
    return "synced"


def _copy_directory_back(
    copy: OpenCopy,
    target_dir: int,
    seen: os.stat_result | None,
    budget: EntryBudget,
    copied: Copied | None,
) -> str:
    """Steps 5 and 6 for a directory checkpoint (`fsprobe.save_dir`), published whole.

    The copy is first counted against its area's `budget` (streamed; `TooManyEntries` past
    it, before anything is written). It then goes into a staging directory beside the
    original, with no more entries than were counted, every file and directory of it is
    fsynced and read back: the sha256 of its tree must be the one recorded. Then one rename
    publishes it, only over the original seen in step 4 (`Staging.swap_in_if_unchanged`).
    """
    counted = measure_tree(copy.fd, budget)
    staging = Staging(copy.entry.requested, target_dir)
    try:
        assert staging.fd is not None
        staging.mode = stat.S_IMODE(os.fstat(copy.fd).st_mode)  # the checkpoint's own mode
        grown = EntryBudget(counted.files + counted.directories - 1)  # refused if it grew since
        owner, limit = copy.entry.area.owner, copy.entry.bytes
        copy_tree(copy.fd, staging.fd, owner, limit, grown, copied=copied)
        staging.sync()
        if tree_digest(digest_tree(staging.fd)) != copy.entry.sha256:
            return "checksum_mismatch"
        published, replaced = staging.swap_in_if_unchanged(seen)
        if published:
            staging.sync_parent()
        if replaced is not None:
            staging.remove(replaced)
        return "synced" if published else "superseded"
    finally:
        staging.close()


def _sync_one(entry: Entry, **options: Any) -> SyncOutcome:
    try:
        copy = OpenCopy(entry)
    except FileNotFoundError:
        return SyncOutcome(entry, "missing", f"{entry.actual} is gone; nothing to copy back")
    except NotTrusted as error:
        return SyncOutcome(entry, "skipped", f"{error}; not acting on it")
    with copy:
        return _sync_open(copy, **options)


def _sync_open(
    copy: OpenCopy,
    *,
    dry_run: bool,
    prune_superseded: bool,
    ready: Readiness,
    budget: EntryBudget,
    meter: CopyMeter | None,
) -> SyncOutcome:
    entry = copy.entry

    def outcome(action: str, message: str) -> SyncOutcome:
        return SyncOutcome(entry, action, message)

    not_ready = ready(entry)  # the target may be the hung mount: ask before touching it
    if not_ready is not None:
        return outcome("waiting", f"{entry.requested} not ready: {not_ready}")
    final = os.path.basename(entry.requested)
    target_dir = _requested_directory(entry.requested)
    try:
        seen = _stat_or_none(final, target_dir)
        if is_superseded(entry, seen):
            if not prune_superseded:
                return outcome(
                    "superseded",
                    f"{entry.requested} is newer than the redirected copy; kept both "
                    "(--prune-superseded removes the copy)",
                )
            if dry_run:
                return outcome("superseded", f"would remove {entry.actual}: the original is newer")
            copy.remove()
            return outcome("pruned", f"removed {entry.actual}: {entry.requested} is newer")
        if dry_run:
            return outcome("would_sync", f"would copy {entry.actual} back to {entry.requested}")
        copied = None
        if meter is not None:
            meter.begin(entry.requested, entry.bytes)
            copied = meter.copied
        try:
            if copy.is_directory:
                action = _copy_directory_back(copy, target_dir, seen, budget, copied)
            else:
                action = _copy_back(copy, target_dir, final, seen, copied)
        except TooManyEntries as error:
            return outcome(
                "too_many_entries",
                f"{entry.actual}: its area {entry.area.path} holds {error.strerror} in its "
                f"directory copies; not synced, left where it is",
            )
        except OSError as error:
            return outcome(
                "failed",
                f"copying back to {entry.requested} failed: {error.strerror or error} "
                f"({name_of(error)}); {entry.requested} left as it was",
            )
        finally:
            if meter is not None:
                meter.end()
    finally:
        os.close(target_dir)
    if action == "checksum_mismatch":
        return outcome(
            "checksum_mismatch",
            f"the copy of {entry.actual} does not have the sha256 the manifest recorded "
            f"({entry.sha256}); {entry.requested} left as it was",
        )
    if action == "superseded":
        return outcome("superseded", f"{entry.requested} was saved anew during the copy; kept it")
    copy.remove()
    return outcome("synced", f"copied {entry.actual} back to {entry.requested} (sha256 verified)")


def _sync_area(
    area: Area,
    under: str | None,
    clean: Callable[[str], object] | None,
    max_entries: int,
    meter: CopyMeter | None,
    **options: Any,
) -> list[SyncOutcome]:
    try:
        live, replaced = latest_per_file(read_manifest(area))
    except OSError as error:
        log.warning("skipping the redirect manifest in %s: %s", area.path, error)
        return []
    if under is not None:
        live = [entry for entry in live if is_under(entry.requested, under)]
        replaced = [entry for entry in replaced if is_under(entry.requested, under)]
    if clean is not None and not options["dry_run"]:  # before the entries empty them
        for directory in sorted({os.path.dirname(e.actual) for e in (*live, *replaced)}):
            clean(directory)
    outcomes = [
        SyncOutcome(entry, "replaced", f"{entry.actual} was overwritten by a later save")
        for entry in replaced
    ]
    budget = EntryBudget(max_entries)  # this area's, for this round
    for entry in sorted(live, key=lambda e: e.time, reverse=True):
        try:
            result = _sync_one(entry, budget=budget, meter=meter, **options)
        except OSError as error:
            result = SyncOutcome(entry, "failed", f"{entry.actual}: {error}")
        outcomes.append(result)
        if result.action in _REPORTED_ONCE:
            continue
        log.log(
            logging.WARNING if result.action in ("failed", "checksum_mismatch") else logging.INFO,
            "sync %s: %s",
            result.action,
            result.message,
        )
    settled = {o.entry for o in outcomes if o.done}
    if settled and not options["dry_run"] and not rewrite(area, settled):
        log.warning(UNLOCKED.format(area.path))
    return outcomes


def _sync_as_owner(
    fallback: str,
    owner: int,
    under: str | None,
    *,
    dry_run: bool,
    prune_superseded: bool,
    state_dir: str | None,
    timeout: float,
    share: float,
) -> list[SyncOutcome] | UnsyncedUser:
    """Root's part for another user's areas: ``fsprobe sync`` run as that user, its report
    read; or why that could not be done. The run is killed once it overruns `share`."""
    arguments = ["sync", "--json", "--fallback-dir", fallback, "--timeout", str(timeout)]
    arguments += ["--state-dir", state_dir or default_state_dir()]
    arguments += ["--dry-run"] * dry_run + ["--prune-superseded"] * prune_superseded
    if under is not None:
        arguments += ["--under", under]
    try:
        report = delegate.run_as(owner, arguments, share)
        outcomes = [SyncOutcome.from_dict(fields, fallback, owner) for fields in report["entries"]]
    except delegate.DelegationTimedOut as error:
        cause = f"{error}: it had {share:.3g} s, its share of the sync round; killed"
        return UnsyncedUser(owner, fallback, cause)
    except (delegate.DelegationFailed, KeyError, TypeError, ValueError) as error:
        return UnsyncedUser(owner, fallback, str(error))  # the caller's to report, once
    for outcome in outcomes:
        if outcome.action not in _REPORTED_ONCE:
            log.info("sync as uid %d %s: %s", owner, outcome.action, outcome.message)
    return outcomes


def fair_order(runs: list[tuple[str, int]], rotation: int) -> list[tuple[str, int]]:
    """`runs` (sorted) starting at the `rotation`-th: each round another user goes first."""
    if not runs:
        return runs
    start = rotation % len(runs)
    return runs[start:] + runs[:start]


def sync(
    fallback_dirs: Iterable[str],
    *,
    dry_run: bool = False,
    prune_superseded: bool = False,
    state_dir: str | None = None,
    timeout: float = 10.0,
    under: str | None = None,
    ready: Readiness,
    clean: Callable[[str], object] | None = None,
    max_entries: int = MAX_AREA_ENTRIES,
    round_seconds: float = ROUND_SECONDS,
    rotation: int = 0,
    meter: CopyMeter | None = None,
) -> SyncReport:
    """Copy pending redirected checkpoints back to where they were asked to go.

    Newest first, so that an older redirected copy of the same path finds the newer one already
    in place and is reported as superseded instead of overwriting it. Settled entries (synced,
    pruned, replaced, missing) leave the manifest; the rest stay for the next run. With `under`,
    only the checkpoints that were meant for that directory (or below it) are handled. `ready`
    decides whether a target can take an entry now (`fsprobe.saving.preflight.preflight_readiness`
    asks a bounded preflight). As root, every other user's area is synced by a run as that user,
    which asks its own preflight (`state_dir` and `timeout` are passed on to it); a user that
    could not be acted for is in the report's `failures`, and the others go on. `clean`
    (`fsprobe.saving.stale.clean_directory`) is given each directory of the user's own areas
    that holds an entry, before its entries are synced: a save killed there (a ``save_dir``'s
    staging directory) left what no later save into the target would remove. The directory
    copies of one area are walked streaming, at most `max_entries` entries in all (a copy past
    that is ``too_many_entries``, and stays); a run as another user uses its own default cap.

    As root, the runs as other users share `round_seconds` equally: one that overruns its
    share is killed with its process group and is a failure of that user for this round, and
    the users after it are synced all the same. They go in the order of `fair_order`: the
    daemon passes its round's number as `rotation`, so that each round another goes first.
    A fallback directory that does not exist is in the report's `missing`. `meter` is shown
    each copy of the user's own areas as it goes (not the runs as other users).
    """
    options: dict[str, Any] = {"dry_run": dry_run, "prune_superseded": prune_superseded}
    report = SyncReport()
    runs: list[tuple[str, int]] = []  # (fallback, uid) of the other users' areas
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        if not os.path.isdir(fallback):  # a typo, or not mounted here: never "nothing to sync"
            report.missing.append(fallback)
            continue
        for area in own_areas(fallback):
            report.outcomes += _sync_area(
                area, under, clean, max_entries, meter, ready=ready, **options
            )
        if os.geteuid() == 0:
            listing = _areas_or_none(fallback)
            if listing.crowded:
                log.error("not every area of %s is synced: %s", fallback, listing.crowded)
                report.crowded.append(listing.crowded)
            others = {area.owner for area in listing} - {0}
            runs += [(fallback, owner) for owner in sorted(others)]
    share = round_seconds / max(1, len(runs))
    for fallback, owner in fair_order(runs, rotation):
        done = _sync_as_owner(
            fallback, owner, under, state_dir=state_dir, timeout=timeout, share=share, **options
        )
        if isinstance(done, UnsyncedUser):
            report.failures.append(done)
        else:
            report.outcomes += done
    return report


def _areas_or_none(fallback: str) -> Areas:
    try:
        return areas(fallback)
    except OSError as error:
        log.warning("cannot list the fallback directory %s: %s", fallback, error)
        return Areas(())
