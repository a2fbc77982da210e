"""Mutation run: make one small mistake at a time in the code users trust most, and see whether
the tests that cover it fail. Not part of the suite (it takes a while); run it as a habit before
and after changing those places::

    .venv/bin/python -m tests.support.mutation.run                 # every target
    .venv/bin/python -m tests.support.mutation.run policy quota-ids --jobs 2
    .venv/bin/python -m tests.support.mutation.run save-write --list   # the mutants, not run

The repository is copied to a scratch directory (one per job), so the working tree is never touched
and a run can go on while you edit. Each mutant is written into the copy and the target's tests run
there with ``FSPROBE_REQUIRE_MOUNT_TESTS=1`` (a test that skips kills nothing). A mutant is *killed*
when the tests fail or time out, *survives* when they pass. Survivors whose reason is known are
listed in tests/support/mutation/survivors.py; the run reports them apart and exits 1 only when a
survivor is unexplained. ``--json FILE`` keeps every outcome.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .mutants import Mutant, apply, find
from .survivors import EXPLAINED
from .targets import TARGETS, Target

REPO = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Outcome:
    target: str
    module: str
    mutant: Mutant
    verdict: str  # killed | survived | timeout
    seconds: float
    reason: str | None = None  # why a survivor is accepted, from survivors.py


def _tracked_files() -> list[str]:
    """The tree's files: tracked and new ones, not ignored (every file outside a git tree)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0:
        names = listed.stdout.splitlines()
    else:  # an exported tree (git archive), e.g. an older commit to measure "before"
        names = [
            str(path.relative_to(REPO))
            for path in REPO.rglob("*")
            if not {".venv", "__pycache__", ".git"} & set(path.relative_to(REPO).parts)
        ]
    return [name for name in names if (REPO / name).is_file()]


def make_copy(destination: Path) -> Path:
    """A copy of the working tree's files (tracked and new, not ignored) at `destination`."""
    for name in _tracked_files():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    return destination


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, float]:
    """(pytest's exit status or None on timeout, seconds) for `tests` in `copy`."""
    environment = {**os.environ, "FSPROBE_REQUIRE_MOUNT_TESTS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={copy.parent / 'pt'}",
        *tests,
    ]
    start = time.monotonic()
    try:
        done = subprocess.run(
            command,
            cwd=copy,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, time.monotonic() - start
    return done.returncode, time.monotonic() - start


def existing_tests(target: Target) -> tuple[str, ...]:
    present = tuple(test for test in target.tests if (REPO / test).exists())
    missing = set(target.tests) - set(present)
    if missing:
        print(f"  {target.name}: not in this tree, left out: {', '.join(sorted(missing))}")
    return present


def mutate_target(target: Target, copy: Path, baseline: float) -> list[Outcome]:
    path = copy / target.module
    original = path.read_text()
    tests = existing_tests(target)
    timeout = 3 * baseline + 60
    outcomes = []
    try:
        for mutant in find(original, target.scopes):
            path.write_text(apply(original, mutant))
            status, seconds = run_tests(copy, tests, timeout)
            verdict = "timeout" if status is None else "survived" if status == 0 else "killed"
            reason = EXPLAINED.get(f"{target.module} {mutant.key()}")
            outcome = Outcome(target.name, target.module, mutant, verdict, seconds, reason)
            outcomes.append(outcome)
            print(_line(outcome), flush=True)
    finally:
        path.write_text(original)
    return outcomes


def _line(outcome: Outcome) -> str:
    mutant = outcome.mutant
    mark = {"killed": "killed  ", "timeout": "timeout ", "survived": "SURVIVED"}[outcome.verdict]
    if outcome.verdict == "survived" and outcome.reason:
        mark = "explained"
    where = f"{outcome.module}:{mutant.line} {mutant.scope}"
    return f"  {mark} {where}: {mutant.description}  `{mutant.original}`"


def run_target(target: Target, scratch: Path) -> list[Outcome]:
    copy = make_copy(scratch / target.name / "repo")
    tests = existing_tests(target)
    status, baseline = run_tests(copy, tests, timeout=1800)
    if status != 0:  # nothing to learn from mutants: say so, and go on with the others
        print(f"{target.name}: NOT RUN, the unmutated tests fail (exit {status})", flush=True)
        return []
    print(f"{target.name}: {target.module}, tests pass unmutated in {baseline:.0f} s", flush=True)
    return mutate_target(target, copy, baseline)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.mutation.run", description=__doc__
    )
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="targets run in parallel")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    args = parser.parse_args(argv)
    known = {target.name: target for target in TARGETS}
    unknown = set(args.targets) - set(known)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {sorted(known)}")
    chosen = [known[name] for name in args.targets] or list(TARGETS)

    if args.list:
        for target in chosen:
            mutants = find((REPO / target.module).read_text(), target.scopes)
            print(f"{target.name}: {len(mutants)} mutants of {target.module}")
            for mutant in mutants:
                print(f"  {mutant.line} {mutant.key()}")
        return 0

    scratch = Path(tempfile.mkdtemp(prefix="fsprobe-mutation-"))
    # SIGTERM (a timeout, a kill of the run) unwinds like Ctrl-C, so the scratch copy goes.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda target: run_target(target, scratch), chosen))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outcomes = [outcome for result in results for outcome in result]
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return report(outcomes)


def report(outcomes: list[Outcome]) -> int:
    print("\ntarget            mutants  killed  explained  unexplained")
    unexplained_total = 0
    for name in dict.fromkeys(o.target for o in outcomes):
        mine = [o for o in outcomes if o.target == name]
        survived = [o for o in mine if o.verdict == "survived"]
        explained = [o for o in survived if o.reason]
        unexplained_total += len(survived) - len(explained)
        killed = len(mine) - len(survived)
        print(
            f"{name:17} {len(mine):7} {killed:7} {len(explained):10} "
            f"{len(survived) - len(explained):12}"
        )
    unexplained = [o for o in outcomes if o.verdict == "survived" and not o.reason]
    if unexplained:
        print("\nunexplained survivors (a test should fail, or survivors.py say why not):")
        for outcome in unexplained:
            print(_line(outcome))
    return 1 if unexplained_total else 0


if __name__ == "__main__":
    sys.exit(main())
