"""The OSTs and the quotas a new checkpoint really meets: the directory's layout pools.

`fsprobe check` runs the fake `lfs`, which plays a filesystem of five OSTs: pool ``flash`` holds
OST0000 and OST0001, pool ``capacity`` OST0002 and OST0003, OST0004 is in none. The directory's
default layout, each pool's members and each pool quota are the state the tests set; the fake
prints them in the forms of each Lustre version (tests/fixtures/lfs/layout, quota/*/pool_*).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fsprobe.lustre.caches import LustreCaches
from fsprobe.probing.lfs_df import probe_lfs_df
from fsprobe.probing.quota import probe_quota
from fsprobe.quota import ServerProbeSettings
from tests.support.fakes.fake_lfs import FakeLfs, fake_lfs_for

pytestmark = pytest.mark.slow  # the fake lfs and the CLI as processes: the full run only

GIB_KIB = 2**20  # a GiB in the KiB that lfs df counts in
UID = 1000
AS_USER = ["--user", str(UID), "--group", str(UID), "--no-write-probe"]
POOLS = {"flash": [0, 1], "capacity": [2, 3]}


@pytest.fixture
def fake_lfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def ost(index: int, free_gib: float) -> dict[str, Any]:
    free = int(free_gib * GIB_KIB)
    return {"kind": "OST", "index": index, "blocks": 100 * GIB_KIB, "bfree": free,
            "bavail": free, "files": 1 << 20, "ffree": 1 << 19}  # fmt: skip


def world(tmp_path: Path, *, full: tuple[int, ...] = (), layout: Any = None, **more) -> dict:
    """The fake's state: five OSTs of 100 GiB (those in `full` with 1 GiB free), one MDT."""
    mdt = {"kind": "MDT", "index": 0, "blocks": GIB_KIB, "bfree": GIB_KIB // 2,
           "bavail": GIB_KIB // 2, "files": 1 << 20, "ffree": 1 << 19}  # fmt: skip
    targets = [mdt] + [ost(i, 1 if i in full else 60) for i in range(5)]
    usage = {"used": 10 * 2**30, "soft": None, "hard": 500 * 2**30, "grace": 604800,
             "grace_start": None}  # fmt: skip
    quota = {"bytes": usage, "inodes": {"used": 10, "soft": None, "hard": None}}
    state = {"mountpoint": str(tmp_path), "targets": targets, "pools": POOLS, "quota": quota}
    if layout is not None:
        state["layout"] = layout
    return {**state, **more}


def pool_quota(hard_gib: int, used_gib: int = 2) -> dict[str, Any]:
    return {
        "bytes": {"used": used_gib * 2**30, "soft": None, "hard": hard_gib * 2**30},
        "inodes": {"used": 10, "soft": None, "hard": None},
    }


def check_json(path: Path, *args: str) -> tuple[int, dict]:
    completed = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(path), "--json",
         "--quota-provider", "lfs", *AS_USER, *args],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(path)}, timeout=60,
    )  # fmt: skip
    assert completed.stdout, completed.stderr
    return completed.returncode, json.loads(completed.stdout)


def codes(report: dict) -> list[str]:
    return [reason["code"] for reason in report["reasons"]]


@pytest.mark.parametrize("version", ["2.12", "2.14", "2.16"])
def test_a_full_ost_outside_the_layouts_pool_is_not_judged(tmp_path, fake_lfs, version):
    fake_lfs.configure(version=version, state=world(tmp_path, full=(4,), layout={"pool": "flash"}))
    code, report = check_json(tmp_path)
    assert "lustre_target_full" not in codes(report), report["reasons"]
    assert code == 0
    marks = {t["name"]: (t["pools"], t["in_layout"]) for t in report["lustre_targets"]}
    assert marks["lustre-OST0000"] == (["flash"], True)
    assert marks["lustre-OST0004"] == ([], False)
    assert marks["lustre-MDT0000"] == ([], True)


@pytest.mark.parametrize("version", ["2.14", "2.16"])
def test_a_full_ost_inside_the_pool_is_judged_and_named_with_it(tmp_path, fake_lfs, version):
    layout = [{"end": 1048576, "pattern": "mdt"}, {"end": "EOF", "pool": "flash"}]
    fake_lfs.configure(version=version, state=world(tmp_path, full=(1, 4), layout=layout))
    code, report = check_json(tmp_path)
    (full,) = [r for r in report["reasons"] if r["code"] == "lustre_target_full"]
    assert full["message"].startswith("lustre-OST0001 (pool flash) has only 1 GiB"), full
    assert "more" not in full["message"], "OST0004 is outside the layout: not counted"
    assert code == 1


def test_a_full_pool_says_so(tmp_path, fake_lfs):
    fake_lfs.configure(state=world(tmp_path, full=(0, 1), layout={"pool": "flash"}))
    _, report = check_json(tmp_path)
    (full,) = [r for r in report["reasons"] if r["code"] == "lustre_target_full"]
    assert "every OST of pool flash is nearly full" in full["message"], full


def test_without_a_pool_every_ost_counts(tmp_path, fake_lfs):
    fake_lfs.configure(state=world(tmp_path, full=(4,)))  # the default layout: no pool
    _, report = check_json(tmp_path)
    assert "lustre_target_full" in codes(report)
    assert all(t["in_layout"] for t in report["lustre_targets"])


@pytest.mark.parametrize("version", ["2.14", "2.15", "2.16"])
def test_a_pool_quota_binds_the_headroom(tmp_path, fake_lfs, version):
    layout = [{"end": 1073741824, "pool": "flash"}, {"end": "EOF", "pool": "capacity"}]
    pool_ids = {"flash": {f"user:{UID}": pool_quota(hard_gib=4)}}
    state = world(tmp_path, layout=layout, pool_ids=pool_ids)
    fake_lfs.configure(version=version, state=state)
    code, report = check_json(tmp_path)
    pooled = [q for q in report["quota"] if q["pool"] is not None]
    assert [(q["type"], q["id"], q["pool"]) for q in pooled] == [("user", UID, "flash")]
    assert pooled[0]["bytes"]["hard"] == 4 * 2**30
    assert report["headroom"]["bytes_limited_by"] == "quota:user@flash"
    assert report["headroom"]["bytes"] == 2 * 2**30
    assert report["quota_errors"] == []
    asked = [c["argv"] for c in fake_lfs.quota_calls() if "--pool" in c["argv"]]
    assert sorted((argv[2], argv[3]) for argv in asked) == [
        ("capacity", "-g"), ("capacity", "-u"), ("flash", "-g"), ("flash", "-u"),
    ]  # fmt: skip
    assert code == 0, report["reasons"]


def test_the_terminal_names_the_pool_quota_that_binds(tmp_path, fake_lfs):
    pool_ids = {"flash": {f"user:{UID}": pool_quota(hard_gib=4)}}
    fake_lfs.configure(state=world(tmp_path, layout={"pool": "flash"}, pool_ids=pool_ids))
    shown = subprocess.run(
        [sys.executable, "-m", "fsprobe", "check", str(tmp_path), "--quota-provider", "lfs",
         *AS_USER],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=60,
    ).stdout  # fmt: skip
    assert "(the user quota of pool flash binds)" in shown, shown
    assert "@flash space  2 GiB / hard 4 GiB (50 %)" in shown, shown


def test_a_pool_quota_at_its_hard_limit_refuses_with_edquot(tmp_path, fake_lfs):
    pool_ids = {"flash": {f"user:{UID}": pool_quota(hard_gib=4, used_gib=4)}}
    state = world(tmp_path, layout={"pool": "flash"}, pool_ids=pool_ids)
    fake_lfs.configure(version="2.15", state=state)
    code, report = check_json(tmp_path)
    (reached,) = [r for r in report["reasons"] if r["code"] == "quota_hard_reached"]
    assert "user quota of" in reached["message"] and "in pool flash" in reached["message"]
    assert reached["errno"] == "EDQUOT"
    assert code == 2


def test_on_2_12_no_pool_quota_is_asked_for_and_none_is_missed(tmp_path, fake_lfs):
    state = world(tmp_path, layout={"pool": "flash"})
    fake_lfs.configure(version="2.12", state=state)
    code, report = check_json(tmp_path)
    assert [c for c in fake_lfs.calls() if "--pool" in c["argv"]] == []
    assert all(q["pool"] is None for q in report["quota"])
    assert (report["quota_errors"], code) == ([], 0), report["reasons"]


def test_a_pool_without_pool_quotas_adds_nothing(tmp_path, fake_lfs):
    fake_lfs.configure(version="2.16", state=world(tmp_path, layout={"pool": "flash"}))
    code, report = check_json(tmp_path)
    assert len([c for c in fake_lfs.quota_calls() if "--pool" in c["argv"]]) == 2  # asked
    assert [q["pool"] for q in report["quota"]] == [None, None]  # no limit: not reported
    assert (report["quota_errors"], code) == ([], 0), report["reasons"]


def test_a_layout_pool_the_quota_master_does_not_know_is_an_error(tmp_path, fake_lfs):
    state = world(tmp_path, layout={"pool": "gone"}, pools={**POOLS, "gone": []})
    del state["pools"]["gone"]  # the layout still names it; lfs has no such pool
    fake_lfs.configure(version="2.16", state=state)
    code, report = check_json(tmp_path)
    assert any("pool quotas not read" in error for error in report["quota_errors"]), report
    assert "quota_unavailable" in codes(report)
    assert code == 1


def test_layout_and_pools_are_read_once_per_quota_interval(tmp_path, fake_lfs: FakeLfs):
    """Several targets of one directory and probe rounds within the interval share them."""
    layout = [{"end": 1048576, "pool": "flash"}, {"end": "EOF", "pool": "capacity"}]
    fake_lfs.configure(version="2.16", state=world(tmp_path, layout=layout))
    cached = ServerProbeSettings(provider="lfs", user=UID, group=UID, cache_seconds=300)
    caches = LustreCaches()
    for _ in range(3):
        probe_quota(str(tmp_path), cached, caches=caches)
        probe_lfs_df(str(tmp_path), cached, caches=caches)
    commands = [call["argv"][0] for call in fake_lfs.calls()]
    assert commands.count("getstripe") == 1
    assert commands.count("pool_list") == 2  # flash and capacity, once each
    assert commands.count("--version") == 1
    assert commands.count("getname") == 1  # the fake's mount source names no filesystem
    assert commands.count("quota") == 2 + 4  # user, group; and each in both pools
    assert commands.count("df") == 2


def test_the_daemon_asks_once_per_round_and_labels_the_pools(tmp_path, fake_lfs):
    """Two targets under one pooled directory, one `fsprobe run --once`: every lfs question is
    asked once for both (layout per directory), and the series carry the pool."""
    ckpt = tmp_path / "ckpt"
    runs = [ckpt / "run-a", ckpt / "run-b"]  # not there yet: ckpt stands in for both
    ckpt.mkdir()
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    pool_ids = {"flash": {f"user:{UID}": pool_quota(hard_gib=4)}}
    fake_lfs.configure(
        state=world(tmp_path, full=(4,), layout={"pool": "flash"}, pool_ids=pool_ids)
    )
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nquota_provider = "lfs"\nwrite_probe = false\nquota_probe = "always"\n'
        + "".join(f'[[targets]]\npath = "{run}"\nuser = {UID}\ngroup = {UID}\n' for run in runs)
    )
    done = subprocess.run(
        [sys.executable, "-m", "fsprobe", "run", "--once", "--config", str(config),
         "--state-dir", str(tmp_path / "state"), "--textfile-dir", str(textfiles)],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    asked = [
        " ".join(a for a in call["argv"] if not a.startswith("/")) for call in fake_lfs.calls()
    ]
    assert sorted(asked) == sorted(
        ["--version", "getstripe -d -y", "getname", "pool_list lustre.flash",
         "quota -u 1000", "quota -g 1000", "quota --pool flash -u 1000",
         "quota --pool flash -g 1000", "df -v", "df -i -v"]
    ), asked  # fmt: skip
    series = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families((textfiles / "fsprobe.prom").read_text())
        for sample in family.samples
    }
    for run in map(str, runs):
        pool_hard = {"path": run, "type": "user", "id": str(UID), "pool": "flash"}
        assert series[("fsprobe_quota_hard_limit_bytes", frozenset(pool_hard.items()))] == 4 * 2**30
        for target, pool in (("lustre-OST0000", {"pool": "flash"}), ("lustre-OST0004", {})):
            labels = frozenset({"path": run, "target": target, **pool}.items())
            assert ("fsprobe_lustre_target_avail_bytes", labels) in series
        status = ("fsprobe_health_status", frozenset({"path": run}.items()))
        assert series[status] == 0  # OST0004 is full, but outside the layout's pool


@pytest.mark.mount
def test_a_plain_layout_without_a_pool_takes_the_roots_pool(faultfs, fake_lfs: FakeLfs):
    """LOD fills what a plain default leaves unset from the root's plain default: its pool."""
    ckpt = faultfs.mountpoint / "ckpt"
    ckpt.mkdir()
    layouts = {str(faultfs.mountpoint): {"pool": "flash"}, str(ckpt): {"stripe_count": 4}}
    state = world(faultfs.mountpoint, full=(4,), layouts=layouts)
    fake_lfs.configure(state=state)
    settings = ServerProbeSettings(provider="lfs")
    targets = probe_lfs_df(str(ckpt), settings, caches=LustreCaches())
    assert targets is not None
    assert {t.name for t in targets if t.kind == "OST" and t.in_layout} == {
        "lustre-OST0000", "lustre-OST0001",
    }  # fmt: skip
    fake_lfs.configure(state={**state, "layouts": {str(ckpt): {"stripe_count": 4}}})
    # the root has no pool: any OST
    targets = probe_lfs_df(str(ckpt), settings, caches=LustreCaches())
    assert targets is not None and all(t.in_layout for t in targets)
    composite = [{"end": 1048576}, {"end": "EOF"}]
    fake_lfs.configure(state={**state, "layouts": {**layouts, str(ckpt): composite}})
    # a composite default is taken as it is
    targets = probe_lfs_df(str(ckpt), settings, caches=LustreCaches())
    assert targets is not None and all(t.in_layout for t in targets)
