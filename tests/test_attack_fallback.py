"""A shared fallback directory, attacked by the neighbours who share it (issue 13).

A fallback directory is where fsprobe puts a user's checkpoint when its target cannot take it:
often a team's directory or a scratch root that many users write. Each test is a real attack
by a real second user (`local_users`) on what fsprobe keeps or does there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.users import share
from tests.test_trust_fallback import make_dir, save_as


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A directory every test user can reach; what is made inside decides what they may do."""
    share(tmp_path)
    return tmp_path


def test_a_redirected_checkpoint_is_no_more_readable_than_where_it_was_meant_to_go(
    local_users, place
):
    """Alice's checkpoints go to a directory only she may enter; redirected to a scratch
    fallback, the copy sat in directories of mode 0755 and anyone could read her weights."""
    alice, mallory = local_users.user(), local_users.user()
    private = make_dir(place / "alice", 0o700, owner=alice)
    target = make_dir(private / "ckpt", 0o755)  # root's: her save is refused and redirected
    scratch = make_dir(place / "scratch", 0o1777)
    result = save_as(alice, target / "model.pt", "alice's weights", scratch)
    assert result["redirected"], result
    copy = Path(result["path"])
    assert alice.run(copy.read_text) == "alice's weights"  # hers to load

    def look(path: str) -> dict:
        seen = {}
        for name, action in (("read", lambda: Path(path).read_text()), ("list", os.listdir)):
            try:
                seen[name] = action() if name == "read" else action(os.path.dirname(path))
            except PermissionError:
                seen[name] = "refused"
        return seen

    assert mallory.run(look, str(copy)) == {"read": "refused", "list": "refused"}
    assert mallory.run(os.listdir, str(scratch)) == [f"uid-{alice.uid}"]


def test_an_area_an_earlier_version_left_open_is_closed_at_the_next_save(local_users, place):
    alice = local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    area = scratch / f"uid-{alice.uid}"
    alice.run(lambda: (area.mkdir(), area.chmod(0o755)))
    target = make_dir(place / "ckpt", 0o755)  # root's: redirected
    assert save_as(alice, target / "model.pt", "weights", scratch)["redirected"]
    assert area.stat().st_mode & 0o777 == 0o700
