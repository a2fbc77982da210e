"""Lustre's `lfs` tool: running it safely and reading what it prints.

The parsers are pure functions of (stdout, stderr, status) that never raise: what they cannot
read is named (docs/lfs-output-formats.md).
"""
