"""Which user, group and project a new file in the target directory is charged to (§4).

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
from fsprobe.posix.identity import Identity

#: _IOR('X', 31, struct fsxattr) from <linux/fs.h>.
FS_IOC_FSGETXATTR = 0x801C581F
#: struct fsxattr: xflags, extsize, nextents, projid, cowextsize (u32 each), 8 bytes of padding.
FSXATTR = struct.Struct("=IIIII8x")

#: FS_XFLAG_PROJINHERIT in fsx_xflags: new files and directories inherit the project ID.
FS_XFLAG_PROJINHERIT = 0x200

#: The errnos that mean "this filesystem does not implement the ioctl": try the fallback.
UNSUPPORTED_ERRNOS = frozenset({errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL})


@dataclass(frozen=True)
class DirectoryProject:
    """A directory's project ID and whether new files in it inherit that ID."""

    id: int
    inherit: bool


@dataclass(frozen=True)
class QuotaIds:
    """The IDs to query; `project` is None when new files get none.

    `errors` say what failed; `notes` say why a quota that might be expected is not asked for
    (a project ID without its inherit flag): information, not errors.
    """

    user: int
    group: int
    project: int | None
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def queries(self) -> tuple[tuple[str, int], ...]:
        """(type, id) pairs in the order they are queried and shown: user, group, project."""
        pairs = [("user", self.user), ("group", self.group)]
        if self.project is not None:
            pairs.append(("project", self.project))
        return tuple(pairs)


def read_project(directory: str) -> DirectoryProject:
    """The project of `directory` via FS_IOC_FSGETXATTR; OSError when it cannot be read."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        reply = fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(FSXATTR.size))
    finally:
        os.close(fd)
    xflags, _extsize, _nextents, projid, _cowextsize = FSXATTR.unpack(reply)
    return DirectoryProject(projid, bool(xflags & FS_XFLAG_PROJINHERIT))


def charged_group(directory_stat: os.stat_result, own_gid: int | None = None) -> int:
    """The group of a new file: the directory's if it is set-group-ID, else the writer's
    (`own_gid`, by default our effective gid)."""
    if directory_stat.st_mode & stat.S_ISGID:
        return directory_stat.st_gid
    return os.getegid() if own_gid is None else own_gid


def _derived_project(
    directory: str, fallback: Callable[[str], DirectoryProject] | None
) -> tuple[DirectoryProject, str]:
    """(project, error); the ID is 0 with an error saying why when it could not be read."""
    none = DirectoryProject(0, False)
    try:
        return read_project(directory), ""
    except OSError as error:
        if error.errno not in UNSUPPORTED_ERRNOS or fallback is None:
            reason = f"{errno_name(error.errno)}: {error.strerror}"
            return none, f"cannot read the project ID of {directory}: {reason}"
    try:
        return fallback(directory), ""
    except (OSError, ProbeFailure) as error:
        name = error.error if isinstance(error, ProbeFailure) else errno_name(error.errno)
        text = error.message if isinstance(error, ProbeFailure) else str(error)
        return none, f"cannot read the project ID of {directory}: {name}: {text}"


def not_inherited(directory: str, project: int) -> str:
    """The one line that says why a directory's project quota is not asked for."""
    return f"{directory} has project {project} but not its inherit flag: new files get no project"


def resolve_ids(
    directory: str,
    *,
    user: int | None = None,
    group: int | None = None,
    project: int | None = None,
    project_fallback: Callable[[str], DirectoryProject] | None = None,
    writer: Identity | None = None,
) -> QuotaIds:
    """The IDs for `directory` (an existing directory) when `writer` (by default this process)
    creates a file there; explicit IDs replace derived ones.

    `project_fallback` reads the project another way (`lfs project -d`) when the ioctl is not
    supported. A project ID that cannot be read is left out with an error, not raised: the user and
    group quota are still worth reporting. A project ID without the inherit flag is left out with
    a note: new files get project 0, so its quota does not apply to them.
    """
    errors: list[str] = []
    notes: list[str] = []
    if group is None:
        group = charged_group(os.stat(directory), writer.gid if writer else None)
    if project is None:
        derived, error = _derived_project(directory, project_fallback)
        if error:
            errors.append(error)
        if derived.id and not derived.inherit:
            notes.append(not_inherited(directory, derived.id))
        project = (derived.id if derived.inherit else 0) or None
    return QuotaIds(
        user=user if user is not None else writer.uid if writer else os.geteuid(),
        group=group,
        project=project,
        errors=tuple(errors),
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
