"""The daemon's log: one event per line of ``key=value`` pairs, every value escaped (a line
logged in words elsewhere is ``event=log``); ``-v`` adds every probe result."""

from __future__ import annotations

import logging
import re
import sys
import time

from fsprobe.posix.paths import escaped

log = logging.getLogger("fsprobe.daemon")

_PLAIN = re.compile(r"[A-Za-z0-9_./:@+,\[\]\-]+")


def _value(value: object) -> str:
    text = "" if value is None else str(value)
    if _PLAIN.fullmatch(text):  # (`match` with `$` let a trailing newline through)
        return text
    return '"' + escaped(text).replace('"', '\\"') + '"'


def event(level: int, name: str, **fields: object) -> None:
    """Log the event `name` with its fields (target, probe, errno, ...), skipping None ones."""
    if not log.isEnabledFor(level):
        return
    pairs = " ".join(f"{key}={_value(value)}" for key, value in fields.items() if value is not None)
    log.log(level, "event=%s %s", name, pairs) if pairs else log.log(level, "event=%s", name)


def log_bug(path: str, stage: str, summary: str, traceback: str) -> None:
    """A bug contained at a target's boundary (`fsprobe.exporters.contained`), at error."""
    event(
        logging.ERROR,
        "internal_error",
        target=path,
        stage=stage,
        error=summary,
        traceback=traceback.rstrip() or None,
    )


class _Formatter(logging.Formatter):
    """``ts=2024-05-01T12:00:00.123Z level=warning event=... target=... probe=... errno=...``"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
        message = record.getMessage()
        if not message.startswith("event="):  # said in words elsewhere: one event all the same
            message = f"event=log logger={record.name} message={_value(message)}"
        elif not message.isprintable():  # an event line written without `event`
            message = escaped(message)
        line += message
        if record.exc_info:
            line += " traceback=" + _value(self.formatException(record.exc_info))
        return line


def configure(level: str) -> None:
    """Send fsprobe's log to stderr at `level` (debug, info, warning, error)."""
    root = logging.getLogger("fsprobe")
    if not any(getattr(handler, "_fsprobe", False) for handler in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Formatter())
        handler._fsprobe = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(level.upper())
