"""The save path's own costs, for this tree and (``--before TREE``) another, in one run.

- **module switches** of one healthy `fsprobe.save` (the second in its process, a fresh state
  file answering): how often the code being run moves from one fsprobe module to another
  (`sys.setprofile`), and through how many modules; with the state file unchanged since the
  save before, and (the realistic case: the daemon rewrites it every 15 s) rewritten since;
- **first preflight**: `import fsprobe` and the first `fsprobe.preflight` in a fresh process
  with a fresh state file, timed inside it; and a whole process doing only that, timed from
  outside, minus a bare interpreter's start and exit timed the same way right before it (the
  median of these paired differences: what a training process pays above Python itself);
- **redirect decision**: the first `fsprobe.preflight` in a fresh process whose state file says
  the target is read-only and the fallback healthy: its time (inside, and above a bare
  interpreter as above), and the child processes started;
- **lines** of `fsprobe/saving/`, `report.py` and `state.py`.

    python benchmarks/save_path.py [--before /path/to/older/tree] [--runs 7] [--json]

Each figure is the median of `--runs` fresh processes; the trees run interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

#: Run in a fresh process with the tree first on sys.path: prints one JSON object.
_SWITCHES = r"""
import json, os, sys
import fsprobe
from fsprobe.state import Writer, write_state
from tests.support.state import daemon_view, publish
target, state = sys.argv[1], sys.argv[2]
publish(state, {target: daemon_view(target)})
path = os.path.join(target, "model.pt")
fsprobe.save({"w": 1}, path, state_dir=state)  # the first: imports, the state file parsed
def followed(rewritten):
    if rewritten:  # the daemon rewrites the file every statvfs interval (15 s)
        publish(state, {target: daemon_view(target)})
    modules = []
    def profile(frame, event, arg):
        if event in ("call", "return"):
            name = frame.f_globals.get("__name__", "")
            if name.startswith("fsprobe") and (not modules or modules[-1] != name):
                modules.append(name)
    sys.setprofile(profile)
    result = fsprobe.save({"w": 2}, path, state_dir=state)
    sys.setprofile(None)
    assert not result.redirected and result.attempts == 1
    return modules
unchanged, rewritten = followed(False), followed(True)
print(json.dumps({"switches": len(unchanged) - 1, "modules": sorted(set(unchanged)),
                  "sequence": unchanged, "rewritten_switches": len(rewritten) - 1,
                  "rewritten_modules": sorted(set(rewritten)), "rewritten_sequence": rewritten}))
"""

_FIRST_PREFLIGHT = r"""
import json, os, sys, time
target, state = sys.argv[1], sys.argv[2]
start = time.perf_counter()
import fsprobe
decision = fsprobe.preflight(os.path.join(target, "model.pt"), state_dir=state)
seconds = time.perf_counter() - start
import psutil
assert (decision.action, decision.source) == ("proceed", "state"), decision
print(json.dumps({"seconds": seconds,
                  "modules": len([m for m in sys.modules if m.startswith("fsprobe")]),
                  "lfs_parsers": sorted(m for m in sys.modules
                                      if m.startswith("fsprobe.") and m.endswith("_parser"))}))
"""

_REDIRECT = r"""
import json, os, sys, time
target, fallback, state = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
import fsprobe
decision = fsprobe.preflight(
    os.path.join(target, "model.pt"), state_dir=state, fallback_dirs=[fallback]
)
seconds = time.perf_counter() - start
import psutil
assert decision.action == "redirect", decision
print(json.dumps({"seconds": seconds,
                  "children": len(psutil.Process().children(recursive=True))}))
"""


def _run(tree: Path, code: str, *args: str) -> dict:
    environment = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    environment.pop("FSPROBE_FALLBACK_DIRS", None)
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tree,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


#: Only the import and the first preflight: timed from outside, against `_interpreter_start`.
_ONLY_PREFLIGHT = r"""
import os, sys, fsprobe
fsprobe.preflight(os.path.join(sys.argv[1], "model.pt"), state_dir=sys.argv[2],
                  fallback_dirs=sys.argv[3:])
"""


def _wall(tree: Path, *args: str) -> float:
    """Seconds for a fresh process to import fsprobe, preflight once and exit, from outside."""
    environment = {**os.environ, "PYTHONPATH": str(tree)}
    environment.pop("FSPROBE_FALLBACK_DIRS", None)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", _ONLY_PREFLIGHT, *args], env=environment, cwd=tree, check=True
    )
    return time.perf_counter() - start


def _interpreter_start() -> float:
    """The baseline: seconds for a fresh interpreter to start and exit, timed from outside."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def _lines(tree: Path) -> int:
    files = [*sorted((tree / "fsprobe" / "saving").glob("*.py"))]
    files += [tree / "fsprobe" / "report.py", tree / "fsprobe" / "state.py"]
    return sum(len(f.read_text().splitlines()) for f in files)


def measure(trees: dict[str, Path], runs: int) -> dict[str, dict]:
    sys.path.insert(0, str(HERE))
    from tests.support.state import daemon_view, publish  # the tree's own helpers

    results: dict[str, dict] = {
        name: {"first": [], "redirect": [], "python": [], "first_above": [], "redirect_above": []}
        for name in trees
    }
    with tempfile.TemporaryDirectory(prefix="fsprobe-bench-") as scratch:
        target, fallback = os.path.join(scratch, "ckpt"), os.path.join(scratch, "fallback")
        full, state = os.path.join(scratch, "full"), os.path.join(scratch, "state")
        for directory in (target, fallback, full):
            os.mkdir(directory)
        redirect_state = os.path.join(scratch, "redirect-state")
        for name, tree in trees.items():
            switches = _run(tree, _SWITCHES, target, os.path.join(scratch, f"switch-{name}"))
            results[name]["switches"] = switches
            results[name]["lines"] = _lines(tree)
        for _ in range(runs):
            publish(state, {target: daemon_view(target)})
            publish(
                redirect_state,
                {full: daemon_view(full, readonly=True), fallback: daemon_view(fallback)},
            )
            for name, tree in trees.items():
                results[name]["python"].append(_interpreter_start())
                results[name]["first_above"].append(
                    _wall(tree, target, state) - _interpreter_start()
                )
                results[name]["redirect_above"].append(
                    _wall(tree, full, redirect_state, fallback) - _interpreter_start()
                )
                results[name]["first"].append(_run(tree, _FIRST_PREFLIGHT, target, state))
                results[name]["redirect"].append(
                    _run(tree, _REDIRECT, full, fallback, redirect_state)
                )
    summary: dict[str, dict] = {}
    for name, result in results.items():
        first = result["first"]
        summary[name] = {
            "module_switches": result["switches"]["switches"],
            "modules_in_one_save": len(result["switches"]["modules"]),
            "module_switches_rewritten": result["switches"]["rewritten_switches"],
            "modules_in_one_save_rewritten": len(result["switches"]["rewritten_modules"]),
            "first_preflight_ms": 1e3 * statistics.median(r["seconds"] for r in first),
            "interpreter_start_ms": 1e3 * statistics.median(result["python"]),
            "first_preflight_above_python_ms": 1e3 * statistics.median(result["first_above"]),
            "fsprobe_modules_loaded": first[-1]["modules"],
            "lfs_parsers_loaded": first[-1]["lfs_parsers"],
            "redirect_ms": 1e3 * statistics.median(r["seconds"] for r in result["redirect"]),
            "redirect_above_python_ms": 1e3 * statistics.median(result["redirect_above"]),
            "redirect_children": max(r["children"] for r in result["redirect"]),
            "lines": result["lines"],
            "sequence": result["switches"]["sequence"],
            "rewritten_sequence": result["switches"]["rewritten_sequence"],
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another source tree to measure alongside")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    trees = {"this": HERE}
    if options.before:
        trees = {"before": options.before.resolve(), **trees}
    summary = measure(trees, options.runs)
    if options.json:
        print(json.dumps(summary, indent=2))
        return 0
    keys = [k for k in summary["this"] if not k.endswith("sequence")]
    print(f"{'':32}" + "".join(f"{name:>22}" for name in summary))
    for key in keys:
        cells = "".join(f"{_cell(summary[name][key]):>22}" for name in summary)
        print(f"{key:32}{cells}")
    for case, key in (("state file unchanged", "sequence"), ("rewritten", "rewritten_sequence")):
        print(
            f"one save's modules, in order ({case}):",
            " > ".join(m.removeprefix("fsprobe.") for m in summary["this"][key]),
        )
    return 0


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list):
        return ",".join(v.rsplit(".", 1)[-1] for v in value) or "-"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
