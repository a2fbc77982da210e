"""A checkpoint directory that every rank of a job writes part of, committed once for all:
rank 0 runs the one preflight and the one loop, every rank writes and fsyncs its part
(docs/design.md §7, "One loop for every kind of save" and "Collectives and timeouts").
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from fsprobe.extras import extra_imports

with extra_imports("torch", "fsprobe.distributed", "torch"):
    import torch.distributed as dist

from fsprobe.model import TIMEOUT
from fsprobe.posix.staging import Staging
from fsprobe.posix.tree import open_directory, opened, sync_file_at, sync_tree
from fsprobe.redirect.manifest import sha256_of_directory
from fsprobe.saving.context import SaveContext
from fsprobe.saving.deadline import Progress, bounded
from fsprobe.saving.options import SaveOptions, save_options
from fsprobe.saving.retry import (
    FailedAttempt,
    NextAttempt,
    RetryState,
    SaveError,
    SaveResult,
    SaveSteps,
    attempt_until_done,
    collective_failure,
    deciding,
    failure_of,
    start,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.options import SaveOverrides

log = logging.getLogger("fsprobe.save")

#: What this rank's `write` hands back: the files it wrote (fsynced here), or None (all).
Written = Optional[Iterable[Union[str, os.PathLike[str]]]]  # Python 3.9: no `|` at run time


@dataclass(frozen=True)
class _Outcome:
    """What one rank reports after its part of an attempt."""

    rank: int
    failure: FailedAttempt | None = None
    bug: str | None = None  # not an I/O failure: a bug in `write`; every rank raises


@dataclass(frozen=True)
class _Order:
    """What the coordinator tells every rank: write into `staging`, or return, or raise."""

    staging: str | None = None
    result: SaveResult | None = None
    error: BaseException | None = None


class _Group:
    """The collectives of one save, each turned into a `SaveError` when it cannot complete."""

    def __init__(self, group: Any, requested: str) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.requested = requested

    @property
    def coordinator(self) -> bool:
        return self.rank == 0

    def _failed(self, what: str, error: Exception) -> SaveError:
        return collective_failure(self.rank, self.requested, what, error)

    def broadcast(self, order: _Order | None) -> _Order:
        box = [order]
        try:
            dist.broadcast_object_list(box, group=self.group, group_src=0)
        except Exception as error:  # DistBackendError, RuntimeError from gloo, ...
            raise self._failed("broadcast", error) from error
        order = box[0]
        assert order is not None  # the coordinator always sends one
        return order

    def gather(self, value: Any) -> list[Any]:
        """`value` of every rank, in rank order, on the coordinator ([] elsewhere)."""
        box: list[Any] | None = [None] * self.size if self.coordinator else None
        try:
            dist.gather_object(value, box, group=self.group, group_dst=0)
        except Exception as error:
            raise self._failed("gather", error) from error
        return box or []


def _sync_written(staging: str, written: Written) -> None:
    """fsync what this rank wrote: the files it names, else every file in the directory."""
    with opened(open_directory(staging)) as fd:
        if written is None:
            sync_tree(fd, directories=False)
            return
        for path in written:
            relative = os.path.relpath(os.path.join(staging, os.fspath(path)), staging)
            if relative.startswith(".."):
                raise ValueError(f"{path} is not in the staging directory {staging}")
            sync_file_at(fd, relative)


def _write_part(
    rank: int,
    staging: str,
    write: Callable[[str], Written],
    options: SaveOptions,
) -> tuple[_Outcome, BaseException | None]:
    """This rank's part of an attempt, within `options.save_timeout`; a bug is reported, and
    kept to be raised here after."""

    def part(directory: str, progress: Progress) -> int:
        progress.step = "write"
        written = write(directory)
        if options.fsync:
            progress.step = "fsync"
            _sync_written(directory, written)
        return 0

    try:
        bounded(options.save_timeout, part, staging)
    except FailedAttempt as held:  # TIMEOUT: abandoned at the deadline, left behind
        return _Outcome(rank, failure=_of_rank(rank, held)), None
    except Exception as error:
        failure = failure_of(error, "write", where=staging)
        if failure is None:
            return _Outcome(rank, bug=f"rank {rank}: {error!r}"), error
        return _Outcome(rank, failure=_of_rank(rank, failure)), None
    return _Outcome(rank), None


def _of_rank(rank: int, failure: FailedAttempt) -> FailedAttempt:
    return FailedAttempt(failure.errno, failure.step, f"rank {rank}: {failure.message}")


def _commit(staging: Staging, fsync: bool) -> int:
    """Sync the directories, publish, sync the parent: the bytes (`FailedAttempt` if not)."""
    progress = Progress()
    progress.step = "fsync_dir"
    try:
        size = staging.sync(files=False) if fsync else staging.measure()
        staging.publish(fsync, progress.at)
    except OSError as error:
        raise FailedAttempt.of(error, progress.step) from error
    return size.bytes


def _close(staging: Staging, outcomes: list[_Outcome]) -> None:
    """Close `staging` (removed unless published); in a thread left behind when a rank was
    held past its deadline: removing the file it is stuck on waits as long as that rank does."""
    if any(o.failure is not None and o.failure.errno == TIMEOUT for o in outcomes):
        threading.Thread(target=staging.close, name=f"fsprobe-cleanup {staging.path}").start()
    else:
        staging.close()


def _coordinate(
    group: _Group,
    tries: RetryState,
    write: Callable[[str], Written],
    options: SaveOptions,
) -> SaveResult:
    """The coordinator's side of the protocol (see the module docstring): the attempts of
    every save, each one made by all ranks, each decision announced to them."""

    def attempt(destination: str) -> int:
        try:
            tries.prepare()
            staging = Staging(destination)
        except OSError as error:
            raise FailedAttempt.of(error, "mkdir") from error
        outcomes: list[_Outcome] = []
        try:
            group.broadcast(_Order(staging=staging.path))
            outcome, bug = _write_part(0, staging.path, write, options)
            outcomes = group.gather(outcome)
            bugs = [o.bug for o in outcomes if o.bug is not None]
            if bugs:
                group.broadcast(_Order(error=RuntimeError("; ".join(bugs))))
                raise bug or RuntimeError("; ".join(bugs))
            failure = deciding(o.failure for o in outcomes if o.failure is not None)
            if failure is not None:
                raise failure
            return _commit(staging, options.fsync)
        finally:
            _close(staging, outcomes)

    def announce(decision: NextAttempt | SaveResult | SaveError) -> None:
        if isinstance(decision, SaveResult):
            group.broadcast(_Order(result=decision))
        elif isinstance(decision, SaveError):
            group.broadcast(_Order(error=decision))
        # the next attempt: the other ranks wait for its order meanwhile

    return attempt_until_done(tries, SaveSteps(attempt, sha256_of_directory, announce))


def _follow(group: _Group, write: Callable[[str], Written], options: SaveOptions) -> SaveResult:
    """Every other rank's side: write where told, until told the result or the error."""
    while True:
        order = group.broadcast(None)
        if order.result is not None:
            return order.result
        if order.error is not None:
            raise order.error
        assert order.staging is not None
        outcome, bug = _write_part(group.rank, order.staging, write, options)
        group.gather(outcome)
        if bug is not None:
            group.broadcast(None)  # the coordinator's order to raise: raise our own instead
            raise bug


def save_dir(
    path: str | os.PathLike[str],
    write: Callable[[str], Written],
    *,
    process_group: Any = None,
    options: SaveOptions | None = None,
    context: SaveContext | None = None,
    **overrides: Unpack[SaveOverrides],
) -> SaveResult:
    """Save the directory `path` collectively: every rank of `process_group` calls this.

    Each rank's `write(staging_dir)` writes that rank's files into the one staging directory
    and may return the paths it wrote (relative to it, or absolute): those are the files this
    rank fsyncs. Returning None makes the rank fsync every file in the directory: correct,
    but one fsync per file per rank. `need_bytes` and `need_inodes` are this rank's share
    (summed over the ranks; if any rank leaves `need_bytes` out, the whole directory's last
    size is assumed); `fsync` and `save_timeout` (which bounds this rank's write and fsync,
    each attempt) count as each rank gives them; the other options (`options` and keyword
    overrides, as for `fsprobe.save_dir`) and `context` as the coordinator (rank 0) gives
    them. Returns the same `SaveResult` on every rank, or raises `SaveError` on every rank.
    """
    chosen = save_options(options, overrides)
    group = _Group(process_group, os.path.abspath(os.fspath(path)))
    needs = group.gather((chosen.need_bytes, chosen.need_inodes))
    if not group.coordinator:
        return _follow(group, write, chosen)
    chosen = dataclasses.replace(
        chosen,
        need_bytes=None if any(b is None for b, _ in needs) else sum(b for b, _ in needs),
        need_inodes=None if any(i is None for _, i in needs) else sum(i for _, i in needs),
    )
    try:
        tries = start(group.requested, chosen, ranks=group.size, context=context)
    except SaveError as error:
        group.broadcast(_Order(error=error))
        raise
    return _coordinate(group, tries, write, chosen)
