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


def escaped(text: str) -> str:
    """`text` (a path, a message, a host name) on one line of printable text; distinct texts
    stay distinct. The one escape of everything a person reads (and of metric labels).

    Backslashes are doubled; control characters (``\\n``, ``\\t``, ``\\r``, other C0 and DEL
    as ``\\xNN``, C1 as ``\\u00NN``), bidi and other format characters (U+202E), line and
    paragraph separators (U+2028/9) and every other character that is not printable become
    ``\\uNNNN`` (``\\UNNNNNNNN`` beyond the BMP); bytes that are not UTF-8 (kept by the OS as
    surrogates) become ``\\xNN``: a line cannot be broken, a terminal not rewritten, text not
    reordered, and two paths that differ only in invalid bytes do not print, or label a
    metric, the same.
    """
    if "\\" not in text and text.isprintable():  # nothing to escape (the common case)
        return text
    out = []
    for char in text:
        code = ord(char)
        if char == "\\":
            out.append("\\\\")
        elif char in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape keeps it
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        elif code <= 0xFFFF:  # C1 (a terminal reads 0x9B as an escape), bidi, U+2028, ...
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return "".join(out)


_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
