"""`fsprobe.save_async()` and `fsprobe.wait_saves()`: a snapshot in the training thread
(`cpu_copy`), the save itself on the context's writers (`writers`); docs/saving.md.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from fsprobe.extras import import_extra
from fsprobe.saving.context import SaveContext, default_context
from fsprobe.saving.cpu_copy import cpu_copy
from fsprobe.saving.file import write_file
from fsprobe.saving.options import SaveOptions, save_options, split_keywords
from fsprobe.saving.retry import SaveResult

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from fsprobe.saving.options import SaveKeywords


def save_async(
    obj: object,
    path: str | os.PathLike[str],
    *,
    options: SaveOptions | None = None,
    context: SaveContext | None = None,
    **kwargs: Unpack[SaveKeywords],
) -> Future[SaveResult]:
    """`fsprobe.save(obj, path, ...)` in the background of `context`; returns its `Future`.

    Returns once `obj` is snapshotted (its tensors copied to CPU memory); the future's result
    is the `SaveResult`, or its exception the `SaveError` (or whatever else the save raised).
    Saves of the same path are written one at a time, in the order they were made. Arguments
    the save would refuse (a wrong option, a keyword `torch.save` does not take, a file
    object) are refused here, at once, not hours later on the future.
    """
    torch = import_extra("torch", "torch", "fsprobe.save_async")  # on use, as fsprobe.save
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"fsprobe.save_async needs a path, not {type(path).__name__}: a file object the "
            "caller holds cannot be written behind its back (use fsprobe.save)"
        )
    overrides, torch_save_kwargs = split_keywords(kwargs)
    chosen = save_options(options, overrides)
    inspect.signature(torch.save).bind(obj, None, **torch_save_kwargs)
    requested = os.path.abspath(os.fspath(path))  # now: the cwd may change before the write
    context = context or default_context()

    stop = threading.Event()  # set by the writers when the process is interrupted

    def prepare() -> Callable[[], SaveResult]:
        copied = cpu_copy(obj)
        return lambda: write_file(
            requested,
            lambda stream: torch.save(copied, stream, **torch_save_kwargs),
            chosen,
            context,
            stop,
        )

    return context.background().submit(requested, prepare, stop=stop)


def wait_saves(timeout: float | None = None, *, context: SaveContext | None = None) -> None:
    """Wait until every background save of `context` (of this process, by default) has
    finished, failed or not: `save_async`'s and DCP's `async_save`'s.

    Raises `TimeoutError` (`concurrent.futures.TimeoutError`) if some are still running after
    `timeout` seconds. Failures are on each save's future (and in the log), not raised here.
    """
    (context or default_context()).background().wait(timeout)
