"""Which user, group and project a new file in the target directory is charged to (DESIGN §4).

- user: the effective uid of this process (the trainer's, when the hook runs in the trainer);
- group: the directory's gid when it has the set-group-ID bit (new files inherit it), else the
  effective gid;
- project: the directory's project ID, read with the FS_IOC_FSGETXATTR ioctl that Lustre, XFS
  and ext4 implement, or by a provider's own tool (`lfs project -d`) where the ioctl is not
  supported; ID 0 means "no project", and is not queried.
An explicit ID (--user/--group/--project, or a target's config) replaces the derived one.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import os
import pwd
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass

from fsprobe.errors import ProbeFailure, errno_name

#: _IOR('X', 31, struct fsxattr) from <linux/fs.h>.
FS_IOC_FSGETXATTR = 0x801C581F
#: struct fsxattr: xflags, extsize, nextents, projid, cowextsize (u32 each), 8 bytes of padding.
FSXATTR = struct.Struct("=IIIII8x")

#: The errnos that mean "this filesystem does not implement the ioctl": try the fallback.
UNSUPPORTED_ERRNOS = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL})


@dataclass(frozen=True)
class QuotaIds:
    """The IDs to query; `project` is None when the directory has none. `notes` say what failed."""

    user: int
    group: int
    project: int | None
    notes: tuple[str, ...] = ()

    def queries(self) -> tuple[tuple[str, int], ...]:
        """(type, id) pairs in the order they are queried and shown: user, group, project."""
        pairs = [("user", self.user), ("group", self.group)]
        if self.project is not None:
            pairs.append(("project", self.project))
        return tuple(pairs)


def read_project_id(directory: str) -> int:
    """The project ID of `directory` via FS_IOC_FSGETXATTR; OSError when it cannot be read."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        reply = fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size))
    finally:
        os.close(fd)
    return FSXATTR.unpack(reply)[3]


def charged_group(directory_stat: os.stat_result) -> int:
    """The group of a new file: the directory's if it is set-group-ID, else our effective gid."""
    if directory_stat.st_mode & stat.S_ISGID:
        return directory_stat.st_gid
    return os.getegid()


def _derived_project(directory: str, fallback: Callable[[str], int] | None) -> tuple[int, str]:
    """(project ID, note); the ID is 0 with a note saying why when it could not be read."""
    try:
        return read_project_id(directory), ""
    except OSError as error:
        if error.errno not in UNSUPPORTED_ERRNOS or fallback is None:
            reason = f"{errno_name(error.errno)}: {error.strerror}"
            return 0, f"cannot read the project ID of {directory}: {reason}"
    try:
        return fallback(directory), ""
    except (OSError, ProbeFailure) as error:
        name = error.error if isinstance(error, ProbeFailure) else errno_name(error.errno)
        text = error.message if isinstance(error, ProbeFailure) else str(error)
        return 0, f"cannot read the project ID of {directory}: {name}: {text}"


def resolve_ids(
    directory: str,
    *,
    user: int | None = None,
    group: int | None = None,
    project: int | None = None,
    project_fallback: Callable[[str], int] | None = None,
) -> QuotaIds:
    """The IDs for `directory` (an existing directory); explicit IDs replace derived ones.

    `project_fallback` reads the project ID another way (`lfs project -d`) when the ioctl is not
    supported. A project ID that cannot be read is left out with a note, not raised: the user and
    group quota are still worth reporting.
    """
    notes: list[str] = []
    if group is None:
        group = charged_group(os.stat(directory))
    if project is None:
        derived, note = _derived_project(directory, project_fallback)
        if note:
            notes.append(note)
        project = derived or None
    return QuotaIds(
        user=os.geteuid() if user is None else user,
        group=group,
        project=project,
        notes=tuple(notes),
    )


def id_of(quota_type: str, name: str) -> int:
    """The uid of a user name or the gid of a group name; KeyError when there is none.

    `lfs quota -u alice` takes names too, but fsprobe asks lfs by number, so that the header
    it prints can be checked against the question.
    """
    if quota_type == "user":
        return pwd.getpwnam(name).pw_uid
    if quota_type == "group":
        return grp.getgrnam(name).gr_gid
    raise KeyError(f"{quota_type} IDs have no names")


def id_name(quota_type: str, quota_id: int) -> str | None:
    """The user or group name of an ID, for people; projects have no standard name database."""
    try:
        if quota_type == "user":
            return pwd.getpwuid(quota_id).pw_name
        if quota_type == "group":
            return grp.getgrgid(quota_id).gr_name
    except (KeyError, OverflowError):
        return None
    return None
