"""A week on call, compressed: what reaches a person from the shipped rules
(deploy/prometheus/fsprobe.rules.yml) and the shipped Alertmanager configuration
(deploy/alertmanager/alertmanager.yml), in real Prometheus and Alertmanager, from a root
`fsprobe run` watching five targets while trainers save there as a real user.

Time runs `SCALE` times faster, alike everywhere (tests/support/oncall.py): a compressed minute
is a real second. The targets: `steady` and `rare` (plain directories, a save every 2 minutes and
every 8-10 minutes), `space` (an 8 MiB tmpfs), `inodes` (a tmpfs of 1,000 inodes) and `ckpt`
(the fault filesystem, its quota read by the fake `lfs`), each with its trainer. A webhook stands
in for the person: it counts every notification Alertmanager sends to the pager and to tickets.

The quiet scenario lives through a reload and restarts of the daemon, Prometheus and
Alertmanager, and must reach nobody. Each bad day must reach the pager exactly once, naming the
path (or the node), the cause and the first thing to do; a ticket of the same cause may come
before that page (escalation), nothing after it, and nothing is resolved while the problem
lasts. The quiet "week" holds its events, not 7 x 24 compressed hours (2.8 real hours).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.test_deploy_alertmanager import fill_to
from tests.support.alertmanager import Alertmanager, Webhook
from tests.support.daemon_process import (
    PATIENCE,
    REPO_ROOT,
    DaemonProcess,
    clean_environment,
    free_port,
)
from tests.support.fakes.fake_lfs import fake_lfs_for
from tests.support.faultmount import FaultFS
from tests.support.node_exporter import NodeExporter
from tests.support.oncall import (
    PROMETHEUS_FLAGS,
    SCALE,
    daemon_defaults,
    scaled_alertmanager,
    scaled_rules,
)
from tests.support.prometheus import Prometheus
from tests.support.users import LocalUser

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

RULES = REPO_ROOT / "deploy" / "prometheus" / "fsprobe.rules.yml"
ALERTMANAGER = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
PAGER, TICKETS = "fsprobe-pager", "fsprobe-tickets"
#: Compressed minutes a problem is held after its page, to see whatever else it would send
#: (the longest `for:` of a consequence is 15 minutes).
HOLD = 20

#: Real seconds a page may come later than its rules say, on a loaded 2-CPU machine.
SLACK = 20
#: A trainer of the user's: saves a 4 KiB checkpoint every LOW-HIGH compressed minutes into
#: TARGET (two files in turn, as keep-last-2), its retries' backoff compressed too.
TRAINER = f"""
import os, random, sys, time
import fsprobe
from fsprobe.saving.options import Backoff
target, low, high = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
backoff = Backoff(base=2.0 / {SCALE}, cap=15.0 / {SCALE})
step = 0
while True:
    name = os.path.join(target, f"step-{{step % 2}}.pt")
    try:
        fsprobe.atomic_write(name, lambda f: f.write(b"x" * 4096), backoff=backoff)
        print(step, "saved", flush=True)
    except OSError as error:
        print(step, "failed", error.errno, flush=True)
    step += 1
    time.sleep(random.uniform(low, high) * 60 / {SCALE})
"""
#: The trainers: target and cadence in compressed minutes.
CADENCES = {"steady": (2, 2), "rare": (8, 10), "space": (2, 2), "inodes": (2, 2), "ckpt": (2, 2)}


@dataclass
class Page:
    """What a scenario must send to the pager, once: the alert, labels it has (the path, or
    the node: the first label is what the cause reaches), words of its description (the
    cause) and of its action (the first thing to do); before it, tickets of this alert or of
    those it `escalates` from. Where two alerts could each be the one page, `alternatives`."""

    alertname: str
    where: dict[str, str]
    cause: tuple[str, ...]
    action: str
    #: Alerts of the same cause that may make a ticket before the page (its warning, a
    #: forecast): escalation, never after the page.
    escalates: tuple[str, ...] = ()
    #: Other alerts that would be as good a page for this cause (with their own words).
    alternatives: tuple[Page, ...] = ()

    def variants(self) -> tuple[Page, ...]:
        return (self, *self.alternatives)

    def variant(self, alert: dict) -> Page:
        """The variant of this page that `alert` is."""
        (page,) = [p for p in self.variants() if p.matches(alert)]
        return page

    def matches(self, alert: dict) -> bool:
        labels = alert["labels"]
        return labels["alertname"] == self.alertname and all(
            labels.get(k) == v for k, v in self.where.items()
        )

    @property
    def scope(self) -> tuple[str, str]:
        """The label and value of everything this cause may be behind: its path or node."""
        return next(iter(self.where.items()))


@dataclass
class Week:
    home: Path
    targets: dict[str, Path]
    faultfs: FaultFS
    user: LocalUser
    daemon: DaemonProcess
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: Webhook
    node_exporter: NodeExporter | None
    trainers: dict[str, subprocess.Popen] = field(default_factory=dict)

    def sent(self, label: str = "", value: str = "") -> list[tuple[str, str, dict]]:
        """Every alert that reached a person (with `label` = `value`, if given), as
        (receiver, status, alert), in order; an alert counts once per notification that
        carries it."""
        return [
            (receiver, alert["status"], alert)
            for receiver, notification in self.webhook.notifications()
            if receiver in (PAGER, TICKETS)
            for alert in notification["alerts"]
            if not label or alert["labels"].get(label) == value
        ]

    def sent_lines(self, label: str = "", value: str = "") -> list[str]:
        return [
            f"{receiver} {status} {a['labels']['alertname']}/{a['labels']['severity']} "
            f"{a['labels'].get('probe', '')} "
            f"{a['labels'].get('path', a['labels'].get('instance'))} "
            f"[{a['startsAt'][11:19]}-{a['endsAt'][11:19]}]"
            for receiver, status, a in self.sent(label, value)
        ]

    def pages(self, page: Page) -> list[dict]:
        return [
            alert
            for receiver, status, alert in self.sent()
            if receiver == PAGER
            and status == "firing"
            and any(variant.matches(alert) for variant in page.variants())
        ]

    def wait_for_page(self, page: Page, within: float) -> dict:
        """Wait (at most `within` compressed minutes, plus `SLACK`) for the page; returns it."""
        deadline = time.monotonic() + within * 60 / SCALE + SLACK
        while not (pages := self.pages(page)):
            assert time.monotonic() < deadline, (page, self.sent_lines(*page.scope), self.firing())
            time.sleep(0.25)
        return pages[0]

    def firing(self) -> list[str]:
        return sorted(
            f"{a['labels']['alertname']}/{a['labels']['severity']} {a['labels'].get('path')}"
            for a in self.prometheus.alerts()
            if a["state"] == "firing"
        )

    def pass_time(self, minutes: float) -> None:
        time.sleep(minutes * 60 / SCALE)

    def trainer(self, name: str) -> None:
        low, high = CADENCES[name]
        command = [self.user.python_executable, "-c", TRAINER, str(self.targets[name])]
        with open(self.home / f"trainer-{name}.log", "ab") as log:
            self.trainers[name] = subprocess.Popen(
                [*command, str(low), str(high)],
                cwd=REPO_ROOT,
                env=clean_environment(FSPROBE_STATE_DIR=str(self.daemon.state_dir)),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                **self.user.subprocess_kwargs(),
            )

    def restart_daemon(self, how: int = signal.SIGTERM) -> None:
        self.daemon.send(how)
        self.daemon.wait(PATIENCE)
        self.daemon.start()
        self.daemon_shared()

    def daemon_shared(self) -> None:
        """The state dir reachable by the trainers (the unit's /run/fsprobe is 0755)."""
        os.chmod(self.daemon.home, 0o755)
        os.chmod(self.daemon.state_dir, 0o755)

    def stop(self) -> None:
        self.faultfs.ctl.clear()  # a hung mount a failed test left behind lets its callers go
        for trainer in self.trainers.values():
            trainer.kill()
            trainer.wait()


def _config(week_home: Path, targets: dict[str, Path]) -> Path:
    plain = 'quota_probe = "never"\n'
    lines = [daemon_defaults()]
    for name, path in targets.items():
        settings = 'quota_provider = "lfs"\nquota_probe = "always"\n' if name == "ckpt" else plain
        lines.append(f'[[targets]]\npath = "{path}"\n{settings}')
    config = week_home / "fsprobe.toml"
    config.write_text("".join(lines))
    return config


@pytest.fixture
def home() -> Iterator[Path]:
    """The week's directory. Not under pytest's basetemp: another pytest session on the
    machine makes that 0700 again, which would lock the trainers out of the daemon's state
    dir mid-week."""
    path = Path(tempfile.mkdtemp(prefix="fsprobe-week-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def fake_lfs(monkeypatch, home):
    """The fake lfs, which the daemon runs as each target's owner: its logs are everyone's."""
    logs = home / "lfs"
    logs.mkdir(mode=0o1777)
    logs.chmod(0o1777)
    fake = fake_lfs_for(monkeypatch, logs)
    for log in ("fake-lfs.log", "fake-lctl.log"):
        (logs / log).touch(mode=0o666)
        (logs / log).chmod(0o666)
    yield from fake


@pytest.fixture
def week(home, faultfs_factory, tmpfs, fake_lfs, local_users) -> Iterator[Callable[..., Week]]:
    """``week(textfile=False)``: the world above, every trainer saving, alerts flowing."""
    started: list[object] = []

    def start(textfile: bool = False) -> Week:
        user = local_users.user()
        faultfs = faultfs_factory(mountpoint=_directory(home / "mnt"))
        started.append(faultfs)  # stopped (again) before `home` goes
        targets = {
            "steady": home / "steady",
            "rare": home / "rare",
            "space": tmpfs(size="8M").path,
            "inodes": tmpfs(size="8M", nr_inodes=1000).path,
            "ckpt": faultfs.mountpoint / "ckpt",
        }
        for name in ("steady", "rare", "ckpt"):
            targets[name].mkdir()
        for path in targets.values():  # the user's own: root probes them as the user
            os.chown(path, user.uid, user.gid)
        faultfs.ctl.exempt_root()  # as Lustre: root's write probe is not refused by a quota
        # The fake lfs answers from the fault filesystem's control socket, also when the
        # daemon runs it as the target's owner.
        faultfs.socket_path.parent.chmod(0o755)
        faultfs.socket_path.chmod(0o666)
        fake_lfs.configure(
            control=faultfs.ctl.socket_path, imports={"targets": {}}, limited_types="user"
        )
        env = clean_environment(TMPDIR=str(home))
        env.update({k: v for k, v in os.environ.items() if k.startswith(("FAKE_L", "FSPROBE_L"))})
        env["PATH"] = os.environ["PATH"]
        args = ["--config", str(_config(home, targets))]
        args += ["--listen", f"127.0.0.1:{free_port()}"]
        jobs: dict[str, list[str]]
        exporter = None
        if textfile:
            textfiles = _directory(home / "textfile")
            args += ["--textfile-dir", str(textfiles)]
            exporter = NodeExporter(_directory(home / "node"), textfiles)
            started.append(exporter)
            exporter.wait_ready()
        daemon = DaemonProcess(_directory(home / "daemon"), *args, env=env)
        started.append(daemon.start())
        if exporter is not None:
            jobs = {"node": [exporter.address]}
        else:
            jobs = {"fsprobe": [daemon.url.split("//")[1].split("/")[0]]}
        webhook = Webhook()
        started.append(webhook)
        alertmanager = Alertmanager(
            _directory(home / "alertmanager"), scaled_alertmanager(ALERTMANAGER, webhook)
        )
        started.append(alertmanager)
        alertmanager.wait_ready()
        prometheus = Prometheus(
            _directory(home / "prometheus"),
            "",
            [scaled_rules(RULES, home)],
            alertmanager.address,
            jobs=jobs,
            flags=PROMETHEUS_FLAGS,
        )
        started.append(prometheus)
        prometheus.wait_ready()
        run = Week(
            home, targets, faultfs, user, daemon, prometheus, alertmanager, webhook, exporter
        )
        started.append(run)
        run.daemon_shared()
        for name in CADENCES:
            run.trainer(name)
        return run

    yield start
    for thing in reversed(started):
        thing.stop()  # type: ignore[attr-defined]


def _directory(path: Path) -> Path:
    path.mkdir(mode=0o755)
    return path


def test_a_quiet_week_reaches_nobody(week):
    """Trainers save every 2 and every 8-10 minutes on healthy targets; the daemon is reloaded
    and restarted, Prometheus restarted and reloaded, Alertmanager restarted: no notification."""
    run = week()
    run.pass_time(30)  # the rare trainer has saved three times: its interval is known
    run.daemon.send(signal.SIGHUP)
    run.daemon.wait_for_log("event=reloaded")
    run.pass_time(10)
    run.restart_daemon()
    run.pass_time(20)
    run.prometheus.restart()
    run.pass_time(12)
    run.prometheus.proc.send_signal(signal.SIGHUP)
    run.pass_time(8)
    run.alertmanager.restart()
    run.pass_time(15)
    assert run.sent_lines() == [], "\n".join(run.sent_lines())


# -- the bad days ----------------------------------------------------------------------------


def full_filesystem(run: Week) -> Page:
    fill_to(run.targets["space"], 0.0)  # the trainer saving there now fails with ENOSPC
    return Page(
        "FsprobeSpaceHeadroomLow",
        {"path": str(run.targets["space"]), "severity": "critical"},
        ("the filesystem", "ENOSPC"),
        "delete old checkpoints",
        escalates=("FsprobeSpaceFillingUp",),
    )


def inodes_filling(run: Week) -> Page:
    """80 % of the inodes at once (under 20 % left: the trend says they run out within 4
    hours), then 1.5 a minute (under 10 % left from about minute 64), then from minute 66 the
    rest within 5 minutes: none left, and the write probe and the trainer saving there fail
    with ENOSPC, while the trend's page (after its hour) fires on. One page, by the trend (by
    the headroom, had it fired first)."""
    target = run.targets["inodes"]
    st = os.statvfs(target)
    created = 0

    def create(count: int) -> None:
        nonlocal created
        for _ in range(count):
            try:
                os.close(os.open(target / f"shard-{created}", os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError:
                return
            created += 1

    create(st.f_files * 8 // 10 - (st.f_files - st.f_ffree))

    def fill() -> None:
        for minute in range(66):
            create(st.f_files * 15 * (minute + 1) // 10000 - st.f_files * 15 * minute // 10000)
            run.pass_time(1)
        for _ in range(8):
            create(st.f_files // 50)
            run.pass_time(1)

    threading.Thread(target=fill, daemon=True).start()
    where = {"path": str(target), "severity": "critical"}
    headroom = Page("FsprobeInodeHeadroomLow", where, ("inodes are left",), "Remove small files")
    return Page(
        "FsprobeInodesFillingUp",
        where,
        ("inode headroom left", "runs out within 4 hours"),
        "Find what creates",
        escalates=("FsprobeInodeHeadroomLow",),
        alternatives=(headroom,),
    )


def eio(run: Week) -> Page:
    run.faultfs.ctl.fail("write", "EIO", path="/ckpt/*", times=None)
    return Page(
        "FsprobeWriteProbeFailing",
        {"path": str(run.targets["ckpt"]), "severity": "critical"},
        ("EIO",),
        "dmesg for EIO",
    )


def grace_expires(run: Week) -> Page:
    """Usage goes over the soft limit with 20 compressed minutes of grace, which then run out
    while the trainer keeps saving (refused with EDQUOT once it has)."""
    used = run.faultfs.ctl.quota()["bytes"]["used"]
    run.faultfs.ctl.set_quota("bytes", soft=used + (64 << 10), grace=20 * 60 / SCALE)
    (run.targets["ckpt"] / "dataset.bin").write_bytes(bytes(1 << 20))
    return Page(
        "FsprobeQuotaGraceExpiring",
        {"path": str(run.targets["ckpt"]), "severity": "critical"},
        ("grace period",),
        "under its soft limit",
        escalates=("FsprobeQuotaSoftLimitExceeded",),
    )


def hung_mount(run: Week) -> Page:
    run.faultfs.ctl.block("*", path="/ckpt*")
    return Page(
        "FsprobeMountStuck",
        {"path": str(run.targets["ckpt"]), "severity": "critical"},
        (f"mount {run.faultfs.mountpoint}",),
        "do not touch the mount",
    )


def hung_trainer(run: Week) -> Page:
    run.trainers["steady"].send_signal(signal.SIGSTOP)
    return Page(
        "FsprobeCheckpointOverdue",
        {"path": str(run.targets["steady"]), "severity": "critical"},
        ("it is saved about every",),
        "py-spy",
    )


def daemon_killed(run: Week) -> Page:
    run.daemon.send(signal.SIGKILL)
    run.daemon.wait(PATIENCE)
    return Page(
        "FsprobeDown",
        {"instance": run.daemon.url.split("//")[1].split("/")[0], "reason": "scrape_failed"},
        ("failed to scrape", "unwatched"),
        "systemctl status fsprobe",
    )


def textfile_daemon_killed(run: Week) -> Page:
    assert run.node_exporter is not None
    run.daemon.send(signal.SIGKILL)
    run.daemon.wait(PATIENCE)
    return Page(
        "FsprobeDown",
        {"instance": run.node_exporter.address, "reason": "textfile_stale"},
        ("stopped or stalled",),
        "systemctl status fsprobe",
    )


@dataclass(frozen=True)
class BadDay:
    cause: Callable[[Week], Page]
    within: float  # compressed minutes from the cause to its page, at most
    textfile: bool = False
    restart_daemon: bool = False  # restarted (SIGTERM) once the page went out
    recovers: Callable[[Week], None] | None = None  # the cause ends after the hold


def _unblock(run: Week) -> None:
    run.faultfs.ctl.clear()


BAD_DAYS = [
    pytest.param(BadDay(full_filesystem, 20), id="full-with-a-trainer-saving"),
    pytest.param(BadDay(inodes_filling, 65), id="inodes-filling"),
    pytest.param(BadDay(eio, 15), id="eio"),
    pytest.param(BadDay(grace_expires, 15), id="grace-expiring-then-expired"),
    pytest.param(BadDay(hung_mount, 10, recovers=_unblock), id="hung-mount"),
    pytest.param(BadDay(hung_trainer, 10, restart_daemon=True), id="hung-trainer-across-restart"),
    pytest.param(BadDay(daemon_killed, 15), id="daemon-killed"),
    pytest.param(BadDay(textfile_daemon_killed, 25, textfile=True), id="textfile-daemon-killed"),
]


@pytest.mark.parametrize("day", BAD_DAYS)
def test_a_bad_day_pages_once_per_cause(week, day: BadDay):
    """What the cause's path (or node) sends a person: one page, tickets only of its
    escalation and only before it, nothing resolved while the problem lasts, nothing new firing
    once it ends."""
    run = week(textfile=day.textfile)
    run.pass_time(8)  # every trainer has saved a few times: its interval is known
    page = day.cause(run)
    scope = page.scope
    assert run.sent(*scope) == [], "the day started noisy"
    alert = run.wait_for_page(page, day.within)
    if day.restart_daemon:
        run.restart_daemon()
    run.pass_time(HOLD)
    lines = run.sent_lines(*scope)
    print(f"\n{page.alertname} {page.where}: {len(lines)} notified\n" + "\n".join(lines))
    sent = run.sent(*scope)
    assert [line for line in lines if " resolved " in line] == [], lines
    assert [receiver for receiver, _, _ in sent].count(PAGER) == 1, lines
    before = sent.index((PAGER, "firing", alert))
    escalation = {name for p in page.variants() for name in (p.alertname, *p.escalates)}
    assert all(
        receiver == TICKETS and a["labels"]["alertname"] in escalation
        for receiver, _, a in sent[:before]
    ), lines
    assert sent[before + 1 :] == [], lines
    says_what_to_do(alert, scope[1], page.variant(alert))
    if day.recovers is not None:  # what the cause held back must not page once it ends
        day.recovers(run)
        run.pass_time(HOLD)
        lines = run.sent_lines(*scope)
        assert [line for line in lines[before + 1 :] if " firing " in line] == [], lines


def says_what_to_do(alert: dict, where: str, page: Page) -> None:
    annotations = alert["annotations"]
    assert where in annotations["summary"], annotations
    for word in page.cause:
        assert word in annotations["description"], (word, annotations["description"])
    assert page.action in annotations["action"], annotations["action"]
    name = alert["labels"]["alertname"].lower()
    assert annotations["runbook_url"].endswith(f"#{name}")
    assert "/d/fsprobe-overview/" in annotations["dashboard_url"]
