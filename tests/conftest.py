"""Fixtures for the whole suite: real filesystems that fail for real (docs/design.md §9).

- ``tmpfs``: a factory, ``tmpfs(size="1M", nr_inodes=None) -> Tmpfs``; the mount is at
  ``.path``, a fresh directory, and goes away after the test. Real ENOSPC, real inode
  exhaustion (see :mod:`tests.support.tmpfs` for ``fill_inodes`` / ``fill_bytes``).
- ``faultfs``: a mounted FUSE fault filesystem (:class:`tests.support.faultmount.FaultFS`)
  over an empty backing directory: ``.mountpoint``, ``.backing``, and ``.ctl``, the control
  client (:class:`tests.support.faultctl.FaultControl`) that injects errors, delays, blocked
  calls, quota and statfs numbers.
- ``faultfs_factory``: ``faultfs_factory(backing=None, mountpoint=None, **options)`` for more
  than one fault filesystem, or one over a backing directory of the test's choosing (a tmpfs,
  say, to combine injected faults with a real ENOSPC); `options` go to ``FaultFS``
  (``direct_io``, ``max_block``).

A test that uses any of them is marked ``mount`` automatically. Where the machine cannot
mount (not root, no /dev/fuse, no fusermount3, a probe mount fails) such a test is skipped
with the reason, or fails with it when ``FSPROBE_REQUIRE_MOUNT_TESTS=1``. Teardown releases
blocked calls and unmounts even when the test failed halfway; a fault filesystem whose own code
raised (its log shows a traceback) fails the test at teardown, since such a bug reaches the
caller only as a bare EINVAL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.support.capability import fuse_problem, require, tmpfs_problem
from tests.support.faultmount import FaultFS
from tests.support.prometheus import Prometheus
from tests.support.tmpfs import Tmpfs
from tests.support.users import LocalUsers, SharedPython, users_problem

MOUNT_FIXTURES = frozenset({"tmpfs", "faultfs", "faultfs_factory"})


#: What makes a test slow by itself: a mount, a second account, a real Prometheus.
SLOW_FIXTURES = MOUNT_FIXTURES | {"local_users", "shared_python", "prometheus_for"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if MOUNT_FIXTURES & fixtures:
            item.add_marker(pytest.mark.mount)
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_daemon_state_from_the_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A test sees no fsprobe daemon state and no fallback directories unless it makes them.

    The save hook reads both from the environment (FSPROBE_STATE_DIR, FSPROBE_FALLBACK_DIRS);
    a developer's own daemon must not change what a test decides.
    """
    monkeypatch.setenv("FSPROBE_STATE_DIR", str(tmp_path / "no-state"))
    monkeypatch.delenv("FSPROBE_FALLBACK_DIRS", raising=False)


@pytest.fixture
def tmpfs() -> Iterator[Callable[..., Tmpfs]]:
    require(tmpfs_problem())
    mounted: list[Tmpfs] = []

    def make(size: str | int = "1M", nr_inodes: int | None = None, mode: int = 0o755) -> Tmpfs:
        fs = Tmpfs(size=size, nr_inodes=nr_inodes, mode=mode)
        fs.mount()
        mounted.append(fs)
        return fs

    yield make
    errors = []
    for fs in reversed(mounted):
        try:
            fs.unmount()
        except (RuntimeError, OSError) as exc:
            errors.append(str(exc))
    if errors:
        pytest.fail("tmpfs teardown: " + "; ".join(errors), pytrace=False)


@pytest.fixture
def faultfs_factory(tmp_path: Path) -> Iterator[Callable[..., FaultFS]]:
    require(fuse_problem())
    started: list[FaultFS] = []

    def make(
        backing: Path | None = None, mountpoint: Path | None = None, **options: Any
    ) -> FaultFS:
        home = tmp_path / f"faultfs{len(started)}"
        if backing is None:
            backing = home / "backing"
            backing.mkdir(parents=True)
        if mountpoint is None:
            mountpoint = home / "mnt"
            mountpoint.mkdir(parents=True)
        fs = FaultFS(backing, mountpoint, **options)
        started.append(fs)
        return fs.start()

    yield make
    errors = []
    for fs in reversed(started):
        try:
            fs.stop()
        except (RuntimeError, OSError) as exc:
            errors.append(f"{fs.mountpoint}: {exc}")
        if fs.problems():
            errors.append(f"{fs.mountpoint}: the filesystem itself failed:\n{fs.output}")
    if errors:
        pytest.fail("faultfs teardown:\n" + "\n".join(errors), pytrace=False)


@pytest.fixture
def faultfs(faultfs_factory: Callable[..., FaultFS]) -> FaultFS:
    return faultfs_factory()


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Callable[..., Prometheus]]:
    """A factory: ``prometheus_for("127.0.0.1:PORT", rule_files=[...])`` starts a real
    Prometheus scraping that address every second, ready to query; stopped after the test."""
    started: list[Prometheus] = []

    def start(
        scrape_target: str, rule_files: Sequence[Path] = (), alertmanager: str | None = None
    ) -> Prometheus:
        home = tmp_path / f"prometheus{len(started)}"
        home.mkdir()
        server = Prometheus(home, scrape_target, rule_files, alertmanager)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def shared_python() -> Iterator[str]:
    """An interpreter with fsprobe that every user can execute (:class:`SharedPython`)."""
    require(users_problem())
    python = SharedPython()
    yield python.executable
    python.close()


@pytest.fixture
def local_users(shared_python: str) -> Iterator[LocalUsers]:
    """Real accounts on demand (:mod:`tests.support.users`), deleted after the test."""
    users = LocalUsers(python=shared_python)
    yield users
    problems = users.remove()
    if problems:
        pytest.fail("removing the test users: " + "; ".join(problems), pytrace=False)
