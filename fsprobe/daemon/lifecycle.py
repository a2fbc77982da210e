"""Start, reload, stop: `fsprobe run` as a process a supervisor can trust (docs/design.md §8)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import time
from collections.abc import Callable

from fsprobe import __version__
from fsprobe.daemon import logs
from fsprobe.daemon.config import Config, ConfigError
from fsprobe.daemon.logs import event
from fsprobe.daemon.lustre_memory import LustreMemory
from fsprobe.daemon.memory import boot_id, read_memory
from fsprobe.daemon.publish import Publisher
from fsprobe.daemon.scheduler import Scheduler, log_result, planned_probes, target_spec
from fsprobe.daemon.store import Store
from fsprobe.daemon.tasks import run_tasks_once
from fsprobe.events.receive import Receiver
from fsprobe.exporters.exposition import Exposition, ReloadStatus
from fsprobe.exporters.server import MetricsServer
from fsprobe.exporters.textfile import open_textfile_dir
from fsprobe.exporters.view import TargetView
from fsprobe.exporters.webconfig import WebConfigError, load_web_config
from fsprobe.posix.outputdir import OutputDirectory, UntrustedOutput
from fsprobe.probing.plan import run_plans
from fsprobe.probing.worker import shared_runner
from fsprobe.state import StateFileError, WriterLock, ensure_state_dir

#: How often the main thread looks at the scheduler's health, in seconds.
SUPERVISE_EVERY = 1.0


class StartupError(Exception):
    """The daemon cannot start as configured; the message says what to change."""


def _check_outputs(config: Config) -> None:
    """Refuse at start what would otherwise fail on every write."""
    try:
        ensure_state_dir(config.state_dir)
    except (OSError, StateFileError) as error:
        raise StartupError(f"state dir {config.state_dir}: {error}") from None
    if config.textfile_dir:
        try:
            open_textfile_dir(config.textfile_dir).close()
        except (OSError, UntrustedOutput) as error:
            raise StartupError(f"textfile dir {config.textfile_dir}: {error}") from None
        if not os.access(config.textfile_dir, os.W_OK | os.X_OK):
            raise StartupError(f"textfile dir {config.textfile_dir} is not a writable directory")


def _lock_state_dir(state_dir: str) -> WriterLock:
    """Become the one writer of `state_dir`, or refuse: two writers would overwrite each
    other's state file, and `fsprobe status` would show one under the other's pid."""
    lock = WriterLock(state_dir)
    try:
        lock.acquire()
    except (OSError, StateFileError) as error:
        raise StartupError(str(error)) from None
    return lock


def _directory(lock: WriterLock) -> OutputDirectory:
    """The state dir that a held `lock` opened."""
    assert lock.directory is not None, "the writer lock is held"
    return lock.directory


class Daemon:
    """The long-running `fsprobe run`: scheduler, store, outputs and the metrics endpoint."""

    def __init__(self, config: Config, reload: Callable[[], Config]) -> None:
        self.config = config
        self._reload = reload
        self.store = Store()
        self.exposition = Exposition(
            self.store.views,
            dropped_events=self._dropped_events,
            internal_errors=self.store.internal_errors,
        )
        self.exposition.reload_status = ReloadStatus(True, time.time())
        #: What the daemon saw of each Lustre target beyond the imports' state history.
        self.lustre = LustreMemory()
        self.publisher = Publisher(
            self.store.views,
            self.exposition,
            config.state_dir,
            config.textfile_dir,
            memory=self.store.memory,
            lustre=self.lustre,
        )
        self.scheduler = Scheduler(self.store, self.publisher.publish, shared_runner(), self.lustre)
        self.server: MetricsServer | None = None
        self.receiver: Receiver | None = None
        self._lock: WriterLock | None = None
        self._trouble: str | None = None

    def start(self) -> None:
        """Check the outputs, lock the state dir, bind the endpoint, start probing.

        StartupError if any of it is impossible; nothing is left held then.
        """
        _check_outputs(self.config)
        try:
            web = load_web_config(self.config.web_config)
        except WebConfigError as error:
            raise StartupError(str(error)) from None
        self._lock = _lock_state_dir(self.config.state_dir)
        self.publisher.state_dir = _directory(self._lock)
        boot, remembered, lustre = read_memory(_directory(self._lock), len(self.config.targets))
        self.store.recall(remembered, same_boot=bool(boot) and boot == boot_id())
        self.lustre.restore(lustre)  # a loss or an eviction is the filesystem's, any boot
        try:
            self.server = MetricsServer(
                self.config.listen_address, self.exposition.render, web, self.scheduler.health
            )
        except OSError as error:
            self._lock.release()
            raise StartupError(f"cannot listen on {self.config.listen}: {error}") from None
        self.scheduler.configure(self.config.targets)
        self.scheduler.start()
        self.server.start()
        self._listen_for_saves(self.config.state_dir)
        event(
            logging.INFO,
            "started",
            version=__version__,
            pid=os.getpid(),
            metrics=self.server.url,
            targets=len(self.config.targets),
            state_dir=self.config.state_dir,
            textfile_dir=self.config.textfile_dir,
            config=self.config.source,
        )

    def reload(self) -> bool:
        """Re-read the configuration; keep the running one if the new one is bad (and say so
        in ``fsprobe_config_last_reload_successful``)."""
        loaded = self._reloaded()
        status = self.exposition.reload_status
        if loaded:
            self.exposition.reload_status = ReloadStatus(True, time.time())
        elif status is not None:
            self.exposition.reload_status = ReloadStatus(False, status.success_at)
        self.publisher.publish()  # the textfile says so too
        return loaded

    def _reloaded(self) -> bool:
        try:
            config = self._reload()
            web = load_web_config(config.web_config)
            _check_outputs(config)
        except (ConfigError, WebConfigError, StartupError) as error:
            event(logging.ERROR, "reload_failed", message=error)
            return False
        if config.listen != self.config.listen:
            event(
                logging.WARNING,
                "reload_listen_ignored",
                listen=self.config.listen,
                wanted=config.listen,
                message="a new listen address takes effect on restart",
            )
            config = dataclasses.replace(config, listen=self.config.listen)
        if config.state_dir != self.config.state_dir:
            try:
                lock = _lock_state_dir(config.state_dir)
            except StartupError as error:
                event(logging.ERROR, "reload_failed", message=error)
                return False
            if self._lock is not None:
                self._lock.release()
            self._lock = lock
            self._listen_for_saves(config.state_dir)
            self.publisher.state_dir = _directory(lock)
        logs.configure(config.log_level)
        self.publisher.textfile_dir = config.textfile_dir
        if self.server is not None:
            self.server.reconfigure(web)
        self.scheduler.configure(config.targets)
        self.config = config
        event(logging.INFO, "reloaded", targets=len(config.targets), config=config.source)
        return True

    def _listen_for_saves(self, state_dir: str) -> None:
        """Receive save events in `state_dir` (instead of the earlier one). A socket that
        cannot be made is logged: the probes go on without the saves' news."""
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None
        store = self.scheduler.store
        receiver = Receiver(state_dir, self.scheduler.saved, store.owner_uids, store.target_of)
        try:
            receiver.start()
        except OSError as error:
            event(logging.ERROR, "save_events_unavailable", state_dir=state_dir, message=error)
            return
        self.receiver = receiver

    def _dropped_events(self) -> dict[str, int]:
        receiver = self.receiver
        return dict(receiver.dropped()) if receiver is not None else {}

    def stop(self) -> None:
        if self.receiver is not None:
            self.receiver.stop()
            self.receiver = None
        self.scheduler.stop(timeout=0.5)
        if self.server is not None:
            self.server.stop()
        if self._lock is not None:
            self.publisher.publish_stopped()
            self.publisher.close()
            self._lock.release()
            self._lock = None
        event(logging.INFO, "stopped", pid=os.getpid())

    def supervise(self) -> bool:
        """Look at the scheduler once: say when it stops (or starts again) turning; True when
        its loop died and the daemon must go."""
        trouble = self.scheduler.health()
        if trouble != self._trouble:
            self.publisher.publish_failure(trouble)
            self._trouble = trouble
            if trouble is not None:
                event(logging.ERROR, "not_probing", message=trouble)
            else:
                event(logging.INFO, "probing_again")
        return self.scheduler.died

    def run_until_signalled(self) -> str | None:
        """Start, then serve until SIGTERM or SIGINT (None) or until the scheduler's loop died
        (why it did); SIGHUP reloads."""
        with _signal_pipe((signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) as signals:
            self.start()
            try:
                while True:
                    received = signals(SUPERVISE_EVERY)
                    if signal.SIGHUP in received:
                        self.reload()
                    if signal.SIGTERM in received or signal.SIGINT in received:
                        return None
                    if self.supervise():
                        return self.scheduler.health()
            finally:
                self.stop()


@contextlib.contextmanager
def _signal_pipe(numbers: tuple[int, ...]):
    """Route `numbers` to a pipe; yields a function that waits up to its timeout for the next
    ones and returns them (none when the time ran out)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {number: signal.signal(number, lambda *_: None) for number in numbers}

    def wait(timeout: float) -> set[int]:
        ready, _, _ = select.select([read_fd], [], [], timeout)
        return set(os.read(read_fd, 256)) if ready else set()

    try:
        yield wait
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(read_fd)
        os.close(write_fd)


def run_once(config: Config) -> tuple[TargetView, ...]:
    """One round of every probe of every target, then of every task, outputs written; returns
    every target's view (the caller prints them, and exits with the worst status).

    For cron: nothing is served; each probe and task is bounded by its deadline.
    """
    _check_outputs(config)
    lock = _lock_state_dir(config.state_dir)
    try:
        store = Store()
        exposition = Exposition(
            store.views, process_metrics=False, internal_errors=store.internal_errors
        )
        publisher = Publisher(
            store.views, exposition, _directory(lock), config.textfile_dir, once=True
        )
        store.configure(target_spec(target) for target in config.targets)
        plans = {target.path: planned_probes(target) for target in config.targets}
        runner = shared_runner()
        for path, results in run_plans(plans, runner).items():
            for result in results.values():
                before = store.view(path)
                after = store.record(path, result)
                if after is not None:
                    log_result(before, after, result)
        run_tasks_once(config.targets, store, runner.executor)
        publisher.publish(store.views())
        publisher.close()
    finally:
        lock.release()
    return store.views()
