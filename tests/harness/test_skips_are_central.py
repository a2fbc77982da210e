"""No test skips on its own: every environment skip goes through tests/support/capability.py.

With ``FSPROBE_REQUIRE_MOUNT_TESTS=1`` a skip there becomes a failure; a ``pytest.skip`` or an
``importorskip`` anywhere else would stay a silent skip, and a run that left out what it could
not run would look as green as one that ran everything (issue 12: the root-only trust tests
and the promtool, shellcheck, openssl, systemd-analyze, IPv6 and framework tests did).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.capability import (
    REQUIRE_ENV,
    command_problem,
    need_module,
    require,
    root_problem,
)

TESTS = Path(__file__).resolve().parents[1]
CENTRAL = TESTS / "support" / "capability.py"
#: pytest's ways to leave a test out; `pytest.skip.Exception` (naming, not calling) is fine.
SKIPPING = {"skip", "skipif", "importorskip", "xfail"}


def _is_pytest(node: ast.expr) -> bool:
    """`pytest` or `pytest.mark`."""
    if isinstance(node, ast.Name):
        return node.id == "pytest"
    return isinstance(node, ast.Attribute) and node.attr == "mark" and _is_pytest(node.value)


def skips_in(source: str) -> list[tuple[int, str]]:
    """(line, text) of every call or decorator that skips outside the central module."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        candidates = []
        if isinstance(node, ast.Call):
            candidates.append(node.func)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            candidates += node.decorator_list
        if isinstance(node, ast.Assign):  # pytestmark = pytest.mark.skipif(...)
            candidates.append(node.value)
        for candidate in candidates:
            target = candidate.func if isinstance(candidate, ast.Call) else candidate
            if (
                isinstance(target, ast.Attribute)
                and target.attr in SKIPPING
                and _is_pytest(target.value)
            ):
                found.add((target.lineno, ast.unparse(target)))
    return sorted(found)


def test_no_test_skips_outside_the_capability_module():
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}: {text}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != CENTRAL
        for line, text in skips_in(path.read_text())
    ]
    assert offenders == [], "skip through tests/support/capability.py instead"


@pytest.mark.parametrize(
    "source",
    [
        "import pytest\npytest.skip('no promtool')\n",
        "import pytest\ntorch = pytest.importorskip('torch')\n",
        "import pytest\n@pytest.mark.skipif(True, reason='x')\ndef test(): pass\n",
        "import pytest\npytestmark = pytest.mark.skip(reason='x')\n",
        "import pytest\ndef test():\n    pytest.xfail('later')\n",
    ],
)
def test_the_scan_finds_every_way_to_skip(source):
    assert skips_in(source)


def test_naming_the_skip_exception_is_not_skipping():
    assert skips_in("import pytest\npytest.raises(pytest.skip.Exception)\n") == []


def test_every_capability_skips_by_default_and_fails_when_required(monkeypatch):
    problems = [
        command_problem("fsprobe-no-such-command", "nothing"),
        root_problem("a test") or "pretend: a test needs root",
    ]
    for problem in problems:
        monkeypatch.delenv(REQUIRE_ENV, raising=False)
        with pytest.raises(pytest.skip.Exception, match="set FSPROBE_REQUIRE_MOUNT_TESTS=1"):
            require(problem)
        monkeypatch.setenv(REQUIRE_ENV, "1")
        with pytest.raises(pytest.fail.Exception, match="must run here"):
            require(problem)
    with pytest.raises(pytest.fail.Exception, match="cannot import fsprobe_no_such_module"):
        need_module("fsprobe_no_such_module")
