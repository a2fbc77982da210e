"""Memory of walking a user's fallback area that holds a directory copy of a million entries.

Issue 18.4: a directory copy with 600,000 empty files in a user's own area made root's
pending-bytes count (the daemon's ``count`` task, in its probe worker) list it whole into
memory: 538 MiB, and the worker OOM-killed under the shipped MemoryMax=256M. The walks now
stream the entries and stop at `MAX_AREA_ENTRIES` per area and round.

On a tmpfs with enough inodes, an area of uid 65534 (nobody) holds one directory copy of
`--entries` empty files with a sound manifest line; a baseline area holds a copy of 10 files.
For each, a real root `fsprobe run` counts the fallback every second; the peak RSS (VmHWM) of
its probe worker after `--rounds` counts is read from /proc. Then ``fsprobe sync --json`` is
run as the area's owner (what root's sync runs for her) and its peak RSS taken from wait4.

    sudo .venv/bin/python benchmarks/area_walk.py                 # a million entries, ~2 min

Goal: the worker's peak RSS under 64 MiB with a million entries (and near the baseline's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from live_daemon import running_daemon  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.users import SharedPython

REPO = Path(__file__).resolve().parent.parent
OWNER = 65534  # nobody: an account every Linux has


#: Run as the owner: a directory copy of argv[3] empty files for argv[2], and its manifest line.
PLANT = """
import os, sys
from fsprobe.redirect import manifest
from fsprobe.redirect.areas import prepare_directory, redirect_path
fallback, requested, entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
actual = redirect_path(fallback, requested)
prepare_directory(fallback, actual)
os.mkdir(actual, 0o755)
for number in range(entries):
    os.close(os.open(f"{actual}/{number}", os.O_CREAT | os.O_WRONLY, 0o644))
# The sha256 is never reached past the cap; under it, the sync reports checksum_mismatch.
manifest.record(manifest.new_entry(fallback, requested, actual, 0, "0" * 64))
"""
AS_OWNER = {"user": OWNER, "group": OWNER, "extra_groups": []}


def plant(python: str, fallback: Path, target: Path, entries: int) -> None:
    command = [python, "-c", PLANT, str(fallback), str(target / "run"), str(entries)]
    subprocess.run(command, cwd=REPO, check=True, **AS_OWNER)


def vm_hwm_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status)[1]) / 1024


def worker_peak(home: Path, target: Path, fallback: Path, rounds: int) -> tuple[float, str]:
    """The probe worker's peak RSS after `rounds` counts, and the pending-bytes sample."""
    config = home / "fsprobe.toml"
    config.write_text(
        '[defaults]\nredirect_interval = 1\nwrite_probe = false\nquota_probe = "never"\n'
        f'[[targets]]\npath = "{target}"\nfallback_dirs = ["{fallback}"]\n'
    )
    with running_daemon(home, "--config", str(config)) as daemon:
        time.sleep(rounds)  # a count a second
        sample = ""
        deadline = time.monotonic() + 120
        while not sample and time.monotonic() < deadline:
            body = urllib.request.urlopen(daemon.url, timeout=10).read()
            found = re.search(rb"^fsprobe_redirected_pending_bytes\{.*$", body, re.M)
            sample = found[0].decode() if found else ""
            time.sleep(0.5)
        [worker] = psutil.Process(daemon.process.pid).children()
        peak = vm_hwm_mib(worker.pid)
    log = daemon.log.read_text()
    if "area_too_many_entries" in log:
        print("   daemon log:", *re.findall(r".*area_too_many_entries.*", log))
    return peak, sample


def sync_peak(python: str, fallback: Path) -> tuple[float, list[str], float]:
    """The peak RSS of ``fsprobe sync --json`` run as the owner, its actions and its time."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [python, "-m", "fsprobe", "sync", "--json", "--fallback-dir", str(fallback),
         "--state-dir", str(fallback.parent / "no-state")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **AS_OWNER,
    )  # fmt: skip
    output = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - started
    actions = [entry["action"] for entry in json.loads(output)["entries"]]
    return usage.ru_maxrss / 1024, actions, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="counts before measuring")
    options = parser.parse_args()
    shared = SharedPython()  # an interpreter the owner can run (root's may be under /root)
    mount = Path(tempfile.mkdtemp(prefix="fsprobe-area-walk-"))
    inodes = 2 * options.entries + 10_000  # room left: a preflight reads a full one as not ready
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size=512M,nr_inodes={inodes},mode=0755", "tmpfs",
         str(mount)],
        check=True,
    )  # fmt: skip
    try:
        print(f"{'area holds':>14} | worker peak RSS | sync as owner: peak RSS, time, actions")
        for entries in (10, options.entries):
            case = mount / f"case-{entries}"
            fallback, target = case / "fallback", case / "ckpt"
            for directory, mode in ((case, 0o755), (fallback, 0o1777), (target, 0o755)):
                directory.mkdir(mode=mode)
                directory.chmod(mode)
            os.chown(target, OWNER, OWNER)
            started = time.monotonic()
            plant(shared.executable, fallback, target, entries)
            made = time.monotonic() - started
            home = Path(tempfile.mkdtemp(prefix="fsprobe-area-walk-home-"))
            try:
                worker, sample = worker_peak(home, target, fallback, options.rounds)
            finally:
                shutil.rmtree(home)
            peak, actions, took = sync_peak(shared.executable, fallback)
            print(
                f"{entries:>14,} | {worker:>11.1f} MiB | {peak:.1f} MiB, {took:.1f} s, {actions}"
                f"   ({sample}; planted in {made:.0f} s)"
            )
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        os.rmdir(mount)
        shared.close()


if __name__ == "__main__":
    main()
