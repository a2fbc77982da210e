"""PyTorch Distributed Checkpoint: every rank's shards and the ``.metadata``, committed once.

`FsprobeWriter`, `save`, `async_save`, `load` (docs/integrations.md). Built on private parts
of torch 2.13's DCP filesystem writer, pinned by tests/integrations/test_integration_dcp.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import functools
import logging
import math
import os
import queue
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fsprobe.extras import extra_imports

with extra_imports("torch", __name__, "torch"):
    import torch.distributed as dist
    import torch.distributed.checkpoint as torch_dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.filesystem import (
        FileSystem,
        FileSystemReader,
        FileSystemWriter,
        SerializationFormat,
        StreamTransformExtension,
        _item_size,
        _StoragePrefix,
        _write_files_from_queue,
    )
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        SavePlanner,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.stateful import Stateful
    from torch.futures import Future

from fsprobe.errors import ErrorClass, classify
from fsprobe.posix.atomic import EXCLUSIVE_FLAGS
from fsprobe.posix.tree import open_directory, open_regular, opened
from fsprobe.redirect.copies import copy_bytes, copy_tree
from fsprobe.redirect.locate import locate
from fsprobe.saving.commit import (
    NEED_MARGIN,
    FailedAttempt,
    NextAttempt,
    Progress,
    RetryState,
    SaveContext,
    SaveError,
    SaveOptions,
    SaveResult,
    SaveSteps,
    Staging,
    attempt_until_done,
    collective_failure,
    deciding,
    default_context,
    failure_of,
    save_options,
    sha256_of_directory,
    split_keywords,
    sync_file_at,
)
from fsprobe.units import format_seconds

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.commit import SaveOverrides

    class WriterKeywords(SaveOverrides, total=False):
        """The keyword arguments of `FsprobeWriter`: the save options, and `FileSystemWriter`'s
        own but `sync_files` (the `fsync` option)."""

        single_file_per_rank: bool
        thread_count: int
        per_thread_copy_ahead: int
        cache_staged_state_dict: bool
        overwrite: bool
        _extensions: Sequence[StreamTransformExtension] | None
        serialization_format: SerializationFormat


log = logging.getLogger("fsprobe.save")

_METADATA = ".metadata"
#: The names DCP's `FileSystemWriter` gives what it writes (shards, metadata, its temp name):
#: the part of an existing checkpoint that a new save replaces; anything else is carried over.
_DCP_FILE = re.compile(r"(__\d+_\d+\.distcp|(__\d+)?\.metadata(\.tmp)?)\Z")
#: No bound on what a carried directory holds: it is the user's, copied as it is.
_UNBOUNDED = 1 << 62
#: Bytes assumed for a non-tensor item (a pickled Python object) and for the ``.metadata``.
_SMALL_ITEM_BYTES = 64 * 1024
#: What DCP queues for each file a rank writes: (its path, its file name, its write items).
_FileTask = tuple[Path, str, list[WriteItem]]
_T = TypeVar("_T")
#: The option a DCP save cannot honour: its attempt is DCP's collectives, never abandoned.
_UNHONOURED = ("save_timeout",)
#: The background queue of every DCP checkpoint of a context: one at a time, in order.
_DCP_QUEUE = "torch.distributed.checkpoint"


@dataclasses.dataclass
class _Placement(_StoragePrefix):
    """What a rank's plan carries: its file prefix, where to write, where it will be published."""

    staging: str = ""
    destination: str = ""


class _StagingFileSystem(FileSystem):
    """DCP's local filesystem, with the checkpoint directory mapped to the staging directory.

    The writer's `path` stays the requested checkpoint (it is the checkpoint id DCP records);
    everything DCP writes "in" it goes to the staging directory instead.
    """

    def __init__(self) -> None:
        self.checkpoint: Path | None = None
        self.staging: Path | None = None

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> Path:
        if self.staging is not None and Path(path) == self.checkpoint:
            return self.staging / suffix
        return Path(path) / suffix

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        if Path(path) != self.checkpoint:  # the staging directory is made by the coordinator
            super().mkdir(path)


def carry_over(source_fd: int, target_fd: int) -> list[str]:
    """Copy into the new checkpoint `target_fd` what the one it replaces (`source_fd`) holds
    besides DCP's own files (a config copy, notes, another library's sidecar); their names.

    Plain DCP writes into the existing directory and leaves such files; a save that publishes
    a fresh directory would delete them. Files are hard-linked (no data copied) or else
    copied, directories copied (their owner's files only), symlinks recreated, never followed;
    anything else (a FIFO, a socket) is refused, naming it: nothing is dropped silently.
    """
    carried = []
    for name in sorted(os.listdir(source_fd)):
        if _DCP_FILE.match(name):
            continue
        info = os.stat(name, dir_fd=source_fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=source_fd), name, dir_fd=target_fd)
        elif stat.S_ISREG(info.st_mode):
            _link_or_copy(source_fd, target_fd, name, info)
        elif stat.S_ISDIR(info.st_mode):
            with opened(open_directory(name, source_fd)) as source:
                os.mkdir(name, stat.S_IRWXU, dir_fd=target_fd)
                with opened(open_directory(name, target_fd)) as target:
                    copy_tree(source, target, info.st_uid, _UNBOUNDED)
                    os.fchmod(target, stat.S_IMODE(info.st_mode))
        else:
            raise OSError(
                errno.EPERM,
                f"{name} in the checkpoint is neither a file nor a directory nor a symlink: "
                "the new checkpoint replaces the directory and cannot carry it; move it away",
            )
        carried.append(name)
    return carried


def _link_or_copy(source_fd: int, target_fd: int, name: str, info: os.stat_result) -> None:
    try:
        os.link(name, name, src_dir_fd=source_fd, dst_dir_fd=target_fd, follow_symlinks=False)
        return
    except OSError:
        pass  # another owner's file (protected_hardlinks), a filesystem without links: copy
    with opened(open_regular(name, source_fd)) as source:
        created = os.open(name, EXCLUSIVE_FLAGS, 0o600, dir_fd=target_fd)
        with opened(created) as target:
            copy_bytes(source, target, info.st_size)
            os.fchmod(target, stat.S_IMODE(info.st_mode))


def retried_in_place(write: Callable[[], _T], options: SaveOptions, name: str) -> _T:
    """`write()` of one file of a rank (`name`), written again from scratch after a transient
    failure, at most `options.attempts` times in all with `options.backoff` between; any other
    failure, or the last, fails the attempt it is part of (for the coordinator to decide). No
    save of its own: never reported to the daemon, nor remembered."""
    number = 1
    while True:
        try:
            return write()
        except FailedAttempt as failure:
            kind = classify(failure.errno, failure.step)
            final = kind is not ErrorClass.TRANSIENT or number == options.attempts
            wait = 0.0 if final else options.backoff.delay(number)
            log.warning(
                "save %s: attempt %d/%d failed at %s with %s (%s): %s; %s",
                *(name, number, options.attempts, failure.step, failure.errno, kind.value),
                failure.message,
                "failing the attempt it is part of"
                if final
                else (f"retrying in {format_seconds(wait)}" if wait else "retrying now"),
            )
            if final:
                raise failure.bare() from None
        options.backoff.sleep(wait)
        number += 1


def _planned_bytes(plans: list[SavePlan]) -> tuple[int, int]:
    """(bytes, files) the plans of every rank will write, with room for the ``.metadata``."""
    nbytes = _SMALL_ITEM_BYTES
    for plan in plans:
        for item in plan.items:
            is_bytes = item.type == WriteItemType.BYTE_IO
            nbytes += _SMALL_ITEM_BYTES if is_bytes else _item_size(item)
    return math.ceil(nbytes * NEED_MARGIN), len(plans) + 1


class FsprobeWriter(FileSystemWriter):
    """A DCP `StorageWriter` that stages, retries per file, and commits in `finish()`.

    `options` and keyword overrides of its fields are those of `fsprobe.save_dir` (read on
    the coordinator); `attempts` and `backoff` also bound the retries of a transient error per
    file (`retried_in_place`). What the save needs is planned from every rank's items, or
    what `need_bytes` and `need_inodes` say if more; `fsync` is passed to DCP as `sync_files`;
    an attempt, DCP's collectives, is never abandoned: `save_timeout` is refused. `context` is
    `fsprobe.saving.commit.default_context()` unless given. The other keyword arguments are
    `FileSystemWriter`'s. `last_result` is the `SaveResult` of the last checkpoint committed by
    this writer (on the coordinator; None on the other ranks).
    """

    fs: _StagingFileSystem  # DCP's `FileSystem`, with the staging directory mapped in

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        options: SaveOptions | None = None,
        context: SaveContext | None = None,
        **kwargs: Unpack[WriterKeywords],
    ) -> None:
        overrides, writer_kwargs = split_keywords(kwargs)
        # checked before anything else
        self.options = save_options(options, overrides, _UNHONOURED, "FsprobeWriter")
        self.context = context or default_context()
        super().__init__(
            os.path.abspath(os.fspath(path)), sync_files=self.options.fsync, **writer_kwargs
        )
        self.fs = _StagingFileSystem()
        self.fs.checkpoint = Path(self.path)
        self.last_result: SaveResult | None = None
        self._attempts: RetryState | None = None  # the coordinator's, of the attempt running
        self._driven: RetryState | None = None  # the checkpoint whose attempts `save` makes
        self._staging: Staging | None = None  # the coordinator's, until published or dropped
        self._committed = 0  # the bytes `finish` published

    # -- the attempts of one checkpoint (made by `save` and `async_save` below) ----------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            checkpoint_id = os.path.abspath(os.fspath(checkpoint_id))
        super().reset(checkpoint_id)
        self.fs.checkpoint, self.fs.staging = Path(self.path), None

    @contextlib.contextmanager
    def driven(self, requested: str) -> Iterator[RetryState]:
        """On the coordinator, for `save`: the `RetryState` of a new checkpoint of `requested`,
        each `dcp.save` meanwhile one attempt at it (plain DCP's each a checkpoint of its own)."""
        self._driven = RetryState(requested, self.options, context=self.context)
        try:
            yield self._driven
        finally:
            self._driven = None
            self.drop_staging()

    def drop_staging(self) -> None:
        """Remove the staging directory of an attempt that did not commit."""
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    # -- StorageWriter ---------------------------------------------------------------------

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        if not self.use_collectives:
            raise ValueError(
                "FsprobeWriter commits one checkpoint for all ranks: it needs use_collectives=True"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """DCP's own check of an existing checkpoint (``overwrite``), on every rank, before
        anything is written; its mkdir of the checkpoint is skipped (`_StagingFileSystem`)."""
        return super().prepare_local_plan(plan)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: the destination of this attempt, prepared, its staging dir.

        The first attempt at a checkpoint runs its preflight, for every rank's planned bytes.
        """
        self.drop_staging()  # of an earlier `dcp.save` that failed without `save` to clean up
        state = self._driven or RetryState(str(self.path), self.options, context=self.context)
        if state is not self._attempts:  # its first attempt: DCP's plan says what it needs
            need_bytes, need_inodes = _planned_bytes(plans)
            given = state.options
            state.options = dataclasses.replace(
                given,
                need_bytes=max(need_bytes, given.need_bytes or 0),
                need_inodes=max(need_inodes, given.need_inodes or 0),
            )
            state.ranks = len(plans)
            state.preflight()  # SaveError: not this checkpoint, not anywhere
        self._attempts = state
        destination = state.destination
        try:
            state.prepare()
            self._staging = Staging(destination)
        except OSError as error:
            raise FailedAttempt.of(error, "mkdir") from error
        return [
            dataclasses.replace(
                plan,
                storage_data=_Placement(
                    prefix=f"__{rank}_", staging=self._staging.path, destination=destination
                ),
            )
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[Any]]:
        placement: _Placement = plan.storage_data
        self.fs.staging = Path(placement.staging)
        return super().write_data(plan, planner)

    def _write_data(
        self, planner: SavePlanner, file_queue: queue.Queue[_FileTask]
    ) -> Future[list[Any]]:
        """Write every file of this rank, each retried on a transient error."""
        tasks = []
        while not file_queue.empty():
            tasks.append(file_queue.get_nowait())
        workers = min(self.thread_count, len(tasks))
        if workers <= 1:  # as DCP does: in the calling thread
            written = [self._write_file(planner, task) for task in tasks]
        else:
            with concurrent.futures.ThreadPoolExecutor(workers, "fsprobe-dcp-write") as pool:
                written = list(pool.map(lambda task: self._write_file(planner, task), tasks))
        future: Future[list[Any]] = Future()
        future.set_result([result for results in written for result in results])
        return future

    def _write_file(self, planner: SavePlanner, task: _FileTask) -> list[Any]:
        """One file of this rank's shards: a part of the attempt, written again from scratch
        after a transient error (`retried_in_place`)."""

        def write() -> list[Any]:
            tasks: queue.Queue[_FileTask] = queue.Queue()
            tasks.put(task)
            results: queue.Queue[list[Any]] = queue.Queue()
            try:
                _write_files_from_queue(
                    create_stream=self.fs.create_stream,
                    file_queue=tasks,
                    result_queue=results,
                    planner=planner,
                    transforms=self.transforms,
                    inflight_threshhold=self.per_thread_copy_ahead,
                    use_fsync=self.sync_files,
                    thread_count=1,
                    serialization_format=self.serialization_format,
                )
            except Exception as error:
                failure = failure_of(error, "write")
                if failure is None:
                    raise
                message = f"rank {self.rank}: {task[0]}: {failure.message}"
                raise FailedAttempt(failure.errno, failure.step, message) from error
            written: list[Any] = results.get_nowait()
            return written

        return retried_in_place(write, self.options, str(task[0]))

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        """On the coordinator: ``.metadata`` into the staging dir, then publish it whole."""
        assert self._staging is not None and self._staging.fd is not None
        assert self._attempts is not None
        self.fs.staging = Path(self._staging.path)
        super().finish(metadata, results)
        progress = Progress()
        try:
            progress.at("carry")
            self._carry_over()
            progress.at("fsync")
            if self.sync_files:
                # torch 2.13 fsyncs the .metadata before Python's buffer is flushed into it
                # (pickle.dump, then os.fsync, then close): the data itself is synced here.
                sync_file_at(self._staging.fd, _METADATA)
                progress.at("fsync_dir")
            size = self._staging.sync(files=False) if self.sync_files else self._staging.measure()
            self._staging.publish(self.sync_files, progress.at)
        except OSError as error:
            raise FailedAttempt.of(error, progress.step) from error
        finally:
            self.drop_staging()
        self._committed = size.bytes
        if self._attempts is not self._driven:  # plain DCP: this attempt is the whole save
            self.last_result = self._attempts.succeeded(size.bytes, sha256_of_directory)

    def _carry_over(self) -> None:
        """The files of the checkpoint being replaced that DCP did not write, into the new one:
        from the destination, or (a first redirect) from the requested path."""
        staging = self._staging
        assert staging is not None and staging.fd is not None and self._attempts is not None
        places = [staging.final]
        if staging.final != str(self.path):
            places.append(str(self.path))
        for place in places:
            parent, name = os.path.split(place)
            try:
                with opened(os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)) as up:
                    source = open_directory(name, up)
            except OSError as error:
                if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # no checkpoint there (a symlink is not one: publish refuses it)
                raise
            with opened(source):
                carried = carry_over(source, staging.fd)
            if carried:
                log.info(
                    "dcp save %s: carried %s from %s into the new checkpoint",
                    self.path,
                    ", ".join(carried),
                    place,
                )
            return


# -- save, async_save, load -------------------------------------------------------------------


def _verdict(error: CheckpointException) -> FailedAttempt | SaveError | None:
    """On the coordinator, after a failed `dcp.save`: the failure that decides what comes
    next (of every rank's), the preflight's `SaveError` (final), or None when some rank failed
    for another reason than I/O (a bug)."""
    failures = []
    for rank, (exception, _trace) in sorted(error.failures.items()):
        if isinstance(exception, SaveError):  # the preflight said no: that is final
            return exception
        failure = exception if isinstance(exception, FailedAttempt) else None
        failure = failure or failure_of(exception, "write")
        if failure is None:
            return None
        if not failure.message.startswith("rank "):
            failure = FailedAttempt(failure.errno, failure.step, f"rank {rank}: {failure.message}")
        failures.append(failure)
    return deciding(failures)


def _is_coordinator(group: Any) -> bool:
    return not dist.is_initialized() or dist.get_rank(group) == 0


def _broadcast(value: _T, group: Any) -> _T:
    """The coordinator's `value` on every rank (itself without torch.distributed)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]


def save(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    process_group: Any = None,
    planner: SavePlanner | None = None,
    writer: FsprobeWriter | None = None,
    context: SaveContext | None = None,
    **writer_kwargs: Unpack[WriterKeywords],
) -> SaveResult:
    """`torch.distributed.checkpoint.save` of `state_dict` to `path`, committed whole, retried.

    Every rank calls it. A failed attempt (after per-file retries) is retried as a whole, and
    capacity or permanent errors move every rank to a fallback together; returns the same
    `SaveResult` on every rank, or raises `SaveError` (a bug in a rank's state raises DCP's
    `CheckpointException`). `writer_kwargs` and `context` make the `FsprobeWriter`
    (``options``, ``fallback_dirs``, ``attempts``, ``thread_count``...), or pass your own
    `writer`.
    """
    writer = writer or FsprobeWriter(path, context=context, **writer_kwargs)
    requested = os.path.abspath(os.fspath(path))
    coordinator = _is_coordinator(process_group)

    def attempt() -> int:
        """One `dcp.save` by every rank, into the destination the writer's plan takes from
        the attempts; on the coordinator, a failed one as `attempt_until_done` takes it."""
        try:
            torch_dcp.save(
                state_dict,
                checkpoint_id=requested,
                storage_writer=writer,
                planner=planner,
                process_group=process_group,
            )
        except RuntimeError as error:  # not DCP's: a collective failed (a rank died or hung)
            writer.drop_staging()
            rank = dist.get_rank(process_group) if dist.is_initialized() else 0
            raise collective_failure(rank, requested, "DCP collectives", error) from error
        except CheckpointException as error:
            if not coordinator:
                raise
            writer.drop_staging()
            verdict = _verdict(error)
            if isinstance(verdict, FailedAttempt):
                raise verdict from error  # decided and announced by `attempt_until_done`
            _broadcast(verdict, process_group)  # the end: told to every rank here
            if verdict is None:
                raise  # a bug (not an I/O failure) on some rank: DCP's own exception
            raise verdict from error
        return writer._committed

    if not coordinator:
        return _follow(attempt, process_group)
    with writer.driven(requested) as state:
        steps = SaveSteps(
            lambda destination: attempt(),  # the writer's plan knows where
            sha256_of_directory,
            functools.partial(_broadcast, group=process_group),
        )
        writer.last_result = attempt_until_done(state, steps)
    return writer.last_result


def _follow(attempt: Callable[[], int], group: Any) -> SaveResult:
    """Every other rank's side: each attempt with the coordinator, until it says the result
    or the error."""
    while True:
        failed: CheckpointException | None = None
        try:
            attempt()
        except CheckpointException as error:
            failed = error
        order: NextAttempt | SaveResult | SaveError | None = _broadcast(None, group)
        if isinstance(order, SaveResult):
            return order
        if isinstance(order, SaveError):
            raise order from failed
        if order is None:  # a bug on some rank: DCP's own exception, as the coordinator's
            assert failed is not None
            raise failed


def async_save(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    process_group: Any = None,
    planner: SavePlanner | None = None,
    context: SaveContext | None = None,
    **writer_kwargs: Unpack[WriterKeywords],
) -> concurrent.futures.Future[SaveResult]:
    """`save` in the background: the caller pays for a copy of the tensors to CPU memory only.

    Every rank calls it; the returned future holds what `save` returns or raises. The writes,
    their retries and redirects, and the collectives run in a thread of their own: give it a
    process group of its own (``dist.new_group(backend="gloo")``) if the training loop runs
    collectives on the default group meanwhile. Its thread is one of `context`'s background
    writers: DCP checkpoints are written one at a time, in order (every rank runs their
    collectives in the same order), and `fsprobe.wait_saves` and interpreter exit wait for them.
    """
    writer = FsprobeWriter(path, context=context, **writer_kwargs)

    def prepare() -> Callable[[], SaveResult]:
        flat = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
        staged = writer.stage(flat)
        return lambda: save(
            staged, path, process_group=process_group, planner=planner, writer=writer
        )

    return writer.context.background().submit(str(writer.path), prepare, queue=_DCP_QUEUE)


def load(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    fallback_dirs: Iterable[str | os.PathLike[str]] = (),
    process_group: Any = None,
    **load_kwargs: Any,
) -> str:
    """`torch.distributed.checkpoint.load` from where the checkpoint `path` landed.

    The newest committed copy (`fsprobe.locate`): `path` itself, or its redirected copy in one
    of `fallback_dirs` (plus ``FSPROBE_FALLBACK_DIRS``) if that is newer. The coordinator
    decides, every rank loads the same one. Returns the directory loaded.
    """
    where = os.fspath(path)  # on the other ranks, replaced by the coordinator's
    if _is_coordinator(process_group):
        where = locate(path, fallback_dirs=fallback_dirs)
    where = _broadcast(where, process_group)
    torch_dcp.load(
        state_dict,
        storage_reader=FileSystemReader(where),
        process_group=process_group,
        **load_kwargs,
    )
    return where
