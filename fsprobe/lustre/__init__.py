"""Lustre's `lfs` tool: running it safely and reading what it prints.

`lfs quota` and `lfs df` print tables meant for people, and their layout changed between Lustre
2.12, 2.14, 2.15 and 2.16 (see ``docs/lfs-output-formats.md``). The
parsers here are pure functions of (stdout, stderr, exit status) that never raise: every line they
cannot read is named in their result, so a caller reports it instead of guessing.
"""
