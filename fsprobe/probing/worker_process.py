"""The probe worker's own side: it runs in the child `fsprobe.probing.worker` starts, and is the
only place of the save path that loads the probes themselves (`fsprobe.probing.probes`)."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any, cast

from fsprobe.lustre.caches import LustreCaches
from fsprobe.posix import children
from fsprobe.probing.probes import bound
from fsprobe.probing.runner import Work, timed_call
from fsprobe.probing.worker import Channel


def _serve(connection: Channel, caches: LustreCaches) -> None:
    send_lock = threading.Lock()

    def run(job: int, probe: str, work: Work) -> None:
        result = timed_call(probe, bound(work, caches))
        with send_lock:
            connection.send((job, result))

    while True:
        try:
            job, probe, work = cast(tuple[int, str, Any], connection.recv())
        except (EOFError, OSError):
            return  # the parent is gone
        threading.Thread(target=run, args=(job, probe, work), daemon=True).start()


def main(argv: list[str]) -> None:
    """The worker's entry point (see `fsprobe.probing.worker.worker_command`); `argv` is the
    channel's fd."""
    children.adopt_orphans()  # what an lfs leaves behind is ours to reap, not init's
    # The parent ends the worker (it closes the channel). A SIGTERM meant for the whole job
    # (Slurm's scancel signals every process of the job, other sessions too) would kill it
    # first, and the parent would report a worker lost before it stops itself. Caught, not
    # ignored: an `lfs` it starts gets the default back at exec.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    # One for the worker's life, shared by every probe thread: one `lfs` call per filesystem
    # and ID per interval, however many targets and callers ask (docs/design.md §7).
    _serve(Channel(socket.socket(fileno=int(argv[0]))), LustreCaches())
    # The parent has gone, nobody wants the probes' answers: their `lfs` runs (each in a
    # session of its own) and what they left behind end with the worker, not after it.
    children.kill_runs()
    children.reap_orphans()
    os._exit(0)  # do not wait for probe threads
