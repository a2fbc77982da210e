"""The write probe on a local directory: every step timed, nothing left behind, no symlink games."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.posix.atomic import EXCLUSIVE_FLAGS, parse_temp_name, temp_name
from fsprobe.probing.write import probe_write
from tests.support.capability import need_root
from tests.support.policy import WRITE_STEPS


def test_rehearses_every_step_and_leaves_nothing(tmp_path):
    (tmp_path / "keep.pt").write_bytes(b"x")
    result = probe_write(str(tmp_path), size=64 * 1024)
    assert result.ok and result.bytes == 64 * 1024
    assert set(result.latency_seconds) == {*WRITE_STEPS, "total"}
    assert result.total_seconds >= sum(
        seconds for step, seconds in result.latency_seconds.items() if step != "total"
    )
    assert sorted(os.listdir(tmp_path)) == ["keep.pt"]


def test_missing_target_is_probed_in_its_nearest_existing_parent(tmp_path):
    result = probe_write(str(tmp_path / "not" / "yet"), size=1024)
    assert result.ok
    assert os.listdir(tmp_path) == []  # no directory was created


def _probe_as_unprivileged_user(directory: str) -> ProbeFailure | None:
    """Run the probe in a forked child that dropped root, so that permissions apply."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        outcome = b"ok"
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            probe_write(directory, size=1024)
        except ProbeFailure as failure:
            outcome = f"{failure.error} {failure.value.step}".encode()
        except BaseException as error:
            outcome = repr(error).encode()
        os.write(write_end, outcome)
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read().decode()


def test_failure_records_step_and_errno_and_cleans_up(tmp_path):
    tmp_path.chmod(0o755)
    if os.geteuid() == 0:
        outcome = _probe_as_unprivileged_user(str(tmp_path))
    else:
        tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            with pytest.raises(ProbeFailure) as failure:
                probe_write(str(tmp_path), size=1024)
        finally:
            tmp_path.chmod(0o755)
        outcome = f"{failure.value.error} {failure.value.value.step}"
    assert outcome == "EACCES create"
    assert os.listdir(tmp_path) == []


def test_read_only_directory_via_bind_mount_is_erofs(tmp_path):
    need_root("a read-only bind mount")
    target = tmp_path / "ro"
    target.mkdir()
    subprocess.run(["mount", "--bind", str(target), str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        with pytest.raises(ProbeFailure) as failure:
            probe_write(str(target), size=1024)
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert failure.value.error == "EROFS"
    assert failure.value.value.step == "create"


def test_temp_names_are_hidden_unique_and_carry_their_writer():
    first, second = temp_name("model.pt"), temp_name("model.pt")
    assert first != second
    assert first.startswith(".") and first.endswith(".tmp") and not first.endswith(".pt")
    parsed = parse_temp_name(first)
    assert parsed.pid == os.getpid() and parsed.base == "model.pt"
    assert parse_temp_name("model.pt") is None
    assert parse_temp_name(".fsprobe~host~notapid~ab~x.tmp") is None
    assert len(temp_name("x" * 255)) <= 255


def test_exclusive_create_refuses_an_existing_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    trap = tmp_path / "trap"
    trap.symlink_to(victim)
    with pytest.raises(FileExistsError):
        os.open(trap, EXCLUSIVE_FLAGS, 0o600)
    assert victim.read_text() == "precious"
