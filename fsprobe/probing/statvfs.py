"""Space and inode headroom of the filesystem, and which mount it is."""

from __future__ import annotations

import os
import stat

from fsprobe.model import DirectoryOwner, FilesystemInfo
from fsprobe.probing.mounts import find_mount
from fsprobe.probing.target import OWNER, open_target

#: statvfs counts are unsigned 64-bit numbers; Python's `os.statvfs` hands some of them over as
#: signed ones (a filesystem reporting 2**64 - 1 free inodes reads as -1).
_U64 = 2**64


def _count(value: int) -> int:
    return value % _U64 if value < 0 else value


def probe_statvfs(target: str, probe_as: str = OWNER) -> FilesystemInfo:
    """statvfs of `target`, or of its nearest existing ancestor if it does not exist yet.

    `f_bavail`/`f_favail` are used, not `f_bfree`/`f_ffree`: what an unprivileged writer can
    really take, after the blocks reserved for root. Asked of the directory's descriptor
    (``fstatvfs``), opened as the write probe opens it, and refused where it is refused.
    """
    with open_target(target, probe_as) as directory:
        info = os.fstat(directory.fd)
        stats = os.fstatvfs(directory.fd)
    probed, itself = directory.path, directory.exists
    st_dev = info.st_dev
    mount = find_mount(probed)
    return FilesystemInfo(
        probed_path=probed,
        mountpoint=mount.mountpoint if mount else "/",
        fstype=mount.fstype if mount else "unknown",
        device=mount.source if mount else f"{os.major(st_dev)}:{os.minor(st_dev)}",
        size_bytes=_count(stats.f_blocks) * _count(stats.f_frsize),
        avail_bytes=_count(stats.f_bavail) * _count(stats.f_frsize),
        files=_count(stats.f_files),
        files_free=_count(stats.f_favail),
        readonly=bool(stats.f_flag & os.ST_RDONLY),
        st_dev=st_dev,
        owner=DirectoryOwner(info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)),
        target_exists=itself,
    )
