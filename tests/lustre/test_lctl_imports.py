"""This node's connection to each Lustre target: the import states `lctl get_param` prints.

The fake `lctl` (tests/support/fakes/lctl) prints what the kernel's `lprocfs_state_seq_show` and
`lctl`'s `print_param_internal` print at v2_17_0; the fake `lfs getname` names the instance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import fsprobe
from fsprobe.errors import ProbeFailure
from fsprobe.exporters.metrics import target_samples
from fsprobe.exporters.view import TargetView
from fsprobe.lustre.imports import own_mount, parse_states
from fsprobe.lustre.pools import parse_getname_instance
from fsprobe.lustre.runner import LfsRun
from fsprobe.model import LustreImport, LustreTarget, ProbeResult, Snapshot, Status
from fsprobe.policy import Policy, evaluate
from fsprobe.units import format_clock
from tests.support.cli import check_json
from tests.support.fakes.fake_lfs import FAKE_LCTL, fake_lfs_for, is_fake_process
from tests.support.policy import NOW, filesystem_info
from tests.support.state import daemon_view, publish

INSTANCE = "ffff8f1c2a3b4000"
AS_USER = ["--user", "1000", "--group", "1000"]


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def lctl_prints(tmp_path, state=None, osts=2) -> str:
    """What the fake lctl prints for the mount's two patterns."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    env["FAKE_LFS_OSTS"] = str(osts)
    if state is not None:
        (tmp_path / "lctl.json").write_text(json.dumps(state))
        env["FAKE_LCTL_STATE"] = str(tmp_path / "lctl.json")
    patterns = ["osc.*.state", "mdc.*.state"]
    done = subprocess.run(
        [sys.executable, str(FAKE_LCTL), "get_param", *patterns],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=True,
    )
    return done.stdout


def test_every_import_of_the_mount_is_read_with_its_state(tmp_path):
    text = lctl_prints(tmp_path, osts=3)
    assert text.startswith(f"osc.lustre-OST0000-osc-{INSTANCE}.state=\ncurrent_state: FULL\n")
    imports = parse_states(text, NOW)[("lustre", INSTANCE)]
    assert [(t.name, t.kind, t.index, t.state) for t in imports] == [
        ("lustre-MDT0000", "MDT", 0, "FULL"),
        ("lustre-OST0000", "OST", 0, "FULL"),
        ("lustre-OST0001", "OST", 1, "FULL"),
        ("lustre-OST0002", "OST", 2, "FULL"),
    ]
    assert all(t.connected and t.lost_at is None and t.last_eviction is None for t in imports)


def test_a_lost_import_says_since_when_and_an_eviction_is_kept_with_its_time(tmp_path):
    history = [
        [NOW - 7200, "CONNECTING"],
        [NOW - 7200, "FULL"],
        [NOW - 600, "DISCONN"],
        [NOW - 590, "CONNECTING"],
        [NOW - 500, "EVICTED"],
        [NOW - 400, "CONNECTING"],
    ]
    state = {"now": NOW, "targets": {"OST0001": {"state": "CONNECTING", "history": history}}}
    mounts = parse_states(lctl_prints(tmp_path, state), NOW)
    imports = {t.name: t for t in mounts[("lustre", INSTANCE)]}
    lost = imports["lustre-OST0001"]
    assert (lost.state, lost.connected, lost.lost_at, lost.last_eviction) == (
        "CONNECTING",
        False,
        NOW - 600,
        NOW - 500,
    )
    assert imports["lustre-OST0000"].connected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("this is not what lctl prints\n", "cannot read lctl's line 1"),
        (f"osc.lustre-OST0000-osc-{INSTANCE}.state=\ncurrent_state: WEIRD\n", "unknown import"),
        (f"ost.lustre-OST0000-osc-{INSTANCE}.state=\ncurrent_state: FULL\n", "cannot read"),
        (f"osc.lustre-MDT0000-osc-{INSTANCE}.state=\ncurrent_state: FULL\n", "not a client's"),
        (f"osc.lustre-OST0000-osc-{INSTANCE}.state=\nstate_history:\n", "cannot read"),
        (f"osc.lustre-OST0000-osc-{INSTANCE}.state=\n", "no current_state"),
    ],
)
def test_what_lctl_never_prints_is_a_parse_failure(text, said):
    with pytest.raises(ProbeFailure) as failure:
        parse_states(text, NOW)
    assert failure.value.error == "PARSE" and said in failure.value.message


def test_the_mount_is_told_by_its_filesystem_then_by_its_instance():
    lustre = (LustreImport("lustre-OST0000", "OST", 0, "FULL"),)
    other = (LustreImport("lustre-OST0000", "OST", 0, "DISCONN"),)
    scratch = (LustreImport("scratch-MDT0000", "MDT", 0, "FULL"),)
    assert own_mount({("lustre", "aa"): lustre}, None, None) == lustre
    assert own_mount({("lustre", "aa"): lustre, ("scratch", "bb"): scratch}, "lustre", None) == (
        lustre
    )
    two = {("lustre", "aa"): lustre, ("lustre", "bb"): other}
    with pytest.raises(ValueError):
        own_mount(two, "lustre", None)  # lfs getname must say which
    assert own_mount(two, "lustre", "bb") == other
    with pytest.raises(ProbeFailure) as failure:
        own_mount({}, None, None)
    assert failure.value.error == "ENODEV"
    with pytest.raises(ProbeFailure):
        own_mount(two, "lustre", "cc")


def test_getname_names_the_filesystem_and_the_instance():
    run = LfsRun(
        ("lfs", "getname", "/mnt/lustre/ckpt"),
        f"lustre-{INSTANCE} /mnt/lustre/ckpt\n",
        "",
        0,
        NOW,
        0.01,
    )
    assert parse_getname_instance(run) == ("lustre", INSTANCE)


def imports_snapshot(*imports: LustreImport, outside: tuple[str, ...] = ()) -> Snapshot:
    """statvfs, the imports, and an `lfs df` that marks the OSTs `outside` the layout."""
    osts = tuple(
        LustreTarget(name, "OST", 0, 2**40, 2**39, None, None, in_layout=False) for name in outside
    )
    results = {
        "statvfs": ProbeResult(
            "statvfs", NOW - 1, 0.01, filesystem_info(2**40, 2**41, 10**6, 10**6)
        ),
        "imports": ProbeResult("imports", NOW - 1, 0.01, tuple(imports)),
        "lfs_df": ProbeResult("lfs_df", NOW - 1, 0.01, osts),
    }
    return Snapshot("/ckpt", results)


def test_a_lost_ost_of_the_layout_degrades_waits_and_then_goes_elsewhere():
    lost = LustreImport("lustre-OST0007", "OST", 7, "DISCONN", lost_at=NOW - 120)
    verdict = evaluate(imports_snapshot(lost), Policy(), NOW)
    (reason,) = [r for r in verdict.reasons if r.code == "lustre_target_disconnected"]
    assert verdict.status is Status.DEGRADED
    assert reason.message.startswith(
        f"this node lost its connection to OST0007 at {format_clock(NOW - 120, NOW)} (DISCONN)"
    )
    assert verdict.worth_waiting and not verdict.can_take_save
    assert not verdict.acceptable_destination


def test_an_ost_the_layout_cannot_reach_and_an_idle_import_are_no_concern():
    outside = LustreImport("lustre-OST0003", "OST", 3, "DISCONN")
    idle = LustreImport("lustre-OST0004", "OST", 4, "IDLE")
    verdict = evaluate(imports_snapshot(outside, idle, outside=("lustre-OST0003",)), Policy(), NOW)
    assert verdict.status is Status.OK and verdict.reasons == ()
    assert verdict.can_take_save


def test_a_lost_mdt_always_counts_and_a_recent_eviction_is_a_notice_with_its_time():
    mdt = LustreImport("lustre-MDT0000", "MDT", 0, "DISCONN", lost_at=NOW - 60)
    back = LustreImport("lustre-OST0001", "OST", 1, "FULL", last_eviction=NOW - 3000)
    old = LustreImport("lustre-OST0002", "OST", 2, "FULL", last_eviction=NOW - 3 * 86400)
    verdict = evaluate(imports_snapshot(mdt, back, old), Policy(), NOW)
    codes = {r.code: r for r in verdict.reasons}
    assert "MDT0000" in codes["lustre_target_disconnected"].message
    evicted = codes["lustre_target_evicted"]
    assert evicted.severity.label == "notice"
    assert evicted.message.startswith(
        f"OST0001 evicted this node at {format_clock(NOW - 3000, NOW)}"
    )


def test_metrics_say_which_target_is_connected_and_when_it_last_evicted_this_node():
    snapshot = imports_snapshot(
        LustreImport("lustre-MDT0000", "MDT", 0, "FULL"),
        LustreImport("lustre-OST0000", "OST", 0, "EVICTED", lost_at=NOW - 9, last_eviction=NOW - 9),
        LustreImport("lustre-OST0001", "OST", 1, "DISCONN"),
        LustreImport("lustre-OST0002", "OST", 2, "REPLAY_WAIT", lost_at=NOW - 99),
        LustreImport("lustre-OST0003", "OST", 3, "DISCONN", active=False),
    )
    view = TargetView("/ckpt", snapshot, evaluate(snapshot, Policy(), NOW))
    samples = target_samples(view)

    def values(family: str) -> dict[str, float]:
        return {s.labels["target"]: s.value for s in samples[family]}

    assert values("fsprobe_lustre_target_connected") == {
        "lustre-MDT0000": 1.0,
        "lustre-OST0000": 0.0,
        "lustre-OST0001": 0.0,
        "lustre-OST0002": 1.0,
        "lustre-OST0003": 0.0,
    }
    recovering = values("fsprobe_lustre_target_recovering")
    assert [name for name, value in recovering.items() if value] == ["lustre-OST0002"]
    active = values("fsprobe_lustre_target_active")
    assert [name for name, value in active.items() if not value] == ["lustre-OST0003"]
    (eviction,) = samples["fsprobe_lustre_target_last_eviction_timestamp_seconds"]
    assert (eviction.labels["target"], eviction.value) == ("lustre-OST0000", NOW - 9)


def test_check_reads_the_connections_of_the_mount(faultfs, fake_lfs):
    now = int(time.time())
    history = [[now - 3600, "FULL"], [now - 120, "DISCONN"]]
    fake_lfs.configure(
        version="2.17",
        control=faultfs.ctl.socket_path,
        imports={"now": now, "targets": {"OST0001": {"state": "DISCONN", "history": history}}},
    )
    code, report = check_json(faultfs.mountpoint, "--quota-provider", "lfs", *AS_USER)
    assert code == 1, report["reasons"]
    assert [r["code"] for r in report["reasons"]] == ["lustre_target_disconnected"]
    assert f"OST0001 at {format_clock(now - 120, time.time())}" in report["reasons"][0]["message"]
    states = {t["name"]: t["state"] for t in report["lustre_imports"]}
    assert states == {
        "lustre-MDT0000": "FULL",
        "lustre-OST0000": "FULL",
        "lustre-OST0001": "DISCONN",
    }
    assert report["probes"]["imports"]["ok"] and report["probes"]["quota"]["ok"]
    (call,) = fake_lfs.lctl_calls()
    assert call["argv"] == ["get_param", "osc.*.active", "osc.*.state", "mdc.*.state"]
    text = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsprobe",
            "check",
            str(faultfs.mountpoint),
            "--quota-provider",
            "lfs",
            "--no-write-probe",
            *AS_USER,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "lustre" in text and "2 of 3 targets connected; lost: lustre-OST0001 DISCONN" in text
    assert "this node lost its connection to OST0001" in text


@pytest.mark.parametrize(
    ("fail", "error"), [("garbage", "PARSE"), ("missing", "ENOENT"), ("hang", "TIMEOUT")]
)
def test_a_broken_lctl_fails_its_own_probe_and_no_other(faultfs, fake_lfs, tmp_path, fail, error):
    fake_lfs.configure(
        control=faultfs.ctl.socket_path, lctl_fail=None if fail == "missing" else fail
    )
    args = ["--quota-provider", "lfs", "--no-write-probe", "--timeout", "3", *AS_USER]
    if fail == "missing":
        args += ["--lctl", str(tmp_path / "no-lctl")]
    code, report = check_json(faultfs.mountpoint, *args)
    imports = report["probes"]["imports"]
    assert imports["ok"] is False and imports["error"] == error, imports
    assert report["probes"]["quota"]["ok"] and report["probes"]["statvfs"]["ok"]
    assert report["probes"]["lfs_df"]["ok"]
    assert code == 1 and [r["code"] for r in report["reasons"]] == ["probe_failed"]
    if fail == "missing":
        assert "--lctl" in imports["message"] and "FSPROBE_LCTL" in imports["message"]
    deadline = time.monotonic() + 60
    while any(is_fake_process(int(p)) for p in _fake_lctl_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _fake_lctl_pids(), "a hung lctl or its child survived"


def _fake_lctl_pids() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except OSError:
            continue
        if str(FAKE_LCTL).encode() in command:
            found.append(pid)
    return found


def run_once(path, tmp_path) -> subprocess.CompletedProcess:
    config = tmp_path / "fsprobe.toml"
    config.write_text(
        '[defaults]\nquota_provider = "lfs"\nwrite_probe = false\nquota_probe = "always"\n'
        f'[[targets]]\npath = "{path}"\nuser = 1000\ngroup = 1000\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "fsprobe", "run", "--once", "--config", str(config),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env={**os.environ, "TMPDIR": str(path)}, timeout=120,
    )  # fmt: skip


def test_the_daemon_names_a_lost_target_and_an_lfs_too_old(faultfs, fake_lfs, tmp_path):
    now = int(time.time())
    history = [[now - 3600, "FULL"], [now - 300, "EVICTED"]]
    fake_lfs.configure(
        control=faultfs.ctl.socket_path,
        imports={"now": now, "targets": {"MDT0000": {"state": "EVICTED", "history": history}}},
    )
    done = run_once(faultfs.mountpoint, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    clock = format_clock(now - 300, time.time())
    assert f"this node lost its connection to MDT0000 at {clock} (EVICTED)" in done.stdout
    assert f"MDT0000 evicted this node at {clock}" in done.stdout
    fake_lfs.configure(version="2.9", control=faultfs.ctl.socket_path)
    done = run_once(faultfs.mountpoint, tmp_path)
    assert "lfs 2.9.0 is older than fsprobe supports" in done.stdout, done.stdout
    assert "lfs 2.10 and later" in done.stdout


@pytest.fixture
def dirs(tmp_path):
    """A target directory, a fallback directory and a private state directory."""
    target, fallback, state = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "state"
    target.mkdir()
    fallback.mkdir()
    state.mkdir(mode=0o700)
    return str(target), str(fallback), str(state)


LOST = (
    LustreImport("lustre-MDT0000", "MDT", 0, "FULL"),
    LustreImport("lustre-OST0007", "OST", 7, "DISCONN", lost_at=time.time() - 60),
)
BACK = (
    LustreImport("lustre-MDT0000", "MDT", 0, "FULL"),
    LustreImport("lustre-OST0007", "OST", 7, "FULL"),
)


def test_a_save_waits_for_a_lost_target_then_goes_to_a_fallback(dirs):
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, imports=LOST), fallback: daemon_view(fallback)})
    decision = fsprobe.preflight(
        os.path.join(target, "m.pt"), max_wait=1.5, fallback_dirs=[fallback], state_dir=state
    )
    assert decision.action == "redirect" and decision.wait_seconds >= 1.5
    assert decision.path.startswith(fallback + "/")
    assert decision.status is Status.DEGRADED
    assert [r.code for r in decision.reasons] == ["lustre_target_disconnected"]


def test_a_save_proceeds_once_the_node_is_back(dirs):
    target, fallback, state = dirs
    publish(state, {target: daemon_view(target, imports=LOST)})
    back = threading.Timer(1.0, lambda: publish(state, {target: daemon_view(target, imports=BACK)}))
    back.start()
    try:
        decision = fsprobe.preflight(
            os.path.join(target, "m.pt"), max_wait=30, fallback_dirs=[fallback], state_dir=state
        )
    finally:
        back.cancel()
    assert decision.action == "delay" and decision.status is Status.OK
    assert decision.path.startswith(target + "/") and decision.wait_seconds >= 0.9
