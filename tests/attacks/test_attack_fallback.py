"""A shared fallback directory, attacked by the neighbours who share it (issue 13).

A fallback directory is where fsprobe puts a user's checkpoint when its target cannot take it:
often a team's directory or a scratch root that many users write. Each test is a real attack
by a real second user (`local_users`) on what fsprobe keeps or does there.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsprobe.redirect import manifest
from fsprobe.redirect.areas import own_area, prepare_directory, redirect_path
from fsprobe.redirect.manifest import MAX_AREA_ENTRIES
from tests.redirect.test_trust_fallback import make_dir, save_as, syncing_daemon
from tests.support.users import REPO, share


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


#: Root's count of the bytes waiting in a fallback (the daemon's task, every minute), in a
#: process of its own: (bytes counted, how much its peak memory grew in MiB).
COUNT = """
import resource, sys
from fsprobe.redirect.manifest import measure_pending
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
counted = measure_pending([sys.argv[1]], under=sys.argv[2])[0]
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(counted, grown // 1024)
"""


def _plant_manifest(area: str, target: str, size: int) -> None:
    """Mallory's own manifest of `size` bytes of sound lines, each for a copy of her own."""
    os.mkdir(area, 0o700)
    written = 0
    with open(os.path.join(area, manifest.MANIFEST), "w") as stream:
        for number in itertools.count():
            requested = f"{target}/epoch-{number}.pt"
            line = json.dumps(
                {"requested": requested, "actual": area + requested, "bytes": 1 << 30,
                 "sha256": "0" * 64, "time": 1.0, "host": "node", "pid": 1}
            ) + "\n"  # fmt: skip
            if written + len(line) > size:
                return
            stream.write(line)
            written += len(line)


@pytest.mark.parametrize("planted_mib", [60, "just under the cap"])
def test_a_huge_manifest_costs_roots_count_little_memory(local_users, place, planted_mib):
    """Mallory's own manifest, 60 MiB of sound lines, was under the cap (64 MiB): root's count
    parsed it all, every minute, in the daemon's worker: 400 MiB at its peak, above the
    memory limits the systemd unit and the DaemonSet ship (256M, 128Mi), and 35 s of CPU."""
    bob, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Bob's save is redirected
    assert save_as(bob, target / "model.pt", "bob's", scratch)["redirected"]
    size = planted_mib << 20 if isinstance(planted_mib, int) else manifest.MAX_MANIFEST_BYTES - 4096
    mallory.run(_plant_manifest, str(scratch / f"uid-{mallory.uid}"), str(target), size)

    done = subprocess.run(
        [sys.executable, "-c", COUNT, str(scratch), str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counted, grown_mib = map(int, done.stdout.split())
    assert counted == len("bob's")  # Mallory's claims are not counted: no copy is there
    assert grown_mib < 48, grown_mib


def test_hostile_lines_in_a_manifest_cost_roots_count_one_warning_each_kind(local_users, place):
    """A line of 100,000 nested brackets raised RecursionError out of root's count: the
    daemon's pending-bytes task failed for the whole target, Bob's bytes went unreported."""
    bob, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Bob's save is redirected
    assert save_as(bob, target / "model.pt", "bob's", scratch)["redirected"]

    def plant(area: str) -> None:
        os.mkdir(area, 0o700)
        with open(os.path.join(area, manifest.MANIFEST), "w") as stream:
            stream.write("[" * 100_000 + "\n" + "not json\n" * 100_000)

    mallory.run(plant, str(scratch / f"uid-{mallory.uid}"))
    done = subprocess.run(
        [sys.executable, "-c", COUNT, str(scratch), str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) == len("bob's")
    assert len(done.stderr.splitlines()) < 10, done.stderr[:2000]


def test_a_file_saved_again_and_again_keeps_its_manifest_small(tmpfs):
    """With the cap on what is read, a legitimate manifest must stay far below it: each
    redirected save of ``last.pt`` adds a line, and a long outage adds thousands."""
    fallback = tmpfs(size="64M").path
    requested = "/lustre/proj/run7/last.pt"
    actual = redirect_path(str(fallback), requested)
    prepare_directory(str(fallback), actual)
    Path(actual).write_bytes(b"weights")
    entries = []
    for saved in range(4 * manifest.COMPACT_BYTES // 300):  # about 4 times the threshold
        entries.append(manifest.new_entry(str(fallback), requested, actual, 7, f"{saved:064x}"))
        manifest.record(entries[-1])
    area = own_area(str(fallback))
    size = os.stat(os.path.join(area.path, manifest.MANIFEST)).st_size
    assert size <= manifest.COMPACT_BYTES + len(entries[-1].to_line())
    kept = manifest.read_manifest(area)
    assert kept[-1] == entries[-1] and kept == entries[-len(kept) :]  # the newest, in order
    assert manifest.pending([str(fallback)]) == [entries[-1]]


def _plant_directory_copy(fallback: str, requested: str, files: int) -> str:
    """A sound entry for a directory copy of Mallory's own holding `files` one-byte files
    (her own redirected ``save_dir``, or one she made so): the copy's path."""
    actual = redirect_path(fallback, requested)
    prepare_directory(fallback, actual)
    os.mkdir(actual, 0o755)
    for number in range(files):
        with open(os.path.join(actual, f"shard-{number}"), "w") as stream:
            stream.write("x")
    digest = manifest.sha256_of_directory(actual)
    manifest.record(manifest.new_entry(fallback, requested, actual, files, digest))
    return actual


def _sync_capped(fallback: str, under: str, max_entries: int) -> list[tuple[str, str]]:
    from fsprobe.redirect.sync import sync

    report = sync([fallback], under=under, ready=lambda entry: None, max_entries=max_entries)
    return [(outcome.action, outcome.message) for outcome in report]


def test_a_directory_copy_past_the_entry_cap_is_neither_counted_nor_synced(local_users, place):
    """A directory copy of 600,000 empty files in Mallory's own area was listed whole, with an
    lstat per name, by root's pending-bytes count (538 MiB) and by the sync of it: the worker
    was OOM-killed under the shipped memory limit. Both now stream the entries and stop at the
    cap (`MAX_AREA_ENTRIES`, passed by the daemon; a smaller one here): the copy is not
    counted, not synced and not deleted, and the count names the area."""
    bob, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Bob's save is redirected
    assert save_as(bob, target / "model.pt", "bob's", scratch)["redirected"]
    requested = str(target / "run")
    copy = mallory.run(_plant_directory_copy, str(scratch), requested, 3000)
    area = str(scratch / f"uid-{mallory.uid}")

    assert manifest.measure_pending([str(scratch)], str(target), max_entries=1000) == (
        len("bob's"),
        (area,),
    )
    assert manifest.count_fallbacks(
        [str(scratch)], str(target), max_entries=1000
    ).too_many_entries == (area,)
    assert manifest.measure_pending([str(scratch)], str(target), max_entries=3000) == (
        len("bob's") + 3000,
        (),
    )

    os.chown(target, mallory.uid, -1)  # the target could take her copy back now
    [(action, message)] = mallory.run(_sync_capped, str(scratch), str(target), 1000)
    assert action == "too_many_entries", message
    assert area in message
    assert not os.path.exists(requested)
    assert os.listdir(target) == []  # no staging directory left behind
    assert len(os.listdir(copy)) == 3000  # the copy stays where it is, whole
    assert [e.actual for e in manifest.pending([str(scratch)]) if e.area.owner == mallory.uid] == [
        copy
    ]

    [(action, message)] = mallory.run(_sync_capped, str(scratch), str(target), 3001)
    assert action == "synced", message
    assert len(os.listdir(requested)) == 3000


def test_the_daemon_names_an_area_past_the_entry_cap_once(local_users, place):
    """Root's daemon, counting and syncing every round, names an area whose directory copy is
    past the cap once (event=area_too_many_entries), not at every count and every sync; the
    other users' checkpoints go back all the same."""
    bob, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Bob's save is redirected
    assert save_as(bob, target / "model.pt", "bob's", scratch)["redirected"]
    copy = mallory.run(
        _plant_directory_copy, str(scratch), str(target / "run"), MAX_AREA_ENTRIES + 1,
        timeout=300,
    )  # fmt: skip
    daemon = syncing_daemon(
        place, target, scratch, local_users.python, defaults='quota_probe = "never"\n'
    )
    with daemon:
        line = daemon.wait_for_log("event=area_too_many_entries", timeout=120)
        os.chown(target, bob.uid, -1)  # a later round brings Bob's back, and meets hers again
        daemon.wait_for_log("action=synced", timeout=120)
        log = daemon.log()
    assert f"area={scratch}/uid-{mallory.uid}" in line, line
    assert log.count("event=area_too_many_entries") == 1, log
    assert (target / "model.pt").read_text() == "bob's"
    assert len(os.listdir(copy)) == MAX_AREA_ENTRIES + 1  # left where it is
