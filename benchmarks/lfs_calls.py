"""How many `lfs` calls a daemon makes per quota round, by command, for N targets on one
filesystem (the questions that reach the Lustre servers; the goal of docs/design.md §8: per
filesystem and ID, not per target).

Runs a real `fsprobe run` for `--duration` seconds with a short `--interval` for the quota and `lfs
df` probes against the fake `lfs` of tests/support/fakes (every call logged), on N directories of
one pretend filesystem whose default layout names a pool, and prints the calls per round:

    .venv/bin/python benchmarks/lfs_calls.py --targets 10 --interval 4 --duration 40
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAKE_LFS = REPO / "tests" / "support" / "fakes" / "lfs"


def fake_state(root: Path) -> dict:
    usage = {"used": 2**30, "soft": None, "hard": 100 * 2**30}
    return {
        "mountpoint": str(root),
        "layout": [{"end": 1048576, "pool": "flash"}, {"end": "EOF", "pool": "capacity"}],
        "pools": {"flash": [0], "capacity": [1]},
        "quota": {"bytes": usage, "inodes": {"used": 1}},
        "pool_ids": {"flash": {"user:1000": {"bytes": usage, "inodes": {"used": 1}}}},
    }


def run(targets: int, interval: float, duration: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fsprobe-lfs-calls-") as work:
        root = Path(work)
        dirs = [root / f"job-{index:03d}" for index in range(targets)]
        for directory in dirs:
            directory.mkdir()
        (root / "state.json").write_text(json.dumps(fake_state(root)))
        config = root / "fsprobe.toml"
        config.write_text(
            "[defaults]\n"
            f'quota_provider = "lfs"\nquota_probe = "always"\nwrite_probe = false\n'
            f"quota_interval = {interval}\nlfs_df_interval = {interval}\n"
            f"quota_timeout = {interval / 2}\n"  # a layout is kept at least this long
            + "".join(f'[[targets]]\npath = "{d}"\nuser = 1000\ngroup = 1000\n' for d in dirs)
        )
        log = root / "lfs.log"
        env = {
            **os.environ,
            "FSPROBE_LFS": str(FAKE_LFS),
            "FAKE_LFS_STATE": str(root / "state.json"),
            "FAKE_LFS_LOG": str(log),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        }
        daemon = subprocess.Popen(
            [sys.executable, "-m", "fsprobe", "run", "--config", str(config),
             "--state-dir", str(root / "state"), "--listen", "127.0.0.1:0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(duration)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    rounds = duration / interval
    counts = collections.Counter(
        " ".join(a for a in argv[:3] if not a.startswith("/") and not a.isdigit()) for argv in calls
    )
    return {command: count / rounds for command, count in sorted(counts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--interval", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=40.0)
    args = parser.parse_args()
    per_round = run(args.targets, args.interval, args.duration)
    print(f"{args.targets} targets on one filesystem, quota and lfs df every {args.interval} s:")
    for command, count in per_round.items():
        print(
            f"  lfs {command:<24} {count:6.1f} per round  ({count / args.targets:.2f} per target)"
        )
    print(f"  {'all':<32} {sum(per_round.values()):6.1f} per round")


if __name__ == "__main__":
    main()
