"""Driving the fake `lfs` (tests/support/fakes/lfs) from a test; loading the lfs output fixtures.

In a test module (or use this module as a pytest plugin, see `fake_lfs`)::

    @pytest.fixture
    def fake_lfs(monkeypatch, tmp_path):
        yield from fake_lfs_for(monkeypatch, tmp_path)

    def test_something(fake_lfs, faultfs):
        fake_lfs.configure(version="2.12", control=faultfs.socket_path)
        report = probe_quota(str(faultfs.mountpoint), ServerProbeSettings(provider="lfs"))

`configure` points FSPROBE_LFS at the fake (and forgets the layouts fsprobe remembers), puts
this interpreter first on PATH (the fake runs with ``python3`` from PATH) and sets the
FAKE_LFS_* variables the fake reads (see its docstring), all through monkeypatch, so they are
undone after the test. `calls()` lists the invocations the fake logged (`quota_calls()` the
`lfs quota` ones); `pids()` the processes of a hanging fake.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FAKE_LFS = Path(__file__).resolve().with_name("lfs")
FAKE_LCTL = Path(__file__).resolve().with_name("lctl")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lfs"
#: What the children a hanging or escaping fake starts run (see `hang` and `escape` in
#: tests/support/fakes/lfs): they sleep forever.
SLEEP_FOREVER = "time.sleep(1 << 30)"


def load_fixtures(kind: str) -> list[tuple[str, dict[str, Any]]]:
    """(id, case) for every fixture under tests/fixtures/lfs/<kind>, sorted by path."""
    root = FIXTURES / kind
    return [
        (str(path.relative_to(root).with_suffix("")), json.loads(path.read_text()))
        for path in sorted(root.rglob("*.json"))
    ]


class FakeLfs:
    """The fake lfs, configured for one test."""

    path = FAKE_LFS

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workdir: Path) -> None:
        self._monkeypatch = monkeypatch
        self.workdir = workdir
        self.log = workdir / "fake-lfs.log"
        self.pidfile = workdir / "fake-lfs.pids"
        self.lctl_log = workdir / "fake-lctl.log"
        for name in list(os.environ):
            if name.startswith(("FAKE_LFS_", "FAKE_LCTL_")):
                monkeypatch.delenv(name)
        interpreter_dir = os.path.dirname(sys.executable)
        monkeypatch.setenv("PATH", interpreter_dir + os.pathsep + os.environ.get("PATH", ""))
        monkeypatch.setenv("FSPROBE_LFS", str(FAKE_LFS))
        monkeypatch.setenv("FSPROBE_LCTL", str(FAKE_LCTL))
        monkeypatch.setenv("FAKE_LCTL_LOG", str(self.lctl_log))
        monkeypatch.setenv("FAKE_LFS_LOG", str(self.log))
        monkeypatch.setenv("FAKE_LFS_PIDFILE", str(self.pidfile))

    def configure(
        self,
        *,
        version: str = "2.16",
        control: str | os.PathLike[str] | None = None,
        state: dict[str, Any] | None = None,
        fail: str | None = None,
        fail_types: str | None = None,
        delay: float | None = None,
        limited_types: str | None = None,
        project: int | None = None,
        osts: int | None = None,
        mdts: int | None = None,
        imports: dict[str, Any] | None = None,
        lctl_fail: str | None = None,
    ) -> FakeLfs:
        """Set the fake's behaviour (None leaves a variable unset); returns self.

        `imports` is the fake `lctl`'s state ({"targets": {"OST0001": {"state", "history"}},
        "now"}), `lctl_fail` its failure (hang, garbage, flood); see tests/support/fakes/lctl.
        """
        values: dict[str, Any] = {
            "VERSION": version,
            "CONTROL": control,
            "FAIL": fail,
            "FAIL_TYPES": fail_types,
            "DELAY": delay,
            "LIMITED_TYPES": limited_types,
            "PROJECT": project,
            "OSTS": osts,
            "MDTS": mdts,
        }
        if state is not None:
            state_file = self.workdir / "fake-lfs-state.json"
            state_file.write_text(json.dumps(state))
            values["STATE"] = state_file
        lctl: dict[str, Any] = {"FAIL": lctl_fail}
        if imports is not None:
            lctl_file = self.workdir / "fake-lctl-state.json"
            lctl_file.write_text(json.dumps(imports))
            lctl["STATE"] = lctl_file
        for prefix, settings in (("FAKE_LFS_", values), ("FAKE_LCTL_", lctl)):
            for name, value in settings.items():
                if value is None:
                    self._monkeypatch.delenv(f"{prefix}{name}", raising=False)
                else:
                    self._monkeypatch.setenv(f"{prefix}{name}", str(value))
        return self

    def lctl_calls(self) -> list[dict[str, Any]]:
        """Every invocation of the fake `lctl` so far: ``{"argv", "time"}``."""
        if not self.lctl_log.exists():
            return []
        return [json.loads(line) for line in self.lctl_log.read_text().splitlines()]

    def calls(self) -> list[dict[str, Any]]:
        """Every invocation so far: ``{"argv", "pid", "time"}``."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def quota_calls(self) -> list[dict[str, Any]]:
        """The `lfs quota` invocations only (not the layout, pool and version look-ups)."""
        return [call for call in self.calls() if call["argv"][:1] == ["quota"]]

    def pids(self) -> list[int]:
        """With fail="hang": the hanging fake's pid and its child's, once both run; with
        fail="escape_*": the helper's (then the fake's own with "escape_*_hang")."""
        if not self.pidfile.exists():
            return []
        return [int(pid) for pid in self.pidfile.read_text().split()]


def fake_lfs_for(monkeypatch: pytest.MonkeyPatch, workdir: Path) -> Iterator[FakeLfs]:
    """The body of a `fake_lfs` fixture: yields the fake, then ends any hanging fake."""
    fake = FakeLfs(monkeypatch, workdir)
    yield fake
    for pid in fake.pids():  # a hang test that failed early must not leave sleepers behind
        if is_fake_process(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeLfs]:
    """The fake lfs as FSPROBE_LFS, unconfigured (version 2.16, no state) until `configure`.

    Register this module as a plugin to use it anywhere (``pytest_plugins =
    ["tests.support.fakes.fake_lfs"]`` in the root conftest), or wrap `fake_lfs_for` in a fixture.
    """
    yield from fake_lfs_for(monkeypatch, tmp_path)


def is_fake_process(pid: int) -> bool:
    """Whether `pid` is still a hanging fake or a child it left (not a reused pid)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    fakes = (str(FAKE_LFS).encode(), str(FAKE_LCTL).encode(), SLEEP_FOREVER.encode())
    return any(fake in command for fake in fakes)
