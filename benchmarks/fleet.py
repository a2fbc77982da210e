"""A fleet on one machine (issue 21.6): what N sidecars of one job cost the shared servers.

N daemons (default 1, 8, 32), each the sidecar of one rank of a Slurm job (``SLURM_PROCID`` =
its rank), watch one checkpoint directory on one shared fake Lustre: the FUSE fault filesystem
(it counts every operation the servers would serve) with the fake ``lfs`` (it logs every call).
Beside each daemon a trainer saves its rank's checkpoint with `fsprobe.atomic_write` at a
regular interval. Intervals are the defaults scaled down by ``--scale`` (20: statvfs 0.75 s,
write probe 3 s, quota and lfs df 15 s, a save every 15 s for "every 5 minutes"). After a
warm-up (``--warmup-saves``, 5: every trainer's third save, from which the daemons know
its interval, is in), the calls and operations of ``--seconds``
are counted, and reported per minute of the scaled clock and per scaled interval.

The same fleet runs on a baseline tree (``--baseline``, a ``git worktree`` of main before the
change, imported through PYTHONPATH) and on this one, side by side. Then the time a daemon
takes to mark a hung mount stuck (statfs blocked) while saves flow, on both trees.

    git -C /work/main worktree add --detach /tmp/fsprobe-baseline <commit>
    .venv/bin/python benchmarks/fleet.py --baseline /tmp/fsprobe-baseline [--daemons 1 8 32]

Goals: ``lfs quota`` calls per quota interval equal the distinct IDs (3: user, group, project),
not 3 x N; write-probe operations at least 5x fewer while saves flow; hung-mount detection
unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.fakes.fake_lfs import FAKE_LFS  # noqa: E402  (the harness of the tests)
from tests.support.faultmount import FaultFS  # noqa: E402

#: The default intervals (docs/design.md §4) and the save interval of a trainer, in seconds.
DEFAULTS = {"statvfs": 15.0, "write": 60.0, "tmpdir": 60.0, "quota": 300.0, "lfs_df": 3600.0}
SAVE_EVERY = 300.0
IDS = 3  # user, group and project of the job

TRAINER = """
import os, sys, time
import fsprobe
path, every, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
payload = os.urandom(1 << 20)
time.sleep(every * float(sys.argv[4]))  # ranks do not save in lockstep
while not os.path.exists(stop):
    fsprobe.atomic_write(path, lambda f: f.write(payload))
    time.sleep(every)
"""


@dataclass
class Counts:
    quota: int
    df: int
    lfs_other: int
    metadata: int
    probe_files: int
    saves: int


def config_text(target: Path, scale: float) -> str:
    intervals = "".join(f"{kind}_interval = {s / scale}\n" for kind, s in DEFAULTS.items())
    return (
        "[defaults]\n" + intervals + 'quota_provider = "lfs"\nquota_probe = "auto"\n'
        f"deadline = {10 / scale}\n"
        f'[[targets]]\npath = "{target}"\nuser = 1000\ngroup = 1000\n'
    )


def environment(tree: Path, home: Path, rank: int, fs: FaultFS, lfs_log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSPROBE_", "SLURM_"))}
    env.update(
        PYTHONPATH=str(tree),  # the tree under test's fsprobe, first on the path
        FSPROBE_LFS=str(FAKE_LFS),
        FSPROBE_STATE_DIR=str(home / "state"),
        FAKE_LFS_VERSION="2.16",
        FAKE_LFS_CONTROL=str(fs.socket_path),
        FAKE_LFS_PROJECT="4242",
        FAKE_LFS_LOG=str(lfs_log),
        SLURM_JOB_ID="4242",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID="0",
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
    )
    return env


def stop_all(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_started(logs: list[Path], timeout: float = 600.0) -> None:
    """Until every daemon is up (32 starting at once take a minute on a loaded 2-CPU VM, and
    the saves made before a daemon listens are lost to it, as they should be)."""
    deadline = time.monotonic() + timeout
    while not all(log.exists() and "event=started" in log.read_text() for log in logs):
        if time.monotonic() > deadline:
            raise RuntimeError("the daemons did not all start")
        time.sleep(0.5)


def lfs_calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()]


def run_fleet(
    tree: Path, daemons: int, scale: float, seconds: float, scratch: Path, warmup_saves: float
) -> Counts:
    """Start the fleet on `tree`, warm it up, count for `seconds`, stop it."""
    home = Path(tempfile.mkdtemp(prefix=f"fleet-{daemons}-", dir=scratch))
    (home / "backing").mkdir()
    (home / "mnt").mkdir()
    processes: list[subprocess.Popen] = []
    with ExitStack() as stack:
        fs = FaultFS(home / "backing", home / "mnt").start()
        stack.callback(fs.stop)
        stack.callback(stop_all, processes)
        target = home / "mnt" / "job" / "ckpt"
        target.mkdir(parents=True)
        lfs_log = home / "lfs.log"
        stop_file = home / "stop"
        config = home / "fsprobe.toml"
        config.write_text(config_text(target, scale))
        probe_files = fs.ctl.delay("create", 0.0001, path="*~write-probe.tmp")
        saves = fs.ctl.delay("rename", 0.0001, path="*/rank-*.pt")
        for rank in range(daemons):
            node = home / f"node-{rank}"
            node.mkdir()
            env = environment(tree, node, rank, fs, lfs_log)
            log = open(node / "daemon.log", "wb")  # noqa: SIM115  (closed with the process)
            stack.callback(log.close)
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "fsprobe", "run", "--config", str(config),
                     "--state-dir", str(node / "state"), "--listen", "127.0.0.1:0"],
                    cwd=node, env=env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )  # fmt: skip
        wait_started([home / f"node-{rank}" / "daemon.log" for rank in range(daemons)])
        for rank in range(daemons):
            env = environment(tree, home / f"node-{rank}", rank, fs, lfs_log)
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", TRAINER, str(target / f"rank-{rank}.pt"),
                     str(SAVE_EVERY / scale), str(stop_file), str(rank / max(daemons, 1))],
                    cwd=home, env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        time.sleep(warmup_saves * SAVE_EVERY / scale)  # every trainer's third save is in
        fs.ctl.reset_counts()
        before_calls = len(lfs_calls(lfs_log))
        before_probes = fs.ctl.rule(probe_files)["hits"]
        before_saves = fs.ctl.rule(saves)["hits"]
        time.sleep(seconds)
        counts = fs.ctl.counts()
        calls = lfs_calls(lfs_log)[before_calls:]
        result = Counts(
            quota=sum(1 for argv in calls if argv[:1] == ["quota"]),
            df=sum(1 for argv in calls if argv[:1] == ["df"]),
            lfs_other=sum(1 for argv in calls if argv[:1] not in (["quota"], ["df"])),
            metadata=sum(n for op, n in counts.items() if op not in ("read", "write")),
            probe_files=fs.ctl.rule(probe_files)["hits"] - before_probes,
            saves=fs.ctl.rule(saves)["hits"] - before_saves,
        )
        stop_file.touch()
    return result


def time_to_stuck(tree: Path, scale: float, scratch: Path) -> float:
    """Seconds from a hung statfs to the daemon's fsprobe_mount_stuck 1, while saves flow."""
    home = Path(tempfile.mkdtemp(prefix="fleet-hung-", dir=scratch))
    (home / "backing").mkdir()
    (home / "mnt").mkdir()
    processes: list[subprocess.Popen] = []
    with ExitStack() as stack:
        fs = FaultFS(home / "backing", home / "mnt").start()
        stack.callback(fs.stop)
        stack.callback(stop_all, processes)
        target = home / "mnt" / "ckpt"
        target.mkdir()
        config = home / "fsprobe.toml"
        config.write_text(config_text(target, scale))
        env = environment(tree, home, 0, fs, home / "lfs.log")
        log_path = home / "daemon.log"
        log = open(log_path, "wb")  # noqa: SIM115
        stack.callback(log.close)
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "fsprobe", "run", "--config", str(config),
                 "--state-dir", str(home / "state"), "--listen", "127.0.0.1:0"],
                cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        processes.append(
            subprocess.Popen(
                [sys.executable, "-c", TRAINER, str(target / "rank-0.pt"),
                 str(SAVE_EVERY / scale / 5), str(home / "stop"), "0"],
                cwd=home, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )  # fmt: skip
        deadline = time.monotonic() + 30
        url = None
        while url is None and time.monotonic() < deadline:
            found = re.search(r"metrics=\"?(\S+/metrics)", log_path.read_text())
            url = found[1] if found else None
            time.sleep(0.1)
        assert url, log_path.read_text()
        time.sleep(3 * SAVE_EVERY / scale / 5 + 2)
        rule = fs.ctl.block("statfs")
        started = time.monotonic()
        try:
            while time.monotonic() - started < 60:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if re.search(rb"fsprobe_mount_stuck\{[^}]*\} 1", response.read()):
                        return time.monotonic() - started
                time.sleep(0.05)
            return float("nan")
        finally:
            fs.ctl.remove(rule)
            (home / "stop").touch()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare")
    parser.add_argument("--daemons", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--warmup-saves",
        type=float,
        default=5.0,
        help="save intervals before counting: the daemons know the interval from the third "
        "save, which a loaded machine (interpreter starts, slow saves) delays",
    )
    args = parser.parse_args()
    minute = 60.0 / args.scale  # one scaled minute, in seconds of this run
    quota_interval = DEFAULTS["quota"] / args.scale
    trees = {"baseline": args.baseline.resolve(), "this": REPO}
    with tempfile.TemporaryDirectory(prefix="fsprobe-fleet-") as scratch:
        print(
            f"scale 1/{args.scale:g}: per minute and per quota interval of the unscaled "
            f"defaults, counted over {args.seconds:g} s after a warm-up"
        )
        print(
            f"{'N':>3} {'tree':<9} {'quota/int':>9} {'df/int':>7} {'lfs other/min':>13} "
            f"{'metadata/min':>12} {'probe files/min':>15} {'saves/min':>9}"
        )
        for daemons in args.daemons:
            for name, tree in trees.items():
                c = run_fleet(
                    tree, daemons, args.scale, args.seconds, Path(scratch), args.warmup_saves
                )
                per_minute = minute / args.seconds
                per_interval = quota_interval / args.seconds
                print(
                    f"{daemons:>3} {name:<9} {c.quota * per_interval:>9.1f} "
                    f"{c.df * per_interval:>7.1f} {c.lfs_other * per_minute:>13.1f} "
                    f"{c.metadata * per_minute:>12.0f} {c.probe_files * per_minute:>15.1f} "
                    f"{c.saves * per_minute:>9.1f}",
                    flush=True,
                )
        for name, tree in trees.items():
            seconds = time_to_stuck(tree, args.scale, Path(scratch))
            statvfs = DEFAULTS["statvfs"] / args.scale
            print(
                f"hung mount, {name}: stuck after {seconds:.2f} s "
                f"({seconds / statvfs:.1f} statvfs intervals)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
