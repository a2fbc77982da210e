"""Mutants of a Python module: small, plausible mistakes made one at a time, by AST.

Each operator is a mistake a reviewer could miss and a user would pay for: a boundary moved
(``<`` to ``<=``), a threshold moved by one unit, a condition inverted, a call deleted (the
fsync), the wrong field read (``f_bfree`` for ``f_bavail``), ``min`` for ``max``. Only the
functions (or classes) named in a target are mutated; log calls are left alone (deleting a log
line is no mistake a test should catch).

A mutant is identified by the index of its node in :func:`ast.walk` order of the freshly parsed
module, so that applying it needs nothing but the source and that index.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

_COMPARE_SWAPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub, ast.Sub: ast.Add}
_BOOL_SWAPS: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}
#: Fields read by mistake for one another.
ATTRIBUTE_SWAPS = {
    "f_bavail": "f_bfree",
    "f_favail": "f_ffree",
    "st_uid": "st_gid",
    "st_gid": "st_uid",
}
_NAME_SWAPS = {"min": "max", "max": "min", "any": "all", "all": "any"}
#: Receivers whose calls are logging, never mutated away.
_LOGGERS = frozenset({"log", "logger", "logging", "warnings"})

_SYMBOLS = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.And: "and",
    ast.Or: "or",
}


@dataclass(frozen=True)
class Mutant:
    """One mistake: where (node index, line, enclosing scope) and what."""

    node: int
    slot: int  # which operator of a chained comparison
    line: int
    scope: str
    description: str
    original: str  # the source line, stripped, as it reads before the mutation

    def key(self) -> str:
        """Identifies the mutant across edits elsewhere in the file (no line number)."""
        return f"{self.scope}: {self.description} in `{self.original}`"


def _bump(value: float | int) -> float | int:
    """A threshold moved by one unit: +1 for counts and seconds, +0.01 for ratios."""
    if isinstance(value, int):
        return value + 1
    return round(value + (0.01 if abs(value) < 1 else 1.0), 10)


def _is_log_call(call: ast.Call) -> bool:
    func = call.func
    while isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id in _LOGGERS:
            return True
        func = func.value
    return False


def _scopes(tree: ast.Module, wanted: frozenset[str]) -> dict[int, str]:
    """id(node) -> qualname of the wanted scope enclosing it ("*" wants everything)."""
    found: dict[int, str] = {}

    def visit(node: ast.AST, qualname: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = qualname
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{qualname}.{child.name}" if qualname else child.name
                if "*" in wanted or name in wanted:
                    for inner in ast.walk(child):
                        found.setdefault(id(inner), name)
            visit(child, name)

    visit(tree, "")
    return found


def _left_alone(tree: ast.Module) -> set[int]:
    """Nodes no mistake is made in: docstrings, annotations, decorators (a frozen dataclass
    made mutable is no behaviour a user meets) and log calls."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            ids.add(id(body[0]))
        skipped: list[ast.AST] = []
        if isinstance(node, ast.AnnAssign):
            skipped.append(node.annotation)
        if isinstance(node, ast.arg) and node.annotation is not None:
            skipped.append(node.annotation)
        if isinstance(node, ast.Call) and _is_log_call(node):
            skipped.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            skipped += node.decorator_list
            if not isinstance(node, ast.ClassDef) and node.returns is not None:
                skipped.append(node.returns)
        for subtree in skipped:
            ids.update(id(inner) for inner in ast.walk(subtree))
    return ids


def _changes(node: ast.AST) -> Iterator[tuple[int, str]]:
    """(slot, description) of every mutation this node offers."""
    if isinstance(node, ast.Compare):
        for slot, op in enumerate(node.ops):
            swap = _COMPARE_SWAPS.get(type(op))
            if swap is not None:
                yield slot, f"{_SYMBOLS[type(op)]} -> {_SYMBOLS[swap]}"
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
        yield 0, f"{_SYMBOLS[type(node.op)]} -> {_SYMBOLS[_BINOP_SWAPS[type(node.op)]]}"
    elif isinstance(node, ast.BoolOp):
        yield 0, f"{_SYMBOLS[type(node.op)]} -> {_SYMBOLS[_BOOL_SWAPS[type(node.op)]]}"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield 0, "not x -> x"
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        yield 0, f"{node.value!r} -> {_bump(node.value)!r}"
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield 0, f"{node.value} -> {not node.value}"
    elif isinstance(node, ast.Attribute) and node.attr in ATTRIBUTE_SWAPS:
        yield 0, f".{node.attr} -> .{ATTRIBUTE_SWAPS[node.attr]}"
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _NAME_SWAPS
    ):
        yield 0, f"{node.func.id}() -> {_NAME_SWAPS[node.func.id]}()"
    elif (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and not _is_log_call(node.value)
    ):
        yield 0, "call deleted"


def find(source: str, wanted: frozenset[str]) -> list[Mutant]:
    """Every mutant of `source` inside the wanted scopes (qualnames such as ``Foo.bar``)."""
    tree = ast.parse(source)
    scopes = _scopes(tree, wanted)
    skipped = _left_alone(tree)
    lines = source.splitlines()
    mutants = []
    for index, node in enumerate(ast.walk(tree)):
        scope = scopes.get(id(node))
        if scope is None or id(node) in skipped:
            continue
        for slot, description in _changes(node):
            line = getattr(node, "lineno", 0)
            original = lines[line - 1].strip() if line else ""
            mutants.append(Mutant(index, slot, line, scope, description, original))
    return mutants


def apply(source: str, mutant: Mutant) -> str:
    """`source` with `mutant` made, as Python source (comments are lost, the code is not)."""
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.node]
    if isinstance(node, ast.Compare):
        node.ops[mutant.slot] = _COMPARE_SWAPS[type(node.ops[mutant.slot])]()
    elif isinstance(node, ast.BinOp):
        node.op = _BINOP_SWAPS[type(node.op)]()
    elif isinstance(node, ast.BoolOp):
        node.op = _BOOL_SWAPS[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        _replace(tree, node, node.operand)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node, ast.Constant):
        node.value = _bump(node.value)
    elif isinstance(node, ast.Attribute):
        node.attr = ATTRIBUTE_SWAPS[node.attr]
    elif isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        node.func.id = _NAME_SWAPS[node.func.id]
    elif isinstance(node, ast.Expr):
        _replace(tree, node, ast.Pass())
    else:  # pragma: no cover - find() offers nothing else
        raise ValueError(f"cannot mutate {ast.dump(node)}")
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list) and any(item is old for item in value):
                value[[id(item) for item in value].index(id(old))] = new
                return
    raise ValueError("node not found in its tree")
