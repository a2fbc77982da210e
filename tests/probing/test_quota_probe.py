"""probe_quota and probe_lfs_df end to end: fsprobe runs the fake `lfs`, which reads the FUSE
fault filesystem's quota and statfs, so what fsprobe reports is what the filesystem holds."""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from pathlib import Path

import pytest

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.caches import LustreCaches
from fsprobe.model import QuotaState
from fsprobe.probing.lfs_df import probe_lfs_df
from fsprobe.probing.quota import probe_quota
from fsprobe.probing.runner import ProbeCall, ProbeRunner
from fsprobe.probing.threads import ThreadExecutor
from fsprobe.quota import ServerProbeSettings
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for, is_fake_process

VERSIONS = ["2.12", "2.14", "2.15", "2.16"]
FORCED = ServerProbeSettings(provider="lfs", user=1000, group=1000)
#: Generous: the deadline plus the kill, on a loaded two-core machine.
SLACK = 3.0


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


@pytest.fixture
def caches() -> LustreCaches:
    """What this test's probes remember, handed to each: nothing of another test's."""
    return LustreCaches()


def write_files(directory: Path, sizes: list[int]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for number, size in enumerate(sizes):
        (directory / f"shard{number}").write_bytes(os.urandom(size))


@pytest.mark.parametrize("version", VERSIONS)
def test_quota_reports_what_the_filesystem_holds(
    version: str, faultfs, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(version=version, control=faultfs.ctl.socket_path, project=4242)
    write_files(faultfs.mountpoint / "ckpt", [4096 * 25, 1 << 20, 1000])
    faultfs.ctl.set_quota("inodes", soft=3, hard=100, grace=3600)  # 4 inodes: over soft
    faultfs.ctl.set_quota("bytes", hard=64 << 20)
    truth = faultfs.ctl.quota()
    assert truth["bytes"]["used"] == 4096 * 25 + (1 << 20) + 1000
    assert truth["inodes"]["used"] == 4  # the directory and three files

    before = time.time()
    report = probe_quota(str(faultfs.mountpoint / "ckpt" / "step-100"), FORCED, caches=caches)
    assert report is not None and report.provider == "lfs" and report.errors == ()
    assert [(e.type, e.id) for e in report.entries] == [
        ("user", 1000),
        ("group", 1000),
        ("project", 4242),  # read with `lfs project -d`: the FUSE mount has no ioctl
    ]
    for entry in report.entries:
        # lfs shows KiB rounded up from bytes, so the 1000-byte file counts as 1 KiB.
        assert entry.bytes.used == math.ceil(truth["bytes"]["used"] / 1024) * 1024
        assert (entry.bytes.soft, entry.bytes.hard) == (None, 64 << 20)
        assert entry.bytes.state is QuotaState.OK
        assert entry.inodes.used == truth["inodes"]["used"]
        assert (entry.inodes.soft, entry.inodes.hard) == (3, 100)
        assert entry.inodes.state is QuotaState.SOFT_EXCEEDED
        expected = truth["inodes"]["grace_expires_at"]
        assert entry.inodes.grace_expires_at is not None
        assert abs(entry.inodes.grace_expires_at - expected) < 5  # lfs prints whole seconds
        assert entry.inodes.grace_expires_at > before


def test_hard_limit_reached_on_the_filesystem_is_hard_reached(
    faultfs, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(control=faultfs.ctl.socket_path)
    faultfs.ctl.set_quota("inodes", hard=2)
    (faultfs.mountpoint / "a").write_bytes(b"x")
    (faultfs.mountpoint / "b").write_bytes(b"x")
    with pytest.raises(OSError) as refused:
        (faultfs.mountpoint / "c").write_bytes(b"x")
    assert refused.value.errno == errno.EDQUOT
    report = probe_quota(str(faultfs.mountpoint), FORCED, caches=caches)
    assert report is not None
    assert {e.inodes.state for e in report.entries} == {QuotaState.HARD_REACHED}
    assert {e.inodes.remaining(time.time()) for e in report.entries} == {0}


def test_hung_lfs_is_killed_and_the_probe_returns_by_its_deadline(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(fail="hang")
    settings = ServerProbeSettings(provider="lfs", user=1000, group=1000, project=7, timeout=2.0)
    started = time.monotonic()
    with pytest.raises(ProbeFailure) as failure:
        probe_quota(str(tmp_path), settings, caches=caches)
    elapsed = time.monotonic() - started
    assert failure.value.error == "TIMEOUT"
    assert elapsed < settings.timeout + SLACK, "three IDs share one deadline"
    pids = fake_lfs.pids()
    assert len(pids) == 2
    deadline = time.monotonic() + 60
    while any(is_fake_process(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_fake_process(pid) for pid in pids), "the fake and its child are gone"
    assert len(fake_lfs.calls()) == 1, "no second lfs once the deadline has passed"


def test_concurrent_probes_share_one_lfs_call_per_id(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)}, delay=0.4)
    settings = ServerProbeSettings(provider="lfs", user=1000, group=1000, project=7)
    reports: list = []
    threads = [
        threading.Thread(
            target=lambda: reports.append(probe_quota(str(tmp_path), settings, caches=caches))
        )
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(reports) == 3 and all(r is not None and len(r.entries) == 3 for r in reports)
    argv = sorted(tuple(call["argv"][1:3]) for call in fake_lfs.quota_calls())
    assert argv == [("-g", "1000"), ("-p", "7"), ("-u", "1000")]


def test_results_are_cached_for_cache_seconds(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)})
    cached = ServerProbeSettings(provider="lfs", user=1000, group=1000, cache_seconds=300)
    probe_quota(str(tmp_path), cached, caches=caches)
    probe_quota(
        str(tmp_path / "other" / "target"), cached, caches=caches
    )  # same filesystem, same IDs
    assert len(fake_lfs.quota_calls()) == 2
    uncached = ServerProbeSettings(provider="lfs", user=1000, group=1000)
    probe_quota(str(tmp_path), uncached, caches=caches)
    assert len(fake_lfs.quota_calls()) == 4


def test_the_probes_of_one_executor_share_its_caches_and_another_has_its_own(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    """Named probes are handed the caches of where they run: two targets of one filesystem
    through one executor ask `lfs quota` once per ID; a new executor asks again."""
    fake_lfs.configure(state={"mountpoint": str(tmp_path)})
    cached = ServerProbeSettings(provider="lfs", user=1000, group=1000, cache_seconds=300)

    def probe(executor: ThreadExecutor, target: Path) -> None:
        call = ProbeCall("quota", (str(target), cached))
        result = ProbeRunner(executor).submit(str(target), "quota", call, 60).result()
        assert result.ok, result

    shared = ThreadExecutor(caches)
    probe(shared, tmp_path / "a")
    probe(shared, tmp_path / "b")
    assert len(fake_lfs.quota_calls()) == 2  # user and group, once for both targets
    probe(ThreadExecutor(), tmp_path / "a")
    assert len(fake_lfs.quota_calls()) == 4  # its own caches: asked again
    probe(ThreadExecutor(caches), tmp_path / "b")
    assert len(fake_lfs.quota_calls()) == 4  # handed the first one's: nothing new asked


def test_partial_result_names_what_failed(tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)}, fail="esrch", fail_types="group")
    report = probe_quota(
        str(tmp_path), ServerProbeSettings(provider="lfs", user=1000, group=1000), caches=caches
    )
    assert report is not None
    assert [e.type for e in report.entries] == ["user"]
    assert len(report.errors) == 1
    assert report.errors[0].startswith("group 1000: ESRCH: lfs quota -g 1000")


def test_inaccurate_data_is_returned_flagged(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)}, fail="inaccurate")
    report = probe_quota(
        str(tmp_path), ServerProbeSettings(provider="lfs", user=1000, group=1000), caches=caches
    )
    assert report is not None and report.inaccurate
    assert all(e.bytes.inaccurate for e in report.entries)


@pytest.mark.parametrize(
    ("fail", "error"), [("eperm", "EPERM"), ("enodev", "ENODEV"), ("garbage", "PARSE")]
)
def test_nothing_read_raises_the_failure(
    tmp_path: Path, fake_lfs: FakeLfs, fail, error, caches: LustreCaches
):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)}, fail=fail)
    with pytest.raises(ProbeFailure) as failure:
        probe_quota(
            str(tmp_path), ServerProbeSettings(provider="lfs", user=1000, group=1000), caches=caches
        )
    assert failure.value.error == error


def test_missing_lfs_is_enoent_and_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caches: LustreCaches
):
    monkeypatch.setenv("FSPROBE_LFS", str(tmp_path / "no" / "lfs"))
    with pytest.raises(ProbeFailure) as failure:
        probe_quota(
            str(tmp_path),
            ServerProbeSettings(provider="lfs", user=1, group=1, project=1),
            caches=caches,
        )
    assert failure.value.error == "ENOENT"
    assert "--lfs" in failure.value.message and "FSPROBE_LFS" in failure.value.message


def test_not_lustre_needs_no_lfs(tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches):
    fake_lfs.configure()
    assert probe_quota(str(tmp_path), ServerProbeSettings(), caches=caches) is None
    assert probe_quota(str(tmp_path), ServerProbeSettings(provider="none"), caches=caches) is None
    assert probe_lfs_df(str(tmp_path), ServerProbeSettings(), caches=caches) is None
    assert probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="none"), caches=caches) is None
    assert fake_lfs.calls() == []


@pytest.mark.parametrize("version", ["2.12", "2.16"])
def test_lfs_df_shows_every_target_of_the_filesystem(
    version: str, faultfs, fake_lfs, caches: LustreCaches
):
    fake_lfs.configure(version=version, control=faultfs.ctl.socket_path, osts=3)
    faultfs.ctl.set_statfs(
        f_frsize=4096, f_blocks=300000, f_bfree=30000, f_bavail=29000, f_files=5000, f_ffree=400
    )
    targets = probe_lfs_df(
        str(faultfs.mountpoint / "ckpt"), ServerProbeSettings(provider="lfs"), caches=caches
    )
    assert targets is not None
    assert [t.name for t in targets] == [
        "lustre-MDT0000",
        "lustre-OST0000",
        "lustre-OST0001",
        "lustre-OST0002",
    ]
    mdt, *osts = targets
    assert (mdt.files, mdt.files_free) == (5000, 400)
    assert sum(t.size_bytes for t in osts) == 300000 * 4096
    assert sum(t.avail_bytes for t in osts) == 29000 * 4096
    assert all(t.active for t in targets)


def test_lfs_df_keeps_inactive_and_unreachable_targets(
    tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches
):
    state = {"mountpoint": str(tmp_path), "statfs": {"f_frsize": 4096, "f_blocks": 1000,
             "f_bfree": 500, "f_bavail": 400, "f_files": 100, "f_ffree": 50}}  # fmt: skip
    fake_lfs.configure(state=state, fail="inactive", osts=3)
    targets = probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="lfs"), caches=caches)
    assert targets is not None
    inactive = [t for t in targets if not t.active]
    assert [(t.name, t.size_bytes) for t in inactive] == [("lustre-OST0001", None)]
    caches = LustreCaches()  # the fake plays another filesystem now
    fake_lfs.configure(state=state, fail="df_error", osts=3)
    targets = probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="lfs"), caches=caches)
    assert targets is not None
    unreachable = [t for t in targets if t.avail_bytes is None]
    assert [(t.name, t.active) for t in unreachable] == [("lustre-OST0001", True)]


def test_lfs_df_failures(tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches):
    fake_lfs.configure(version="2.16", state={"mountpoint": "/mnt/elsewhere"})
    with pytest.raises(ProbeFailure) as failure:
        probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="lfs"), caches=caches)
    assert "not on a Lustre filesystem" in failure.value.message
    caches = LustreCaches()  # the fake plays another filesystem now
    fake_lfs.configure(version="2.12", state={"mountpoint": "/mnt/elsewhere"})
    with pytest.raises(ProbeFailure) as failure:
        probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="lfs"), caches=caches)
    assert failure.value.error == "ENODEV"
    caches = LustreCaches()  # the fake plays another filesystem now
    fake_lfs.configure(fail="hang")
    started = time.monotonic()
    with pytest.raises(ProbeFailure) as failure:
        probe_lfs_df(str(tmp_path), ServerProbeSettings(provider="lfs", timeout=1.5), caches=caches)
    assert failure.value.error == "TIMEOUT"
    assert time.monotonic() - started < 1.5 + SLACK


def test_a_negative_id_never_reaches_lfs(tmp_path: Path, fake_lfs: FakeLfs, caches: LustreCaches):
    fake_lfs.configure(state={"mountpoint": str(tmp_path)})
    report = probe_quota(
        str(tmp_path), ServerProbeSettings(provider="lfs", user=-5, group=1000), caches=caches
    )
    assert report is not None and [e.type for e in report.entries] == ["group"]
    assert report.errors == ("user -5: EINVAL: user ID -5 is negative",)
    assert [call["argv"][1:3] for call in fake_lfs.quota_calls()] == [["-g", "1000"]]
