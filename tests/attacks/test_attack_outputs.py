"""What root's daemon writes into (its state dir, node_exporter's textfile dir), attacked by a
local user who owns a directory on the way there (issue 18.7).

The daemon rewrites its outputs every few seconds. Written by path, each write went wherever
the path led at that moment: a user who could rename the textfile dir's parent replaced the
textfile dir with a symlink, and root's next rename replaced a root-owned ``fsprobe.prom`` in a
directory of root's choosing (or any file named so, anywhere). Now the directories are opened
once at start, checked like the state dir (root's or ours, writable by nobody else, not a
symlink), and written relative to the descriptor.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess, clean_environment, fast_config, run_fsprobe
from tests.support.users import share


def wait_for(condition, what: str = "", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.05)


def test_a_textfile_dir_swapped_for_a_symlink_while_the_daemon_runs_is_not_followed(
    local_users, tmp_path
):
    share(tmp_path)
    mallory = local_users.user()
    home = tmp_path / "mallory"  # e.g. /var/lib/prometheus, of the prometheus user
    home.mkdir(mode=0o755)
    os.chown(home, mallory.uid, mallory.gid)
    theirs = home / "node-exporter"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, mallory.uid, mallory.gid)
    textfiles = theirs / "textfile"
    textfiles.mkdir(mode=0o755)  # root's
    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir(mode=0o700)
    precious = elsewhere / "fsprobe.prom"
    precious.write_text("precious\n")
    target = tmp_path / "ckpt"
    target.mkdir()
    config = fast_config(tmp_path / "fsprobe.toml", target)
    env = clean_environment(TMPDIR=str(target))
    args = ("--config", str(config), "--textfile-dir", str(textfiles))
    with DaemonProcess(tmp_path, *args, env=env) as daemon:
        wait_for((textfiles / "fsprobe.prom").exists)

        def swap() -> None:  # root's directory cannot be moved, the one above it can
            os.rename(theirs, home / "moved")
            os.mkdir(theirs, 0o755)
            os.symlink(elsewhere, textfiles)

        mallory.run(swap)
        moved = home / "moved" / "textfile" / "fsprobe.prom"
        written = moved.stat().st_mtime_ns
        wait_for(
            lambda: moved.stat().st_mtime_ns != written,
            "the daemon goes on writing the textfile in the directory it opened",
        )
        time.sleep(1.0)  # a few more rounds
        log = daemon.log()
    assert precious.read_text() == "precious\n"
    assert sorted(os.listdir(elsewhere)) == ["fsprobe.prom"]  # nothing of root's written there
    assert "output_failed" not in log


@pytest.mark.parametrize("kind", ["symlink", "open to others", "another user's"])
def test_a_textfile_dir_someone_else_could_write_is_refused_at_start(local_users, tmp_path, kind):
    share(tmp_path)
    mallory = local_users.user()
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    textfiles = tmp_path / "textfile"
    if kind == "symlink":
        textfiles.symlink_to(real)
        os.lchown(textfiles, mallory.uid, mallory.gid)
    else:
        textfiles.mkdir()
        os.chmod(textfiles, 0o777 if kind == "open to others" else 0o755)
        if kind == "another user's":
            os.chown(textfiles, mallory.uid, mallory.gid)
    target = tmp_path / "ckpt"
    target.mkdir()
    code, _out, err = run_fsprobe(
        "run", "--once", "--state-dir", str(tmp_path / "state"),
        "--textfile-dir", str(textfiles), str(target),
        env=clean_environment(TMPDIR=str(target)),
    )  # fmt: skip
    assert code == 69, err
    assert f"textfile dir {textfiles}" in err
    reason = {
        "symlink": "is a symbolic link",
        "open to others": "is writable by group or others",
        "another user's": f"belongs to uid {mallory.uid}",
    }[kind]
    assert reason in err
    assert os.listdir(real) == [] and not any(Path(textfiles).glob("*.prom"))


def test_the_state_dir_is_written_where_it_was_opened(local_users, tmp_path):
    """The state dir is opened once too: a state dir renamed away and replaced by the owner
    of its parent keeps the daemon's state file, and nothing lands in the new one."""
    share(tmp_path)
    mallory = local_users.user()
    theirs = tmp_path / "run"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, mallory.uid, mallory.gid)
    target = tmp_path / "ckpt"
    target.mkdir()
    config = fast_config(tmp_path / "fsprobe.toml", target)
    daemon = DaemonProcess(
        tmp_path, "--config", str(config), env=clean_environment(TMPDIR=str(target))
    )
    daemon.state_dir = theirs / "state"
    daemon.args[daemon.args.index("--state-dir") + 1] = str(daemon.state_dir)
    with daemon:
        state = daemon.state_dir / "state.json"
        wait_for(state.exists)

        def swap() -> None:
            os.rename(theirs / "state", theirs / "moved")
            os.mkdir(theirs / "state", 0o755)

        mallory.run(swap)
        moved = theirs / "moved" / "state.json"
        written = moved.stat().st_mtime_ns
        wait_for(
            lambda: moved.stat().st_mtime_ns != written,
            "the daemon goes on writing its state file in the directory it opened",
        )
        log = daemon.log()
    assert os.listdir(theirs / "state") == []
    assert "output_failed" not in log
