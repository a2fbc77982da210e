"""The probes: small functions that observe one thing about a target directory.

Each may block (it runs in the worker), returns a `fsprobe.model` value, and raises `OSError` or
`ProbeFailure` when it cannot observe.
"""
