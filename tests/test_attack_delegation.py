"""Root acting for users (`fsprobe.saving.delegate`), attacked and as bad luck would have it.

Root's sync (`fsprobe sync` as root, the root daemon's sync task) acts on a user's fallback area
only through ``fsprobe sync`` run as that user. These tests attack that run from both sides:
from the daemon it lives in (its probe worker kills the children it does not know), and from
the user it runs as (a process of theirs that they may signal, trace and inspect), with real
accounts, a real daemon and real processes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess, clean_environment
from tests.support.users import share
from tests.test_trust_fallback import make_dir, save_as


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A directory every test user can reach; what is made inside decides what they may do."""
    share(tmp_path)
    return tmp_path


def test_a_users_sync_back_is_not_killed_by_the_lfs_runs_beside_it(local_users, place):
    """The probe worker reaps what an `lfs` leaves behind: every child it did not start as an
    lfs run. The sync task's run as the user is a child of the worker too, and was killed at
    the end of every quota probe of any target (the checkpoint never went back)."""
    alice = local_users.user()
    fallback = make_dir(place / "fallback", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Alice's save is refused and redirected
    result = save_as(alice, target / "model.pt", "alice's weights", fallback)
    assert result["redirected"], result
    os.chown(target, alice.uid, -1)  # now it can take the checkpoint back
    lfs_runs = place / "lfs-runs"
    lfs = place / "lfs"
    lfs.write_text(f"#!/bin/sh\necho run >> {lfs_runs}\n")
    lfs.chmod(0o755)
    config = place / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.5\nwrite_probe = false\n"
        f'quota_probe = "always"\nquota_provider = "lfs"\nlfs = "{lfs}"\nquota_interval = 0.1\n'
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{fallback}"]\nuser = {alice.uid}\n'
    )
    home = make_dir(place / "daemon", 0o700)
    daemon = DaemonProcess(
        home, "--config", str(config), "--sync-redirected", env=clean_environment(),
        python=local_users.python,
    )  # fmt: skip
    with daemon:
        deadline = time.monotonic() + 60
        while not (target / "model.pt").exists():
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        line = daemon.wait_for_log("event=sync ")
    assert "action=synced" in line, daemon.log()
    assert (target / "model.pt").read_text() == "alice's weights"
    assert len(lfs_runs.read_text().splitlines()) > 5  # lfs ran, and ended, during the sync
    assert "could not sync" not in daemon.log()
