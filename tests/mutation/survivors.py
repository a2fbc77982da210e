"""Mutants that survive on purpose, each with the reason no test can or should kill it.

Keyed as the run prints them: ``<module> <scope>: <mutation> in `<source line>```. A key that
no longer matches anything is harmless; a survivor without a key fails the run.
"""

from __future__ import annotations

EXPLAINED: dict[str, str] = {}
