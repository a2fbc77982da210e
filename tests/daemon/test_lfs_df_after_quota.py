"""A real daemon runs `lfs df` right after a quota probe, whose wake of the OST imports it
shares: once in many quota rounds while there is room, after each while an OST of the layout is
tight (fsprobe/daemon/pace.py). Counted from the fake `lfs`'s log, never timed."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support.daemon_process import PATIENCE, DaemonProcess, clean_environment
from tests.support.fakes.fake_lfs import FAKE_LCTL, FAKE_LFS

pytestmark = pytest.mark.slow

QUOTA_ROUNDS = 6


def targets(ost1_free: float) -> list[dict]:
    mdt = {"kind": "MDT", "index": 0, "blocks": 1 << 20, "bfree": 1 << 19, "bavail": 1 << 19}
    mdt.update(files=1 << 20, ffree=1 << 19)
    osts = []
    for index, free in ((0, 0.6), (1, ost1_free)):
        blocks = 1 << 30
        osts.append(
            {"kind": "OST", "index": index, "blocks": blocks, "bfree": int(blocks * free),
             "bavail": int(blocks * free), "files": 1 << 20, "ffree": 1 << 19}
        )  # fmt: skip
    return [mdt, *osts]


def calls_until_quota_rounds(tmp_path: Path, ost1_free: float) -> list[dict]:
    """The fake lfs's log of a daemon that ran `QUOTA_ROUNDS` quota probes (user and group)."""
    (tmp_path / "state.json").write_text(
        json.dumps({"mountpoint": str(tmp_path), "targets": targets(ost1_free)})
    )
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.3\nimports_interval = 0.3\nwrite_probe = false\n"
        'quota_interval = 0.5\nlfs_df_interval = 30\nquota_provider = "lfs"\n'
        'quota_probe = "always"\n'
        f'[[targets]]\npath = "{tmp_path}"\nuser = 1000\ngroup = 1000\n'
    )
    log = tmp_path / "lfs.log"
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LFS_STATE=str(tmp_path / "state.json"),
        FAKE_LFS_LOG=str(log),
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    home = tmp_path / "home"
    home.mkdir()

    def calls() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    with DaemonProcess(home, "--config", str(config), env=env):
        deadline = time.monotonic() + 4 * PATIENCE
        while sum(c["argv"][:2] == ["quota", "-u"] for c in calls()) < QUOTA_ROUNDS:
            assert time.monotonic() < deadline, "the quota probe did not run"
            time.sleep(0.1)
        return calls()


def df_runs(calls: list[dict]) -> list[int]:
    """The positions in the log of each `lfs df -v` (the block table of one run)."""
    return [i for i, c in enumerate(calls) if c["argv"][:2] == ["df", "-v"]]


def test_with_room_lfs_df_runs_once_in_many_quota_rounds(tmp_path):
    calls = calls_until_quota_rounds(tmp_path, ost1_free=0.5)
    assert len(df_runs(calls)) == 1  # the first, at the start; the next within the hour


def test_while_an_ost_is_tight_lfs_df_follows_every_quota_probe(tmp_path):
    calls = calls_until_quota_rounds(tmp_path, ost1_free=0.1)
    runs = df_runs(calls)
    assert len(runs) >= QUOTA_ROUNDS - 2
    for position in runs[1:]:  # each right after a quota probe: its last call is the quota's
        before = [c["argv"][0] for c in calls[:position] if c["argv"][0] in ("quota", "df")]
        assert before[-1] == "quota", calls[position - 3 : position + 1]
