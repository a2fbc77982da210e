"""Soak: a real daemon and real savers on the FUSE fault filesystem, for as long as you like.

What it does, for `--duration` seconds (default 20 minutes; hours for a release):
- a `fsprobe run --sync-redirected` daemon watches `--targets` directories on the fault
  filesystem (fast intervals: statvfs 1 s, write probe and tmpdir 2 s, sync every 5 s);
- one saver process per target writes numbered checkpoints with `fsprobe.atomic_write`
  (fallback directory beside the mount) and records each save that returned (acknowledged)
  in a log, fsynced;
- every `--fault-every` seconds a random fault: a failed write (EIO), a failed rename
  (ESTALE), a full filesystem for a few seconds (ENOSPC), a hung statfs for a few seconds;
- every `--kill-every` seconds a random saver is SIGKILLed mid-loop and restarted.

At the end it stops the faults and the savers, lets the daemon sync back and counts:
- acknowledged-but-lost saves: a target whose newest committed copy (`fsprobe.locate`) holds an
  older checkpoint than its last acknowledged save (must be 0);
- leftovers: fsprobe temp files and staging directories in the targets and the fallback area
  after one clean save per target;
- the daemon's RSS (daemon + probe worker): first and last samples and the slope of a least
  squares line over the second half of the run, in KiB per minute.

    .venv/bin/python benchmarks/soak.py --duration 120            # a quick look
    .venv/bin/python benchmarks/soak.py --duration 14400 --json    # four hours
Needs root and /dev/fuse (the fault filesystem of the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.faultmount import FaultFS  # noqa: E402  (the harness of the tests)

SAVER = """\
import os, sys, time
import fsprobe
target, fallback, acks, state_dir = sys.argv[1:5]
path = os.path.join(target, "ckpt.pt")
number = int(open(acks).read().split()[-1]) if os.path.getsize(acks) else 0
with open(acks, "a") as log:
    while True:
        number += 1
        payload = (f"{number}\\n".encode()) * 4096
        try:
            fsprobe.atomic_write(path, lambda f: f.write(payload), fallback_dirs=[fallback],
                                 state_dir=state_dir, max_wait=2.0)
        except OSError as error:
            print(f"save {number} failed: {error}", file=sys.stderr, flush=True)
            number -= 1
            time.sleep(0.5)
            continue
        log.write(f"{number}\\n"); log.flush(); os.fsync(log.fileno())
        time.sleep(0.2)
"""

#: `fsprobe.saving.stale` leaves temp files younger than this alone.
STALE_AFTER = 61.0

CONFIG = """\
listen = "127.0.0.1:0"
sync_redirected = true
[defaults]
statvfs_interval = 1
write_interval = 2
tmpdir_interval = 2
redirect_interval = 5
write_bytes = "64K"
quota_probe = "never"
"""


def start_daemon(home: Path, targets: list[Path]) -> tuple[subprocess.Popen, Path]:
    config = home / "fsprobe.toml"
    config.write_text(CONFIG + "".join(f'[[targets]]\npath = "{t}"\n' for t in targets))
    log = home / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fsprobe", "run", "--config", str(config),
             "--state-dir", str(home / "state")],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while "event=started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start:\n{log.read_text()}")
        time.sleep(0.1)
    return proc, log


def start_saver(target: Path, fallback: Path, acks: Path, state_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SAVER, str(target), str(fallback), str(acks), str(state_dir)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def rss_kib(proc: subprocess.Popen) -> float:
    daemon = psutil.Process(proc.pid)
    return sum(p.memory_info().rss for p in [daemon, *daemon.children(recursive=True)]) / 1024


def slope_kib_per_minute(samples: list[tuple[float, float]]) -> float | None:
    """Least squares slope over the second half of the samples (after the warm-up)."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return None
    times, values = zip(*half)
    return statistics.linear_regression(times, values).slope * 60


def inject(fs: FaultFS, rng: random.Random) -> tuple[str, list[int]]:
    kind = rng.choice(["write-EIO", "rename-ESTALE", "full", "hung-statfs"])
    if kind == "write-EIO":
        return kind, [fs.ctl.fail("write", "EIO", times=1)]
    if kind == "rename-ESTALE":
        return kind, [fs.ctl.fail("rename", "ESTALE", times=1)]
    if kind == "full":
        return kind, [fs.ctl.fail("write", "ENOSPC", times=None)]
    return kind, [fs.ctl.block("statfs")]


def newest_number(path: str) -> int:
    import fsprobe

    with open(fsprobe.locate(path), "rb") as stream:
        return int(stream.readline())


def leftovers(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for directory, names, files in os.walk(root):
            found += [
                os.path.join(directory, n) for n in names + files if n.startswith(".fsprobe~")
            ]
    return found


def soak(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    home = Path(tempfile.mkdtemp(prefix="fsprobe-soak-"))
    (home / "backing").mkdir()
    (home / "mnt").mkdir()
    fallback = home / "fallback"
    fallback.mkdir(mode=0o1777)
    fallback.chmod(0o1777)
    counts = {"faults": 0, "kills": 0}
    with ExitStack() as stack:
        fs = FaultFS(home / "backing", home / "mnt").start()
        stack.callback(fs.stop)
        targets = [home / "mnt" / f"job-{i}" for i in range(args.targets)]
        for target in targets:
            target.mkdir()
        daemon, log = start_daemon(home, targets)
        stack.callback(lambda: daemon.poll() is None and daemon.send_signal(signal.SIGTERM))
        acks = [home / f"acks-{i}" for i in range(args.targets)]
        for ack in acks:
            ack.touch()
        savers = [start_saver(t, fallback, a, home / "state") for t, a in zip(targets, acks)]
        stack.callback(lambda: [s.kill() for s in savers if s.poll() is None])
        start = time.monotonic()
        samples: list[tuple[float, float]] = []
        next_fault, next_kill, next_sample = (
            start + args.fault_every,
            start + args.kill_every,
            start,
        )
        active: list[tuple[float, list[int]]] = []
        while time.monotonic() - start < args.duration:
            now = time.monotonic()
            if now >= next_sample:
                samples.append((now - start, rss_kib(daemon)))
                next_sample += args.sample_every
            if now >= next_fault:
                kind, rules = inject(fs, rng)
                counts["faults"] += 1
                counts[kind] = counts.get(kind, 0) + 1
                active.append((now + rng.uniform(1, 5), rules))
                next_fault += args.fault_every
            for until, rules in [a for a in active if a[0] <= now]:
                for rule in rules:
                    fs.ctl.remove(rule)
                active.remove((until, rules))
            if now >= next_kill:
                index = rng.randrange(len(savers))
                savers[index].kill()
                savers[index].wait()
                savers[index] = start_saver(targets[index], fallback, acks[index], home / "state")
                counts["kills"] += 1
                next_kill += args.kill_every
            if daemon.poll() is not None:
                raise SystemExit(f"the daemon exited ({daemon.returncode}):\n{log.read_text()}")
            time.sleep(0.1)
        fs.ctl.clear()
        for saver in savers:
            saver.kill()
            saver.wait()
        # The daemon's sync-back brings redirected copies home; and a temp file younger than a
        # minute is never removed (between its create and its lock a writer looks dead).
        time.sleep(max(args.settle, STALE_AFTER))
        acknowledged = [int(a.read_text().split()[-1]) if a.read_text() else 0 for a in acks]
        located = [newest_number(str(t / "ckpt.pt")) for t in targets]
        lost = sum(1 for a, n in zip(acknowledged, located) if n < a)
        import fsprobe

        for target in targets:  # a clean save removes what killed ones left behind
            fsprobe.atomic_write(
                target / "ckpt.pt", lambda f: f.write(b"0\n"), state_dir=str(home / "state")
            )
        left = leftovers(*targets, fallback)
        samples.append((time.monotonic() - start, rss_kib(daemon)))
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(10)
        text = log.read_text(errors="replace")
    return {
        "duration_s": args.duration,
        "targets": args.targets,
        "saves_acknowledged": sum(acknowledged),
        **counts,
        "acknowledged_but_lost": lost,
        "leftovers": left,
        "rss_first_kib": round(samples[0][1]),
        "rss_last_kib": round(samples[-1][1]),
        "rss_slope_kib_per_min": slope_kib_per_minute(samples),
        "daemon_errors": len(re.findall(r"level=error", text)),
        "daemon_exit": daemon.returncode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds (default 20 min)")
    parser.add_argument("--targets", type=int, default=3)
    parser.add_argument("--fault-every", type=float, default=5.0)
    parser.add_argument("--kill-every", type=float, default=60.0)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--settle", type=float, default=15.0, help="seconds for the sync-back")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = soak(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:>24}: {value}")
    return 1 if result["acknowledged_but_lost"] or result["leftovers"] else 0


if __name__ == "__main__":
    sys.exit(main())
