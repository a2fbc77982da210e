"""fsprobe: keeps multi-day training jobs alive when the shared filesystem misbehaves.

The public API (docs/design.md §6)::

    fsprobe.check(path, need_bytes=None, ...) -> Report          # probe now, judge
    fsprobe.preflight(path, need_bytes=None, ...) -> Decision     # right before a save
    fsprobe.save(obj, path_or_fileobj, ...) -> SaveResult         # torch.save, but survives
    fsprobe.atomic_write(path, write, ...) -> SaveResult          # the same for any writer
    fsprobe.save_dir(path, write, ...) -> SaveResult              # a directory, committed whole
    fsprobe.distributed.save_dir(path, write, ...) -> SaveResult  # ... written by every rank
    fsprobe.save_async(obj, path, ...) -> Future[SaveResult]      # snapshot now, write later
    fsprobe.wait_saves(timeout=None)                              # the background saves done
    fsprobe.locate(path) -> str                                   # where to resume from
    fsprobe.SaveError                                             # an OSError, every attempt
    fsprobe.SaveOptions                                           # every save option, one value

Every name is loaded on first use, so `import fsprobe` costs next to nothing (the probe worker
process imports this package too), and none of them imports torch, Lightning or transformers;
the integrations live in `fsprobe.integrations`, and `fsprobe.distributed` (a module, loaded
when first used) imports `torch.distributed`.

No public name is also the name of a submodule (the module behind `fsprobe.check` is
`fsprobe.checking`): importing a submodule binds its name on the package, which would replace
the function of the same name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_API = {
    "check": "fsprobe.checking",
    "Report": "fsprobe.report",
    "preflight": "fsprobe.saving.preflight",
    "Decision": "fsprobe.saving.preflight",
    "save": "fsprobe.saving.file",
    "atomic_write": "fsprobe.saving.file",
    "save_dir": "fsprobe.saving.directory",
    "SaveError": "fsprobe.saving.retry",
    "SaveResult": "fsprobe.saving.retry",
    "SaveOptions": "fsprobe.saving.options",
    "save_async": "fsprobe.saving.background",
    "wait_saves": "fsprobe.saving.background",
    "locate": "fsprobe.redirect.locate",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` loads these
    from fsprobe.checking import check as check
    from fsprobe.redirect.locate import locate as locate
    from fsprobe.report import Report as Report
    from fsprobe.saving.background import save_async as save_async
    from fsprobe.saving.background import wait_saves as wait_saves
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
