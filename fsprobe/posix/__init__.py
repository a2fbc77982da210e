"""Operating-system primitives that know nothing of checkpoints' policy.

Everything here works from descriptors, never through a path a symlink could redirect, and
imports nothing of fsprobe outside this folder (docs/design.md §3).
"""
