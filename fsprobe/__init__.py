"""fsprobe: keeps multi-day training jobs alive when the shared filesystem misbehaves.

The public API (DESIGN §6)::

    fsprobe.check(path, need_bytes=None, ...) -> Report          # probe now, judge
    fsprobe.preflight(path, need_bytes=None, ...) -> Decision     # right before a save
    fsprobe.save(obj, path, ...) -> SaveResult                    # torch.save, but survives
    fsprobe.atomic_write(path, write, ...) -> SaveResult          # the same for any writer
    fsprobe.SaveError                                             # an OSError, every attempt

Importing fsprobe imports neither torch nor Lightning nor transformers; `save` imports torch
when first called, and the integrations live in `fsprobe.integrations`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from fsprobe.check import check
from fsprobe.preflight import Decision, preflight
from fsprobe.report import Report

#: Loaded on first use: the save path pulls in psutil and the checksum code, which the probe
#: worker process (it imports this package too) and a plain `fsprobe check` never need.
_SAVING = ("SaveError", "SaveResult", "atomic_write", "save")


def __getattr__(name: str):
    if name in _SAVING:
        from fsprobe import saving

        return getattr(saving, name)
    raise AttributeError(f"module 'fsprobe' has no attribute {name!r}")


__all__ = [
    "Decision",
    "Report",
    "SaveError",
    "SaveResult",
    "__version__",
    "atomic_write",
    "check",
    "preflight",
    "save",
]
