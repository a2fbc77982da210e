"""A user who fills a shared fallback directory with names, against root's listing of areas.

Root's daemon lists every fallback directory's areas every round (to count pending bytes) and
root's `fsprobe sync` acts for every user it finds there. On main that listing looked at every
name and kept every area: Mallory's thousands of directories ``uid-<her uid>.<16 hex digits>``
(hers, 0700, the form of a private area) were thousands of areas, each a manifest read by root
every minute. Now at most `MAX_AREA_NAMES` names are looked at and `MAX_AREAS_PER_USER` areas
of one user kept; what is left out is said (root's sync exits 2, the daemon logs
``event=fallback_crowded`` once and counts it), and the honest users' areas are all there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fsprobe.redirect.areas import MAX_AREA_NAMES, claim_area, own_area
from fsprobe.redirect.manifest import MAX_AREAS_PER_USER, areas
from tests.redirect.test_trust_fallback import area_of, fsprobe_sync, make_dir, save_as
from tests.support.daemon_process import DaemonProcess, clean_environment
from tests.support.users import share

MALLORYS_AREAS = 2_000


@pytest.fixture
def place(tmp_path: Path) -> Path:
    share(tmp_path)
    return tmp_path


def make_areas(fallback: Path, count: int) -> None:
    """As their user: `count` directories in the form of that user's private areas."""
    for number in range(count):
        os.mkdir(fallback / f"uid-{os.getuid()}.{number:016x}", 0o700)


def test_a_user_with_thousands_of_areas_costs_root_only_her_share(local_users, place):
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # not Alice's to write: her save is redirected
    assert save_as(alice, target / "model.pt", "alice's", scratch)["redirected"]
    mallory.run(make_areas, scratch, MALLORYS_AREAS)

    listing = areas(str(scratch))
    owners = [area.owner for area in listing]
    assert owners.count(mallory.uid) == MAX_AREAS_PER_USER  # on main: all 2,000 of them
    assert [a.path for a in listing if a.owner == alice.uid] == [str(area_of(scratch, alice))]
    assert f"uid {mallory.uid} has more than {MAX_AREAS_PER_USER} areas" in listing.crowded

    os.chown(target, alice.uid, alice.gid)  # now her save can go home
    code, report = fsprobe_sync(local_users.python, None, "--fallback-dir", str(scratch))
    assert code == 2, report  # not every area was looked at: never a green exit
    assert report["crowded"] and str(mallory.uid) in report["crowded"][0]
    assert {(e["owner"], e["action"]) for e in report["entries"]} == {(alice.uid, "synced")}
    assert (target / "model.pt").read_text() == "alice's"


def test_a_listing_stops_at_its_cap_of_names_and_says_so(local_users, place):
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    os.mkdir(area_of(scratch, alice), 0o700)
    os.chown(area_of(scratch, alice), alice.uid, alice.gid)

    def flood() -> None:
        for number in range(600):
            os.close(os.open(scratch / f"junk-{number}", os.O_CREAT | os.O_WRONLY, 0o600))

    mallory.run(flood)
    whole = areas(str(scratch), max_names=1_000)
    assert whole.crowded == "" and [a.owner for a in whole] == [alice.uid]
    cut = areas(str(scratch), max_names=100)
    assert f"{scratch}: it holds more than 100 names" in cut.crowded
    assert len(cut.found) <= 1


def test_the_daemon_names_a_crowded_fallback_once(local_users, place):
    mallory = local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)
    mallory.run(make_areas, scratch, MAX_AREAS_PER_USER + 5)
    config = place / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.2\nwrite_probe = false\n"
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{scratch}"]\n'
    )
    home = make_dir(place / "daemon", 0o700)
    daemon = DaemonProcess(home, "--config", str(config), "-v", env=clean_environment())
    with daemon:
        line = daemon.wait_for_log("event=fallback_crowded", timeout=30)
        labels = {"path": str(target), "problem": "fallback_crowded"}
        daemon.wait_for_value("fsprobe_redirect_problems_total", 1.0, timeout=30, **labels)
        # statvfs every 0.5 s, the count every 0.2 s: some 25 more counts
        daemon.wait_for_log("event=probe ", count=10, timeout=60)
        assert daemon.value("fsprobe_redirect_problems_total", **labels) == 1.0
        log = daemon.log()
    assert f"uid {mallory.uid} has more than" in line and "level=error" in line
    assert log.count("event=fallback_crowded") == 1


def _flood_of_names(fallback: Path, count: int) -> None:
    for number in range(count):
        os.close(os.open(fallback / f"n{number}", os.O_CREAT | os.O_WRONLY, 0o600))


def test_a_squat_and_a_flood_of_names_do_not_hide_a_users_area_from_herself(local_users, tmpfs):
    """Mallory squats ``uid-<alice>``, Alice's saves use the private area they make instead,
    then Mallory fills the fallback with more than `MAX_AREA_NAMES` names. On tmpfs (newest
    name listed first) Alice's area came after the cap: her own `own_area` fell back to the
    squat, and her resume would load an older checkpoint. Root's listing stops at the cap;
    hers looks at every name."""
    alice, mallory = local_users.user(), local_users.user()
    fs = tmpfs(size="64M", nr_inodes=MAX_AREA_NAMES + 10_000, mode=0o1777)
    fallback = fs.path
    mallory.run(os.mkdir, fallback / f"uid-{alice.uid}", 0o700)
    claimed = alice.run(lambda: claim_area(str(fallback)).path)
    assert claimed != str(fallback / f"uid-{alice.uid}")
    mallory.run(_flood_of_names, fallback, MAX_AREA_NAMES + 1, timeout=300)
    assert alice.run(lambda: own_area(str(fallback)).path) == claimed
