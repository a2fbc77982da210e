"""Running ``lctl get_param``: what it printed, and each parameter it could not read.

Its exit status does not say (`do_param_op` and `jt_lcfg_getparam`, lustre/utils/lustre_param.c
at v2_17_0): within one pattern each read sets the status anew, so the last parameter read
decides it (an unreadable one before a readable one leaves 0); across patterns the first failing
pattern wins. So the status is not taken as the answer; stderr is read line by line, where every
parameter that failed is named (docs/lfs-output-formats.md §5).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.runner import run_lfs, status_error_name
from fsprobe.quota.provider import Deadline

#: ``error: read_param: '<path>': <strerror>``: one parameter matched and could not be read.
_READ_ERROR = re.compile(r"^error: read_param: '(?P<path>[^']*)': (?P<message>.+)$")
#: ``error: get_param: param_path '<pattern, dots as slashes>': <strerror>``: a pattern that
#: matched nothing.
_NO_MATCH = re.compile(r"^error: get_param: param_path '(?P<path>[^']*)': (?P<message>.+)$")


#: strerror text to errno name, to name what lctl said (it runs in the C locale).
_ERRNO_NAMES = {os.strerror(number): name for number, name in errno.errorcode.items()}


@dataclass(frozen=True)
class Unread:
    """A parameter lctl matched but could not read: ``osc.DEVICE.state``, and why (its
    strerror text and errno name, EIO when the text is not one)."""

    name: str
    device: str
    message: str

    @property
    def error(self) -> str:
        return _ERRNO_NAMES.get(self.message, "EIO")


@dataclass(frozen=True)
class Params:
    """What one ``lctl get_param`` printed (`stdout`) and when, the parameters it could not read,
    and the patterns (as lctl names them, dots as slashes) that matched nothing."""

    stdout: str
    read_at: float  # Unix time lctl ended
    unread: tuple[Unread, ...] = ()
    unmatched: tuple[str, ...] = ()


def _unread(path: str, message: str) -> Unread:
    """`path` is the file lctl read (``/sys/kernel/debug/lustre/osc/DEVICE/state``)."""
    parts = [part for part in path.split("/") if part]
    if len(parts) < 3:
        return Unread(path, "", message)
    return Unread(".".join(parts[-3:]), parts[-2], message)


def get_params(lctl: str, patterns: Sequence[str], deadline: Deadline, how_to_fix: str) -> Params:
    """Run ``lctl get_param PATTERN...``; each unreadable parameter and unmatched pattern is
    named in the answer, whatever the exit status says.

    Raises ProbeFailure (the errno name of the exit status, or the signal's) when a signal ended
    lctl, or it failed and said something else or nothing, and what `run_lfs` raises.
    """
    run = run_lfs(
        ("get_param", *patterns), binary=lctl, timeout=deadline.remaining(), how_to_fix=how_to_fix
    )
    unread: list[Unread] = []
    unmatched: list[str] = []
    other: list[str] = []
    for line in run.stderr.splitlines():
        line = line.strip()
        read_error, no_match = _READ_ERROR.match(line), _NO_MATCH.match(line)
        if read_error is not None:
            unread.append(_unread(read_error.group("path"), read_error.group("message")))
        elif no_match is not None:
            unmatched.append(no_match.group("path"))
        elif line:
            other.append(line)
    if run.status < 0 or (run.status != 0 and (other or not (unread or unmatched))):
        said = (" ".join(other) or "no message")[:500]
        raise ProbeFailure(status_error_name(run.status), f"{run.command}: {said}")
    return Params(run.stdout, run.started_at + run.duration, tuple(unread), tuple(unmatched))
