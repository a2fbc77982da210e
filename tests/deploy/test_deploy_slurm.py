"""The Slurm example job script, run for real with bash: preflight exit codes, the daemon's
lifetime, the hook's state dir, and the signals of a time limit (USR1) and a preemption (TERM).

`fsprobe` is replaced by a recording stand-in on PATH, so that each exit code of `fsprobe check`
can be produced on demand and the daemon's start and stop are observable; what is tested is
the script's control flow. The trainer is a small Python program that records what it sees.
For jobs over several nodes, `srun` is a stand-in too: it runs its command once per node, the
other nodes each in a mount namespace of its own where a directory of their own is mounted on
TMPDIR (node-local /tmp: the same path, another filesystem), and passes on TERM and INT.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.capability import need_command, need_root
from tests.support.daemon_process import DaemonProcess, fast_config

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "fsprobe-train.sbatch"
JOB_ID = "4242"

FAKE_FSPROBE = """\
import json, os, signal, sys, time

def record(event, **fields):
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\\n")

if sys.argv[1] == "check":
    record("check", argv=sys.argv[1:])
    sys.exit(int(os.environ.get("FAKE_CHECK_STATUS", "0")))
if sys.argv[1] == "run":
    node = os.environ.get("SLURMD_NODENAME")
    state_dir = sys.argv[sys.argv.index("--state-dir") + 1]
    if os.environ.get("FAKE_RUN_STATUS") or (  # a daemon that cannot start
        os.path.lexists(state_dir) and os.lstat(state_dir).st_uid != os.getuid()
    ):
        record("run-refused", argv=sys.argv[1:], node=node)
        print("Error: the state dir is not yours", file=sys.stderr)
        sys.exit(int(os.environ.get("FAKE_RUN_STATUS") or "69"))
    def stop(signum, frame):
        record("run-stopped", signal=signum, node=node)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    os.makedirs(state_dir, exist_ok=True)
    open(os.path.join(state_dir, "state.json"), "w").close()  # what a started daemon writes
    record("run-started", argv=sys.argv[1:], state_dir=os.environ.get("FSPROBE_STATE_DIR"),
           node=node, tmpdir=os.environ.get("TMPDIR"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    record("run-not-stopped")
    sys.exit(1)
sys.exit(64)
"""

TRAINER = """\
import json, os, signal, sys, time

def record(event, **fields):
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\\n")

def events():
    with open(os.environ["FAKE_LOG"]) as log:
        return [json.loads(line)["event"] for line in log]

mode, status = sys.argv[1], int(sys.argv[2])
def on_signal(signum, frame):
    record("trainer-signalled", signal=signum)
    sys.exit(status)
signal.signal(signal.SIGUSR1, on_signal)
signal.signal(signal.SIGTERM, on_signal)
record("trainer-started", state_dir=os.environ.get("FSPROBE_STATE_DIR"),
       checkpoint_dir=os.environ.get("CHECKPOINT_DIR"))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    started = events().count("run-started") + events().count("run-refused")
    if mode == "exit" and started >= int(os.environ.get("FAKE_DAEMONS", "1")):
        sys.exit(status)
    time.sleep(0.05)
record("trainer-not-signalled")
sys.exit(99)
"""

FAKE_SRUN = """\
import json, os, signal, subprocess, sys

def record(event, **fields):
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\\n")

options = {}
arguments = sys.argv[1:]
while arguments and arguments[0].startswith("--"):
    name, _, value = arguments.pop(0)[2:].partition("=")
    options[name] = value
record("srun", options=options, command=arguments)
nodes = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ["SLURM_NNODES"])
if int(options.get("nodes", nodes)) > nodes or not arguments:
    print("srun: error: the step asks for more nodes than the job has", file=sys.stderr)
    sys.exit(1)
children = []
for node in range(int(options.get("nodes", nodes))):
    environ = {**os.environ, "SLURMD_NODENAME": f"node{node}", "SLURM_NODEID": str(node),
               "SLURM_PROCID": str(node)}
    command = arguments
    if node:  # the first node is the batch script's: its own TMPDIR
        local = os.path.join(os.environ["FAKE_NODES_DIR"], f"node{node}")
        os.makedirs(local, exist_ok=True)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                   local, os.environ["TMPDIR"], *arguments]
    children.append(subprocess.Popen(command, env=environ))

def forward(signum, frame):
    for child in children:
        child.send_signal(signum)

signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
sys.exit(max(child.wait() for child in children))
"""


class Job:
    """The batch script running under bash, as sbatch would start it on the first node."""

    def __init__(self, tmp_path: Path, check_status: int = 0) -> None:
        self.root = tmp_path
        self.bin_dir = bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "fsprobe"
        fake.write_text(f"#!{sys.executable}\n{FAKE_FSPROBE}")
        fake.chmod(0o755)
        self.trainer = tmp_path / "trainer.py"
        self.trainer.write_text(TRAINER)
        self.log = tmp_path / "events.jsonl"
        self.log.touch()
        self.checkpoints = tmp_path / "ckpt"
        self.tmpdir = tmp_path
        environ = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "FSPROBE_"))
        }
        self.environ = {
            **environ,
            "PATH": f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}",
            "CHECKPOINT_DIR": str(self.checkpoints),
            "TMPDIR": str(tmp_path),
            "SLURM_JOB_ID": JOB_ID,
            "FAKE_LOG": str(self.log),
            "FAKE_CHECK_STATUS": str(check_status),
        }
        self.process: subprocess.Popen[str] | None = None

    def start(self, *trainer_args: str) -> None:
        command = [sys.executable, str(self.trainer), *trainer_args] if trainer_args else []
        self.process = subprocess.Popen(
            ["bash", str(SCRIPT), *command],
            env=self.environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def finish(self) -> tuple[int, str]:
        assert self.process is not None
        try:
            _, stderr = self.process.communicate(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        return self.process.returncode, stderr

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def names(self) -> list[str]:
        return [event["event"] for event in self.events()]

    def wait_for(self, *names: str) -> None:
        """Until every named event is in the log (the processes record as they go)."""
        deadline = time.monotonic() + 30
        while not set(names) <= set(self.names()):
            assert self.process is not None and self.process.poll() is None, self.names()
            assert time.monotonic() < deadline, f"waited for {names}, saw {self.names()}"
            time.sleep(0.05)

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def play_nodes(self, count: int) -> None:
        """A job over COUNT nodes, whose `srun` runs its command on each, TMPDIR node-local."""
        need_root("mount namespaces for the nodes' TMPDIR")
        need_command("unshare", "util-linux")
        srun = self.bin_dir / "srun"
        srun.write_text(f"#!{sys.executable}\n{FAKE_SRUN}")
        srun.chmod(0o755)
        self.tmpdir = self.root / "tmp"  # alone in its directory: mounted over on other nodes
        self.tmpdir.mkdir()
        self.environ.update(
            TMPDIR=str(self.tmpdir),
            SLURM_JOB_NUM_NODES=str(count),
            FAKE_NODES_DIR=str(self.root / "nodes"),
            FAKE_DAEMONS=str(count),
        )

    def node_tmpdir(self, node: int) -> Path:
        """What node NODE has at TMPDIR (the first node is the batch script's)."""
        return self.tmpdir if node == 0 else self.root / "nodes" / f"node{node}"

    def all_of(self, name: str) -> list[dict]:
        return [event for event in self.events() if event["event"] == name]

    def event(self, name: str) -> dict:
        (found,) = [event for event in self.events() if event["event"] == name]
        return found


def _daemon_pid(stderr: str) -> int:
    match = re.search(r"fsprobe run started \(pid (\d+)\)", stderr)
    assert match, stderr
    return int(match.group(1))


def _assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_sbatch_directives_come_before_the_first_command() -> None:
    """sbatch stops reading #SBATCH lines at the first command."""
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    first_command = next(
        i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")
    )
    assert directives and max(directives) < first_command
    assert "#SBATCH --signal=B:USR1@120" in lines


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)


def test_shellcheck_finds_nothing() -> None:
    shellcheck = need_command("shellcheck", "shellcheck")
    result = subprocess.run(
        [shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


def test_without_a_training_command_it_is_a_usage_error(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start()
    status, stderr = job.finish()
    assert status == 64
    assert "usage" in stderr
    assert job.names() == []


def test_healthy_run_starts_the_daemon_hands_its_state_to_the_trainer_and_stops_it(
    tmp_path: Path,
) -> None:
    job = Job(tmp_path)
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0, stderr

    check = job.event("check")
    assert check["argv"] == ["check", str(job.checkpoints), "--need", "50G"]
    state_dir = str(tmp_path / f"fsprobe-slurm-job-{JOB_ID}")  # never like fsprobe-<uid>
    run = job.event("run-started")
    assert run["argv"] == [
        "run",
        str(job.checkpoints),
        "--state-dir",
        state_dir,
        "--listen",
        "127.0.0.1:0",
    ]
    trainer = job.event("trainer-started")
    assert trainer["state_dir"] == state_dir
    assert trainer["checkpoint_dir"] == str(job.checkpoints)
    assert job.event("run-stopped")["signal"] == signal.SIGTERM
    assert job.names()[0] == "check"
    assert job.names()[-1] == "run-stopped"
    _assert_gone(_daemon_pid(stderr))


def test_the_trainers_exit_status_is_the_jobs(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("exit", "7")
    status, stderr = job.finish()
    assert status == 7
    assert "run-stopped" in job.names()
    _assert_gone(_daemon_pid(stderr))


@pytest.mark.parametrize(("check_status", "word"), [(1, "degraded"), (3, "unknown")])
def test_degraded_or_unknown_preflight_warns_and_trains(
    tmp_path: Path, check_status: int, word: str
) -> None:
    job = Job(tmp_path, check_status=check_status)
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0
    assert word in stderr
    assert "trainer-started" in job.names()


@pytest.mark.parametrize("check_status", [2, 64])
def test_unhealthy_preflight_or_a_failed_check_starts_nothing(
    tmp_path: Path, check_status: int
) -> None:
    job = Job(tmp_path, check_status=check_status)
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == check_status, stderr
    assert job.names() == ["check"]


def test_time_limit_warning_reaches_the_trainer_then_fsprobe_stops(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("wait", "0")
    job.wait_for("trainer-started", "run-started")
    job.signal(signal.SIGUSR1)  # what --signal=B:USR1@120 sends to the batch shell
    status, stderr = job.finish()
    assert status == 0, stderr
    assert job.event("trainer-signalled")["signal"] == signal.SIGUSR1
    assert job.event("run-stopped")["signal"] == signal.SIGTERM
    assert job.names().index("trainer-signalled") < job.names().index("run-stopped")
    _assert_gone(_daemon_pid(stderr))


def test_preemption_reaches_the_trainer_then_fsprobe_stops(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.start("wait", "143")
    job.wait_for("trainer-started", "run-started")
    job.signal(signal.SIGTERM)
    status, stderr = job.finish()
    assert status == 143, stderr
    assert job.event("trainer-signalled")["signal"] == signal.SIGTERM
    assert "run-stopped" in job.names()
    _assert_gone(_daemon_pid(stderr))


def test_a_daemon_that_cannot_start_is_said_loudly_and_the_trainer_still_runs(
    tmp_path: Path,
) -> None:
    """On main the job log said "fsprobe run started ... stopped" for a daemon that had exited
    at once (a planted state dir). The planted dir is not the job's to remove at its end."""
    job = Job(tmp_path)
    planted = tmp_path / f"fsprobe-slurm-job-{JOB_ID}"
    planted.mkdir()
    os.chown(planted, 65534, 65534)  # someone else's, which the daemon refuses
    job.environ["FAKE_RUN_STATUS"] = "69"
    job.start("wait", "0")
    job.wait_for("trainer-started")
    job.signal(signal.SIGUSR1)
    status, stderr = job.finish()
    assert status == 0, stderr
    assert "run-refused" in job.names() and "trainer-started" in job.names()
    assert "WARNING: fsprobe run did NOT start (exit status 69" in stderr, stderr
    assert "training WITHOUT the daemon" in stderr
    assert "fsprobe run started" not in stderr and "fsprobe run stopped" not in stderr
    assert planted.is_dir()


def test_the_job_state_dir_cannot_be_taken_for_a_users_default(tmp_path: Path) -> None:
    """/tmp/fsprobe-<uid> is the per-user default: a job's state dir must not look like it."""
    from fsprobe.state import default_state_dir

    job = Job(tmp_path)
    job.environ["SLURM_JOB_ID"] = str(os.getuid())  # a job ID that is also a uid
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0, stderr
    state_dir = job.event("trainer-started")["state_dir"]
    by_default = default_state_dir({"TMPDIR": str(tmp_path)})
    assert os.path.basename(state_dir) == f"fsprobe-slurm-job-{os.getuid()}"
    assert os.path.basename(state_dir) != os.path.basename(by_default)


def test_with_a_node_daemon_no_job_daemon_is_started(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.environ["FSPROBE_NODE_STATE_DIR"] = "/run/fsprobe"
    job.start("wait", "0")
    job.wait_for("trainer-started")
    job.signal(signal.SIGUSR1)
    status, stderr = job.finish()
    assert status == 0, stderr
    assert job.event("trainer-started")["state_dir"] == "/run/fsprobe"
    assert "run-started" not in job.names()


@pytest.mark.parametrize("ending", ["exit", "scancel"])
def test_the_job_removes_its_state_dir_at_its_end(tmp_path: Path, ending: str) -> None:
    """Jobs left their fsprobe-slurm-job-N state dir behind, one per job and node."""
    job = Job(tmp_path)
    job.start("exit" if ending == "exit" else "wait", "0")
    job.wait_for("trainer-started", "run-started")
    state_dir = Path(job.event("run-started")["state_dir"])  # the fake wrote state.json first
    if ending == "scancel":  # (an ending trainer may have ended the job already)
        assert (state_dir / "state.json").exists()
        job.signal(signal.SIGTERM)
    status, stderr = job.finish()
    assert status == 0, stderr
    assert "run-stopped" in job.names() and not state_dir.exists()


EVENT_LINE = re.compile(r"ts=\S+Z level=(debug|info|warning|error|critical) event=[a-z_]+( |$)")


def test_scancel_signals_the_daemon_and_its_worker_and_nothing_malformed_is_logged(
    tmp_path: Path,
) -> None:
    """scancel sends SIGTERM to every process of the job, the probe worker (a session of its
    own) too: it died first, and the daemon logged ``probe worker ... exited unexpectedly
    (-15)`` in words before it stopped. The worker leaves its end to the daemon."""
    target, home = tmp_path / "ckpt", tmp_path / "daemon"
    target.mkdir()
    home.mkdir()
    config = fast_config(tmp_path / "fsprobe.toml", target)
    with DaemonProcess(home, "--config", str(config)) as daemon:
        daemon.wait_for_log("event=status_changed")
        (worker,) = daemon.workers()
        worker.send_signal(signal.SIGTERM)  # as Slurm's cgroup does, to each process
        signalled = time.time()
        deadline = time.monotonic() + 60
        while (
            daemon.value("fsprobe_probe_last_run_timestamp_seconds", probe="statvfs") or 0
        ) <= signalled + 1:  # a probe made after it: the worker's fate is known by then
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.1)
        assert [process.pid for process in daemon.workers()] == [worker.pid]
        daemon.send(signal.SIGTERM)
        assert daemon.wait(30) == 0
    lines = daemon.log().splitlines()
    assert lines and all(EVENT_LINE.match(line) for line in lines), lines
    assert "unexpectedly" not in daemon.log() and "event=stopped" in lines[-1]
    worker.wait(30)  # gone with the daemon's end of its channel, not left behind


NODES = 3


def _assert_every_node_served_and_cleaned(job: Job, stderr: str) -> None:
    state_dir = str(job.tmpdir / f"fsprobe-slurm-job-{JOB_ID}")
    started = job.all_of("run-started")
    assert sorted(event["node"] for event in started) == [f"node{n}" for n in range(NODES)]
    for event in started:  # the same path, the one the ranks read, under each node's TMPDIR
        assert event["argv"][event["argv"].index("--state-dir") + 1] == state_dir
        assert event["argv"][-2:] == ["--listen", "127.0.0.1:0"]
    assert job.event("trainer-started")["state_dir"] == state_dir
    stopped = job.all_of("run-stopped")
    assert sorted(event["node"] for event in stopped) == [f"node{n}" for n in range(NODES)]
    assert {event["signal"] for event in stopped} == {signal.SIGTERM}
    for node in range(NODES):
        assert not (job.node_tmpdir(node) / f"fsprobe-slurm-job-{JOB_ID}").exists(), node
    assert "fsprobe run stopped" in stderr
    _assert_gone(_daemon_pid(stderr))


def test_on_several_nodes_every_node_runs_a_daemon_as_one_overlapping_step(
    tmp_path: Path,
) -> None:
    """Ranks on the job's other nodes found no state dir: their hook probed inline."""
    job = Job(tmp_path)
    job.play_nodes(NODES)
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0, stderr
    (srun,) = job.all_of("srun")
    assert srun["options"]["nodes"] == srun["options"]["ntasks"] == str(NODES)
    assert srun["options"]["ntasks-per-node"] == "1"
    assert srun["options"]["kill-on-bad-exit"] == "0"
    assert {"overlap", "exact"} <= set(srun["options"])  # never takes the training's resources
    _assert_every_node_served_and_cleaned(job, stderr)
    assert job.names().index("trainer-started") < job.names().index("run-stopped")


def test_on_several_nodes_a_preemption_stops_every_nodes_daemon(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.play_nodes(NODES)
    job.environ["SLURM_NNODES"] = job.environ.pop("SLURM_JOB_NUM_NODES")  # the older name
    job.start("wait", "143")
    job.wait_for("trainer-started")
    deadline = time.monotonic() + 30
    while len(job.all_of("run-started")) < NODES:
        assert time.monotonic() < deadline and job.process is not None, job.names()
        assert job.process.poll() is None, job.names()
        time.sleep(0.05)
    for node in range(NODES):
        assert (job.node_tmpdir(node) / f"fsprobe-slurm-job-{JOB_ID}" / "state.json").exists()
    job.signal(signal.SIGTERM)  # to the batch shell, as preemption does
    status, stderr = job.finish()
    assert status == 143, stderr
    assert job.event("trainer-signalled")["signal"] == signal.SIGTERM
    _assert_every_node_served_and_cleaned(job, stderr)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_on_several_nodes_a_planted_state_dir_on_one_node_is_left_alone(
    tmp_path: Path, kind: str
) -> None:
    """Someone else's directory, or their symlink to a directory of the job's user (which the
    wrapper's ownership test, following it, takes for the job's own), stays as it was."""
    job = Job(tmp_path)
    job.play_nodes(NODES)
    planted = job.node_tmpdir(2) / f"fsprobe-slurm-job-{JOB_ID}"
    target = tmp_path / "theirs-or-the-users" if kind == "symlink" else planted
    planted.parent.mkdir(parents=True, exist_ok=True)
    target.mkdir(exist_ok=True)
    (target / "theirs").touch()
    if kind == "symlink":
        planted.symlink_to(target)
    os.chown(planted, 65534, 65534, follow_symlinks=False)  # which that node's daemon refuses
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0, stderr
    assert [event["node"] for event in job.all_of("run-refused")] == ["node2"]
    assert sorted(event["node"] for event in job.all_of("run-stopped")) == ["node0", "node1"]
    assert planted.is_symlink() == (kind == "symlink")
    assert planted.is_dir() and (planted / "theirs").exists()
    for node in (0, 1):
        assert not (job.node_tmpdir(node) / f"fsprobe-slurm-job-{JOB_ID}").exists(), node


def test_on_one_node_no_srun_is_started(tmp_path: Path) -> None:
    job = Job(tmp_path)
    job.play_nodes(1)
    job.start("exit", "0")
    status, stderr = job.finish()
    assert status == 0, stderr
    assert "srun" not in job.names()
    assert job.event("run-started")["node"] is None  # started by the batch shell itself
    assert "run-stopped" in job.names()
    assert not (job.tmpdir / f"fsprobe-slurm-job-{JOB_ID}").exists()
