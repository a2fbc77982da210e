"""Server probes once per job (issue 21.5): the sidecars of one job ask `lfs quota` and
`lfs df` on its global rank 0 only; the others probe what is local to their node and say so."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from fsprobe.daemon.config import (
    Overrides,
    load,
    quota_probes_enabled,
    server_probes_elsewhere,
)
from fsprobe.daemon.scheduler import planned_probes
from tests.support.daemon_process import DaemonProcess, clean_environment, run_fsprobe
from tests.support.fakes.fake_lfs import FAKE_LCTL, FAKE_LFS


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, True),
        ({"SLURM_PROCID": "3", "SLURM_LOCALID": "0"}, False),  # node 3's sidecar
        ({"RANK": "0", "LOCAL_RANK": "0"}, True),
        ({"RANK": "9", "LOCAL_RANK": "1"}, False),
        ({"RANK": "8", "LOCAL_RANK": "0"}, False),  # local rank 0 of the second node
        ({"JOB_COMPLETION_INDEX": "0"}, True),
        ({"JOB_COMPLETION_INDEX": "2"}, False),  # pod 2 of an indexed Kubernetes job
        ({"SLURM_PROCID": "0", "RANK": "5"}, False),  # one of them says this is not rank 0
        ({"LOCAL_RANK": "0"}, True),
        ({}, True),  # a node daemon
    ],
)
def test_quota_probe_auto_runs_on_the_jobs_global_rank_zero_only(environ, expected):
    assert quota_probes_enabled("auto", environ) is expected
    elsewhere = server_probes_elsewhere("auto", environ)
    assert (elsewhere is None) is expected
    if not expected:
        assert "rank 0" in elsewhere and "here)" in elsewhere


def sidecar(tmp_path, name, target, rank, control) -> DaemonProcess:
    """The sidecar of one rank of a Slurm job, with a fake `lfs` that logs its calls."""
    home = tmp_path / name
    home.mkdir()
    config = home / "fsprobe.toml"
    config.write_text(
        "[defaults]\n"
        "statvfs_interval = 0.3\nwrite_interval = 0.5\nquota_interval = 0.5\n"
        'lfs_df_interval = 0.5\nquota_provider = "lfs"\nwrite_bytes = "4K"\n'
        f'[[targets]]\npath = "{target}"\nuser = 1000\ngroup = 1000\n'
    )
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LFS_VERSION="2.16",
        FAKE_LFS_CONTROL=control,
        FAKE_LFS_LOG=str(home / "lfs.log"),
        SLURM_JOB_ID="4242",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID="0",
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    return DaemonProcess(home, "--config", str(config), env=env)


def lfs_calls(daemon: DaemonProcess) -> list[list[str]]:
    log = daemon.home / "lfs.log"
    if not log.exists():
        return []
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def test_ranks_other_than_zero_run_no_lfs_and_say_so(tmp_path, faultfs):
    target = faultfs.mountpoint
    control = str(faultfs.ctl.socket_path)
    with (
        sidecar(tmp_path, "rank0", target, 0, control) as rank0,
        sidecar(tmp_path, "rank1", target, 1, control) as rank1,
    ):
        rank0.wait_for_present("fsprobe_quota_used_bytes")
        rank0.wait_for_present("fsprobe_lustre_target_avail_bytes")
        rank1.wait_for_value("fsprobe_probe_success", 1.0, path=str(target), probe="write")
        time.sleep(1.5)  # three quota intervals
        assert any(argv[:1] == ["quota"] for argv in lfs_calls(rank0))
        assert any(argv[:1] == ["df"] for argv in lfs_calls(rank0))
        assert lfs_calls(rank1) == []
        metrics = rank1.metrics()
        assert "fsprobe_quota_used_bytes" not in metrics
        assert "fsprobe_lustre_target_avail_bytes" not in metrics
        assert rank1.value("fsprobe_health_status", path=str(target)) == 0.0

        _, shown, _ = run_fsprobe(
            "status", "--state-dir", str(rank1.state_dir), env=clean_environment(NO_COLOR="1")
        )
        assert "elsewhere" in shown
        assert (
            "server probes: not here, the job's global rank 0 asks lfs quota and lfs df for "
            "this job (SLURM_PROCID=1 here)" in shown
        )
        state = json.loads((rank1.state_dir / "state.json").read_text())
        assert "SLURM_PROCID=1" in state["targets"][str(target)]["server_probes_elsewhere"]
        state = json.loads((rank0.state_dir / "state.json").read_text())
        assert state["targets"][str(target)]["server_probes_elsewhere"] is None


def test_lfs_df_can_be_switched_off_apart_from_quota(tmp_path):
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nquota_provider = "lfs"\n'
        f'[[targets]]\npath = "{tmp_path / "a"}"\nlfs_df_probe = false\n'
        f'[[targets]]\npath = "{tmp_path / "b"}"\n'
    )
    quiet, full = load(Overrides(config_file=str(config)), environ={}).targets
    assert "quota" in planned_probes(quiet) and "lfs_df" not in planned_probes(quiet)
    assert {"quota", "lfs_df"} <= set(planned_probes(full))


@pytest.mark.parametrize(("rank", "asked"), [("0", True), ("2", False)])
def test_check_on_a_rank_other_than_zero_asks_no_lfs_and_says_so(tmp_path, faultfs, rank, asked):
    config = tmp_path / "fsprobe.toml"
    config.write_text('[defaults]\nquota_provider = "lfs"\nwrite_probe = false\n')
    log = tmp_path / "lfs.log"
    env = clean_environment(
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_LCTL=str(FAKE_LCTL),
        FAKE_LFS_VERSION="2.16",
        FAKE_LFS_CONTROL=str(faultfs.ctl.socket_path),
        FAKE_LFS_LOG=str(log),
        SLURM_PROCID=rank,
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    status, shown, said = run_fsprobe(
        "check", str(faultfs.mountpoint), "--config", str(config), "--json", env=env
    )
    assert status in (0, 1), said
    calls = log.read_text().splitlines() if log.exists() else []
    assert bool(calls) is asked
    assert (json.loads(shown)["quota"] is not None) is asked
    if not asked:
        assert (
            "lfs quota and lfs df not asked here: the job's global rank 0 asks lfs quota and "
            "lfs df for this job (SLURM_PROCID=2 here)" in said
        )
