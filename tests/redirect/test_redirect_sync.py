"""Redirected saves and the way back: the manifest, `fsprobe sync`, and what sync never does."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import fsprobe
from fsprobe.model import QuotaState
from fsprobe.posix.atomic import parse_temp_name
from fsprobe.posix.owned import NotTrusted
from fsprobe.redirect import manifest, sync
from fsprobe.redirect.areas import open_root
from fsprobe.saving.options import Backoff
from fsprobe.saving.preflight import preflight_readiness
from tests.support.durability import assert_file_saved
from tests.support.state import daemon_view, publish, quota_entry

REPO = Path(__file__).resolve().parents[2]


def _sync_back(setup, **options):
    """`fsprobe sync` of the scenario's fallback, its targets judged by a preflight."""
    return sync.sync(
        [str(setup.fallback)],
        state_dir=str(setup.state),
        ready=preflight_readiness(str(setup.state)),
        **options,
    )


def no_sleep() -> Backoff:
    return Backoff(sleep=lambda seconds: None)


def model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torch.nn.Linear(512, 512).state_dict()


def assert_same_state(loaded, original) -> None:
    assert loaded.keys() == original.keys()
    assert all(torch.equal(loaded[k], original[k]) for k in original)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def area(fallback) -> Path:
    """This user's area in a fallback directory: their manifest and mirrored copies."""
    return Path(fallback) / f"uid-{os.geteuid()}"


def manifest_lines(fallback) -> list[dict]:
    path = area(fallback) / manifest.MANIFEST
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def files_under(directory) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(parent, name), directory)
        for parent, _, names in os.walk(directory)
        for name in names
    )


def sync_cli(*args: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync", "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


class Setup:
    """A target directory, a fallback directory and a state dir that can mark the target bad."""

    def __init__(self, tmp_path: Path) -> None:
        self.target = tmp_path / "ckpt"
        self.fallback = tmp_path / "fallback"
        self.state = tmp_path / "state"
        self.target.mkdir()
        self.fallback.mkdir()
        self.state.mkdir(mode=0o700)

    def mark_target(self, **facts) -> None:
        """The daemon's view of the target, with these facts seen (`daemon_view`)."""
        view = daemon_view(str(self.target), **facts)
        publish(str(self.state), {str(self.target): view})

    def save_redirected(self, obj, name: str = "model.pt") -> fsprobe.SaveResult:
        """A save that preflight redirects: the state file says the target is read-only."""
        self.mark_target(readonly=True)
        result = fsprobe.save(
            obj, self.target / name, fallback_dirs=[self.fallback], state_dir=str(self.state)
        )
        assert result.redirected
        self.mark_target()
        return result


@pytest.fixture
def setup(tmp_path) -> Setup:
    return Setup(tmp_path)


def test_edquot_redirects_to_the_fallback_and_sync_brings_it_back(faultfs, tmp_path):
    target_dir = faultfs.mountpoint / "ckpt"
    target_dir.mkdir()
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = target_dir / "model.pt"
    previous, state = model_state(seed=1), model_state(seed=2)
    fsprobe.save(previous, target)
    used = faultfs.ctl.quota()["bytes"]["used"]
    faultfs.ctl.set_quota("bytes", hard=used + 64 * 1024)  # the next 1 MiB save cannot fit

    result = fsprobe.save(state, target, fallback_dirs=[fallback], backoff=no_sleep())
    assert result.redirected and result.errors == ("EDQUOT",) and result.attempts == 2
    assert result.path == str(area(fallback)) + str(target)
    assert_same_state(torch.load(result.path), state)
    assert_same_state(torch.load(target), previous)  # untouched
    assert [n for n in os.listdir(target_dir) if parse_temp_name(n)] == []
    [line] = manifest_lines(fallback)
    assert line["requested"] == str(target) and line["actual"] == result.path
    assert line["bytes"] == result.bytes == os.path.getsize(result.path)
    assert line["sha256"] == sha256(result.path)
    assert abs(line["time"] - time.time()) < 60 and line["pid"] == os.getpid() and line["host"]
    assert manifest.measure_pending([str(fallback)], under=str(target_dir))[0] == result.bytes
    assert manifest.measure_pending([str(fallback)], under=str(tmp_path / "other"))[0] == 0

    code, report = sync_cli("--fallback-dir", str(fallback))  # quota still enforced
    assert code == 2 and report["entries"][0]["action"] == "failed"
    assert "failed: Disk quota exceeded (EDQUOT)" in report["entries"][0]["message"]
    assert_same_state(torch.load(target), previous)

    faultfs.ctl.lift_quota()
    code, report = sync_cli("--fallback-dir", str(fallback))
    assert code == 0, report
    [entry] = report["entries"]
    assert entry["action"] == "synced" and "sha256 verified" in entry["message"]
    assert_same_state(torch.load(target), state)
    assert_file_saved(faultfs, target)  # the copy back is as durable as a save
    assert os.listdir(target_dir) == ["model.pt"]  # the version it replaced is gone, no temp
    assert os.listdir(fallback) == []  # copy, mirrored directories and manifest all gone
    assert manifest.measure_pending([str(fallback)], under=str(target_dir))[0] == 0


def test_real_enospc_on_a_full_tmpfs_is_redirected(tmpfs, tmp_path):
    fs = tmpfs(size="256k")
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    result = fsprobe.save(
        model_state(), fs.path / "model.pt", fallback_dirs=[fallback], backoff=no_sleep()
    )
    assert result.redirected and result.errors == ("ENOSPC",)
    assert os.listdir(fs.path) == []
    assert manifest_lines(fallback)[0]["actual"] == result.path


def test_a_newer_original_is_never_overwritten(setup):
    redirected = model_state(seed=1)
    result = setup.save_redirected(redirected)
    newer = model_state(seed=2)
    time.sleep(0.01)
    fsprobe.save(newer, setup.target / "model.pt", state_dir=str(setup.state))

    code, report = sync_cli("--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state))
    assert code == 1 and report["entries"][0]["action"] == "superseded"
    assert_same_state(torch.load(setup.target / "model.pt"), newer)
    assert os.path.exists(result.path) and len(manifest_lines(setup.fallback)) == 1

    outcomes = _sync_back(setup, prune_superseded=True)
    assert [o.action for o in outcomes] == ["pruned"]
    assert_same_state(torch.load(setup.target / "model.pt"), newer)
    assert os.listdir(setup.fallback) == []


def test_a_copy_that_does_not_match_its_checksum_is_not_put_in_place(setup):
    previous = {"epoch": 1}
    fsprobe.save(previous, setup.target / "model.pt", state_dir=str(setup.state))
    result = setup.save_redirected(model_state())
    with open(result.path, "r+b") as damaged:  # bit rot on the fallback
        damaged.seek(100)
        byte = damaged.read(1)
        damaged.seek(100)
        damaged.write(bytes([byte[0] ^ 0xFF]))
    os.utime(setup.target / "model.pt", (1, 1))  # old, so that only the checksum stops it

    outcomes = _sync_back(setup)
    assert [o.action for o in outcomes] == ["checksum_mismatch"]
    assert torch.load(setup.target / "model.pt") == previous
    assert sorted(os.listdir(setup.target)) == ["model.pt"]  # no temp file left
    assert os.path.exists(result.path) and len(manifest_lines(setup.fallback)) == 1


def test_dry_run_changes_nothing(setup):
    result = setup.save_redirected(model_state())
    before = (area(setup.fallback) / manifest.MANIFEST).read_bytes()
    code, report = sync_cli(
        "--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state), "--dry-run"
    )
    assert code == 1 and report["dry_run"] is True
    assert [e["action"] for e in report["entries"]] == ["would_sync"]
    assert report["entries"][0]["requested"] == str(setup.target / "model.pt")
    assert os.listdir(setup.target) == []
    assert os.path.exists(result.path)
    assert (area(setup.fallback) / manifest.MANIFEST).read_bytes() == before


def test_an_unhealthy_target_keeps_its_entries_waiting(setup):
    result = setup.save_redirected(model_state())
    setup.mark_target(quota=(quota_entry(QuotaState.HARD_REACHED, kind="project"),))
    outcomes = _sync_back(setup)
    assert [o.action for o in outcomes] == ["waiting"]
    assert "quota_hard_reached" in outcomes[0].message
    assert os.path.exists(result.path) and os.listdir(setup.target) == []


def test_a_readiness_callback_decides_instead_of_the_preflight(setup):
    """The daemon's sync task answers from its own verdict: the state file is not consulted."""
    state = model_state()
    result = setup.save_redirected(state)
    setup.mark_target(readonly=True)
    asked = []

    def refuse(entry: manifest.Entry) -> str:
        asked.append(entry.requested)
        return "the daemon's verdict: unhealthy"

    outcomes = sync.sync([str(setup.fallback)], state_dir=str(setup.state), ready=refuse)
    assert [o.action for o in outcomes] == ["waiting"]
    assert outcomes[0].message.endswith("not ready: the daemon's verdict: unhealthy")
    assert asked == [str(setup.target / "model.pt")]
    assert os.path.exists(result.path) and os.listdir(setup.target) == []

    # The state file still says read-only, which a preflight would refuse; the callback rules.
    outcomes = sync.sync([str(setup.fallback)], state_dir=str(setup.state), ready=lambda e: None)
    assert [o.action for o in outcomes] == ["synced"]
    assert_same_state(torch.load(setup.target / "model.pt"), state)
    assert not os.path.exists(result.path)


def test_a_later_save_of_the_same_path_replaces_the_earlier_entry(setup):
    setup.save_redirected(model_state(seed=1))
    latest = model_state(seed=2)
    setup.save_redirected(latest)
    assert len(manifest_lines(setup.fallback)) == 2
    assert len(manifest.pending([str(setup.fallback)])) == 1
    outcomes = _sync_back(setup)
    assert sorted(o.action for o in outcomes) == ["replaced", "synced"]
    assert_same_state(torch.load(setup.target / "model.pt"), latest)
    assert os.listdir(setup.fallback) == []


def test_an_entry_whose_copy_is_gone_is_dropped(setup):
    result = setup.save_redirected(model_state())
    os.unlink(result.path)
    outcomes = _sync_back(setup)
    assert [o.action for o in outcomes] == ["missing"]
    assert manifest_lines(setup.fallback) == []


def test_a_manifest_others_can_write_is_not_acted_on(setup, caplog):
    result = setup.save_redirected(model_state())
    os.chmod(area(setup.fallback) / manifest.MANIFEST, 0o666)
    with caplog.at_level(logging.WARNING, logger="fsprobe.saving.redirect"):
        assert list(_sync_back(setup)) == []
    assert "writable by group or others" in caplog.text
    assert manifest.pending([str(setup.fallback)]) == []
    assert os.path.exists(result.path)


def test_an_entry_pointing_outside_its_fallback_is_skipped(setup, tmp_path):
    outside = tmp_path / "precious.pt"
    outside.write_bytes(b"not a redirected checkpoint")
    manifest.record(
        manifest.new_entry(
            str(setup.fallback), str(setup.target / "x.pt"), str(outside), 27, sha256(outside)
        )
    )
    outcomes = _sync_back(setup)
    assert [o.action for o in outcomes] == ["skipped"]
    assert outside.exists() and not (setup.target / "x.pt").exists()


def test_concurrent_appends_all_land_whole(setup):
    def append(worker: int) -> None:
        for index in range(25):
            manifest.record(
                manifest.new_entry(
                    str(setup.fallback),
                    f"/ckpt/{worker}/{index}.pt",
                    str(area(setup.fallback) / f"{worker}-{index}"),
                    index,
                    "0" * 64,
                )
            )

    threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = manifest_lines(setup.fallback)
    assert len(lines) == 100
    assert {(line["requested"]) for line in lines} == {
        f"/ckpt/{w}/{i}.pt" for w in range(4) for i in range(25)
    }


def test_newest_copy_and_forget_follow_the_redirected_checkpoint(setup):
    requested = str(setup.target / "model.pt")
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == requested
    result = setup.save_redirected(model_state())
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == result.path
    assert manifest.forget(requested, [str(setup.fallback)]) == [result.path]
    assert os.listdir(setup.fallback) == []
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == requested


def test_a_copy_whose_sha256_changed_is_not_handed_out_to_load(setup, caplog):
    requested = str(setup.target / "model.pt")
    result = setup.save_redirected(model_state())
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == result.path
    with open(result.path, "r+b") as damaged:  # bit rot, or a writer that went astray
        damaged.seek(100)
        byte = damaged.read(1)
        damaged.seek(100)
        damaged.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.WARNING, logger="fsprobe.redirect"):
        assert manifest.newest_copy(requested, [str(setup.fallback)]) == requested
    assert "its sha256 is" in caplog.text


def test_a_directory_checkpoint_is_loaded_only_while_its_tree_is_as_saved(setup):
    def write(staging: str) -> None:
        os.mkdir(os.path.join(staging, "optim"))
        Path(staging, "model.pt").write_bytes(b"weights")
        Path(staging, "optim", "state.pt").write_bytes(b"moments")

    requested = str(setup.target / "step-10")
    setup.mark_target(readonly=True)
    result = fsprobe.save_dir(
        requested, write, fallback_dirs=[setup.fallback], state_dir=str(setup.state)
    )
    assert result.redirected
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == result.path
    Path(result.path, "optim", "extra.pt").write_bytes(b"not saved with it")
    assert manifest.newest_copy(requested, [str(setup.fallback)]) == requested


def test_sync_needs_a_fallback_directory():
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 64 and "FSPROBE_FALLBACK_DIRS" in done.stderr


def test_sync_human_output_names_each_entry(setup):
    setup.save_redirected(model_state())
    env = {**os.environ, "FSPROBE_FALLBACK_DIRS": str(setup.fallback)}
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync", "--state-dir", str(setup.state)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "synced" in done.stdout and str(setup.target / "model.pt") in done.stdout


def test_a_full_fallback_is_given_up_for_the_next_one(tmpfs, tmp_path):
    target, first = tmpfs(size="256k"), tmpfs(size="256k")  # both too small for 1 MiB
    second = tmp_path / "fallback"
    second.mkdir()
    result = fsprobe.save(
        model_state(),
        target.path / "model.pt",
        fallback_dirs=[first.path, second],
        backoff=no_sleep(),
    )
    assert result.errors == ("ENOSPC", "ENOSPC") and result.attempts == 3
    assert result.path == str(area(second)) + str(target.path / "model.pt")
    assert os.listdir(target.path) == [] and os.listdir(first.path) == []  # nothing left over
    assert manifest_lines(second)[0]["actual"] == result.path


def test_a_read_only_fallback_is_not_chosen(tmpfs, tmp_path, setup):
    readonly = tmpfs(size="1M")
    subprocess.run(["mount", "-o", "remount,ro", str(readonly.path)], check=True)
    setup.mark_target(readonly=True)
    decision = fsprobe.preflight(
        setup.target / "model.pt",
        fallback_dirs=[readonly.path, setup.fallback],
        state_dir=str(setup.state),
    )
    assert decision.action == "redirect" and decision.path.startswith(str(setup.fallback) + "/")


def test_a_fallback_that_contains_the_target_is_not_mistaken_for_a_redirect(tmp_path):
    target = tmp_path / "run" / "ckpt"
    target.mkdir(parents=True)
    result = fsprobe.save({"step": 1}, target / "model.pt", fallback_dirs=[tmp_path])
    assert not result.redirected and result.path == str(target / "model.pt")
    assert not (tmp_path / manifest.MANIFEST).exists()


def test_a_checkpoint_saved_during_the_copy_back_is_not_overwritten(faultfs, tmp_path):
    setup = Setup(tmp_path)
    setup.fallback = faultfs.mountpoint  # a slow fallback: the copy back takes a while
    result = setup.save_redirected(model_state(seed=1))
    faultfs.ctl.delay("read", 0.05)
    outcomes = []
    syncing = threading.Thread(target=lambda: outcomes.extend(_sync_back(setup)))
    syncing.start()
    try:
        deadline = time.monotonic() + 30
        while not [n for n in os.listdir(setup.target) if parse_temp_name(n)]:
            assert time.monotonic() < deadline, "the copy back never started"
            time.sleep(0.01)
        newer = model_state(seed=2)  # the trainer saves again, the target being fine now
        fsprobe.save(newer, setup.target / "model.pt", state_dir=str(setup.state))
    finally:
        syncing.join(60)
    assert [o.action for o in outcomes] == ["superseded"]
    assert_same_state(torch.load(setup.target / "model.pt"), newer)
    assert os.path.exists(result.path)
    assert sorted(os.listdir(setup.target)) == ["model.pt"]


_TRAINER = """
import sys, fsprobe
fsprobe.atomic_write(sys.argv[1], lambda stream: stream.write(b"epoch 9, saved during the sync"))
"""


def _scenario(faultfs, tmp_path, name: str) -> Setup:
    """A target on the fault filesystem holding epoch 1, and epoch 2 waiting in a fallback."""
    (tmp_path / name).mkdir()
    setup = Setup(tmp_path / name)
    setup.target = faultfs.mountpoint / name
    setup.target.mkdir()
    fsprobe.atomic_write(setup.target / "model.pt", lambda stream: stream.write(b"epoch 1"))
    time.sleep(0.01)
    setup.save_redirected({"epoch": 2})
    return setup


def _sync_in_thread(setup: Setup, outcomes: list) -> threading.Thread:
    syncing = threading.Thread(target=lambda: outcomes.extend(_sync_back(setup)))
    syncing.start()
    return syncing


def test_a_save_that_lands_during_any_fsync_of_the_copy_back_is_never_overwritten(
    faultfs, tmp_path
):
    """The check that the original is older must hold at the publish, not only before the copy.

    The copy back is slow (its fsync is held by the filesystem); a trainer that saves the same
    checkpoint meanwhile must keep its newer file, whichever of the copy's fsyncs it lands in.
    """
    copy_fsyncs = f"*~{os.getpid()}~*~model.pt.tmp"  # the sync's temp files, not the trainer's
    setup = _scenario(faultfs, tmp_path, "counting")
    counting = faultfs.ctl.delay("fsync", 0.001, path=copy_fsyncs)
    assert [o.action for o in _sync_back(setup)] == ["synced"]
    fsyncs = faultfs.ctl.rule(counting)["seen"]
    faultfs.ctl.remove(counting)
    assert fsyncs >= 1

    for held in range(fsyncs):
        setup = _scenario(faultfs, tmp_path, f"held{held}")
        rule = faultfs.ctl.block("fsync", path=copy_fsyncs, after=held, times=1)
        outcomes: list = []
        syncing = _sync_in_thread(setup, outcomes)
        try:
            faultfs.ctl.wait_blocked(rule, timeout=30)
            subprocess.run(
                [sys.executable, "-c", _TRAINER, str(setup.target / "model.pt")],
                cwd=REPO,
                check=True,
                timeout=120,
            )
        finally:
            faultfs.ctl.remove(rule)
            syncing.join(60)
        assert [o.action for o in outcomes] == ["superseded"], (held, outcomes)
        assert (setup.target / "model.pt").read_bytes() == b"epoch 9, saved during the sync"
        assert [n for n in os.listdir(setup.target) if parse_temp_name(n)] == []
        assert len(manifest.pending([str(setup.fallback)])) == 1  # the copy waits, untouched


def test_the_checkpoint_synced_back_keeps_its_mode_and_sync_leaks_no_descriptor(setup):
    """A group-readable checkpoint stays group-readable at home (the team's resume reads it),
    and a daemon that syncs every minute for weeks keeps its descriptors."""
    saved = [setup.save_redirected(model_state(seed), name=f"m{seed}.pt") for seed in range(3)]
    for index, result in enumerate(saved):
        os.chmod(result.path, 0o640 if index % 2 else 0o604)
    before = set(os.listdir("/proc/self/fd"))
    outcomes = _sync_back(setup)
    assert [o.action for o in outcomes] == ["synced"] * 3
    assert set(os.listdir("/proc/self/fd")) == before
    for index, result in enumerate(saved):
        mode = os.stat(result.requested_path).st_mode & 0o777
        assert oct(mode) == oct(0o640 if index % 2 else 0o604)


def test_a_sync_never_copies_into_an_unhealthy_target_even_with_fallbacks_in_the_environment(
    setup, tmp_path, monkeypatch
):
    """The way home asks whether the target can take the checkpoint, never where else it
    could go: FSPROBE_FALLBACK_DIRS must not turn "not ready" into "redirect somewhere"."""
    result = setup.save_redirected(model_state())
    setup.mark_target(readonly=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("FSPROBE_FALLBACK_DIRS", str(elsewhere))
    [outcome] = _sync_back(setup)
    assert outcome.action == "waiting", outcome
    assert not os.path.exists(result.requested_path) and os.path.exists(result.path)


def test_redirected_saves_leave_no_descriptor_open(setup):
    setup.save_redirected(model_state(0), name="warm-up.pt")  # imports and caches settle
    before = set(os.listdir("/proc/self/fd"))
    for seed in range(3):
        setup.save_redirected(model_state(seed), name=f"m{seed}.pt")
    assert set(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("padded", ["after", "before"])  # before: the entry ends at the cap
@pytest.mark.parametrize(("extra", "readable"), [(0, True), (1, False)])
def test_a_manifest_up_to_its_size_limit_is_read_and_one_byte_more_is_not(
    setup, extra, readable, padded
):
    result = setup.save_redirected(model_state())
    [area] = manifest.areas(str(setup.fallback))
    path = Path(area.path) / manifest.MANIFEST
    line = path.read_bytes()
    padding = b" " * (manifest.MAX_MANIFEST_BYTES - len(line) + extra)
    path.write_bytes(line + padding if padded == "after" else padding + line)
    if readable:
        [entry] = manifest.read_manifest(area)
        assert entry.actual == result.path
    else:
        with pytest.raises(manifest.NotTrusted, match="larger than"):
            manifest.read_manifest(area)


def test_a_manifest_locked_past_its_timeout_costs_the_record_never_the_checkpoint(
    tmpfs, tmp_path, monkeypatch, caplog
):
    """Another saver or sync of this user holds the manifest's lock too long: the save waits
    `LOCK_TIMEOUT`, keeps its redirected checkpoint and says how to bring it back."""
    target = tmpfs(size="64k").path / "model.pt"  # too small: every save is redirected
    fallback = tmp_path / "fallback"
    fallback.mkdir()

    def save() -> fsprobe.SaveResult:
        return fsprobe.atomic_write(
            target, lambda f: f.write(bytes(1 << 20)), fallback_dirs=[fallback], backoff=no_sleep()
        )

    first = save()
    assert first.redirected and len(manifest_lines(fallback)) == 1
    monkeypatch.setattr(manifest, "LOCK_TIMEOUT", 0.3)
    with open(area(fallback) / manifest.MANIFEST, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as a save of another process holds it, but for long
        with caplog.at_level(logging.ERROR, logger="fsprobe.save"):
            second = save()
    assert second.redirected and os.path.getsize(second.path) == 1 << 20
    assert "the manifest stayed locked for 0.3 s" in caplog.text
    assert "copy it back by hand" in caplog.text
    assert len(manifest_lines(fallback)) == 1  # not recorded: nothing waited past the timeout
    save()
    assert len(manifest_lines(fallback)) == 2  # the lock released, the next save is recorded


@pytest.mark.parametrize(
    ("torn", "said"),
    [
        (1, "; ignored"),
        (2, "; ignored, and 1 more lines like it"),
        (3, "; ignored, and 2 more lines like it"),
    ],
)
def test_a_torn_manifest_line_is_skipped_and_named_by_its_line_number(setup, caplog, torn, said):
    result = setup.save_redirected(model_state())
    [area] = manifest.areas(str(setup.fallback))
    with open(Path(area.path) / manifest.MANIFEST, "ab") as stream:
        stream.write(b'{"requested": "/torn\n' * torn)
    with caplog.at_level(logging.WARNING, logger="fsprobe"):
        [entry] = manifest.read_manifest(area)
    assert entry.actual == result.path
    [warning] = [r.getMessage() for r in caplog.records if "not a redirect entry" in r.getMessage()]
    assert " line 2 is not a redirect entry (" in warning and warning.endswith(said)


def test_a_fallback_refused_for_want_of_the_sticky_bit_costs_no_descriptor(tmp_path):
    """Every save and every sync of a misconfigured fallback is refused: each refusal must
    close the directory it opened, or a trainer runs out of descriptors over a long run."""
    fallback = tmp_path / "shared"
    fallback.mkdir()
    fallback.chmod(0o777)  # writable by all, no sticky bit
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(NotTrusted, match="without the sticky bit"):
            open_root(str(fallback))
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_team_umask_copy_writable_by_the_group_is_still_found(setup):
    """Teams often run with umask 002: a redirected file is then 0664 and a directory 0775.
    Inside the user's own area (0700) nobody else can reach them, so they are the user's to
    load; refusing them would lose the newest checkpoint on resume."""
    previous = os.umask(0o002)
    try:
        result = setup.save_redirected(model_state())
        setup.mark_target(readonly=True)
        directory = fsprobe.save_dir(
            setup.target / "step-1",
            lambda staging: Path(staging, "shard.pt").write_bytes(b"x" * 4096),
            fallback_dirs=[setup.fallback],
            state_dir=str(setup.state),
        )
        setup.mark_target()
    finally:
        os.umask(previous)
    assert os.stat(result.path).st_mode & 0o777 == 0o664
    assert os.stat(directory.path).st_mode & 0o777 == 0o775
    fallbacks = [str(setup.fallback)]
    assert manifest.newest_copy(str(setup.target / "model.pt"), fallbacks) == result.path
    assert manifest.newest_copy(str(setup.target / "step-1"), fallbacks) == directory.path


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_copy_grown_since_its_save_is_not_copied_back_past_its_recorded_size(setup, kind):
    """Whoever could write the copy stretched it (a sparse terabyte costs the fallback
    nothing): the sync back stops at the bytes the manifest recorded instead of filling the
    target, and publishes nothing (found by attacking as a second user of the team)."""
    if kind == "file":
        result = setup.save_redirected(model_state())
        grown = result.path
    else:
        setup.mark_target(readonly=True)
        result = fsprobe.save_dir(
            setup.target / "step-1",
            lambda staging: Path(staging, "shard.pt").write_bytes(b"x" * 4096),
            fallback_dirs=[setup.fallback],
            state_dir=str(setup.state),
        )
        setup.mark_target()
        grown = os.path.join(result.path, "shard.pt")
    os.truncate(grown, 1 << 40)
    code, report = sync_cli("--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state))
    [entry] = report["entries"]
    assert code != 0 and entry["action"] == "failed", entry
    assert "EFBIG" in entry["message"]
    assert os.listdir(setup.target) == []  # nothing published, nothing left behind


def test_sync_of_a_fallback_directory_that_does_not_exist_is_an_error(setup, tmp_path):
    """A typo in --fallback-dir used to print "nothing to sync" and exit 0; the fallback that
    does exist is synced all the same."""
    setup.save_redirected(model_state())
    typo = tmp_path / "fallbak"
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "sync", "--fallback-dir", str(typo)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FSPROBE_FALLBACK_DIRS"},
        timeout=120,
    )
    assert done.returncode == 2, done
    assert f"the fallback directory {typo} does not exist" in done.stderr
    assert "nothing to sync" not in done.stdout
    code, report = sync_cli(
        "--fallback-dir",
        str(typo),
        "--fallback-dir",
        str(setup.fallback),
        "--state-dir",
        str(setup.state),
    )
    assert code == 2 and report["missing"] == [str(typo)]
    assert [e["action"] for e in report["entries"]] == ["synced"]
    assert (setup.target / "model.pt").exists()


def test_sync_says_the_copies_later_saves_overwrote_in_one_line_per_file(setup):
    """Ten redirected saves of one file: the person reads the copy that was synced, then one
    line for the nine it replaced; `--json` still lists every entry."""
    for seed in range(10):
        setup.save_redirected(model_state(seed=seed), name="learning_rates")
    setup.save_redirected(model_state(seed=99), name="model.pt")
    env = {**os.environ, "FSPROBE_FALLBACK_DIRS": str(setup.fallback)}
    command = [sys.executable, "-m", "fsprobe", "sync", "--state-dir", str(setup.state)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    labels = [line.split()[0] for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert labels == ["synced", "synced", "replaced"]
    assert f"replaced          {setup.target / 'learning_rates'}\n" in done.stdout
    assert "9 earlier copies overwritten by later saves" in done.stdout

    for seed in range(3):
        setup.save_redirected(model_state(seed=seed), name="learning_rates")
    status, document = sync_cli(
        "--fallback-dir", str(setup.fallback), "--state-dir", str(setup.state)
    )
    assert status == 0
    assert sorted(e["action"] for e in document["entries"]) == ["replaced", "replaced", "synced"]


def _sync_on_a_terminal(setup: Setup, *flags: str) -> tuple[int, str, str]:
    """`fsprobe sync` with its stderr on a pseudo-terminal: status, stdout, what the terminal
    showed."""
    controller, terminal = pty.openpty()
    command = [sys.executable, "-m", "fsprobe", "sync", "--fallback-dir", str(setup.fallback)]
    with subprocess.Popen(
        [*command, "--state-dir", str(setup.state), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    ) as process:
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the process closed the terminal's last descriptor
                break
            if not chunk:
                break
            shown += chunk
        out = process.stdout.read() if process.stdout else ""
        status = process.wait(timeout=120)
    os.close(controller)
    return status, out, shown.decode()


def test_a_long_copy_back_shows_its_progress_on_a_terminal_and_nowhere_else(faultfs, tmp_path):
    """Copying a large checkpoint back takes a while: on a terminal the person sees bytes,
    percent, rate and time left, redrawn in place and cleared after; with `--json`, or with
    stderr not a terminal, nothing of it."""
    setup = Setup(tmp_path)
    setup.fallback = faultfs.mountpoint
    big = setup.target / "big.pt"
    faultfs.ctl.delay("read", 0.02, path="/uid-*")  # a slow fallback: the copy takes seconds

    setup.save_redirected(b"x" * (16 << 20), name="big.pt")
    status, out, shown = _sync_on_a_terminal(setup, "--json")
    assert status == 0 and json.loads(out)["entries"][0]["action"] == "synced"
    assert "MiB /" not in shown

    setup.save_redirected(b"y" * (16 << 20), name="big.pt")
    command = [sys.executable, "-m", "fsprobe", "sync", "--fallback-dir", str(setup.fallback)]
    done = subprocess.run(
        [*command, "--state-dir", str(setup.state)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and "synced" in done.stdout
    assert "MiB /" not in done.stderr and "\r" not in done.stderr

    setup.save_redirected(b"z" * (16 << 20), name="big.pt")
    status, out, shown = _sync_on_a_terminal(setup)
    assert status == 0 and "synced" in out and torch.load(big)[:1] == b"z"
    frames = [f for f in shown.split("\r\x1b[K") if f]
    assert frames, shown
    for frame in frames:
        assert re.fullmatch(
            r"\d+(\.\d+)? (B|KiB|MiB) / 16(\.0+)? MiB  \d+%  \S+ (B|KiB|MiB)/s  "
            r"(.+ left|stalled)  " + re.escape(str(big)),
            frame,
        ), frame
    assert shown.endswith("\r\x1b[K")  # cleared before the outcome line
