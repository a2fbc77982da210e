"""fsprobe's version: one place, importable without importing anything else of fsprobe."""

__version__ = "0.1.0"
