"""Space and inode headroom of the filesystem, and which mount it is."""

from __future__ import annotations

import errno
import os
import stat

from fsprobe.model import FilesystemInfo
from fsprobe.probing.mounts import find_mount, nearest_existing


def probe_statvfs(target: str) -> FilesystemInfo:
    """statvfs of `target`, or of its nearest existing ancestor if it does not exist yet.

    `f_bavail`/`f_favail` are used, not `f_bfree`/`f_ffree`: what an unprivileged writer can
    really take, after the blocks reserved for root.
    """
    probed = nearest_existing(target)
    info = os.stat(probed)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", probed)
    stats = os.statvfs(probed)
    st_dev = info.st_dev
    mount = find_mount(probed)
    return FilesystemInfo(
        probed_path=probed,
        mountpoint=mount.mountpoint if mount else "/",
        fstype=mount.fstype if mount else "unknown",
        device=mount.source if mount else f"{os.major(st_dev)}:{os.minor(st_dev)}",
        size_bytes=stats.f_blocks * stats.f_frsize,
        avail_bytes=stats.f_bavail * stats.f_frsize,
        files=stats.f_files,
        files_free=stats.f_favail,
        readonly=bool(stats.f_flag & os.ST_RDONLY),
        st_dev=st_dev,
    )
