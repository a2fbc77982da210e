"""How many series one node exports: a real `fsprobe run` watching 1, 10 and 100 targets, each
saved into once after every probe has run, scraped once the save stood in for the next write
probe. Each target adds the same number of series, the daemon a fixed number of its own; a
target on Lustre (the fake `lfs` and `lctl`) adds its probes' and those of every OST and MDT.
docs/reference.md ("Series per node") says each number."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsprobe.events.receive import BURST, RATE
from tests.support.daemon_process import PATIENCE, REPO_ROOT, DaemonProcess, clean_environment
from tests.support.fakes.fake_lfs import FAKE_LCTL, FAKE_LFS

pytestmark = pytest.mark.slow  # a daemon of its own

#: Series of one plain target (no quota, no Lustre), its saves', its probes' and their errors'
#: included once it has been saved into and every probe has run, without an error.
PER_TARGET = 85
#: Series of the daemon itself (no `path`): build, reload, process and Python information.
PER_NODE = 10
RAN = "fsprobe_probe_last_run_timestamp_seconds"
#: The probes each plain target runs.
PROBES = ("statvfs", "write", "tmpdir")

#: One save into each target named, paced under the receiver's rate per uid once past half its
#: burst (an event dropped would be counted in a series of the daemon's own).
SAVER = f"""
import sys, time
import fsprobe
for index, target in enumerate(sys.argv[1:]):
    if index >= {BURST // 2}:
        time.sleep({1.2 / RATE})
    fsprobe.atomic_write(target + "/step-1.pt", lambda f: f.write(b"x" * 4096))
"""


def _count(daemon: DaemonProcess) -> tuple[dict[str, int], int]:
    """Series by path, and those without one."""
    per_path: dict[str, int] = {}
    pathless = 0
    for samples in daemon.metrics().values():
        for labels in samples:
            path = dict(labels).get("path")
            if path is None:
                pathless += 1
            else:
                per_path[path] = per_path.get(path, 0) + 1
    return per_path, pathless


def _paths(daemon: DaemonProcess, name: str, **labels: str) -> set[str]:
    """The paths that have a series `name` with these labels."""
    return {
        dict(key)["path"]
        for key in daemon.metrics().get(name, {})
        if all((k, v) in key for k, v in labels.items())
    }


def _wait_for_every(daemon: DaemonProcess, targets: list[Path], name: str, **labels: str):
    deadline = time.monotonic() + PATIENCE
    while _paths(daemon, name, **labels) != set(map(str, targets)):
        assert time.monotonic() < deadline, f"not every target has {name}{labels}"
        time.sleep(0.5)


def _save_until_each_stands_in(daemon: DaemonProcess, targets: list[Path], interval: float):
    """Save into every target whose write probe no save has stood in for yet, until each has.

    A save stands in only for a probe due within a write interval of it, and probes are
    jittered (a probe a little late runs), so one round of saves is not enough for every
    target; saving again into those left is."""
    deadline = time.monotonic() + PATIENCE
    waiting = list(targets)
    while waiting:
        assert time.monotonic() < deadline, f"no save stood in for the probe of {waiting}"
        subprocess.run(
            [sys.executable, "-c", SAVER, *map(str, waiting)],
            cwd=REPO_ROOT,
            env=clean_environment(FSPROBE_STATE_DIR=str(daemon.state_dir)),
            check=True,
            timeout=PATIENCE,
        )
        time.sleep(interval * 1.5)  # the next probe of each, jitter included, has been due
        stood_in = _paths(daemon, "fsprobe_probe_skipped_total", probe="write")
        waiting = [target for target in waiting if str(target) not in stood_in]


@pytest.mark.parametrize("count", [1, 10, 100])
def test_each_target_adds_the_same_series_and_the_docs_say_how_many(tmp_path, count):
    targets = [tmp_path / f"target-{n}" for n in range(count)]
    for target in targets:
        target.mkdir()
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 1\nwrite_interval = 5\ntmpdir_interval = 1\n"
        'write_bytes = "4K"\nquota_probe = "never"\n'
        + "".join(f'[[targets]]\npath = "{target}"\n' for target in targets)
    )
    home = tmp_path / "daemon"
    home.mkdir()
    env = clean_environment(TMPDIR=str(tmp_path))
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        for probe in PROBES:
            _wait_for_every(daemon, targets, RAN, probe=probe)
        _wait_for_every(daemon, targets, "fsprobe_write_step_seconds", op="unlink")
        _save_until_each_stands_in(daemon, targets, interval=5)
        per_path, pathless = _count(daemon)
    print(f"\n{count} targets: {sum(per_path.values()) + pathless} series")
    assert per_path == {str(target): PER_TARGET for target in targets}
    assert pathless == PER_NODE
    documented = (REPO_ROOT / "docs" / "reference.md").read_text()
    row = f"| {count} | {PER_TARGET * count + PER_NODE:,} |"
    assert row in documented, f"docs/reference.md has no row {row!r}"
    words = " ".join(documented.split())
    assert f" {PER_TARGET} series per plain target" in words
    assert f" {PER_NODE} of the daemon's own" in words


#: Series of each probe that runs (success, duration, last run, last success, interval, the
#: staleness deadline), and of each Lustre OST or MDT of a target's filesystem (4 of capacity,
#: in_layout, connected, recovering, active; an eviction time once there was one).
PER_PROBE = 6
PER_LUSTRE_TARGET = 8


def test_a_lustre_target_adds_its_probes_and_the_series_of_every_ost_and_mdt(tmp_path):
    """The fake `lfs` and `lctl` play one MDT and two OSTs, all connected, none evicted."""
    target = tmp_path / "ckpt"
    target.mkdir()
    kib = 1 << 20  # a GiB in the KiB that lfs df counts in
    osts = [
        {"kind": kind, "index": index, "blocks": 100 * kib, "bfree": 60 * kib,
         "bavail": 60 * kib, "files": 1 << 20, "ffree": 1 << 19}
        for kind, index in (("MDT", 0), ("OST", 0), ("OST", 1))
    ]  # fmt: skip
    state = tmp_path / "fake-lfs-state.json"
    state.write_text(json.dumps({"mountpoint": str(tmp_path), "targets": osts}))
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 1\nwrite_interval = 1\ntmpdir_interval = 1\n"
        "quota_interval = 1\nlfs_df_interval = 1\nimports_interval = 1\n"
        'write_bytes = "4K"\nquota_probe = "always"\nquota_provider = "lfs"\n'
        f'[[targets]]\npath = "{target}"\n'
    )
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LFS_STATE=str(state),
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        TMPDIR=str(tmp_path),
    )
    home = tmp_path / "daemon"
    home.mkdir()
    probes = (*PROBES, "quota", "lfs_df", "imports")
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        for probe in probes:
            _wait_for_every(daemon, [target], RAN, probe=probe)
        _wait_for_every(daemon, [target], "fsprobe_lustre_target_connected")
        metrics = daemon.metrics()
    assert not metrics.get("fsprobe_probe_errors_total"), daemon.log()

    def series(prefix: str) -> int:
        return sum(
            1
            for name, samples in metrics.items()
            if name.startswith(prefix)
            for labels in samples
            if ("path", str(target)) in labels
        )

    assert series("fsprobe_probe_") == PER_PROBE * len(probes)
    assert series("fsprobe_lustre_target_") == PER_LUSTRE_TARGET * len(osts)
    words = " ".join((REPO_ROOT / "docs" / "reference.md").read_text().split())
    assert f"probes {PER_PROBE} series each" in words
    assert f"Lustre {PER_LUSTRE_TARGET} per OST and MDT" in words
