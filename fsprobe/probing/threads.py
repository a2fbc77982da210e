"""Running probes in threads of this process instead of the worker."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from fsprobe.lustre.caches import LustreCaches
from fsprobe.probing.probes import bound
from fsprobe.probing.runner import ProbeRunner, Work, timed_call
from fsprobe.probing.worker import share_runner


class ThreadExecutor:
    """Runs each probe in a daemon thread of this process.

    Cheap, and enough where nothing has to exit while a mount hangs (tests, short-lived
    helpers); a thread stuck in the kernel keeps its process from exiting, which is why the
    CLI, the daemon and the save hook use `fsprobe.probing.worker.ProcessExecutor` instead.
    Its probes share `caches` (a new `LustreCaches` unless given).
    """

    def __init__(self, caches: LustreCaches | None = None) -> None:
        self.caches = caches or LustreCaches()

    def submit(self, probe: str, work: Work) -> Future:
        future: Future = Future()

        def run() -> None:
            future.set_result(timed_call(probe, bound(work, self.caches)))

        threading.Thread(target=run, name=f"fsprobe-{probe}", daemon=True).start()
        return future


def probe_in_threads() -> None:
    """Make this process's shared runner probe in threads of its own, never in a worker.

    For root's run of ``fsprobe sync`` as a user (`fsprobe.redirect.delegate`), which gave up
    root without ``exec`` so that the user cannot trace it: a worker it started would be the
    user's own process, which she could trace and so run her code in root's service, with the
    limits the run got from root. A probe stuck in the kernel then holds a thread of the run,
    which root's deadline kills with the run; nothing of the user's outlives it.
    """
    share_runner(ProbeRunner(ThreadExecutor()))
