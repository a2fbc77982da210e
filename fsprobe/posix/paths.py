"""Path predicates shared by the mount table, the state file and the fallback directories."""

from __future__ import annotations

import os


def is_under(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or inside it, by the text of both (made absolute).

    A string comparison: it says nothing about symlinks on the way, so it is for paths that
    were resolved already or that are compared for bookkeeping, never for a trust decision.
    """
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def escaped(path: str) -> str:
    """`path` on one line of printable text, and distinct paths stay distinct.

    Backslashes are doubled, control characters (a newline in a directory name) become
    ``\\n``, ``\\t``, ``\\xNN`` or ``\\u00NN``, and bytes that are not UTF-8 (kept by the
    OS as surrogates) become ``\\xNN``: a table row cannot be broken, and two paths that
    differ only in invalid bytes do not print, or label a metric, the same.
    """
    if "\\" not in path and path.isprintable():  # nothing to escape (the common case)
        return path
    out = []
    for char in path:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0x80 <= code <= 0x9F:  # C1 controls (a terminal reads 0x9B as an escape)
            out.append(f"\\u{code:04x}")
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        else:
            out.append(char)
    return "".join(out)


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
