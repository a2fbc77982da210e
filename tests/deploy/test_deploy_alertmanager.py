"""What reaches a person: the shipped rules in a real Prometheus, the shipped inhibitions and
route in a real Alertmanager, a webhook in the person's place, and a real `fsprobe run`.

Every `for:` and `keep_firing_for:` is compressed 60 times (a minute becomes a second), which
keeps the order in which a path's alerts fire; Alertmanager's group timers become a second. Each
scenario waits until the notifications are the expected ones and every other alert Prometheus
fires for the path is held back by an inhibition: from then on nothing more would reach the
person. Each notification names the path, the cause and the first thing to do. The bad days
with consequences (a trainer saving into a full or failing filesystem, fsprobe restarted or
killed in the middle) then wait as long again as the consequences need to fire, and require
that nothing more was sent, nor anything resolved.
"""

from __future__ import annotations

import calendar
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.events.test_save_events import run_trainer
from tests.support.alertmanager import Alertmanager, Webhook, compressed_config
from tests.support.daemon_process import (
    PATIENCE,
    REPO_ROOT,
    DaemonProcess,
    clean_environment,
    free_port,
)
from tests.support.fakes.fake_lfs import fake_lfs_for
from tests.support.node_exporter import NodeExporter
from tests.support.prometheus import Prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

RULES = REPO_ROOT / "deploy" / "prometheus" / "fsprobe.rules.yml"
ALERTMANAGER = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
#: The receivers that reach a person (the shipped route sends severity info to "null").
PERSON = ("fsprobe-pager", "fsprobe-tickets")

DAEMON = """
[defaults]
statvfs_interval = 0.5
write_interval = 1
deadline = 1
write_bytes = "4K"
quota_probe = "never"
"""


def compressed_rules(directory: Path, trends: bool = False) -> Path:
    """The shipped rules with every `for:` and `keep_firing_for:` 60 times shorter (5m -> 5s,
    1h -> 60s); with `trends`, the filling-up predictions too (a 6 h window becomes 6 minutes,
    24 h ahead 24 minutes)."""

    def shorter(match: re.Match) -> str:
        amount, unit = int(match[3]), match[4]
        return f"{match[1]}{match[2]}: {amount * (60 if unit == 'h' else 1)}s"

    text = re.sub(
        r"^(\s+)(for|keep_firing_for): (\d+)([mh])$", shorter, RULES.read_text(), flags=re.MULTILINE
    )
    if trends:
        text = re.sub(
            r"predict_linear\((\w+)\[6h\], (\d+) \* 3600\)",
            r"predict_linear(\1[6m], \2 * 60)",
            text,
        )
    path = directory / "fsprobe.rules.yml"
    path.write_text(text)
    return path


Alert = tuple[str, str]  # (alertname, severity)


@dataclass
class Pipeline:
    daemon: DaemonProcess
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook

    def notified(self, path: str) -> list[tuple[str, dict]]:
        """Every firing alert of `path` that reached a person, as (receiver, alert), in order."""
        return [
            (receiver, alert)
            for receiver, notification in self.webhook.notifications()
            if receiver in PERSON
            for alert in notification["alerts"]
            if alert["status"] == "firing" and alert["labels"].get("path") == path
        ]

    def sent(self, status: str = "firing") -> list[tuple[str, str, str | None]]:
        """Every alert with `status` that reached a person, any path or none, as (alertname,
        severity, path), in order."""
        return [
            (a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("path"))
            for receiver, notification in self.webhook.notifications()
            if receiver in PERSON
            for a in notification["alerts"]
            if a["status"] == status
        ]

    def nothing_more(self, path: str, expected: list[Alert], seconds: float = 15.0) -> None:
        """Wait `seconds` (longer than any compressed `for:` of a consequence and than
        `keep_firing_for`), then require the same notifications of `path` and nothing
        resolved."""
        time.sleep(seconds)
        self.settle(path, expected)
        assert self.sent("resolved") == [], self.sent("resolved")

    def restart(self, number: int) -> None:
        """Stop the daemon with signal `number` and start it again (on the same port)."""
        self.daemon.send(number)
        self.daemon.wait(PATIENCE)
        self.daemon.start()

    def firing(self, path: str) -> set[Alert]:
        return {
            (a["labels"]["alertname"], a["labels"]["severity"])
            for a in self.prometheus.alerts()
            if a["state"] == "firing" and a["labels"].get("path") == path
        }

    def held(self, path: str) -> dict[Alert, dict]:
        """The alerts of `path` Alertmanager holds, with their status."""
        return {
            (a["labels"]["alertname"], a["labels"]["severity"]): a["status"]
            for a in self.alertmanager.alerts()
            if a["labels"].get("path") == path
        }

    def settle(
        self,
        path: str,
        expected: list[Alert],
        inhibited: set[Alert] = frozenset(),
        patience: float = PATIENCE,
    ):
        """Wait (up to `patience` seconds) until the notifications of `path` are `expected` (in
        this order), `inhibited` fires in Prometheus, and Alertmanager holds back every alert
        it fires beyond `expected`; returns the notified alerts."""
        deadline = time.monotonic() + patience
        while True:
            notified = self.notified(path)
            names = [(a["labels"]["alertname"], a["labels"]["severity"]) for _, a in notified]
            firing, held = self.firing(path), self.held(path)
            quiet = all(
                key in held and held[key]["state"] == "suppressed" for key in firing - set(expected)
            )
            if names == expected and inhibited <= firing and quiet:
                print(
                    f"\n{path}: {len(names)} notification(s) {names}; without the "
                    f"inhibitions {len(held)}: {sorted(held)}"
                )
                return [alert for _, alert in notified]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"notified {names}, expected {expected}; firing {sorted(firing)}; "
                    f"Alertmanager {held}"
                )
            time.sleep(0.25)


@pytest.fixture
def pipeline(tmp_path) -> Iterator[Callable[..., Pipeline]]:
    """``pipeline(*targets, env=..., settings=..., nodes=1)``: a daemon watching `targets`
    (each with the TOML lines `settings`; `nodes` daemons, one instance each, as on as many
    nodes), scraped by Prometheus with the shipped rules (compressed), alerting the shipped
    Alertmanager, notifying a webhook."""
    started: list[object] = []

    def start(
        *targets: Path,
        env: dict[str, str] | None = None,
        settings: str = "",
        nodes: int = 1,
        textfile: bool = False,
        quota: bool = False,
        trends: bool = False,
    ) -> Pipeline:
        """`textfile`: Prometheus scrapes a node_exporter serving the (one) daemon's
        fsprobe.prom instead of the daemon. `quota`: the daemon asks `lfs quota` (the fake's)
        every half second. `trends`: the filling-up predictions compressed too. Each daemon
        listens on a port of its own, the same after a restart."""
        assert nodes == 1 or not textfile
        config = tmp_path / "fsprobe.toml"
        defaults = DAEMON
        if quota:
            defaults = DAEMON.replace(
                'quota_probe = "never"\n',
                'quota_probe = "always"\nquota_provider = "lfs"\nquota_interval = 0.5\n',
            )
        config.write_text(
            defaults + "".join(f'[[targets]]\npath = "{t}"\n{settings}' for t in targets)
        )
        if textfile:
            (tmp_path / "textfile").mkdir()
        daemons = []
        for node in range(nodes):
            home = tmp_path / ("daemon" if node == 0 else f"daemon{node}")
            home.mkdir()
            where = ["--listen", f"127.0.0.1:{free_port()}"]
            if textfile:
                where += ["--textfile-dir", str(tmp_path / "textfile")]
            daemon = DaemonProcess(
                home, "--config", str(config), *where, env=env or clean_environment()
            )
            started.append(daemon.start())
            daemons.append(daemon)
        scraped = [daemon.url.split("//")[1].split("/")[0] for daemon in daemons]
        if textfile:
            (tmp_path / "node_exporter").mkdir()
            exporter = NodeExporter(tmp_path / "node_exporter", tmp_path / "textfile")
            started.append(exporter)
            exporter.wait_ready()
            scraped = [exporter.address]
        webhook = Webhook()
        started.append(webhook)
        (tmp_path / "alertmanager").mkdir()
        alertmanager = Alertmanager(
            tmp_path / "alertmanager", compressed_config(ALERTMANAGER, webhook)
        )
        started.append(alertmanager)
        alertmanager.wait_ready()
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(
            tmp_path / "prometheus",
            scraped,
            [compressed_rules(tmp_path, trends)],
            alertmanager.address,
        )
        started.append(prometheus)
        prometheus.wait_ready()
        prometheus.wait_for('count(up{job="fsprobe"} == 1)', float(len(scraped)))
        if textfile:
            prometheus.wait_for('count(node_textfile_mtime_seconds{file=~".*/fsprobe.prom"})', 1.0)
        return Pipeline(daemons[0], prometheus, alertmanager, webhook)

    yield start
    for thing in reversed(started):
        thing.stop()  # type: ignore[attr-defined]


def says_what_to_do(alert: dict, path: str, *cause: str) -> None:
    """The notification names the path, the cause (`cause`: words of its description) and a
    first action, and links its runbook section and the dashboard."""
    annotations = alert["annotations"]
    assert path in annotations["summary"], annotations
    for word in cause:
        assert word in annotations["description"], (word, annotations["description"])
    assert len(annotations["action"].split()) >= 8, annotations
    name = alert["labels"]["alertname"].lower()
    assert annotations["runbook_url"].endswith(f"#{name}")
    assert "/d/fsprobe-overview/" in annotations["dashboard_url"]


def _watched(directory: Path, start: Callable[..., Pipeline], **env: str) -> Pipeline:
    """A pipeline watching `directory` (made here)."""
    directory.mkdir()
    return start(directory, env=clean_environment(**env))


def fill_to(path: Path, free_ratio: float) -> None:
    """Write filler files into `path` until about `free_ratio` of it is free."""
    st = os.statvfs(path)
    to_write = int(st.f_bavail * st.f_frsize - free_ratio * st.f_blocks * st.f_frsize)
    filler = path / f"filler-{time.monotonic_ns()}"
    with open(filler, "wb") as stream:
        try:
            while to_write > 0:
                to_write -= stream.write(bytes(min(to_write, 1 << 20)))
        except OSError:  # ENOSPC: full is what was asked
            pass


def test_a_full_filesystem_reaches_a_person_as_one_alert_warning_then_critical(
    tmp_path, tmpfs, pipeline
):
    target = tmpfs(size="8M").path
    run, path = pipeline(target, env=clean_environment(TMPDIR=str(target))), str(target)
    fill_to(target, 0.06)  # under 10 % left: the warning
    run.settle(path, [("FsprobeSpaceHeadroomLow", "warning")])
    fill_to(target, 0.02)  # under 3 %: the critical one (the warning is inhibited)
    fill_to(target, 0.0)  # full: test writes fail with ENOSPC, filling-up is obvious
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{path}",probe="write"}}', 0.0)
    alerts = run.settle(  # the failing test writes are the headroom alert's, never their own
        path, [("FsprobeSpaceHeadroomLow", "warning"), ("FsprobeSpaceHeadroomLow", "critical")]
    )
    says_what_to_do(alerts[-1], path, "the filesystem", "ENOSPC")
    assert "delete old checkpoints" in alerts[-1]["annotations"]["action"]
    receivers = [receiver for receiver, _ in run.notified(path)]
    assert receivers == ["fsprobe-tickets", "fsprobe-pager"]


def test_a_hung_mount_reaches_a_person_as_one_alert(faultfs, pipeline):
    target = faultfs.mountpoint / "ckpt"
    run, path = _watched(target, pipeline, TMPDIR=str(faultfs.mountpoint)), str(target)
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{path}",probe="write"}}', 1.0)
    rule = faultfs.ctl.block("*", path="/ckpt*")
    try:
        (alert,) = run.settle(
            path,
            [("FsprobeMountStuck", "critical")],
            inhibited={("FsprobeWriteProbeFailing", "critical")},  # its probe timed out
        )
    finally:
        faultfs.ctl.remove(rule)
    says_what_to_do(alert, path, f"mount {faultfs.mountpoint}", "device")
    assert "do not touch the mount" in alert["annotations"]["action"]


def test_a_job_that_ended_reaches_nobody(tmp_path, pipeline):
    """The trainer saved every 0.2 s and exited: its checkpoint is not overdue."""
    target = tmp_path / "ckpt"
    run, path = _watched(target, pipeline), str(target)
    trainer = run_trainer(target, run.daemon.state_dir, "exit")
    assert trainer.wait(PATIENCE) == 0
    ended = time.time()
    run.prometheus.wait_for(f'fsprobe_saves_total{{path="{path}",outcome="ok"}}', 4.0)
    run.prometheus.wait_for(f'fsprobe_savers{{path="{path}"}}', 0.0)
    # Had it been expected, it was overdue 3 intervals (0.6 s) after its last save: wait for
    # the alert rules to be evaluated twice after that on what Prometheus scraped since.
    deadline = time.monotonic() + PATIENCE
    while _last_alert_evaluation(run.prometheus) < ended + 3:
        assert time.monotonic() < deadline
        time.sleep(0.25)
    assert run.firing(path) == set()
    assert run.settle(path, []) == []


def _last_alert_evaluation(prometheus: Prometheus) -> float:
    groups = prometheus.api("/api/v1/rules")["data"]["groups"]
    (alerts,) = [group for group in groups if group["name"] == "fsprobe.alerts"]
    stamp = alerts["lastEvaluation"]  # RFC 3339 in UTC, with nanoseconds
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds + float(f"0.{fraction[:6] or 0}")


def test_a_live_trainer_that_stopped_saving_reaches_a_person(tmp_path, pipeline):
    target = tmp_path / "ckpt"
    run, path = _watched(target, pipeline), str(target)
    trainer = run_trainer(target, run.daemon.state_dir, "stop")
    try:
        assert trainer.stdout.readline() == "saved\n"  # then SIGSTOPped: alive, silent
        (alert,) = run.settle(path, [("FsprobeCheckpointOverdue", "critical")])
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    says_what_to_do(alert, path, "it is saved about every")
    assert "py-spy" in alert["annotations"]["action"]


SAVER = """
import sys
import fsprobe
from fsprobe.saving.options import Backoff
target, fallback = sys.argv[1], sys.argv[2:]
try:
    fsprobe.atomic_write(
        target + "/step-7.pt", lambda f: f.write(b"x" * 4096), attempts=2,
        backoff=Backoff(sleep=lambda seconds: None), fallback_dirs=fallback,
    )
    print("saved", flush=True)
except OSError as error:
    print("failed", error.errno, flush=True)
"""


def _save_once(target: Path, state_dir: Path, *fallback: Path) -> str:
    import subprocess
    import sys

    env = clean_environment(FSPROBE_STATE_DIR=str(state_dir))
    done = subprocess.run(
        [sys.executable, "-c", SAVER, str(target), *map(str, fallback)],
        env=env, capture_output=True, text=True, timeout=PATIENCE, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_failed_save_reaches_a_person_with_user_errno_and_fallback(faultfs, pipeline):
    target = faultfs.mountpoint / "ckpt"
    run, path = _watched(target, pipeline, TMPDIR=str(faultfs.mountpoint)), str(target)
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{path}",probe="write"}}', 1.0)
    faultfs.ctl.fail("write", "EIO", path="/ckpt/*step-7*", times=None)
    assert _save_once(target, run.daemon.state_dir).startswith("failed")
    (alert,) = run.settle(path, [("FsprobeSaveFailed", "critical")])
    says_what_to_do(alert, path, f"uid {os.getuid()}", "EIO", "fallback none")
    assert "step-7" not in str(alert["annotations"])  # the sender's words stay out


def test_a_redirected_save_reaches_a_person_with_user_and_errno(tmp_path, faultfs, pipeline):
    target = faultfs.mountpoint / "ckpt"
    fallback = tmp_path / "fallback"
    fallback.mkdir(mode=0o700)
    run, path = _watched(target, pipeline, TMPDIR=str(faultfs.mountpoint)), str(target)
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{path}",probe="write"}}', 1.0)
    faultfs.ctl.fail("write", "ENOSPC", path="/ckpt/*step-7*", times=None)
    assert _save_once(target, run.daemon.state_dir, fallback) == "saved"
    # The daemon was never told of this fallback: the save's event said where it landed.
    run.prometheus.wait_for(f'fsprobe_redirected_pending_bytes{{path="{path}"}}', 4096.0)
    (alert,) = run.settle(path, [("FsprobeSaveRedirected", "warning")])
    says_what_to_do(alert, path, f"uid {os.getuid()}", "ENOSPC", "fsprobe status")
    assert "step-7" not in str(alert["annotations"]) and str(fallback) not in str(alert)
    assert "fsprobe sync" in alert["annotations"]["action"]


@pytest.fixture
def fake_lfs(monkeypatch, tmp_path):
    yield from fake_lfs_for(monkeypatch, tmp_path)


def test_a_lost_lustre_target_reaches_a_person_once_naming_the_target(faultfs, fake_lfs, pipeline):
    """The node loses OST0001 (the fake `lctl` prints DISCONN): one notification names the
    target and the path; the failing test writes it causes are held back."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    fake_lfs.configure(control=faultfs.ctl.socket_path, imports={"targets": {}})
    lustre = {name: os.environ[name] for name in ("FSPROBE_LFS", "FSPROBE_LCTL", "PATH")}
    lustre.update(
        {k: v for k, v in os.environ.items() if k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    )
    run = pipeline(
        target,
        env=clean_environment(TMPDIR=str(faultfs.mountpoint), **lustre),
        settings='quota_provider = "lfs"\nimports_interval = 0.5\n',  # as often as statvfs
    )
    path = str(target)
    run.prometheus.wait_for(
        f'fsprobe_lustre_target_connected{{path="{path}",target="lustre-OST0001"}}', 1.0
    )
    now = int(time.time())
    lost = {"state": "DISCONN", "history": [[now - 3600, "FULL"], [now, "DISCONN"]]}
    fake_lfs.configure(control=faultfs.ctl.socket_path, imports={"targets": {"OST0001": lost}})
    faultfs.ctl.fail("write", "EIO", path="/ckpt/*", times=None)  # what the lost OST does to writes
    (alert,) = run.settle(
        path,
        [("FsprobeLustreTargetDisconnected", "warning")],
        inhibited={("FsprobeWriteProbeFailing", "critical")},
    )
    says_what_to_do(alert, path, "lustre-OST0001")
    assert "lctl get_param" in alert["annotations"]["action"]


def _lustre_environment() -> dict[str, str]:
    """The daemon's environment with the fake `lfs` and `lctl` the `fake_lfs` fixture set."""
    lustre = {name: os.environ[name] for name in ("FSPROBE_LFS", "FSPROBE_LCTL", "PATH")}
    lustre.update(
        {k: v for k, v in os.environ.items() if k.startswith(("FAKE_LFS_", "FAKE_LCTL_"))}
    )
    return lustre


def _notifications_of(run: Pipeline, alertname: str) -> list[list[dict]]:
    """Each notification that reached a person with `alertname` firing: its firing alerts."""
    found = []
    for receiver, notification in run.webhook.notifications():
        firing = [
            alert
            for alert in notification["alerts"]
            if alert["status"] == "firing" and alert["labels"]["alertname"] == alertname
        ]
        if receiver in PERSON and firing:
            found.append(firing)
    return found


def _one_notification(run: Pipeline, alertname: str, nodes: int) -> list[dict]:
    """Wait for the first notification of `alertname`, then for one more group interval of
    the shipped route (15 m, compressed: 15 s) and a margin: no other notification of it may
    come. Returns its alerts."""
    deadline = time.monotonic() + PATIENCE
    while not (sent := _notifications_of(run, alertname)):
        assert time.monotonic() < deadline, f"no {alertname}: {run.prometheus.alerts()}"
        time.sleep(0.25)
    time.sleep(15 + 5)
    sent = _notifications_of(run, alertname)
    print(f"\n{alertname}: {len(sent)} notification(s), of {[len(s) for s in sent]} node(s)")
    assert len(sent) == 1, sent
    (alerts,) = sent
    assert len({alert["labels"]["instance"] for alert in alerts}) == nodes, alerts
    return alerts


def test_a_failover_seen_by_three_nodes_reaches_a_person_once_per_state(
    faultfs, fake_lfs, pipeline
):
    """An OSS failover of OST0001 seen by three nodes (three daemons, three instances): lost
    for more than 2 minutes (compressed), then connected again and in recovery for more than
    15. Each state reaches a person in one notification that holds the three nodes' alerts
    (the shipped route groups these alerts by target); OST0000, which the admin deactivated,
    never does."""
    nodes = 3
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    now = int(time.time())
    deactivated = {"state": "DISCONN", "active": False, "history": [[now - 9000, "DISCONN"]]}
    fake_lfs.configure(
        control=faultfs.ctl.socket_path, imports={"targets": {"OST0000": deactivated}}
    )
    run = pipeline(
        target,
        env=clean_environment(TMPDIR=str(faultfs.mountpoint), **_lustre_environment()),
        settings='quota_provider = "lfs"\nimports_interval = 0.5\n',
        nodes=nodes,
    )
    run.prometheus.wait_for(
        'count(fsprobe_lustre_target_connected{target="lustre-OST0001"} == 1)', float(nodes)
    )
    now = int(time.time())
    up = [[now - 3600, "CONNECTING"], [now - 3600, "FULL"]]
    lost = {"state": "DISCONN", "history": [*up, [now, "DISCONN"]]}
    fake_lfs.configure(
        control=faultfs.ctl.socket_path,
        imports={"targets": {"OST0000": deactivated, "OST0001": lost}},
    )
    (alert, *_) = _one_notification(run, "FsprobeLustreTargetDisconnected", nodes)
    assert alert["labels"]["target"] == "lustre-OST0001"
    now = int(time.time())
    replaying = [[now, "CONNECTING"], [now, "REPLAY"], [now, "REPLAY_LOCKS"], [now, "REPLAY_WAIT"]]
    recovering = {"state": "REPLAY_WAIT", "history": [*lost["history"], *replaying]}
    fake_lfs.configure(
        control=faultfs.ctl.socket_path,
        imports={"targets": {"OST0000": deactivated, "OST0001": recovering}},
    )
    (alert, *_) = _one_notification(run, "FsprobeLustreTargetRecovering", nodes)
    assert alert["labels"]["target"] == "lustre-OST0001"
    says_what_to_do(alert, str(target), "lustre-OST0001", "900 s")
    assert len(_notifications_of(run, "FsprobeLustreTargetDisconnected")) == 1
    assert not [
        alert
        for alert in run.prometheus.alerts()
        if alert["labels"].get("target") == "lustre-OST0000"
    ]


TRAINING = """
import sys, time
import fsprobe
from fsprobe.saving.options import Backoff
target, step = sys.argv[1], 0
while True:
    try:
        fsprobe.atomic_write(
            f"{target}/step-{step % 2}.pt", lambda f: f.write(b"x" * 65536), attempts=2,
            backoff=Backoff(sleep=lambda seconds: None),
        )
    except OSError:
        pass
    step += 1
    time.sleep(1.0)
"""


@contextmanager
def training(target: Path, state_dir: Path, prometheus: Prometheus) -> Iterator[None]:
    """A trainer saving into `target` every second (failed saves and all) until the block ends;
    the block starts once the daemon knows its save interval."""
    env = clean_environment(FSPROBE_STATE_DIR=str(state_dir))
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINING, str(target)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        prometheus.wait_for(f'count(fsprobe_save_interval_seconds{{path="{target}"}})', 1.0)
        yield
    finally:
        trainer.kill()
        trainer.wait()


def _failed_saves(run: Pipeline, path: str) -> None:
    """Wait until Prometheus has seen a save into `path` fail and the checkpoint go overdue:
    the consequences the cause's page holds back."""
    run.prometheus.wait_for(f'fsprobe_saves_total{{path="{path}",outcome="failed"}} > bool 0', 1.0)
    overdue = (
        f"timestamp(fsprobe_last_successful_save_timestamp_seconds{{path={path!r}}})"
        f" - fsprobe_last_successful_save_timestamp_seconds > bool"
        f" 3 * fsprobe_save_interval_seconds"
    ).replace("'", '"')
    run.prometheus.wait_for(overdue, 1.0)


def test_a_full_filesystem_with_a_trainer_saving_into_it_is_one_page(tmpfs, pipeline):
    """The trainer's failed saves and its overdue checkpoint are the full filesystem's: one
    page, before, during and after the consequences would have fired."""
    target = tmpfs(size="8M").path
    run, path = pipeline(target, env=clean_environment(TMPDIR=str(target))), str(target)
    with training(target, run.daemon.state_dir, run.prometheus):
        fill_to(target, 0.0)
        _failed_saves(run, path)
        (alert,) = run.settle(path, [("FsprobeSpaceHeadroomLow", "critical")])
        run.nothing_more(path, [("FsprobeSpaceHeadroomLow", "critical")])
    says_what_to_do(alert, path, "the filesystem", "ENOSPC")


def test_a_failing_filesystem_with_a_trainer_saving_into_it_is_one_page(faultfs, pipeline):
    """EIO for every write there: the test writes' alert is the page, not the trainer's
    failed saves nor its overdue checkpoint."""
    target = faultfs.mountpoint / "ckpt"
    run, path = _watched(target, pipeline, TMPDIR=str(faultfs.mountpoint)), str(target)
    with training(target, run.daemon.state_dir, run.prometheus):
        faultfs.ctl.fail("write", "EIO", path="/ckpt/*", times=None)
        _failed_saves(run, path)
        (alert,) = run.settle(path, [("FsprobeWriteProbeFailing", "critical")])
        run.nothing_more(path, [("FsprobeWriteProbeFailing", "critical")])
    says_what_to_do(alert, path, "EIO")


def test_a_daemon_restart_resolves_nothing(tmpfs, pipeline):
    """A planned restart (SIGTERM, about a second down) while a full filesystem pages: no
    RESOLVED, no second page."""
    target = tmpfs(size="8M").path
    run, path = pipeline(target, env=clean_environment(TMPDIR=str(target))), str(target)
    fill_to(target, 0.0)
    run.settle(path, [("FsprobeSpaceHeadroomLow", "critical")])
    run.restart(signal.SIGTERM)
    run.prometheus.wait_for('up{job="fsprobe"}', 1.0)
    run.nothing_more(path, [("FsprobeSpaceHeadroomLow", "critical")])
    assert [name for name, _, _ in run.sent()].count("FsprobeDown") == 0


def test_a_killed_daemon_is_fsprobe_down_alone(tmpfs, pipeline):
    """kill -9 while a full filesystem pages: FsprobeDown (critical) is the one new page, and
    the open page is neither resolved nor sent again while fsprobe is down."""
    target = tmpfs(size="8M").path
    run, path = pipeline(target, env=clean_environment(TMPDIR=str(target))), str(target)
    fill_to(target, 0.0)
    run.settle(path, [("FsprobeSpaceHeadroomLow", "critical")])
    run.daemon.send(signal.SIGKILL)
    run.daemon.wait(PATIENCE)
    deadline = time.monotonic() + PATIENCE
    while ("FsprobeDown", "critical", None) not in run.sent():
        assert time.monotonic() < deadline, run.sent()
        time.sleep(0.25)
    run.nothing_more(path, [("FsprobeSpaceHeadroomLow", "critical")])
    assert run.sent() == [
        ("FsprobeSpaceHeadroomLow", "critical", path),
        ("FsprobeDown", "critical", None),
    ]


def test_a_killed_daemon_in_textfile_mode_is_one_message(tmp_path, pipeline):
    """node_exporter serves the dead daemon's last fsprobe.prom: FsprobeDown from the file's
    age, and no FsprobeProbeStale for any of its probes."""
    target = tmp_path / "ckpt"
    target.mkdir()
    run = pipeline(target, textfile=True)
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{target}",probe="write"}}', 1.0)
    run.daemon.send(signal.SIGKILL)
    run.daemon.wait(PATIENCE)
    deadline = time.monotonic() + PATIENCE
    while ("FsprobeDown", "critical", None) not in run.sent():
        assert time.monotonic() < deadline, run.sent()
        time.sleep(0.25)
    time.sleep(15)  # as long again as a stale probe would need to reach a person
    assert run.sent() == [("FsprobeDown", "critical", None)]
    assert not any(a["labels"]["alertname"] == "FsprobeProbeStale" for a in run.prometheus.alerts())
    (down,) = [
        alert for _, notification in run.webhook.notifications() for alert in notification["alerts"]
    ]
    assert down["labels"]["reason"] == "textfile_stale"
    assert "systemctl status fsprobe" in down["annotations"]["action"]


def test_a_quota_grace_that_runs_out_under_a_trainer_is_one_page(faultfs, fake_lfs, pipeline):
    """A quota goes over its soft limit, with 20 s of grace, while a trainer saves: the
    grace alert pages before it runs out and stays the one page after (saves and test writes
    failing with EDQUOT, no headroom left, the soft limit exceeded are all its own)."""
    target = faultfs.mountpoint / "ckpt"
    target.mkdir()
    fake_lfs.configure(control=faultfs.ctl.socket_path, project=4242, limited_types="project")
    faultfs.ctl.set_quota("bytes", soft=1 << 20, hard=1 << 30, grace=20)
    env = clean_environment(TMPDIR=str(faultfs.mountpoint), **_lustre_environment())
    run, path = pipeline(target, env=env, quota=True), str(target)
    with training(target, run.daemon.state_dir, run.prometheus):
        (faultfs.mountpoint / "dataset").write_bytes(bytes(2 << 20))  # over: the grace runs
        run.settle(path, [("FsprobeQuotaGraceExpiring", "critical")])
        run.prometheus.wait_for(
            f'min(fsprobe:quota_grace_remaining:held{{path="{path}"}}) < bool 0', 1.0
        )
        _failed_saves(run, path)
        run.nothing_more(path, [("FsprobeQuotaGraceExpiring", "critical")])
    (alert,) = [alert for _, alert in run.notified(path)]
    says_what_to_do(alert, path, "grace period", "EDQUOT")


def test_inodes_running_out_are_one_page_and_no_ticket_after_it(tmpfs, pipeline):
    """Inodes used at a steady 1.25 a second from 78 %: the trend warns (a ticket), then pages
    at under 20 % left; then every inode is taken (the write probe fails with ENOSPC). The
    trend's page is the one page of it: the headroom alerts (under 10 % and 3 %), which fire,
    and the failing test writes reach nobody, and nothing is resolved while none is free."""
    fs = tmpfs(size="8M", nr_inodes=1000)
    target = fs.path
    for index in range(780):
        (target / f"shard-{index}").touch()
    run, path = (
        pipeline(target, env=clean_environment(TMPDIR=str(target)), trends=True),
        str(target),
    )
    stop = threading.Event()
    index = 780

    def shard() -> None:
        nonlocal index
        while not stop.wait(0.8):
            try:
                (target / f"shard-{index}").touch()
            except OSError:  # ENOSPC: out of inodes (a run far slower than planned)
                return
            index += 1

    feeder = threading.Thread(target=shard, daemon=True)
    feeder.start()
    filling = [("FsprobeInodesFillingUp", "warning"), ("FsprobeInodesFillingUp", "critical")]
    try:
        run.settle(path, filling, patience=240)
    finally:
        stop.set()
        feeder.join()
    with contextlib.suppress(OSError):  # ENOSPC: none left
        while True:
            (target / f"shard-{index}").touch()
            index += 1
    run.prometheus.wait_for(f'fsprobe_probe_success{{path="{path}",probe="write"}}', 0.0)
    headroom = {("FsprobeInodeHeadroomLow", "warning"), ("FsprobeInodeHeadroomLow", "critical")}
    alerts = run.settle(path, filling, inhibited=headroom)
    run.nothing_more(path, filling)
    says_what_to_do(alerts[-1], path, "inode headroom left", "runs out within 4 hours")
    assert "Find what creates the files" in alerts[-1]["annotations"]["action"]
    receivers = [receiver for receiver, _ in run.notified(path)]
    assert receivers == ["fsprobe-tickets", "fsprobe-pager"]
