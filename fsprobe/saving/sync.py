"""`fsprobe sync`: copy redirected checkpoints back once their target can take them again.

`sync` copies a pending checkpoint back (checksum verified on the copy before it is renamed
into place), removes the fallback copy and rewrites the manifest without the entry. It never
overwrites a checkpoint at the original path that is newer than the redirected one, and only
copies a fallback file that is inside that fallback directory and owned by the user running it.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Optional

from fsprobe.paths import is_under
from fsprobe.saving.fallback import remove_mirrored_dirs
from fsprobe.saving.file import atomic_write
from fsprobe.saving.manifest import (
    READ_CHUNK,
    Entry,
    UntrustedManifest,
    latest_per_file,
    read_manifest,
    rewrite,
    sha256_of,
)
from fsprobe.saving.preflight import preflight
from fsprobe.saving.retry import SaveError

log = logging.getLogger("fsprobe.redirect")

#: Whether the target can take `entry` now: None if it can, else why not. The daemon's sync task
#: answers from its own verdict of the target (it runs in the probe worker, where a preflight
#: that probes inline would have to start a worker of its own); `fsprobe sync` asks a preflight.
Readiness = Callable[[Entry], Optional[str]]

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
            while chunk := origin.read(READ_CHUNK):
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


def _sync_one(
    entry: Entry,
    *,
    dry_run: bool,
    prune_superseded: bool,
    state_dir: str | None,
    timeout: float,
    ready: Readiness | None,
) -> SyncOutcome:
    def outcome(action: str, message: str) -> SyncOutcome:
        return SyncOutcome(entry, action, message)

    if not is_under(entry.actual, entry.fallback) or entry.actual == entry.fallback:
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
    # The target may be the hung mount: ask before touching it.
    if ready is None:
        decision = preflight(
            entry.requested,
            need_bytes=entry.bytes,
            redirect=False,
            on_unhealthy="fail",
            state_dir=state_dir,
            timeout=timeout,
        )
        not_ready = decision.summary() if decision.action == "fail" else None
    else:
        not_ready = ready(entry)
    if not_ready is not None:
        return outcome("waiting", f"{entry.requested} not ready: {not_ready}")
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
    ready: Readiness | None = None,
) -> list[SyncOutcome]:
    """Copy pending redirected checkpoints back to where they were asked to go.

    Newest first, so that an older redirected copy of the same path finds the newer one already
    in place and is reported as superseded instead of overwriting it. Settled entries (synced,
    pruned, replaced, missing) leave the manifest; the rest stay for the next run. With `under`,
    only the checkpoints that were meant for that directory (or below it) are handled. `ready`
    decides whether a target can take an entry now; without it, a bounded preflight does.
    """
    outcomes: list[SyncOutcome] = []
    for fallback in dict.fromkeys(os.path.abspath(d) for d in fallback_dirs):
        try:
            live, replaced = latest_per_file(read_manifest(fallback))
        except (UntrustedManifest, OSError) as error:
            log.warning("skipping the redirect manifest in %s: %s", fallback, error)
            continue
        if under is not None:
            live = [entry for entry in live if is_under(entry.requested, under)]
            replaced = [entry for entry in replaced if is_under(entry.requested, under)]
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
                    ready=ready,
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
            rewrite(fallback, settled)
    return outcomes
