"""The probes: small functions that observe one thing about a target directory.

Each probe takes the target path (and its settings), may block (it runs in an abandonable worker,
see `fsprobe.probing.runner`), returns a value from `fsprobe.model`, and raises `OSError` or
`fsprobe.errors.ProbeFailure` when it cannot observe what it is for. None of them knows about
Prometheus, the state file or the health policy.
"""
