"""fsprobe: keeps multi-day training jobs alive when the shared filesystem misbehaves.

The public API (docs/saving.md, docs/reference.md). Every name is loaded on first use, so
`import fsprobe` is cheap; no public name is also a submodule's name (docs/design.md §3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_API = {
    "check": "fsprobe.checking",
    "ProbeSettings": "fsprobe.probing.plan",
    "ServerProbeSettings": "fsprobe.quota.settings",
    "Report": "fsprobe.report",
    "preflight": "fsprobe.saving.preflight",
    "Decision": "fsprobe.saving.preflight",
    "save": "fsprobe.saving.file",
    "atomic_write": "fsprobe.saving.file",
    "save_dir": "fsprobe.saving.directory",
    "SaveError": "fsprobe.saving.retry",
    "SaveResult": "fsprobe.saving.retry",
    "SaveOptions": "fsprobe.saving.options",
    "SaveContext": "fsprobe.saving.context",
    "default_context": "fsprobe.saving.context",
    "save_async": "fsprobe.saving.background",
    "wait_saves": "fsprobe.saving.background",
    "locate": "fsprobe.redirect.locate",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` loads these
    from fsprobe.checking import check as check
    from fsprobe.probing.plan import ProbeSettings as ProbeSettings
    from fsprobe.quota.settings import ServerProbeSettings as ServerProbeSettings
    from fsprobe.redirect.locate import locate as locate
    from fsprobe.report import Report as Report
    from fsprobe.saving.background import save_async as save_async
    from fsprobe.saving.background import wait_saves as wait_saves
    from fsprobe.saving.context import SaveContext as SaveContext
    from fsprobe.saving.context import default_context as default_context
    from fsprobe.saving.directory import save_dir as save_dir
    from fsprobe.saving.file import atomic_write as atomic_write
    from fsprobe.saving.file import save as save
    from fsprobe.saving.options import SaveOptions as SaveOptions
    from fsprobe.saving.preflight import Decision as Decision
    from fsprobe.saving.preflight import preflight as preflight
    from fsprobe.saving.retry import SaveError as SaveError
    from fsprobe.saving.retry import SaveResult as SaveResult


#: Submodules that are public as modules, loaded on first use (they import torch).
_MODULES = frozenset({"distributed"})


def __getattr__(name: str) -> object:
    if name in _MODULES:  # the import binds it on the package: no second lookup
        return importlib.import_module(f"{__name__}.{name}")
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'fsprobe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute: no second lookup
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = [*sorted(_API), "__version__"]
