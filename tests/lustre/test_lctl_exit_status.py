"""lctl's exit status is not the answer: a parameter it could not read is named, never hidden by
a later one read fine, and breaks no other mount (`do_param_op`, `jt_lcfg_getparam`,
lustre/utils/lustre_param.c at v2_17_0: each read sets its pattern's status anew, and the first
failing pattern's status is the exit status).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.imports import own_mount, read_states
from fsprobe.quota.provider import Deadline
from tests.support.fakes.fake_lfs import FAKE_LCTL

INSTANCE = "ffff8f1c2a3b4000"


@pytest.fixture
def lctl_env(monkeypatch, tmp_path):
    """The fake lctl with a state file; returns a function that writes the state."""
    for key in [k for k in os.environ if k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))]:
        monkeypatch.delenv(key)
    state_file = tmp_path / "lctl.json"
    monkeypatch.setenv("FAKE_LCTL_STATE", str(state_file))

    def write(state: dict, osts: int) -> None:
        state_file.write_text(json.dumps(state))
        monkeypatch.setenv("FAKE_LFS_OSTS", str(osts))

    return write


def fake_status(*patterns: str) -> int:
    return subprocess.run(
        [sys.executable, str(FAKE_LCTL), "get_param", *patterns],
        capture_output=True,
        timeout=30,
    ).returncode


def test_an_unreadable_state_before_a_readable_one_is_named_though_lctl_exits_0(lctl_env):
    lctl_env({"targets": {"OST0001": {"unreadable": True}}}, osts=3)
    assert fake_status("osc.*.state", "mdc.*.state") == 0  # OST0002 was read last
    mounts = read_states(str(FAKE_LCTL), Deadline.after(30))
    with pytest.raises(ProbeFailure) as failure:
        own_mount(mounts, "lustre", None)
    assert failure.value.error == "ENODEV"
    assert "lustre-OST0001's state (No such device)" in failure.value.message


def test_an_unreadable_last_state_fails_its_mount_with_the_right_errno(lctl_env):
    lctl_env({"targets": {"OST0001": {"unreadable": True}}}, osts=2)
    assert fake_status("osc.*.state", "mdc.*.state") == 19  # the last osc read failed
    with pytest.raises(ProbeFailure) as failure:
        own_mount(read_states(str(FAKE_LCTL), Deadline.after(30)), "lustre", None)
    assert (failure.value.error, "lustre-OST0001" in failure.value.message) == ("ENODEV", True)


def test_every_state_read_is_the_answer_when_none_fails(lctl_env):
    lctl_env({}, osts=2)
    imports = own_mount(read_states(str(FAKE_LCTL), Deadline.after(30)), "lustre", None)
    assert [t.name for t in imports] == ["lustre-MDT0000", "lustre-OST0000", "lustre-OST0001"]


def stand_in(tmp_path: Path, stdout: str, stderr: str, status: int) -> str:
    """An `lctl` that prints these and exits so: a case two mounts make (the fake has one)."""
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = tmp_path / "lctl"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path}/out'\ncat '{tmp_path}/err' >&2\nexit {status}\n")
    script.chmod(0o755)
    return str(script)


def state(device: str, current: str = "FULL") -> str:
    return f"{device}.state=\ncurrent_state: {current}\nstate_history:\n - [ 1700000000, FULL ]\n"


def test_another_mounts_unreadable_state_and_a_servers_break_nothing(tmp_path):
    """The exit status (19, the last read's) says failure; the target's mount was read whole."""
    stdout = state(f"osc.lustre-OST0000-osc-{INSTANCE}") + state(
        f"mdc.lustre-MDT0000-mdc-{INSTANCE}"
    )
    stderr = (
        "error: read_param: '/sys/kernel/debug/lustre/osc/scratch-OST0003-osc-ffff9/state': "
        "No such device\n"
        "error: read_param: '/sys/kernel/debug/lustre/osc/lustre-OST0001-osc-MDT0000/state': "
        "No such device\n"
    )
    mounts = read_states(stand_in(tmp_path, stdout, stderr, 19), Deadline.after(30))
    imports = own_mount(mounts, "lustre", INSTANCE)
    assert [(t.name, t.state) for t in imports] == [
        ("lustre-MDT0000", "FULL"),
        ("lustre-OST0000", "FULL"),
    ]
    with pytest.raises(ProbeFailure) as failure:
        own_mount(mounts, "scratch", "ffff9")
    assert "scratch-OST0003's state (No such device)" in failure.value.message


def test_a_pattern_that_matches_nothing_is_no_failure_of_the_others(tmp_path):
    stdout = state(f"osc.lustre-OST0000-osc-{INSTANCE}")
    stderr = "error: get_param: param_path 'mdc/*/state': No such file or directory\n"
    mounts = read_states(stand_in(tmp_path, stdout, stderr, 2), Deadline.after(30))
    assert [t.name for t in own_mount(mounts, "lustre", None)] == ["lustre-OST0000"]


@pytest.mark.parametrize(
    ("stderr", "status", "error"),
    [("lctl: something else went wrong\n", 5, "EIO"), ("", 22, "EINVAL"), ("", -11, "SIGSEGV")],
)
def test_a_failure_lctl_does_not_explain_fails_the_probe(tmp_path, stderr, status, error):
    stdout = state(f"osc.lustre-OST0000-osc-{INSTANCE}")
    if status < 0:
        script = Path(stand_in(tmp_path, stdout, stderr, 0))
        script.write_text(f"#!/bin/sh\ncat '{tmp_path}/out'\nkill -{-status} $$\n")
    else:
        script = Path(stand_in(tmp_path, stdout, stderr, status))
    with pytest.raises(ProbeFailure) as failure:
        read_states(str(script), Deadline.after(30))
    assert failure.value.error == error
