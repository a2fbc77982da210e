"""Footprint of probing as each directory's owner: 10 targets of 10 owners, and of one owner.

A root `fsprobe run` probes 10 directories, each owned by a different real account (made with
useradd for the run, removed after), then 10 directories of one account, for every tree given
(`--tree`: a checkout from before probing as the owner, and this one), in the same run. It
measures the peak PSS of the daemon and its probe worker together (shared pages counted once)
and their CPU over `--duration` seconds, at fast intervals so that the write probe (the one
that switches identity) runs often.

    git -C /work/main worktree add --detach /tmp/before <commit before probing as the owner>
    sudo .venv/bin/python benchmarks/probe_as.py --tree /tmp/before --tree .

Goal (issue 18): PSS and CPU at most 1.25x the tree before, for both layouts.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from live_daemon import clean_environment, cpu_seconds, family, running_daemon  # beside this script

FAST = """
[defaults]
statvfs_interval = 1
write_interval = 1
tmpdir_interval = 2
write_bytes = "64K"
quota_probe = "never"
"""
PREFIX = "fsp-bench"


def make_accounts(count: int) -> list[str]:
    names = [f"{PREFIX}{os.getpid()}-{index}" for index in range(count)]
    for name in names:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group", "--shell",
             "/usr/sbin/nologin", name],
            check=True,
        )  # fmt: skip
    return names


def remove_accounts(names: list[str]) -> None:
    for name in names:
        subprocess.run(["userdel", name], check=False)


def make_targets(home: Path, owners: list[str]) -> list[Path]:
    """One directory per entry of `owners` (names may repeat), each owned by that account."""
    home.chmod(0o711)
    targets = []
    for index, name in enumerate(owners):
        account = pwd.getpwnam(name)
        target = home / "targets" / f"job{index:03d}"
        target.mkdir(parents=True)
        os.chown(target, account.pw_uid, account.pw_gid)
        targets.append(target)
    (home / "targets").chmod(0o711)
    return targets


def measure(tree: Path, owners: list[str], duration: float, settle: float) -> tuple[float, float]:
    """(peak PSS in MiB, CPU in % of one core) of a daemon of `tree` probing `owners`' dirs."""
    home = Path(tempfile.mkdtemp(prefix="fsprobe-bench-owner-"))
    targets = make_targets(home, owners)
    config = home / "fsprobe.toml"
    config.write_text(FAST + "".join(f'[[targets]]\npath = "{t}"\n' for t in targets))
    environment = clean_environment(TMPDIR=str(home), PYTHONPATH=str(tree))
    try:
        with running_daemon(
            home, "--config", str(config), tree=tree, environment=environment, stop_timeout=10
        ) as daemon:
            process = psutil.Process(daemon.process.pid)
            time.sleep(settle)
            start = cpu_seconds(family(process))
            pss = [0]
            end = time.monotonic() + duration
            while time.monotonic() < end:
                pss.append(sum(p.memory_full_info().pss for p in family(process)))
                time.sleep(0.5)
            finish = cpu_seconds(family(process))
            cpu = sum(finish[pid] - start.get(pid, 0.0) for pid in finish) / duration * 100
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return max(pss) / 2**20, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", required=True)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured per run")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the daemon must probe other users' directories")
    accounts = make_accounts(10)
    layouts = {"10 owners": accounts, "1 owner": [accounts[0]] * 10}
    try:
        print(f"root fsprobe run, 10 targets, write probe every 1 s, {args.duration:g} s per run; "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        results: dict[tuple[str, Path], tuple[float, float]] = {}
        for layout, owners in layouts.items():
            for tree in args.tree:
                results[layout, tree] = measure(tree, owners, args.duration, args.settle)
                pss, cpu = results[layout, tree]
                base_pss, base_cpu = results[layout, args.tree[0]]
                print(
                    f"{layout:>9}  {tree!s:<24}  PSS {pss:6.1f} MiB ({pss / base_pss:4.2f}x)  "
                    f"CPU {cpu:5.2f} % ({cpu / base_cpu:4.2f}x)",
                    flush=True,
                )
    finally:
        remove_accounts(accounts)


if __name__ == "__main__":
    main()
