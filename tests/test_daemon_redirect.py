"""The daemon and redirected checkpoints: counted in a metric, copied back with --sync-redirected.

A save that `fsprobe.save` redirected to a fallback directory is recorded in that directory's
manifest; the daemon, given the fallback, exports how many bytes wait to go back to each target
(`fsprobe_redirected_pending_bytes`, alert `FsprobeRedirectedCheckpointsPending`) and, when
asked, copies them back once the target can take them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import fsprobe
from fsprobe.saving.manifest import pending
from tests.daemon_process import DaemonProcess, clean_environment


def redirected_save(target: Path, fallback: Path, payload: bytes) -> Path:
    """Save into `target` while it is mounted read-only, so that the save lands in `fallback`."""
    subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)], check=True)
    try:
        result = fsprobe.atomic_write(
            str(target / "last.ckpt"), lambda f: f.write(payload), fallback_dirs=[str(fallback)]
        )
    finally:
        subprocess.run(["umount", str(target)], check=True)
    assert result.redirected, result
    return Path(result.path)


def daemon_config(tmp_path: Path, target: Path, fallback: Path) -> Path:
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.5\nwrite_probe = false\n"
        'quota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{fallback}"]\n'
    )
    return config


def test_pending_bytes_are_exported_and_synced_back_on_request(tmp_path, tmpfs):
    target = tmpfs(size="8M", nr_inodes=200).path
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    payload = os.urandom(300_000)
    landed = redirected_save(target, fallback, payload)
    assert landed.is_relative_to(fallback) and landed.read_bytes() == payload
    assert [entry.bytes for entry in pending([str(fallback)])] == [len(payload)]

    config = daemon_config(tmp_path, target, fallback)
    env = clean_environment(TMPDIR=str(target))
    home = tmp_path / "counting"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), env=env) as daemon:
        daemon.wait_for_value(
            "fsprobe_redirected_pending_bytes", float(len(payload)), path=str(target)
        )
        assert daemon.value("fsprobe_probe_success", path=str(target), probe="redirect") == 1.0
    assert not (target / "last.ckpt").exists()  # counting alone never copies

    home = tmp_path / "syncing"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config), "--sync-redirected", env=env) as daemon:
        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 0.0, path=str(target))
    assert (target / "last.ckpt").read_bytes() == payload
    assert not landed.exists()
    assert pending([str(fallback)]) == []
