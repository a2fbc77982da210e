"""Optional dependencies: import one on use, and name the fsprobe extra when it is missing."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it.

    A `ModuleNotFoundError` still, so that code probing for optional features keeps working.
    """


def install_hint(extra: str) -> str:
    """How to add `extra`: fsprobe is not on PyPI (a name anyone could take there), so it is
    installed from its checkout or a wheel built from it (docs/deployment.md)."""
    return f"pip install '<fsprobe checkout or wheel>[{extra}]' (fsprobe is not on PyPI)"


def missing_extra(module: str, extra: str, needed_by: str) -> MissingExtra:
    """The error to raise when `module` is missing for `needed_by`."""
    return MissingExtra(
        f"{needed_by} needs {module}, which is not installed: {install_hint(extra)}",
        name=module,
    )


def is_missing(error: ModuleNotFoundError, module: str) -> bool:
    """Whether `error` says that `module` itself (or its package) is not installed, as opposed
    to an installed module failing to import one of its own dependencies."""
    top = module.split(".")[0]
    return error.name is not None and error.name.split(".")[0] == top


def import_extra(module: str, extra: str, needed_by: str) -> ModuleType:
    """`import module`, or `MissingExtra` naming ``fsprobe[extra]`` if it is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if not is_missing(error, module):
            raise  # installed, but broken: its own error says more than ours would
        raise missing_extra(module, extra, needed_by) from error


@contextlib.contextmanager
def extra_imports(extra: str, needed_by: str, *modules: str) -> Iterator[None]:
    """Wrap a module's imports of `modules` (top-level names): a missing one becomes
    `MissingExtra` naming ``fsprobe[extra]``, so that the import of an integration says what to
    install instead of failing deep inside it."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = next((module for module in modules if is_missing(error, module)), None)
        if missing is None:
            raise  # something else is missing: its own error says more than ours would
        raise missing_extra(missing, extra, needed_by) from None
