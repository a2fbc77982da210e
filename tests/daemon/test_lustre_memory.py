"""The daemon's own memory of each Lustre target: when it first knew the target lost, and every
eviction it saw for 24 h, whatever the import's 16-entry state history forgets.

The readings are what the fake `lctl` (tests/support/fakes/lctl) prints: the ring of
`import_set_state_nolock` (lustre/ptlrpc/import.c, v2_17_0, lines 40-74), 16 entries, each
reconnect attempt of the pinger a CONNECTING and a DISCONN (lustre/ptlrpc/pinger.c, lines
240-249), each idle cycle a CONNECTING and an IDLE (import.c, lines 1981-2086).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from fsprobe.daemon.lustre_memory import LustreMemory
from fsprobe.daemon.memory import MEMORY_FILE, read_memory, write_memory
from fsprobe.lustre.imports import parse_states
from fsprobe.model import LustreImport, ProbeResult, Snapshot
from fsprobe.policy import Policy, evaluate
from fsprobe.state import open_state_dir
from fsprobe.units import format_clock
from tests.support.daemon_process import DaemonProcess, clean_environment
from tests.support.fakes.fake_lfs import FAKE_LCTL, fake_lfs_for

INSTANCE = "ffff8f1c2a3b4000"
NOW = 1_800_000_000
UP = [[NOW - 7200, "CONNECTING"], [NOW - 7200, "FULL"]]


def read(tmp_path, targets: dict, at: float) -> tuple[LustreImport, ...]:
    """The mount's imports as the fake lctl prints them for `targets`, read at `at`."""
    (tmp_path / "lctl.json").write_text(json.dumps({"now": NOW, "targets": targets}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    env["FAKE_LCTL_STATE"] = str(tmp_path / "lctl.json")
    done = subprocess.run(
        [sys.executable, str(FAKE_LCTL), "get_param", "osc.*.active", "osc.*.state", "mdc.*.state"],
        capture_output=True, text=True, env=env, timeout=30, check=True,
    )  # fmt: skip
    return parse_states(done.stdout, at)[("lustre", INSTANCE)]


def retries(start: int, count: int) -> list[list]:
    """`count` reconnect attempts from `start`, 75 s apart: CONNECTING, DISCONN each."""
    return [
        entry
        for i in range(count)
        for entry in ([start + 75 * i, "CONNECTING"], [start + 75 * i + 5, "DISCONN"])
    ]


def message(imports: tuple[LustreImport, ...], now: float, code: str) -> str:
    results = {"imports": ProbeResult("imports", now, 0.01, imports)}
    verdict = evaluate(Snapshot("/ckpt", results), Policy(), now)
    (reason,) = [r for r in verdict.reasons if r.code == code]
    return reason.message


def test_the_moment_of_a_loss_outlives_the_ring(tmp_path):
    memory = LustreMemory()
    lost = [*UP, [NOW - 1200, "DISCONN"]]
    first = read(tmp_path, {"OST0001": {"state": "DISCONN", "history": lost}}, NOW - 1190)
    assert memory.recall(first, NOW - 1190)[2].lost_at == NOW - 1200
    # Twenty minutes on: 16 entries of retries, the loss is out of the ring.
    history = [[NOW - 1200, "DISCONN"], *retries(NOW - 1150, 15)][-16:]
    later = read(tmp_path, {"OST0001": {"state": "DISCONN", "history": history}}, NOW)
    alone = later[2]
    assert (alone.lost_at, alone.lost_before) == (None, history[0][0])
    assert f"before {format_clock(history[0][0], NOW)}" in message(
        later, NOW, "lustre_target_disconnected"
    )  # a daemon that was not there says what it can know, never a false moment
    recalled = memory.recall(later, NOW)
    assert (recalled[2].lost_at, recalled[2].lost_before) == (NOW - 1200, None)
    assert f"OST0001 at {format_clock(NOW - 1200, NOW)} (DISCONN)" in message(
        recalled, NOW, "lustre_target_disconnected"
    )
    # Back: forgotten; lost again, the new moment.
    back = read(tmp_path, {"OST0001": {"state": "FULL", "history": [*history, [NOW, "FULL"]]}}, NOW)
    assert memory.recall(back, NOW + 1)[2].lost_at is None
    assert memory.remembered()[1] == {}


def test_a_bound_the_daemon_knew_first_stays_the_bound(tmp_path):
    """A daemon that first saw the target already lost beyond its ring keeps that bound: later
    readings, whose oldest entry moves on, do not move it."""
    memory = LustreMemory()
    history = retries(NOW - 1800, 8)
    first = read(tmp_path, {"OST0001": {"state": "DISCONN", "history": history}}, NOW - 1100)
    assert memory.recall(first, NOW - 1100)[2].lost_before == NOW - 1800
    moved = retries(NOW - 1200, 8)
    later = memory.recall(
        read(tmp_path, {"OST0001": {"state": "DISCONN", "history": moved}}, NOW), NOW
    )
    assert (later[2].lost_at, later[2].lost_before) == (None, NOW - 1800)


def test_an_eviction_is_kept_a_day_after_the_ring_forgot_it(tmp_path):
    memory = LustreMemory()
    evicted = [*UP, [NOW - 3700, "DISCONN"], [NOW - 3650, "CONNECTING"], [NOW - 3600, "EVICTED"]]
    evicted += [[NOW - 3590, "RECOVER"], [NOW - 3590, "FULL"]]
    seen = read(tmp_path, {"OST0000": {"state": "FULL", "history": evicted}}, NOW - 3500)
    memory.recall(seen, NOW - 3500)
    # An hour of idle cycles (FULL -> CONNECTING -> IDLE, IDLE -> CONNECTING -> FULL).
    cycles = [
        [NOW - 3400 + 400 * i + step, state]
        for i in range(8)
        for step, state in ((0, "CONNECTING"), (0, "IDLE"), (200, "CONNECTING"), (200, "FULL"))
    ][-16:]
    now = cycles[-1][0] + 1
    forgotten = read(tmp_path, {"OST0000": {"state": "FULL", "history": cycles}}, now)
    assert forgotten[1].last_eviction is None  # the ring alone no longer shows it
    recalled = memory.recall(forgotten, now)
    assert recalled[1].last_eviction == NOW - 3600
    assert message(recalled, now, "lustre_target_evicted").startswith(
        f"OST0000 evicted this node at {format_clock(NOW - 3600, now)}"
    )
    version, remembered = memory.remembered()
    kept = LustreMemory()
    kept.restore(remembered)  # as a restarted daemon does, from its memory file
    assert kept.recall(forgotten, NOW + 20 * 3600)[1].last_eviction == NOW - 3600
    assert kept.recall(forgotten, NOW - 3600 + 24 * 3600 + 1)[1].last_eviction is None
    assert kept.remembered() == (1, {})  # changed once: the eviction dropped
    assert memory.remembered()[0] == version  # a reading that changes nothing: same version


@pytest.mark.parametrize(
    "lustre",
    [
        {"lustre-OST0000": {"lost_at": "noon", "lost_before": None, "evictions": []}},
        {"<!channel>": {"lost_at": None, "lost_before": None, "evictions": [1.0]}},
        {"lustre-OST0000": {"lost_at": None, "lost_before": None, "evictions": [1.0] * 65}},
        {"lustre-OST0000": {"lost_at": -5.0, "lost_before": None, "evictions": []}},
    ],
)
def test_a_memory_file_with_a_lustre_target_out_of_bounds_is_forgotten(tmp_path, lustre):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    write_memory(str(state), {}, "boot")
    document = json.loads((state / MEMORY_FILE).read_text())
    (state / MEMORY_FILE).write_text(json.dumps({**document, "lustre": lustre}))
    with open_state_dir(str(state)) as directory:
        assert read_memory(directory, 1) == ("", {}, {})


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def test_the_running_daemon_remembers_the_moment_and_the_eviction(faultfs, fake_lfs, tmp_path):
    """A real `fsprobe run` with the fake lctl: the target is lost (the ring shows when), then
    the retries push the loss and an eviction out of the ring; the daemon still says when."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    now = int(time.time())
    lost = [[now - 7200, "FULL"], [now - 100, "EVICTED"], [now - 90, "FULL"], [now - 60, "DISCONN"]]
    fake_lfs.configure(
        control=faultfs.ctl.socket_path,
        imports={"targets": {"OST0001": {"state": "DISCONN", "history": lost}}},
    )
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nquota_provider = "lfs"\nwrite_probe = false\nimports_interval = 0.5\n'
        f'[[targets]]\npath = "{target}"\nuser = 1000\ngroup = 1000\n'
    )
    lustre = {name: os.environ[name] for name in ("FSPROBE_LFS", "FSPROBE_LCTL", "PATH")}
    lustre.update(
        {k: v for k, v in os.environ.items() if k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    )
    home = tmp_path / "daemon"
    home.mkdir()
    env = clean_environment(TMPDIR=str(faultfs.mountpoint), **lustre)
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        eviction = "fsprobe_lustre_target_last_eviction_timestamp_seconds"
        daemon.wait_for_value(eviction, float(now - 100), target="lustre-OST0001")
        forgotten = retries(now - 55, 8)
        fake_lfs.configure(
            control=faultfs.ctl.socket_path,
            imports={"targets": {"OST0001": {"state": "DISCONN", "history": forgotten}}},
        )
        status = _status(daemon, env)
        clock = time.time()
        assert f"lost its connection to OST0001 at {format_clock(now - 60, clock)}" in status
        assert f"OST0001 evicted this node at {format_clock(now - 100, clock)}" in status
        assert daemon.value(eviction, target="lustre-OST0001") == float(now - 100)
    # A restarted daemon remembers it from its memory file, where the ring alone cannot say.
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        daemon.wait_for_value(eviction, float(now - 100), target="lustre-OST0001")
        status = _status(daemon, env)
        clock = time.time()
        assert f"lost its connection to OST0001 at {format_clock(now - 60, clock)}" in status
        assert f"OST0001 evicted this node at {format_clock(now - 100, clock)}" in status


def _status(daemon: DaemonProcess, env: dict[str, str]) -> str:
    """`fsprobe status` of the daemon, once it published an imports reading made after now."""
    asked = time.time()
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "fsprobe", "status", "--json", "--state-dir",
             str(daemon.state_dir)],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        targets = json.loads(done.stdout)["targets"].values() if done.stdout else []
        probed = [t["probes"]["imports"]["started_at"] for t in targets if "imports" in t["probes"]]
        if probed and min(probed) > asked:
            break
        assert time.monotonic() < deadline, done.stdout + done.stderr
        time.sleep(0.25)
    return subprocess.run(
        [sys.executable, "-m", "fsprobe", "status", "--state-dir", str(daemon.state_dir)],
        capture_output=True, text=True, env=env, timeout=60,
    ).stdout  # fmt: skip
