"""fsprobe: keeps multi-day training jobs alive when the shared filesystem misbehaves."""

from __future__ import annotations

__version__ = "0.1.0"
