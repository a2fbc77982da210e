"""The write probe on a filesystem that fails at each step in turn: the failing step and errno
are named, the result says it failed, nothing is left behind, and no descriptor leaks (a probe
runs every minute for months in the daemon's worker)."""

from __future__ import annotations

import os
import time

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.probing.write import probe_write

#: Each step of the rehearsal and the filesystem operation that carries it out.
STEPS = {
    "create": "create",
    "write": "write",
    "fsync": "fsync",
    "rename": "rename",
    "fsync_dir": "fsyncdir",
    "unlink": "unlink",
}


def open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_successful_probe_leaves_no_descriptor_and_times_itself(faultfs):
    before = open_descriptors()
    start = time.monotonic()
    result = probe_write(str(faultfs.mountpoint), size=4096)
    wall = time.monotonic() - start
    assert result.ok
    assert 0 <= result.latency_seconds["total"] <= wall
    assert open_descriptors() == before
    assert os.listdir(faultfs.mountpoint) == []


@pytest.mark.parametrize("step", list(STEPS))
def test_a_failure_at_each_step_is_named_cleaned_up_and_leaks_nothing(faultfs, step):
    # The probe's own files, or (for the directory fsync) the directory they are in.
    faultfs.ctl.fail(STEPS[step], "EIO", path="/" if step == "fsync_dir" else "/.fsprobe~*")
    before = open_descriptors()
    start = time.monotonic()
    with pytest.raises(ProbeFailure) as raised:
        probe_write(str(faultfs.mountpoint), size=4096)
    wall = time.monotonic() - start
    result = raised.value.value
    assert (raised.value.error, result.step, result.errno) == ("EIO", step, "EIO")
    assert result.ok is False
    assert f"failed at {step}: Input/output error (EIO)" in result.message
    assert 0 <= result.latency_seconds["total"] <= wall
    assert open_descriptors() == before
    assert os.listdir(faultfs.mountpoint) == []


def test_a_probe_file_that_cannot_be_removed_is_reported_and_still_closed(faultfs):
    faultfs.ctl.fail("unlink", "EIO", path="/.fsprobe~*", times=2)  # the step and the cleanup
    before = open_descriptors()
    with pytest.raises(ProbeFailure) as raised:
        probe_write(str(faultfs.mountpoint), size=4096)
    result = raised.value.value
    assert (result.step, result.errno) == ("unlink", "EIO")
    assert "removing the probe file" in result.message and "failed too" in result.message
    assert open_descriptors() == before
    faultfs.ctl.clear()
    for leftover in os.listdir(faultfs.mountpoint):  # ours, and nothing else
        assert leftover.startswith(".fsprobe~")
        os.unlink(faultfs.mountpoint / leftover)


def test_a_target_that_cannot_be_resolved_fails_at_create_within_its_time(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    start = time.monotonic()
    with pytest.raises(ProbeFailure) as raised:
        probe_write(str(loop / "ckpt"), size=4096)
    wall = time.monotonic() - start
    result = raised.value.value
    assert (result.step, result.errno, result.ok) == ("create", "ELOOP", False)
    assert 0 <= result.latency_seconds["total"] <= wall
