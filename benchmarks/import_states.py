"""What reading this node's connection to every Lustre target costs per target and interval,
against a bare `os.statvfs` of the same directory, measured in the same run.

Three costs, each as a ratio to the median statvfs:
- `run`: starting a program and reading its output, as fsprobe runs `lctl` (`run_lfs`: its own
  session, output caps, the group killed at the end), for `/bin/true`: the floor a real `lctl`
  (a C program reading the kernel's files) costs at least;
- `parse`: reading what `lctl get_param` prints for a filesystem of `--osts` OSTs (16 history
  lines each, the most the kernel keeps), the same text the fake prints;
- `probe`: the whole `imports` probe as the daemon runs it every interval (one mount: no `lfs`;
  the fake `lctl` of tests/support/fakes, a Python program: an upper bound).

    .venv/bin/python benchmarks/import_states.py --osts 64 --rounds 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fsprobe.lustre.caches import LustreCaches  # noqa: E402
from fsprobe.lustre.imports import parse_states  # noqa: E402
from fsprobe.lustre.runner import run_lfs  # noqa: E402
from fsprobe.probing.imports import probe_imports  # noqa: E402
from fsprobe.quota.settings import ServerProbeSettings  # noqa: E402

FAKES = REPO / "tests" / "support" / "fakes"
INSTANCE = "ffff8f1c2a3b4000"


def median_seconds(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def lctl_text(osts: int) -> str:
    history = "".join(
        f" - [ {1700000000 + i}, {'FULL' if i % 2 else 'CONNECTING'} ]\n" for i in range(16)
    )
    names = [f"mdc.lustre-MDT0000-mdc-{INSTANCE}"]
    names += [f"osc.lustre-OST{index:04x}-osc-{INSTANCE}" for index in range(osts)]
    return "".join(
        f"{name}.state=\ncurrent_state: FULL\nstate_history:\n{history}" for name in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--osts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fsprobe-imports-") as work:
        root = Path(work)
        state = root / "state.json"
        state.write_text(f'{{"mountpoint": "{root}"}}')
        os.environ.update(
            FSPROBE_LFS=str(FAKES / "lfs"),
            FSPROBE_LCTL=str(FAKES / "lctl"),
            FAKE_LFS_STATE=str(state),
            FAKE_LFS_OSTS=str(args.osts),
            PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
        )
        settings = ServerProbeSettings(provider="lfs", timeout=30.0)
        true = shutil.which("true") or "/bin/true"
        text = lctl_text(args.osts)
        assert len(parse_states(text, time.time())[("lustre", INSTANCE)]) == args.osts + 1
        caches = LustreCaches()  # as the worker keeps them across rounds
        assert probe_imports(str(root), settings, caches=caches)
        statvfs = median_seconds(lambda: os.statvfs(root), args.rounds * 20)
        costs = {
            "run": median_seconds(lambda: run_lfs((), binary=true, timeout=10.0), args.rounds),
            "parse": median_seconds(lambda: parse_states(text, time.time()), args.rounds),
            "probe": median_seconds(
                lambda: probe_imports(str(root), settings, caches=caches), args.rounds
            ),
        }
    targets = args.osts + 1
    print(f"os.statvfs: {statvfs * 1e6:.1f} µs (median of {args.rounds * 20})")
    for name, seconds in costs.items():
        print(
            f"{name:>5}: {seconds * 1e3:8.3f} ms = {seconds / statvfs:8.0f}x statvfs; "
            f"per target {seconds / targets * 1e6:8.1f} µs = {seconds / targets / statvfs:6.1f}x"
        )


if __name__ == "__main__":
    main()
