"""The package runs on the oldest Python it claims (pyproject's requires-python, 3.9), which CI
does not run: what only a newer interpreter evaluates is found in the source instead.

Annotations are never evaluated (every module has ``from __future__ import annotations``), but
a type alias, a base class or a ``cast`` is: ``tuple[int | None, int]`` at module level stops
``import fsprobe`` on 3.9 with "unsupported operand type(s) for |" (it did, in issue 34's
``saving/context.py``). Checked by hand with 3.9.18 the day this test came: every module
imports (those of the frameworks need a Python they support).
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "fsprobe"
#: A name that is a class: a builtin type, or CamelCase (``PathLike``, ``SaveEvent``); not a
#: constant (``O_PATH``, ``REASON_CODES``), which ``|`` combines as numbers or sets.
_CLASS = re.compile(r"[A-Z][a-z]")
_BUILTIN_TYPES = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)}


def _a_type(node: ast.expr) -> bool:
    """Whether `node` reads as a type: None, a class, or a class subscripted."""
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.Name):
        return node.id in _BUILTIN_TYPES or bool(_CLASS.match(node.id))
    if isinstance(node, ast.Attribute):
        return bool(_CLASS.match(node.attr))
    if isinstance(node, ast.Subscript):
        return _a_type(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _a_type(node.left) or _a_type(node.right)
    return False


def _never_evaluated(tree: ast.AST) -> set[int]:
    """The ids of every node inside an annotation or an ``if TYPE_CHECKING:`` block."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        found: list[ast.AST | None] = []
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            found += node.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
            found += [a.annotation for a in every] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
        for part in found:
            if part is not None:
                inside |= {id(child) for child in ast.walk(part)}
    return inside


def _evaluated_unions(source: str, name: str) -> list[str]:
    """Each union of types in `source` (the module `name`) that Python evaluates."""
    tree = ast.parse(source)
    skipped = _never_evaluated(tree)
    return [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.BitOr)
        and id(node) not in skipped
        and _a_type(node)
    ]


def test_no_union_of_types_is_evaluated_that_python_3_9_cannot():
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in _evaluated_unions(
            path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent))
        )
    ]
    assert found == [], "write Optional[...] / Union[...] where it is evaluated:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("Need = tuple[int | None, int | None]", 2),
        ("Folder = str | os.PathLike[str]", 1),
        ("Deliver = Callable[[Sender, 'SaveEvent | Goodbye'], 'str | None']", 0),
        ("def f(x: int | None) -> str | None: ...", 0),
        ("x: int | None = None", 0),
        ("if TYPE_CHECKING:\n    Watched = tuple[str, SaveAnswer | None]", 0),
        ("FLAGS = os.O_PATH | os.O_DIRECTORY", 0),
        ("NAMES = REASON_CODES | {'unknown'}", 0),
    ],
)
def test_the_check_tells_a_type_union_from_numbers_and_sets(source, flagged):
    assert len(_evaluated_unions(source, "example.py")) == flagged
