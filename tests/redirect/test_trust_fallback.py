"""Hostile neighbours in a shared fallback directory, with real users (issue 13: 1, 5, 6, 7).

fsprobe runs as root on nodes whose fallback directories other users can write: a team's
directory, a scratch root. Nothing one of them plants there (a symlink, a ``..``, a FIFO, a
manifest, a directory under someone else's name) may make fsprobe delete, overwrite or load
anything; the worst a neighbour gets is a logged refusal. Every test uses real accounts
(`local_users`), real symlinks and FIFOs and real processes: permissions are the kernel's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsprobe.redirect import manifest
from tests.support.daemon_process import DaemonProcess, clean_environment
from tests.support.users import REPO, LocalUser, share

MANIFEST = manifest.MANIFEST

SAVE = """
import json, sys, fsprobe
result = fsprobe.atomic_write(
    sys.argv[1], lambda f: f.write(sys.argv[2].encode()), fallback_dirs=sys.argv[3:], attempts=2
)
print(json.dumps({"path": result.path, "redirected": result.redirected, "errors": result.errors}))
"""

NEWEST_COPY = """
import sys
from fsprobe.redirect.manifest import newest_copy
print(newest_copy(sys.argv[1], sys.argv[2:]))
"""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry_line(requested: Path, actual: str, data: bytes) -> str:
    fields = {
        "requested": str(requested),
        "actual": actual,
        "bytes": len(data),
        "sha256": digest(data),
        "time": time.time(),
    }
    return json.dumps(fields) + "\n"


def make_dir(path: Path, mode: int, owner: LocalUser | None = None, group: int = -1) -> Path:
    path.mkdir()
    if owner is not None or group != -1:
        os.chown(path, owner.uid if owner else -1, group)
    path.chmod(mode)  # after chown, which clears the set-id bits
    return path


def syncing_daemon(
    place: Path, target: Path, fallback: Path, python: str, defaults: str = "", more: str = ""
) -> DaemonProcess:
    """Root's `fsprobe run --sync-redirected` of `target` with `fallback`, no write probe, its
    fallback counted and synced every 0.5 s, its home `place/daemon`; `defaults` and `more`
    add lines to the config's [defaults] and to the target."""
    config = place / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.5\nwrite_probe = false\n"
        f'{defaults}[[targets]]\npath = "{target}"\nfallback_dirs = ["{fallback}"]\n{more}'
    )
    home = make_dir(place / "daemon", 0o700)
    return DaemonProcess(
        home, "--config", str(config), "--sync-redirected", env=clean_environment(), python=python
    )


def area_of(fallback: Path, user: LocalUser) -> Path:
    return fallback / f"uid-{user.uid}"


def save_as(user: LocalUser, requested: Path, content: str, *fallbacks: Path) -> dict:
    done = user.python(SAVE, str(requested), content, *map(str, fallbacks))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def fsprobe_sync(python: str, user: LocalUser | None, *arguments: str) -> tuple[int, dict]:
    """`fsprobe sync --json` as `user` (as root when None), on an interpreter users can run."""
    as_user = user.subprocess_kwargs() if user is not None else {}
    done = subprocess.run(
        [python, "-m", "fsprobe", "sync", "--json", *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **as_user,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A directory every test user can reach; what is made inside decides what they may do."""
    share(tmp_path)
    return tmp_path


def _plant(scratch: str, root_only: str) -> None:
    """Mallory's best effort against root, planted as Mallory in a world-writable scratch."""
    scratch_dir, victim_dir = Path(scratch), Path(root_only)
    stolen = (victim_dir / "victim.pt").read_bytes()  # world-readable, so its sha256 is known
    # 1. A manifest where fsprobe used to keep them, its copy behind a symlink to root's dir.
    (scratch_dir / "link").symlink_to(victim_dir)
    legacy = entry_line(victim_dir / "planted.pt", f"{scratch}/link/victim.pt", stolen)
    (scratch_dir / MANIFEST).write_text(legacy)
    # 2. Mallory's own area, with a line that is sound on paper: the mirrored directory of
    #    root's directory is a symlink to it, so the "copy" is root's file itself.
    area = scratch_dir / f"uid-{os.getuid()}"
    mirror = area / str(victim_dir.parent).lstrip("/")
    mirror.mkdir(parents=True)
    (mirror / victim_dir.name).symlink_to(victim_dir)
    sound = entry_line(victim_dir / "victim.pt", f"{mirror}/{victim_dir.name}/victim.pt", stolen)
    # 3. A line that climbs out of the area with "..".
    climbing = entry_line(victim_dir / "victim.pt", f"{area}/../link/victim.pt", stolen)
    (area / MANIFEST).write_text(sound + climbing)
    (area / MANIFEST).chmod(0o600)
    # 4. Root's own area, made by Mallory, with a manifest of Mallory's.
    (scratch_dir / "uid-0").mkdir()
    (scratch_dir / "uid-0" / MANIFEST).write_text(sound)


def root_daemon_sync(python: str, target: Path, fallback: Path) -> subprocess.CompletedProcess:
    """The root daemon's tasks for `target` (fsprobe.daemon.tasks: sync back what the daemon's
    verdict lets through, count what waits), in a process of its own."""
    code = (
        "import sys\n"
        "from fsprobe.redirect.manifest import measure_pending\n"
        "from fsprobe.redirect.sync import sync\n"
        "sync([sys.argv[2]], under=sys.argv[1], ready=lambda entry: None)\n"
        "print(measure_pending([sys.argv[2]], under=sys.argv[1])[0])\n"
    )
    return subprocess.run(
        [python, "-c", code, str(target), str(fallback)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # a blocking open of a FIFO would wait forever
        check=False,
    )


def test_root_acts_on_a_users_manifest_only_as_that_user(local_users, place):
    mallory = local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    root_only = make_dir(place / "root-only", 0o755)
    victim = root_only / "victim.pt"
    victim.write_bytes(b"root's own checkpoint")
    mallory.run(_plant, str(scratch), str(root_only))

    code, report = fsprobe_sync(local_users.python, None, "--fallback-dir", str(scratch))
    assert root_daemon_sync(local_users.python, root_only, scratch).returncode == 0

    assert victim.read_bytes() == b"root's own checkpoint"
    assert sorted(os.listdir(root_only)) == ["victim.pt"]  # nothing planted, nothing deleted
    # Root refused its squatted area and ran Mallory's entries as Mallory, who was refused.
    assert code == 2
    assert {(e["owner"], e["action"]) for e in report["entries"]} == {(mallory.uid, "skipped")}
    assert len(report["entries"]) == 3
    messages = " ".join(e["message"] for e in report["entries"])
    assert "symbolic link" in messages and "not where" in messages


def _count(fallback: str, under: str) -> tuple[int, list[str]]:
    """What a user's daemon counts as pending under `under`, and what it warned about."""
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("fsprobe").addHandler(handler)
    return manifest.measure_pending([fallback], under=under)[0], warnings


def test_a_team_fallback_works_for_every_member_and_each_syncs_their_own(local_users, place):
    team = local_users.group()
    alice, bob = local_users.user(team), local_users.user(team)
    fallback = make_dir(place / "team", 0o3775, group=team)  # setgid and sticky, as documented
    targets = {user: make_dir(place / f"{user.name}-ckpt", 0o755) for user in (alice, bob)}
    for user in (alice, bob):  # the targets are not theirs to write (yet): EACCES, redirected
        result = save_as(user, targets[user] / "model.pt", f"{user.name}'s", fallback)
        assert result["redirected"] and result["errors"] == ["EACCES"]
        copy = Path(result["path"])
        assert copy.is_relative_to(area_of(fallback, user))
        assert copy.stat().st_uid == user.uid and copy.read_text() == f"{user.name}'s"
        assert area_of(fallback, user).stat().st_mode & 0o022 == 0  # nobody else writes it
    counted, warned = alice.run(_count, str(fallback), str(place))
    assert counted == len(f"{alice.name}'s") and warned == []  # Bob's manifest is his alone
    for user, target in targets.items():
        os.chown(target, user.uid, -1)  # the targets can take the checkpoints back now

    code, report = fsprobe_sync(local_users.python, alice, "--fallback-dir", str(fallback))
    assert code == 0, report
    assert [(e["owner"], e["action"]) for e in report["entries"]] == [(alice.uid, "synced")]
    assert (targets[alice] / "model.pt").read_text() == f"{alice.name}'s"
    assert not (targets[bob] / "model.pt").exists()  # Bob's is Bob's business

    code, report = fsprobe_sync(local_users.python, None, "--fallback-dir", str(fallback))
    assert code == 0, report
    assert [(e["owner"], e["action"]) for e in report["entries"]] == [(bob.uid, "synced")]
    synced = targets[bob] / "model.pt"
    assert synced.read_text() == f"{bob.name}'s" and synced.stat().st_uid == bob.uid
    assert os.listdir(fallback) == []


def test_a_symlink_in_place_of_a_users_area_diverts_nothing(local_users, place):
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    home = make_dir(place / "alice-home", 0o755, owner=alice)
    mallory.run(os.symlink, str(home), str(area_of(scratch, alice)))
    target = make_dir(place / "ckpt", 0o755)  # not Alice's to write: her save is redirected

    done = alice.python(SAVE, str(target / "model.pt"), "alice's", str(scratch))
    # A squat (issue 18.5): the save goes to a private area of hers, never through the link.
    assert done.returncode == 0, done.stderr
    assert private_area(scratch, alice) in Path(json.loads(done.stdout)["path"]).parents
    assert "someone made it first" in done.stderr
    assert os.listdir(home) == []  # not diverted into a directory of hers either
    assert os.listdir(target) == []


def private_area(fallback: Path, user: LocalUser) -> Path:
    """The area `user` made in `fallback` instead of a `uid-<uid>` someone else made first."""
    [area] = [p for p in fallback.iterdir() if p.name.startswith(f"uid-{user.uid}.")]
    assert (area.stat().st_uid, area.stat().st_mode & 0o777) == (user.uid, 0o700)
    return area


def test_a_resume_never_loads_a_copy_someone_else_planted(local_users, place):
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    requested = place / "ckpt" / "model.pt"
    planted = b"mallory's weights"
    area = area_of(scratch, alice)
    copy = Path(str(area) + str(requested))

    def squat() -> None:
        copy.parent.mkdir(parents=True)
        copy.write_bytes(planted)
        (area / MANIFEST).write_text(entry_line(requested, str(copy), planted))

    mallory.run(squat)
    done = alice.python(NEWEST_COPY, str(requested), str(scratch))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(requested)
    assert "belongs to uid" in done.stderr


def test_a_fifo_for_a_manifest_never_blocks_a_save_or_the_root_daemon(local_users, place):
    mallory = local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)

    def plant_fifos() -> None:
        os.mkfifo(scratch / MANIFEST)  # where a manifest used to be
        area = area_of(scratch, mallory)
        area.mkdir()
        os.mkfifo(area / MANIFEST)

    mallory.run(plant_fifos)
    done = root_daemon_sync(local_users.python, target, scratch)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    assert "not a regular file" in done.stderr


def test_a_fifo_in_place_of_its_own_manifest_costs_a_save_nothing(tmpfs, place):
    target = tmpfs(size="64k").path  # too small: the save is redirected (ENOSPC)
    fallback = make_dir(place / "fallback", 0o755)
    area = make_dir(fallback / f"uid-{os.geteuid()}", 0o755)
    os.mkfifo(area / MANIFEST)
    code = (
        "import json, sys, fsprobe\n"
        "result = fsprobe.atomic_write(sys.argv[1], lambda f: f.write(bytes(1 << 20)),\n"
        "                              fallback_dirs=[sys.argv[2]])\n"
        "print(json.dumps({'path': result.path, 'errors': result.errors}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(target / "model.pt"), str(fallback)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,  # a blocking open of the FIFO would wait forever, after the write
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["errors"] == ["ENOSPC"] and Path(result["path"]).stat().st_size == 1 << 20
    assert "not a regular file" in done.stderr and "copy it back by hand" in done.stderr


def test_a_squatted_area_never_stops_a_save(local_users, place):
    """`mkdir -m 700 <fallback>/uid-<victim>` by a neighbour made every redirect of the victim
    fail (EACCES; the sticky bit keeps her from removing it), and no line said why. Now the
    save warns once, naming the squatter, and lands in a private area nobody could have made
    in advance; later saves, locate and root's sync find it there."""
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)  # root's: Alice's saves are redirected
    mallory.run(lambda: os.mkdir(area_of(scratch, alice), 0o700))

    first = alice.python(SAVE, str(target / "model.pt"), "alice's", str(scratch))
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["redirected"], result
    private = private_area(scratch, alice)
    assert result["path"] == str(private) + str(target / "model.pt")
    warnings = [line for line in first.stderr.splitlines() if "someone made it first" in line]
    assert len(warnings) == 1 and f"uid {mallory.uid}" in warnings[0], first.stderr
    assert str(area_of(scratch, alice)) in warnings[0]

    second = alice.python(SAVE, str(target / "other.pt"), "alice's other", str(scratch))
    assert json.loads(second.stdout)["path"].startswith(str(private) + "/"), second.stderr
    assert "someone made it first" not in second.stderr  # once
    located = alice.python(NEWEST_COPY, str(target / "model.pt"), str(scratch))
    assert located.stdout.strip() == result["path"], located.stderr

    os.chown(target, alice.uid, -1)  # the target can take them back
    code, report = fsprobe_sync(local_users.python, None, "--fallback-dir", str(scratch))
    assert code == 0, report
    assert sorted((e["owner"], e["action"]) for e in report["entries"]) == [
        (alice.uid, "synced"), (alice.uid, "synced")
    ]  # fmt: skip
    assert (target / "model.pt").read_text() == "alice's"
    assert (target / "other.pt").read_text() == "alice's other"
    assert area_of(scratch, alice).stat().st_uid == mallory.uid  # hers, untouched


def test_the_daemon_counts_each_squatted_area_once(local_users, place):
    alice, mallory = local_users.user(), local_users.user()
    scratch = make_dir(place / "scratch", 0o1777)
    target = make_dir(place / "ckpt", 0o755)
    mallory.run(lambda: os.mkdir(area_of(scratch, alice), 0o700))
    config = place / "fsprobe.toml"
    config.write_text(
        "[defaults]\nstatvfs_interval = 0.5\nredirect_interval = 0.2\nwrite_probe = false\n"
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{scratch}"]\n'
    )
    home = make_dir(place / "daemon", 0o700)
    with DaemonProcess(home, "--config", str(config), env=clean_environment()) as daemon:
        line = daemon.wait_for_log("event=area_squatted", timeout=30)
        labels = {"path": str(target), "problem": "area_squatted"}
        daemon.wait_for_value("fsprobe_redirect_problems_total", 1.0, **labels)
        time.sleep(1.5)  # several more looks
        assert daemon.value("fsprobe_redirect_problems_total", **labels) == 1.0
        log = daemon.log()
    assert str(area_of(scratch, alice)) in line and "level=warning" in line
    assert log.count("event=area_squatted") == 1
