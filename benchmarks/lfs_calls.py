"""How many `lfs` calls a daemon makes per quota round, by command, for N targets on one
filesystem (the questions that reach the Lustre servers; the goal of docs/design.md §8: per
filesystem and ID, not per target); and with ``--per-hour``, the `lfs` and `lctl` runs and the
RPCs they cost per node per hour at the default intervals, before and after `lfs df` was paced.

Runs a real `fsprobe run` for `--duration` seconds with a short `--interval` for the quota and `lfs
df` probes against the fake `lfs` of tests/support/fakes (every call logged), on N directories of
one pretend filesystem whose default layout names a pool, and prints the calls per round:

    .venv/bin/python benchmarks/lfs_calls.py --targets 10 --interval 4 --duration 40

``--per-hour`` runs one target with the default quota and `lfs df` intervals divided by `--scale`
(time runs that much faster; statvfs and the imports, which touch no OST, are counted from their
15 s), as shipped ("after": `lfs df` hourly after a quota
probe, or after each while tight), with the filesystem roomy and with one OST tight, and as
before the pacing ("before": `lfs df` on its own 300 s timer), and scales the counts back to an
hour. RPCs are estimated from the counts by the rules of docs/reference.md (read from the
Lustre source, not measured on a server), for `--osts` OSTs and `--mdts` MDTs:

    .venv/bin/python benchmarks/lfs_calls.py --per-hour --scale 100 --duration 300 --osts 16
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


FAKE_LCTL = REPO / "tests" / "support" / "fakes" / "lctl"
#: The default intervals of the probes that reach Lustre (docs/reference.md, "Defaults").
STATVFS, IMPORTS, QUOTA, LFS_DF = 15.0, 15.0, 300.0, 3600.0
#: `osc_idle_timeout` (lustre/osc/osc_request.c at v2_17_0): an OST import without a request
#: for this long is disconnected; a request after that reconnects it.
IDLE_TIMEOUT = 20.0
#: What touches every OST (and so wakes its import): `lfs quota` without a pool, `lfs df`.
WAKERS = ("quota -u", "quota -g", "quota -p", "df -v", "df -i")
#: A run that starts this soon (real seconds) after the previous one ended is fsprobe's next
#: step (the next `lfs quota`, the `lfs df` after a quota probe), not a timer of its own.
CHAINED = 0.05
#: Runs the fake `lfs` and notes when each run started and ended (the fake logs the start only):
#: a wake is counted from the gap between one run's end and the next one's start.
TIMED_LFS = """#!/bin/sh
start=$(date +%s.%N)
"$FAKE_LFS_BIN" "$@"
status=$?
echo "$start $(date +%s.%N) $1 $2" >> "$FAKE_LFS_SPANS"
exit $status
"""


def wakes_of(spans: list[tuple[float, float, bool]], window: float) -> int:
    """How often every OST import is woken from idle, from (start, end, touches every OST) of
    each run in compressed time, where a run takes as long as ever: a run that starts within
    `CHAINED` of the last one's end follows it (fsprobe's next step), any other run belongs to
    the stretch it starts less than `window` into. Each stretch with a run that touches every
    OST is one wake."""
    wakes, first, until, woken = 0, None, None, False
    for start, end, touches in sorted(spans):
        follows = until is not None and 0 <= start - until <= CHAINED
        near = first is not None and start - first <= window
        if not (follows or near):
            first, woken = start, False
        if touches and not woken:
            wakes, woken = wakes + 1, True
        until = end if until is None else max(until, end)
    return wakes


def rpcs_per_call(command: str, osts: int, mdts: int) -> int:
    """The RPCs of one call, by the rules of docs/reference.md (read from the Lustre source)."""
    if command.startswith("quota"):  # the limits from MDT0000, the usage from every target
        return 1 + mdts + osts
    if command.startswith("df"):  # a statfs per MDT and OST
        return mdts + osts
    if command.startswith("getstripe"):  # the directory's layout from its MDT
        return 1
    return 0  # pool_list, getname, --version, lctl get_param: the client's own tables


def hour_state(root: Path, osts: int, mdts: int, tight: bool) -> dict:
    """One filesystem without pools: every target half free, or one OST at 10 % when tight."""
    usage = {"used": 2**30, "soft": None, "hard": 100 * 2**30}
    targets = [
        {"kind": "MDT", "index": index, "blocks": 1 << 22, "bfree": 1 << 21,
         "bavail": 1 << 21, "files": 1 << 22, "ffree": 1 << 21}
        for index in range(mdts)
    ]  # fmt: skip
    for index in range(osts):
        free = (1 << 30) // 10 if tight and index == 0 else 1 << 29
        targets.append(
            {"kind": "OST", "index": index, "blocks": 1 << 30, "bfree": free, "bavail": free,
             "files": 1 << 22, "ffree": 1 << 21}
        )  # fmt: skip
    return {"mountpoint": str(root), "targets": targets, "quota": {"bytes": usage}}


def run_hour(
    tree: Path, lfs_df: float, scale: float, duration: float, osts: int, mdts: int, tight: bool
) -> tuple[collections.Counter, int]:
    """The calls by command of a daemon from `tree` at the default intervals (`lfs_df` for
    `lfs df`) / `scale`, and the wakes: groups of OST-touching runs less than `IDLE_TIMEOUT`
    (scaled) apart."""
    with tempfile.TemporaryDirectory(prefix="fsprobe-lfs-hour-") as work:
        root = Path(work)
        target = root / "ckpt"
        target.mkdir()
        (root / "state.json").write_text(json.dumps(hour_state(root, osts, mdts, tight)))
        config = root / "fsprobe.toml"
        config.write_text(
            "[defaults]\nwrite_probe = false\ntmpdir_interval = 3600\n"
            'quota_provider = "lfs"\nquota_probe = "always"\n'
            # statvfs and imports touch no OST and their runs are known from their intervals:
            # scaled as far, they would keep the probe worker busy and hold the rest up
            f"statvfs_interval = {QUOTA / scale}\nimports_interval = {QUOTA / scale}\n"
            f"quota_interval = {QUOTA / scale}\nlfs_df_interval = {lfs_df / scale}\n"
            f"quota_timeout = {min(30.0, QUOTA / scale / 2)}\ndeadline = 2\n"
            f'[[targets]]\npath = "{target}"\nuser = 1000\ngroup = 1000\n'
        )
        log, lctl_log, spans_log = root / "lfs.log", root / "lctl.log", root / "spans"
        timed = root / "lfs"
        timed.write_text(TIMED_LFS)
        timed.chmod(0o755)
        env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "FSPROBE_LFS": str(timed),
            "FAKE_LFS_BIN": str(FAKE_LFS),
            "FAKE_LFS_SPANS": str(spans_log),
            "FSPROBE_LCTL": str(FAKE_LCTL),
            "FAKE_LFS_STATE": str(root / "state.json"),
            "FAKE_LFS_OSTS": str(osts),
            "FAKE_LFS_MDTS": str(mdts),
            "FAKE_LFS_LOG": str(log),
            "FAKE_LCTL_LOG": str(lctl_log),
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        }
        daemon = subprocess.Popen(
            [sys.executable, "-m", "fsprobe", "run", "--config", str(config),
             "--state-dir", str(root / "state"), "--listen", "127.0.0.1:0"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(duration)
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon of {tree} exited early ({daemon.returncode})")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        lctl = len(lctl_log.read_text().splitlines()) if lctl_log.exists() else 0
        spans = [line.split() for line in spans_log.read_text().splitlines()]
    counts = collections.Counter(
        " ".join(a for a in c["argv"][:2] if not a.startswith("/") and not a.isdigit())
        for c in calls
    )
    counts["lctl get_param"] = round(lctl * QUOTA / IMPORTS)  # as if every 15 s
    runs = [(float(s[0]), float(s[1]), " ".join(s[2:4]) in WAKERS) for s in spans]
    return counts, wakes_of(runs, IDLE_TIMEOUT / scale)


def per_hour(args: argparse.Namespace) -> None:
    hours = args.duration * args.scale / 3600
    variants = [("after, roomy", REPO, LFS_DF, False), ("after, one OST tight", REPO, LFS_DF, True)]
    with tempfile.TemporaryDirectory(prefix="fsprobe-before-") as before:
        if args.before:
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", args.before, "fsprobe"],
                check=True, capture_output=True,
            ).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
            # before the pacing `lfs df` had a timer of its own, every 300 s by default
            variants.insert(0, (f"before ({args.before})", Path(before), QUOTA, False))
        print(
            f"per node per hour, one filesystem of {args.osts} OSTs and {args.mdts} MDT(s), "
            f"one target, IDs user and group; {hours:.1f} h simulated at x{args.scale:g}:"
        )
        for name, tree, lfs_df, tight in variants:
            counts, wakes = run_hour(
                tree, lfs_df, args.scale, args.duration, args.osts, args.mdts, tight
            )
            calls = {command: count / hours for command, count in sorted(counts.items())}
            rpcs = {c: n * rpcs_per_call(c, args.osts, args.mdts) for c, n in calls.items()}
            statvfs = 3600 / STATVFS  # one statfs RPC to an MDT each (not logged: the interval)
            wake_rpcs = wakes / hours * 2 * args.osts  # a CONNECT and a DISCONNECT per OST
            total = sum(rpcs.values()) + statvfs + wake_rpcs
            print(f"  {name}:")
            for command, count in calls.items():
                print(f"    {command:<18} {count:7.1f} runs  {rpcs[command]:8.0f} RPCs")
            print(f"    {'statvfs':<18} {statvfs:7.1f} runs  {statvfs:8.0f} RPCs")
            print(f"    {'idle OST wakes':<18} {wakes / hours:7.1f}       {wake_rpcs:8.0f} RPCs")
            print(f"    {'all':<18} {'':12} {total:8.0f} RPCs per node per hour")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--interval", type=float, default=4.0)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--per-hour", action="store_true")
    parser.add_argument("--scale", type=float, default=100.0, help="at most 150 (0.1 s intervals)")
    parser.add_argument("--osts", type=int, default=16)
    parser.add_argument("--mdts", type=int, default=1)
    parser.add_argument("--before", help="a git ref whose fsprobe/ runs as 'before'")
    args = parser.parse_args()
    if args.per_hour:
        per_hour(args)
        return
    per_round = run(args.targets, args.interval, args.duration)
    print(f"{args.targets} targets on one filesystem, quota and lfs df every {args.interval} s:")
    for command, count in per_round.items():
        print(
            f"  lfs {command:<24} {count:6.1f} per round  ({count / args.targets:.2f} per target)"
        )
    print(f"  {'all':<32} {sum(per_round.values()):6.1f} per round")


if __name__ == "__main__":
    main()
