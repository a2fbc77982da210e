"""Errno names and what they mean for a checkpoint write.

A failure is always a name: the errno's (``EIO``, ``EDQUOT``), ``TIMEOUT`` for an overrun
deadline, ``PARSE`` for output a tool printed that fsprobe cannot read.
"""

from __future__ import annotations

import enum
import errno as errno_module

#: The name a probe reports when a tool's output could not be parsed.
PARSE = "PARSE"
#: The name a probe reports when the target path leads through a symlink that neither root nor
#: the probing identity owns (`fsprobe.probing.target`): refused, never followed.
UNTRUSTED = "UNTRUSTED"
#: The name the write probe reports when it will not run: root would probe as root in a
#: directory that others may rename in (`fsprobe.probing.target.root_write_refusal`).
NOT_AS_ROOT = "NOT_AS_ROOT"


class ErrorClass(str, enum.Enum):
    """How a failed write should be handled (docs/design.md §7)."""

    TRANSIENT = "transient"  # back off and retry
    CAPACITY = "capacity"  # re-check headroom: redirect, or retry (a soft-quota bounce passes)
    PERMANENT = "permanent"  # retrying cannot help: redirect or give up at once


CAPACITY_ERRNOS = frozenset({"ENOSPC", "EDQUOT"})
#: ``TIMEOUT`` is a save's attempt abandoned at its deadline: the target is stuck, and another
#: try there would only leave a second thread stuck beside the first.
PERMANENT_ERRNOS = frozenset(
    {"EACCES", "EPERM", "EROFS", "ENAMETOOLONG", "EISDIR", "ENOTDIR", "ENOENT", "ELOOP", "TIMEOUT"}
)
#: Steps of a save after its temp file exists: ENOENT there means that file vanished (another
#: process's cleanup removed it), not that the directory is missing; a new attempt makes another.
_TEMP_STEPS = frozenset({"write", "flush", "fsync", "close", "rename"})


def errno_name(code: int | None) -> str:
    """``5`` → ``"EIO"``; unknown or missing codes get a stable placeholder."""
    if code is None:
        return "EUNKNOWN"
    return errno_module.errorcode.get(code, f"E{code}")


def errno_code(name: str) -> int | None:
    """``"EIO"`` → ``5``; ``None`` for names that are not errnos (``TIMEOUT``, ``PARSE``)."""
    return getattr(errno_module, name, None) if name.startswith("E") else None


def name_of(exc: BaseException) -> str:
    """The errno name carried by an exception, ``EUNKNOWN`` if it carries none."""
    return errno_name(getattr(exc, "errno", None))


def classify(name: str | None, step: str | None = None) -> ErrorClass:
    """Transient unless the errno says the target cannot take the write (full or forbidden).

    An unknown error (``None``, as in torch's errno-less "file write failed") is treated as
    transient: a retry costs seconds, giving up costs the job. So is a temp file that vanished
    (ENOENT at a `step` after it was created).
    """
    if name == "ENOENT" and step in _TEMP_STEPS:
        return ErrorClass.TRANSIENT
    if name in CAPACITY_ERRNOS:
        return ErrorClass.CAPACITY
    if name in PERMANENT_ERRNOS:
        return ErrorClass.PERMANENT
    return ErrorClass.TRANSIENT


class ProbeFailure(Exception):
    """A probe failed for a reason that is not a plain `OSError` (a tool's exit status, bad output).

    `value` is what the probe still observed on the way, e.g. the write probe's timings up to the
    step that failed, so that a failure is reported with its details rather than instead of them.
    """

    def __init__(self, error: str, message: str, value: object = None) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.value = value

    @classmethod
    def of(cls, error: OSError | ProbeFailure) -> ProbeFailure:
        """The failure an exception stands for: itself, or an OSError's errno name and text."""
        if isinstance(error, ProbeFailure):
            return error
        return cls(name_of(error), error.strerror or str(error))

    def again(self) -> ProbeFailure:
        """A fresh copy to raise: a failure kept as data (cached, shared) has many raisers."""
        return ProbeFailure(self.error, self.message, self.value)

    def same_as(self, other: ProbeFailure) -> bool:
        return (self.error, self.message) == (other.error, other.message)
