"""The architecture, held by a test: who may import whom (docs/design.md §3), and no import cycles.

Every `import` of an fsprobe module anywhere in a file counts, also one inside a function: a
call-time import that dodges a cycle is still the cycle. Imports inside a function are only
where a `SaveContext` builds what some saves use on first use (`LAZY`).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.state import daemon_view, publish

PACKAGE = Path(__file__).resolve().parents[2] / "fsprobe"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, modules: Mapping[str, Path]) -> set[str]:
    """The fsprobe modules that the imports in `node` (at any depth) name."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            for alias in child.names:
                name = f"{child.module}.{alias.name}"
                found.add(name if name in modules else child.module)
    return {target for target in found if target in modules} - {"fsprobe"}


def _imports() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    """Every fsprobe module and the fsprobe modules it imports (anywhere in the file); and
    the (module, imported) pairs of imports inside a function."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    inside: set[tuple[str, str]] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = _imported(tree, modules) - {name}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside.update((name, target) for target in _imported(node, modules))
    return graph, inside


GRAPH, INSIDE_FUNCTIONS = _imports()

#: The only fsprobe imports inside a function: what only some saves use, loaded by the
#: `SaveContext` method that first needs it (docs/design.md §3): the inline probes, with the
#: probe plan and the worker's parent side; the background saves' writers; and the fallbacks'
#: areas, for a preflight that has to find where a redirect would land.
LAZY = {
    ("fsprobe.saving.context", "fsprobe.saving.inline"),
    ("fsprobe.saving.context", "fsprobe.saving.writers"),
    ("fsprobe.saving.context", "fsprobe.redirect.areas"),
}

#: The bottom layer: plain values and the operating-system primitives every other part shares.
BOTTOM = {"fsprobe.model", "fsprobe.errors", "fsprobe.units", "fsprobe.codec"} | {
    module for module in GRAPH if module.split(".")[:2] == ["fsprobe", "posix"]
}


def _importers_of(prefix: str) -> dict[str, set[str]]:
    return {
        module: {target for target in targets if target.startswith(prefix)}
        for module, targets in GRAPH.items()
        if any(target.startswith(prefix) for target in targets)
    }


def test_there_are_no_import_cycles():
    visiting: list[str] = []
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        if module in done:
            return
        if module in visiting:
            cycles.append([*visiting[visiting.index(module) :], module])
            return
        visiting.append(module)
        for target in sorted(GRAPH[module]):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(GRAPH):
        visit(module)
    assert cycles == []


@pytest.mark.parametrize(
    ("layer", "allowed"),
    [
        ("fsprobe.cli", ("fsprobe.cli", "fsprobe.__main__")),
        ("fsprobe.daemon", ("fsprobe.cli", "fsprobe.daemon")),
    ],
)
def test_nothing_imports_the_command_line_or_the_daemon(layer, allowed):
    offenders = {
        module: targets
        for module, targets in _importers_of(layer).items()
        if not module.startswith(allowed)
    }
    assert offenders == {}


def test_the_exporters_never_see_probes_lfs_or_the_save_path():
    forbidden = ("fsprobe.probing", "fsprobe.lustre", "fsprobe.quota", "fsprobe.saving")
    offenders = {
        module: {target for target in targets if target.startswith(forbidden)}
        for module, targets in GRAPH.items()
        if module.startswith("fsprobe.exporters")
    }
    assert {module: found for module, found in offenders.items() if found} == {}


def test_the_save_path_and_the_probes_stay_in_their_lanes():
    rules = {
        "fsprobe.probing": ("fsprobe.saving", "fsprobe.exporters", "fsprobe.integrations"),
        "fsprobe.saving": ("fsprobe.exporters", "fsprobe.integrations"),
        # lustre/ implements quota/'s provider interface; quota/ knows no filesystem's tool.
        "fsprobe.lustre": ("fsprobe.probing", "fsprobe.saving", "fsprobe.policy"),
        "fsprobe.quota": ("fsprobe.probing", "fsprobe.lustre", "fsprobe.saving", "fsprobe.policy"),
        "fsprobe.redirect": ("fsprobe.saving", "fsprobe.exporters", "fsprobe.integrations"),
    }
    offenders = {
        module: {target for target in targets if target.startswith(rules[layer])}
        for layer in rules
        for module, targets in GRAPH.items()
        if module.startswith(layer)
    }
    assert {module: found for module, found in offenders.items() if found} == {}


def _folder(module: str) -> str:
    """The subsystem of a module: its folder (``fsprobe.quota``), or the module at the top."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_there_are_no_import_cycles_between_folders():
    """A cycle of folders (probing -> quota -> probing) is one even when no two modules form
    one: neither folder can then be read, changed or tested without the other."""
    folders: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        folders.setdefault(_folder(module), set()).update(
            _folder(target) for target in targets if _folder(target) != _folder(module)
        )

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in folders.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cyclic = sorted(folder for folder in folders if reaches(folder, folder, {folder}))
    assert cyclic == []


def test_the_integrations_use_only_the_integration_api_of_the_save_path():
    """docs/design.md §12: of `fsprobe.saving`, an integration imports `saving.commit` only
    (and the public names, `fsprobe.save_dir`, `fsprobe.distributed`): a change inside
    `saving/` cannot break a framework's integration without that module's names changing
    (issue 19.5)."""
    offenders = {
        module: {
            target
            for target in targets
            if _folder(target) == "fsprobe.saving" and target != "fsprobe.saving.commit"
        }
        for module, targets in GRAPH.items()
        if module.startswith("fsprobe.integrations")
    }
    assert {module: found for module, found in offenders.items() if found} == {}


def test_only_the_save_context_imports_inside_a_function():
    """Every other import is at the top of its module, where a reader looks for it; the
    rules above count these like any other."""
    assert INSIDE_FUNCTIONS == LAZY


def test_the_save_path_reads_the_answer_never_the_report_or_the_judge():
    """docs/design.md §2: a save reads its target's `SaveAnswer` from the state file; the
    daemon's report and the policy are not its business (a change of either is not a change of
    the save path). Only the inline probes (`saving/inline.py`, loaded on first use) judge
    what they probed, as the daemon does."""
    save_path = {"fsprobe.state", "fsprobe.events.event", "fsprobe.events.emit"} | {
        module
        for module in GRAPH
        if module.startswith(("fsprobe.saving.", "fsprobe.redirect."))
        and module != "fsprobe.saving.inline"
    }
    offenders = {
        module: GRAPH[module] & {"fsprobe.report", "fsprobe.policy"}
        for module in save_path
        if GRAPH[module] & {"fsprobe.report", "fsprobe.policy"}
    }
    assert offenders == {}


def test_the_bottom_layer_imports_only_itself():
    offenders = {module: GRAPH[module] - BOTTOM for module in BOTTOM if GRAPH[module] - BOTTOM}
    assert offenders == {}


def test_the_policy_judges_plain_values_only():
    assert GRAPH["fsprobe.policy"] <= BOTTOM


def test_importing_the_package_loads_almost_nothing():
    """`import fsprobe` is cheap: the public names load on first use."""
    code = "import sys, fsprobe; print(sorted(m for m in sys.modules if m.startswith('fsprobe')))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "['fsprobe']"


def test_every_public_name_loads():
    code = (
        "import fsprobe; missing = [n for n in fsprobe.__all__ if not hasattr(fsprobe, n)]; "
        "assert not missing, missing; "
        "assert callable(fsprobe.check) and callable(fsprobe.save), 'a module hid a function'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: What a preflight that the daemon's state file answers must not load: the judge (`policy`)
#: and the daemon's report (`report`: it reads the target's answer, nothing else), the `lfs`
#: parsers (and all of `lustre/`), all of `probing/` (the probes, their plan, the runner, both
#: sides of the probe worker), the quota settings, a save's inline probes and the background
#: saves' writers (docs/design.md §3-§4).
NOT_ON_THE_STATE_PATH = (
    "fsprobe.policy",
    "fsprobe.report",
    "fsprobe.lustre",
    "fsprobe.probing",
    "fsprobe.quota",
    "fsprobe.saving.inline",
    "fsprobe.saving.writers",
)


@pytest.mark.parametrize("redirected", [False, True])
def test_a_preflight_the_state_file_answers_loads_no_probe_and_starts_nothing(
    tmp_path: Path, redirected: bool
):
    """Structure, not timing: a fresh process whose first `fsprobe.preflight` is answered by
    the state file (healthy, or read-only with a healthy fallback) imports no `lfs` parser, no
    probe, neither side of the worker, no probe plan and no background writer, and starts no
    process."""
    target, fallback, state = tmp_path / "ckpt", tmp_path / "fallback", tmp_path / "state"
    target.mkdir()
    fallback.mkdir()
    publish(
        str(state),
        {
            str(target): daemon_view(str(target), readonly=redirected),
            str(fallback): daemon_view(str(fallback)),
        },
    )
    code = (
        "import os, sys, fsprobe\n"
        "decision = fsprobe.preflight(sys.argv[1], state_dir=sys.argv[2], "
        "fallback_dirs=[sys.argv[3]])\n"
        "print(decision.action, decision.source, len(os.listdir('/proc/self/task')))\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('fsprobe'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(target / "model.pt"), str(state), str(fallback)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "FSPROBE_FALLBACK_DIRS"},
    )
    decision, modules = done.stdout.splitlines()
    # One thread: no reader of a worker, so no worker was started.
    assert decision == ("redirect state 1" if redirected else "proceed state 1")
    loaded = modules.split()
    assert "fsprobe.saving.preflight" in loaded  # what was measured is the preflight
    assert [m for m in loaded if m.startswith(NOT_ON_THE_STATE_PATH)] == []
    # Where a redirect lands is worked out only for a redirect.
    assert ("fsprobe.redirect.areas" in loaded) == redirected


#: How a Python process starts another: the audit events of each way (PEP 578).
_STARTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
           "os.system")  # fmt: skip


def test_a_first_save_and_a_first_redirected_save_the_daemon_answers_start_no_process(
    tmp_path: Path,
):
    """docs/design.md §7: the one existence question is asked of the daemon's answer first.
    In a fresh process, a first `fsprobe.save` naming a fallback, and a first save that the
    preflight redirects (the target read-only), whose target directories and fallback the
    daemon watches, start no process: an audit hook (PEP 578) fails the run at the first
    fork, exec or spawn, the probe worker's included."""
    target, full, fallback = tmp_path / "ckpt", tmp_path / "full", tmp_path / "fallback"
    state = tmp_path / "state"
    for directory in (target, full, fallback):
        directory.mkdir()
    publish(
        str(state),
        {
            str(target): daemon_view(str(target)),
            str(full): daemon_view(str(full), readonly=True),
            str(fallback): daemon_view(str(fallback)),
        },
    )
    code = (
        "import sys\n"
        f"STARTS = {_STARTS!r}\n"
        "def refuse(event, args):\n"
        "    if event.startswith(STARTS):\n"
        "        raise RuntimeError(f'a process was started: {event}')\n"
        "sys.addaudithook(refuse)\n"
        "import fsprobe\n"
        "target, full, fallback, state = sys.argv[1:]\n"
        "first = fsprobe.save({'w': 1}, target + '/model.pt', state_dir=state, "
        "fallback_dirs=[fallback])\n"
        "moved = fsprobe.save({'w': 2}, full + '/model.pt', state_dir=state, "
        "fallback_dirs=[fallback])\n"
        "print(first.redirected, moved.redirected, moved.path.startswith(fallback))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(target), str(full), str(fallback), str(state)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FSPROBE_FALLBACK_DIRS"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True", "True"]


TESTS = PACKAGE.parent / "tests"
#: Test folders of top-level modules, and of what crosses packages (tests/README.md).
OTHER_TEST_FOLDERS = {"policy", "documents", "attacks", "deploy", "package", "harness"}


def test_at_most_twelve_modules_sit_at_the_top_level():
    """docs/design.md §3: a subsystem is a folder; the top level is the public API and the
    few modules every folder shares."""
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_every_test_file_is_in_the_folder_of_its_package():
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    folders = {
        path.parent.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if "support" not in path.relative_to(TESTS).parts
    }
    assert folders <= packages | OTHER_TEST_FOLDERS, folders - packages - OTHER_TEST_FOLDERS
    assert not list(TESTS.glob("test_*.py")), "a test file at the top of tests/"
