"""Opening the target directory once, and deciding who probes it (docs/design.md §4).

Walked from ``/`` without following the kernel through symlinks; foreign symlinks refused
(``target_untrusted``); root's write probe refused where others may rename.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from dataclasses import dataclass, field

from fsprobe.errors import UNTRUSTED, ProbeFailure
from fsprobe.posix.identity import Identity

#: Who probes: the target directory's owner, root (the process itself), or a named account.
OWNER, ROOT = "owner", "root"
#: Opening a directory of the walk: never through a symlink, never inherited by a child; only
#: a handle (``O_PATH``), which needs search permission where a path would, not read permission
#: (a home directory of mode 0711 is passed through, as by a path).
_DIRECTORY_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The kernel's own bound on symlinks in one lookup (MAXSYMLINKS).
MAX_SYMLINKS = 40


def check_probe_as(value: str) -> str:
    """`value` if it names who probes (owner, root, an account name or uid); ValueError else."""
    if value in (OWNER, ROOT):
        return value
    try:
        _account_uid(value)
    except KeyError:
        raise ValueError(
            f"probe_as must be 'owner', 'root' or an account of this host, not {value!r}"
        ) from None
    return value


def _account_uid(name: str) -> int:
    if name.isdigit():
        return pwd.getpwuid(int(name)).pw_uid
    return pwd.getpwnam(name).pw_uid


def probing_identity(probe_as: str, directory: os.stat_result) -> Identity:
    """Who probes the directory `directory` describes (docs/design.md §4, "Who probes").

    Only root can act as someone else: any other process probes as itself, which is who its
    saves are made as. A new file gets the directory's group when it is set-group-ID.
    """
    process = Identity.of_process()
    if process.uid != 0 or probe_as == ROOT:
        return process
    uid = directory.st_uid if probe_as == OWNER else _account_uid(probe_as)
    if uid == 0:
        return process
    setgid = directory.st_gid if directory.st_mode & stat.S_ISGID else None
    return Identity.of_account(uid, setgid)


#: Who may rename entries of a directory: write and search permission on it. The group bits
#: are the ACL mask when the directory has an ACL, so a named user or group who may write it
#: shows there too.
_GROUP_RENAMES = stat.S_IWGRP | stat.S_IXGRP
_OTHERS_RENAME = stat.S_IWOTH | stat.S_IXOTH


def _group_name(gid: int) -> str:
    try:
        return f"group {grp.getgrgid(gid).gr_name}"
    except KeyError:
        return f"gid {gid}"


def others_who_rename(directory: os.stat_result) -> str:
    """Who besides the owner may rename or remove any entry of `directory` ("" for nobody):
    write and search permission on a directory without the sticky bit (which keeps each
    entry its owner's)."""
    mode = directory.st_mode
    if mode & stat.S_ISVTX:
        return ""
    if mode & _OTHERS_RENAME == _OTHERS_RENAME:
        return "every user"
    if mode & _GROUP_RENAMES == _GROUP_RENAMES:
        return f"the members of {_group_name(directory.st_gid)}"
    return ""


def root_write_refusal(opened: OpenedTarget, probe_as: str) -> str:
    """Why root may not write-probe `opened` (`""`: it may), docs/security.md.

    Root probing as the owner of a directory that is root's own probes as root; where others
    may rename in it, they can take root's probe file the moment it exists (emptied then, still
    an inode of root's beyond every quota per probe), put their own file under its next name or
    race its steps. Only an explicit choice (``probe_as = "root"`` or an account) probes there.
    """
    if probe_as != OWNER or opened.identity.uid != 0 or not opened.identity.is_process():
        return ""
    info = os.fstat(opened.fd)
    others = others_who_rename(info)
    if not others:
        return ""
    return (
        f"not write-probing {opened.path} as root: it is root's and {others} may rename in it "
        f"(mode {stat.S_IMODE(info.st_mode):04o}, no sticky bit), so they could take or "
        "replace root's probe file; set probe_as to an account whose saves land there "
        '(probe_as = "USERNAME" for this target, fsprobe check --probe-as USERNAME), '
        "or give the directory the sticky bit (chmod +t)"
    )


@dataclass
class OpenedTarget:
    """The directory a probe works in: its descriptor (``O_PATH``: for ``*at`` calls, fstat and
    fstatvfs; `open_directory` for more), the path the walk took to it (for the mount table
    and messages, never to act on), who probes it, the symlinks followed, and whether it is
    the target itself (else its nearest existing ancestor)."""

    fd: int
    path: str
    identity: Identity
    links: list[tuple[str, int]] = field(default_factory=list)  # (where, owner uid)
    exists: bool = True

    def open_directory(self) -> int:
        """A readable descriptor of the directory itself (to fsync it), opened as the caller
        is now: with the probing identity's permissions in the write probe."""
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __enter__(self) -> OpenedTarget:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Walk:
    """The state of one walk: the open directory, the names walked to it, the links read."""

    def __init__(self) -> None:
        self.fd = os.open("/", _DIRECTORY_FLAGS)
        self.names: list[str] = []
        self.links: list[tuple[str, int]] = []
        self.reached = True  # False: stopped at the nearest existing ancestor

    @property
    def path(self) -> str:
        return "/" + "/".join(self.names)

    def enter(self, name: str) -> None:
        """Step into the directory `name`; OSError (ELOOP, ENOTDIR) for a symlink or a file.

        A directory the prober may search but not read (``chmod 711``, as a home or a shared
        scratch root often is) is passed through all the same (``O_PATH``), as a path lookup
        would: opening it for reading needs a permission the lookup does not."""
        following = os.open(name, _DIRECTORY_FLAGS, dir_fd=self.fd)
        os.close(self.fd)
        self.fd = following
        if name == "..":
            if self.names:
                self.names.pop()
        else:
            self.names.append(name)

    def read_link(self, name: str) -> str | int:
        """The target of the symlink `name` (remembered with its owner), or the mode of what
        `name` is instead (looked at once, on the inode itself: a name can change under us)."""
        link = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            info = os.fstat(link)
            if not stat.S_ISLNK(info.st_mode):
                return info.st_mode
            content = os.readlink("", dir_fd=link)  # this very link, not what the name is now
        finally:
            os.close(link)
        self.links.append((os.path.join(self.path, name), info.st_uid))
        return content

    def restart_at_root(self) -> None:
        os.close(self.fd)
        self.fd = os.open("/", _DIRECTORY_FLAGS)
        self.names = []


def _names(path: str) -> list[str]:
    return [name for name in path.split("/") if name and name != "."]


def _walk(target: str) -> _Walk:
    """Walk to `target`, or to its nearest existing ancestor (docs/design.md §4)."""
    walk = _Walk()
    pending = _names(os.path.abspath(target))
    swaps = 0
    try:
        while pending:
            name = pending.pop(0)
            try:
                walk.enter(name)
                continue
            except FileNotFoundError:
                walk.reached = False
                return walk  # the nearest existing directory stands in
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                content = walk.read_link(name)
                if isinstance(content, int):
                    if not stat.S_ISDIR(content):  # a file in the way: the target's own error
                        raise NotADirectoryError(
                            errno.ENOTDIR, "not a directory", os.path.join(walk.path, name)
                        ) from None
                    swaps += 1  # a symlink a moment ago, a directory now: look again
                    if swaps > MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, "the path keeps changing", target) from None
                    pending.insert(0, name)
                    continue
            if len(walk.links) > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", target)
            if content.startswith("/"):
                walk.restart_at_root()
            pending[:0] = _names(content)
        return walk
    except BaseException:
        os.close(walk.fd)
        raise


def open_target(target: str, probe_as: str = OWNER) -> OpenedTarget:
    """Open `target` (or its nearest existing ancestor) and decide who probes it.

    Raises OSError for what the target itself is (ENOTDIR for a file in the way, ELOOP, EACCES,
    ENOENT for an empty path) and `ProbeFailure` ``UNTRUSTED`` for a symlink on the way that
    neither root nor the probing identity owns.
    """
    if not target:
        raise FileNotFoundError(errno.ENOENT, "an empty path names no directory", target)
    walk = _walk(target)
    opened = OpenedTarget(walk.fd, walk.path, Identity(0, 0), walk.links, walk.reached)
    try:
        opened.identity = probing_identity(probe_as, os.fstat(walk.fd))
        for where, owner in walk.links:
            if owner not in (0, opened.identity.uid):
                raise ProbeFailure(
                    UNTRUSTED,
                    f"{target} leads through the symbolic link {where} of uid {owner}, who is "
                    f"neither root nor {opened.identity.describe()}, who would probe "
                    f"{walk.path}: not following it",
                )
        return opened
    except BaseException:
        opened.close()
        raise
