"""A team member against root's copy back of its own redirected checkpoint.

Root's checkpoint was saved into a directory of a team directory that every member may rename
in; the copy back (root's `fsprobe sync`, or the root daemon's sync task) comes later, by the
path the manifest recorded.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.redirect.test_redirect_sync import Setup, sync_cli
from tests.redirect.test_trust_fallback import make_dir
from tests.support.users import share


@pytest.mark.parametrize("checkpoint", ["file", "directory"])
def test_roots_copy_back_follows_no_symlink_a_neighbour_put_on_the_way(
    local_users, tmp_path, checkpoint
):
    """Root's checkpoint `team/run/model.pt` went to root's fallback. Mallory, a member of
    the team (`team` is root's, 2770: the members may rename in it), renamed `run` away and
    put a symlink to Bob's project in its place, where Bob has an older `model.pt`: root's
    sync opened the recorded directory by its path, moved Bob's file aside, linked root's copy
    in and unlinked Bob's. A symlink on the way that is neither root's nor the syncing user's
    is not followed: the copy is refused, and stays in the fallback."""
    share(tmp_path)
    team = local_users.group()
    mallory, bob = local_users.user(team), local_users.user()
    setup = Setup(tmp_path)
    shared = make_dir(tmp_path / "team", 0o2770, group=team)
    setup.target = make_dir(shared / "run", 0o755)
    project = make_dir(tmp_path / "bob", 0o755, owner=bob)
    if checkpoint == "file":
        result = setup.save_redirected({"root's": 1}, name="model.pt")
    else:
        setup.mark_target(readonly=True)
        result = fsprobe_save_dir(setup, "model.pt")
        setup.mark_target()
    bobs = project / "model.pt"
    if checkpoint == "directory":  # Bob's checkpoint is a directory too
        bob.run(os.mkdir, str(bobs))
        bobs = bobs / "weights"
    bob.run(bobs.write_bytes, b"bob's")
    older = (time.time() - 3600,) * 2  # than root's copy: it would be replaced
    os.utime(bobs, older)
    os.utime(project / "model.pt", older)

    mallory.run(os.rename, str(setup.target), str(shared / "run.old"))
    mallory.run(os.symlink, str(project), str(setup.target))

    status, report = sync_cli(
        "--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state)
    )
    assert bobs.read_bytes() == b"bob's" and bobs.stat().st_uid == bob.uid, report
    assert sorted(os.listdir(project)) == ["model.pt"], report
    assert (project / "model.pt").stat().st_uid == bob.uid, report
    assert status == 2 and [e["action"] for e in report["entries"]] == ["failed"], report
    assert "symbolic link" in report["entries"][0]["message"], report
    assert os.path.exists(result.path)  # still in the fallback, for a sync that may follow


def fsprobe_save_dir(setup: Setup, name: str):
    import fsprobe

    def write(staging: str) -> None:
        with open(os.path.join(staging, "weights"), "wb") as stream:
            stream.write(b"root's")

    result = fsprobe.save_dir(
        setup.target / name, write, fallback_dirs=[setup.fallback], state_dir=str(setup.state)
    )
    assert result.redirected
    return result
