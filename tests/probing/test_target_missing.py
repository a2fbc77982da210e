"""A path that does not exist says so (issue 17.3).

It is still judged by its nearest existing parent (a checkpoint directory often does not
exist before the first save), but a mistyped `/lustre/proj/porj/ckpt` read ` OK ` on main
with no word that it does not exist, and the daemon logged nothing. And `preflight(DIR)` of an
existing directory judged DIR's parent.
"""

from __future__ import annotations

import json

import fsprobe
from tests.support.daemon_process import DaemonProcess, fast_config, run_fsprobe


def test_check_of_a_missing_path_says_which_parent_judged_it(tmp_path):
    missing = tmp_path / "porj" / "ckpt"
    code, out, err = run_fsprobe("check", str(missing), "--no-write-probe")
    assert code == 0, out + err
    header = out.splitlines()[:2]
    assert str(missing) in header[0]
    assert header[1].strip() == f"does not exist: judged by {tmp_path}, its nearest existing parent"

    code, out, _ = run_fsprobe("check", str(missing), "--no-write-probe", "--json")
    report = json.loads(out)
    assert (report["exists"], report["judged_path"]) == (False, str(tmp_path))
    code, out, _ = run_fsprobe("check", str(tmp_path), "--no-write-probe", "--json")
    report = json.loads(out)
    assert (report["exists"], report["judged_path"]) == (True, str(tmp_path))
    assert "does not exist" not in run_fsprobe("check", str(tmp_path), "--no-write-probe")[1]


def test_the_daemon_warns_of_a_missing_target_at_start_and_when_it_changes(tmp_path):
    missing = tmp_path / "ckpt"
    config = fast_config(tmp_path / "fsprobe.toml", missing)
    with DaemonProcess(tmp_path, "--config", str(config)) as daemon:
        line = daemon.wait_for_log("event=target_missing")
        assert "level=warning" in line and f"judged_by={tmp_path}" in line
        missing.mkdir()
        daemon.wait_for_log("event=target_exists")
        missing.rmdir()
        daemon.wait_for_log("event=target_missing", count=2)
        _, out, _ = run_fsprobe("status", "--state-dir", str(daemon.state_dir), "--json")
        assert json.loads(out)["targets"][str(missing)]["exists"] is False
    assert daemon.log().count("event=target_missing") == 2  # not once per probe


def test_preflight_of_an_existing_directory_judges_that_directory(tmpfs, tmp_path):
    """The directory is a 1 MiB tmpfs mounted in a large parent: judged itself, 10 MiB do
    not fit; judged by its parent (main), they did."""
    small = tmpfs(size="1M").path
    decision = fsprobe.preflight(small, need_bytes=10 << 20, state_dir=str(tmp_path))
    assert decision.fits is False and decision.status.label == "unhealthy", decision
    # a checkpoint file in it: the same directory judges it
    inside = fsprobe.preflight(small / "model.pt", need_bytes=10 << 20, state_dir=str(tmp_path))
    assert inside.fits is False
    # a path that does not exist yet is judged by the directory that will hold it
    new = fsprobe.preflight(tmp_path / "step-1", need_bytes=10 << 20, state_dir=str(tmp_path))
    assert new.fits is True
