"""The fault filesystem: a FUSE passthrough that tests drive to reproduce a filesystem's bad days.

Run it as its own process (a hung operation must never hang the test process)::

    python -m tests.support.faultfs BACKING MOUNTPOINT --control SOCKET [--direct-io]

(from the repository root; :class:`tests.support.faultmount.FaultFS` starts and stops it for
you, and the pytest fixtures ``faultfs`` / ``faultfs_factory`` wrap that). Every operation on
MOUNTPOINT is carried out on BACKING, after the fault rules (:mod:`tests.support.faults`) and
the quota (:mod:`tests.support.quota`) had their say. libfuse serves requests on up to
``--max-threads`` threads, so one blocked call does not block the others; a blocked call is let
go after ``--max-block`` seconds (default 120) with an error in the log, a safety net against a
test that forgets to release it.

Control protocol
----------------
A Unix stream socket at SOCKET. Each request is one line of JSON, ``{"cmd": NAME, ...args}``;
each reply is one line, ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "message"}``.
A connection may carry any number of requests. :class:`tests.support.faultctl.FaultControl` is
the client. Commands, their arguments (``?`` marks an optional one, with its default) and
``-> result``:

- ``ping`` -> ``{"libfuse", "pid", "backing", "mountpoint", "mounted"}``; ``libfuse`` is the
  version of the library loaded (``"3.14"``), which must be 3
- ``fail op errno path?=null after?=0 times?=1 sticky?=false`` -> ``{"id"}``;
  ``errno`` is a number or a name such as ``"EIO"``
- ``delay op seconds path?=null after?=0 times?=null`` -> ``{"id"}``
- ``block op path?=null after?=0 times?=null`` -> ``{"id"}``
- ``remove id`` -> ``null``; removing a block rule releases the calls waiting on it
- ``clear`` -> ``null``: removes every rule, releases every blocked call
- ``rules`` -> list of rules; ``counts`` -> ``{op: calls seen, failed ones included}``;
  ``reset_counts`` -> ``null``
- ``journal`` -> ``{"entries": [[op, paths, error], ...], "dropped": n}``: the calls that change
  or sync something, in order, each with the errno name it ended with (``null``: success); see
  :mod:`tests.support.journal`. ``clear_journal`` -> ``null``
- ``quota`` -> QUOTA; ``rescan`` (recount usage from the backing tree) -> QUOTA
- ``set_quota resource soft? hard? grace?`` -> QUOTA; ``resource`` is ``"bytes"`` or
  ``"inodes"``; only the keys given change, ``null`` lifts a limit
- ``exempt_root exempt?=true`` -> ``null``: while true, the quota never refuses a call made
  with fsuid 0 (its usage is still counted), as Lustre, ext4 and XFS let root (CAP_SYS_RESOURCE)
  write past every quota; everyone else's calls, a root process acting with a user's fsuid
  included, are refused as before
- ``set_statfs fields`` -> ``null``; ``fields`` maps any of ``f_bsize f_frsize f_blocks f_bfree
  f_bavail f_files f_ffree f_namemax`` to a number, replacing the previous overrides; ``{}``
  passes the backing filesystem's numbers through
- ``statfs`` -> ``{f_*: n}``, what statfs reports now (not counted, never blocked)
- ``set_readonly readonly`` -> ``null``: while true, mutating calls fail with EROFS
- ``shutdown`` -> ``null``: releases everything for good, nothing blocks any more

Operation names and rule semantics are in :mod:`tests.support.faults`. A rule, as ``rules``
lists it: ``{"id", "action", "op", "path", "errno" (name or null), "errno_code", "seconds",
"after", "times", "sticky", "seen", "hits", "waiting"}``.

QUOTA, the reply of ``quota`` (also read by the fake ``lfs``), is exactly::

    {
      "bytes":  {"used": int, "soft": int|null, "hard": int|null, "grace": number,
                 "grace_start": number|null, "grace_expires_at": number|null,
                 "state": "ok"|"soft_exceeded"|"grace_expired"|"hard_reached"},
      "inodes": {...the same keys, counted in inodes...},
      "now": number
    }

``used`` is in bytes (apparent size of regular files) or inodes (files, directories, symlinks;
the root not counted); ``soft``/``hard`` are limits in the same unit, ``null`` for none;
``grace`` is the grace period in seconds (default one week); ``grace_start`` is the Unix time
at which usage went above ``soft`` (``null`` while it is not above); ``grace_expires_at`` is
``grace_start + grace``; ``now`` is the filesystem's clock when the reply was made, so that a
reader computes the remaining grace as ``grace_expires_at - now``. ``state`` is
``hard_reached`` if ``used >= hard``, else ``grace_expired`` if ``used > soft`` and
``now >= grace_expires_at``, else ``soft_exceeded`` if ``used > soft``, else ``ok``. One quota
covers the whole tree whichever user, group or project asks; each new entry belongs to the uid
that created it (the caller's fsuid, as FUSE reports it), so a test can tell who wrote what.

Limits of the illusion
----------------------
- FUSE carries no read-only flag in statfs: ``set_readonly`` gives EROFS but ``statvfs`` still
  shows the mount as writable (``FaultFS.remount(readonly=True)`` sets the flag), and
  ``f_favail`` always equals ``f_ffree``.
- Usage is tracked from the calls that pass through the mount; after changing BACKING directly,
  send ``rescan``.
- renameat2() supports RENAME_NOREPLACE; RENAME_EXCHANGE and RENAME_WHITEOUT are refused with
  EINVAL, as the kernel does for filesystems without them.
- xattrs, ioctls (project IDs) and fallocate are not implemented: they fail with ENOTSUP/ENOTTY.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import select
import signal
import socketserver
import stat
import subprocess
import sys
import threading
import time
from typing import Any, Callable

import mfusepy

from .faults import DEFAULT_MAX_HOLD, Faults
from .journal import Journal, journaled
from .quota import Quota, scan_usage

log = logging.getLogger("faultfs")

#: The statvfs fields FUSE carries from the filesystem to the kernel (f_favail is not one).
STATFS_FIELDS = (
    "f_bsize",
    "f_frsize",
    "f_blocks",
    "f_bfree",
    "f_bavail",
    "f_files",
    "f_ffree",
    "f_namemax",
)

_STAT_FIELDS = (
    "st_mode",
    "st_ino",
    "st_nlink",
    "st_uid",
    "st_gid",
    "st_size",
    "st_blocks",
    "st_blksize",
    "st_rdev",
)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC

_RENAME_NOREPLACE = 1  # <linux/fs.h>

# utimensat()'s special nanosecond values (<sys/stat.h>).
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2


def _file_bytes(st: os.stat_result) -> int:
    """What a file counts against the byte quota: regular files only, by apparent size."""
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def _dirent_mode(entry: os.DirEntry[str]) -> int:
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return 0


class FaultOperations(mfusepy.Operations):
    """Passthrough operations over `backing`, each gated by the fault rules and the quota.

    File handles are the backing file descriptors. Modes, owners and times are those of the
    backing tree; entries created by a non-root caller are given to that caller, as a kernel
    filesystem would.
    """

    use_ns = True  # getattr/utimens speak nanoseconds

    def __init__(self, backing: str, max_hold: float = DEFAULT_MAX_HOLD) -> None:
        self.root = os.path.realpath(backing)
        self.faults = Faults(max_hold)
        self.journal = Journal()
        self.quota = Quota()
        self.statfs_overrides: dict[str, int] = {}
        self.root_exempt = False  # see the `exempt_root` command
        self.mounted = threading.Event()
        self.rescan()

    # -- helpers -----------------------------------------------------------------------------

    def _real(self, path: str | None) -> str:
        if path is None:  # an open file that was unlinked meanwhile
            raise OSError(errno.ENOENT, "no path")
        return self.root + path

    def _give_to_caller(self, real: str) -> None:
        """Hand a new entry to the calling user, keeping a set-group-ID directory's group."""
        uid, gid, _pid = mfusepy.fuse_get_context()
        if (uid, gid) == (os.geteuid(), os.getegid()):
            return
        if os.stat(os.path.dirname(real)).st_mode & stat.S_ISGID:
            gid = -1
        os.lchown(real, uid, gid)

    def _check_quota(self, *, nbytes: int = 0, inodes: int = 0) -> None:
        """The quota's say on a call: root's calls pass when root is exempt (as on Lustre)."""
        if self.root_exempt and mfusepy.fuse_get_context()[0] == 0:
            return
        self.quota.check(nbytes=nbytes, inodes=inodes)

    def _freed(self, st: os.stat_result) -> None:
        """Release the quota of an entry that was removed or replaced."""
        if stat.S_ISDIR(st.st_mode):
            self.quota.release(inodes=1)
        elif st.st_nlink <= 1:
            self.quota.release(nbytes=_file_bytes(st), inodes=1)

    def _new_entry(self, op: str, path: str, make: Callable[[str], Any]) -> Any:
        """Gate, check the inode quota, create with `make(real_path)`, charge, chown."""
        self.faults.gate(op, path, mutating=True)
        real = self._real(path)
        with self.quota.lock:
            self._check_quota(inodes=1)
            result = make(real)
            self.quota.charge(inodes=1)
        self._give_to_caller(real)
        return result

    def rescan(self) -> None:
        nbytes, inodes = scan_usage(self.root)
        self.quota.set_usage(nbytes=nbytes, inodes=inodes)

    def statfs_numbers(self) -> dict[str, int]:
        st = os.statvfs(self.root)
        numbers = {name: getattr(st, name) for name in STATFS_FIELDS}
        numbers.update(self.statfs_overrides)
        return numbers

    # -- lifecycle ---------------------------------------------------------------------------

    def init(self, path: str) -> None:
        self.mounted.set()

    # -- metadata ----------------------------------------------------------------------------

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        self.faults.gate("getattr", path, fh=fh)
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        attrs = {name: getattr(st, name) for name in _STAT_FIELDS}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def readlink(self, path: str) -> str:
        self.faults.gate("readlink", path)
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, int]:
        self.faults.gate("statfs", path)
        return self.statfs_numbers()

    @journaled
    def chmod(self, path: str | None, mode: int) -> int:
        self.faults.gate("chmod", path, mutating=True)
        os.chmod(self._real(path), mode)
        return 0

    @journaled
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        self.faults.gate("chown", path, mutating=True)
        os.lchown(self._real(path), uid, gid)
        return 0

    @journaled
    def utimens(self, path: str | None, times: Any = None) -> int:
        """`times` is None (both now) or ((atime_sec, atime_nsec), (mtime_sec, mtime_nsec))."""
        self.faults.gate("utimens", path, mutating=True)
        real = self._real(path)
        if times is None:
            os.utime(real, follow_symlinks=False)
            return 0
        current = os.lstat(real)
        now = time.time_ns()
        resolved = []
        for (sec, nsec), old in zip(times, (current.st_atime_ns, current.st_mtime_ns)):
            if nsec == _UTIME_NOW:
                resolved.append(now)
            elif nsec == _UTIME_OMIT:
                resolved.append(old)
            else:
                resolved.append(sec * 10**9 + nsec)
        os.utime(real, ns=(resolved[0], resolved[1]), follow_symlinks=False)
        return 0

    # -- namespace ---------------------------------------------------------------------------

    @journaled
    def mknod(self, path: str, mode: int, dev: int) -> int:
        self._new_entry("mknod", path, lambda real: os.mknod(real, mode, dev))
        return 0

    @journaled
    def mkdir(self, path: str, mode: int) -> int:
        self._new_entry("mkdir", path, lambda real: os.mkdir(real, mode))
        return 0

    @journaled
    def symlink(self, target: str, source: str) -> int:
        """Create the symlink `target` (a path in the mount) pointing to `source`."""
        self._new_entry("symlink", target, lambda real: os.symlink(source, real))
        return 0

    @journaled
    def link(self, target: str, source: str) -> int:
        """Create the hard link `target` to the existing `source`; no new inode is charged."""
        self.faults.gate("link", target, source, mutating=True)
        os.link(self._real(source), self._real(target))
        return 0

    @journaled
    def unlink(self, path: str) -> int:
        self.faults.gate("unlink", path, mutating=True)
        real = self._real(path)
        with self.quota.lock:
            st = os.lstat(real)
            os.unlink(real)
            self._freed(st)
        return 0

    @journaled
    def rmdir(self, path: str) -> int:
        self.faults.gate("rmdir", path, mutating=True)
        real = self._real(path)
        with self.quota.lock:
            st = os.lstat(real)
            os.rmdir(real)
            self._freed(st)
        return 0

    @journaled
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        """rename(2), and renameat2() with RENAME_NOREPLACE; other flags are refused."""
        self.faults.gate("rename", old, new, mutating=True)
        if flags & ~_RENAME_NOREPLACE:
            raise OSError(errno.EINVAL, "only RENAME_NOREPLACE is supported")
        src, dst = self._real(old), self._real(new)
        with self.quota.lock:
            moved = os.lstat(src)
            try:
                replaced: os.stat_result | None = os.lstat(dst)
            except FileNotFoundError:
                replaced = None
            if replaced is not None and flags & _RENAME_NOREPLACE:
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
            os.rename(src, dst)
            if replaced is not None and (replaced.st_dev, replaced.st_ino) != (
                moved.st_dev,
                moved.st_ino,
            ):
                self._freed(replaced)
        return 0

    # -- files -------------------------------------------------------------------------------

    @journaled
    def create(self, path: str, mode: int, flags: int) -> int:
        # The kernel only sends CREATE after a lookup found no such entry, so O_EXCL is what
        # tells a real creation apart (a racing creator of the same name gets EEXIST).
        return self._new_entry(
            "create", path, lambda real: os.open(real, flags | os.O_CREAT | os.O_EXCL, mode)
        )

    @journaled
    def open(self, path: str, flags: int) -> int:
        self.faults.gate("open", path, mutating=bool(flags & _WRITE_FLAGS))
        real = self._real(path)
        if not flags & os.O_TRUNC:
            return os.open(real, flags)
        with self.quota.lock:
            before = _file_bytes(os.stat(real))
            fd = os.open(real, flags)
            self.quota.release(nbytes=before)
        return fd

    @journaled
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self.faults.gate("truncate", path, fh=fh, mutating=True)
        with self.quota.lock:
            if fh is not None:
                before = os.fstat(fh).st_size
                self._check_quota(nbytes=length - before)
                os.ftruncate(fh, length)
            else:
                real = self._real(path)
                before = os.stat(real).st_size
                self._check_quota(nbytes=length - before)
                os.truncate(real, length)
            self.quota.charge(nbytes=length - before)
        return 0

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        self.faults.gate("read", path, fh=fh)
        return os.pread(fh, size, offset)

    @journaled
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        self.faults.gate("write", path, fh=fh, mutating=True)
        with self.quota.lock:  # check, write and charge as one step against concurrent writers
            before = os.fstat(fh).st_size
            self._check_quota(nbytes=offset + len(data) - before)
            written = os.pwrite(fh, data, offset)
            self.quota.charge(nbytes=os.fstat(fh).st_size - before)
        return written

    @journaled
    def flush(self, path: str | None, fh: int) -> int:
        self.faults.gate("flush", path, fh=fh)
        return 0

    @journaled
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self.faults.gate("fsync", path, fh=fh)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    @journaled
    def release(self, path: str | None, fh: int) -> int:
        try:
            self.faults.gate("release", path, fh=fh)
        finally:  # the kernel ignores a failed release: the descriptor must go regardless
            os.close(fh)
            self.faults.forget_handle(fh)
        return 0

    # -- directories -------------------------------------------------------------------------

    @journaled
    def opendir(self, path: str) -> int:
        self.faults.gate("opendir", path)
        return os.open(self._real(path), os.O_RDONLY | os.O_DIRECTORY)

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        self.faults.gate("readdir", path, fh=fh)
        real = self._real(path)
        # An entry with inode 0 is skipped by readdir(3), so "." and ".." need theirs.
        parent = real if path == "/" else os.path.dirname(real)
        entries = [
            (".", {"st_mode": stat.S_IFDIR, "st_ino": os.fstat(fh).st_ino}, 0),
            ("..", {"st_mode": stat.S_IFDIR, "st_ino": os.lstat(parent).st_ino}, 0),
        ]
        with os.scandir(real) as listing:
            for entry in listing:
                entries.append(
                    (entry.name, {"st_mode": _dirent_mode(entry), "st_ino": entry.inode()}, 0)
                )
        return entries

    @journaled
    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        self.faults.gate("fsyncdir", path, fh=fh)
        os.fsync(fh)
        return 0

    @journaled
    def releasedir(self, path: str | None, fh: int) -> int:
        try:
            self.faults.gate("releasedir", path, fh=fh)
        finally:
            os.close(fh)
        return 0


class _FUSE(mfusepy.FUSE):
    """mfusepy's FUSE with two callbacks that keep what mfusepy would lose.

    mfusepy drops the flags of renameat2() (which would turn RENAME_EXCHANGE into a plain
    rename) and folds utimensat()'s timespecs into one number, which loses UTIME_NOW and
    UTIME_OMIT (libfuse leaves their tv_sec uninitialised).
    """

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        decode = self.encoding, self.errors
        return self.operations.rename(old.decode(*decode), new.decode(*decode), flags)

    def utimens_fuse_3(self, path: bytes | None, buf: Any, fip: Any) -> int:
        times = None
        if buf:
            spec = buf.contents
            times = tuple((ts.tv_sec, ts.tv_nsec) for ts in (spec.actime, spec.modtime))
        decoded = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.utimens(decoded, times)


# -- control -----------------------------------------------------------------------------------


class Controller:
    """Carries out control commands on a running :class:`FaultOperations`."""

    def __init__(self, ops: FaultOperations, mountpoint: str) -> None:
        self.ops = ops
        self.mountpoint = mountpoint
        self.commands: dict[str, Callable[..., Any]] = {
            "ping": self.ping,
            "fail": self.fail,
            "delay": self.delay,
            "block": self.block,
            "remove": self.remove,
            "clear": self.ops.faults.clear,
            "rules": self.ops.faults.rules,
            "counts": self.ops.faults.counts,
            "reset_counts": self.ops.faults.reset_counts,
            "journal": self.ops.journal.to_dict,
            "clear_journal": self.ops.journal.clear,
            "quota": self.ops.quota.to_dict,
            "set_quota": self.set_quota,
            "exempt_root": self.exempt_root,
            "rescan": self.rescan,
            "set_statfs": self.set_statfs,
            "statfs": self.ops.statfs_numbers,
            "set_readonly": self.set_readonly,
            "shutdown": self.ops.faults.shutdown,
        }

    def handle(self, line: bytes) -> bytes:
        """One request line in, one reply line out; errors are replies, never exceptions."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict) or not isinstance(request.get("cmd"), str):
                raise ValueError('a request is a JSON object with a "cmd" string')
            command = self.commands.get(request.pop("cmd"))
            if command is None:
                raise ValueError(f"unknown command; known: {sorted(self.commands)}")
            reply = {"ok": True, "result": command(**request)}
        except (ValueError, TypeError, KeyError, OSError) as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return json.dumps(reply).encode() + b"\n"

    def ping(self) -> dict[str, Any]:
        return {
            "libfuse": f"{mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}",
            "pid": os.getpid(),
            "backing": self.ops.root,
            "mountpoint": self.mountpoint,
            "mounted": self.ops.mounted.is_set(),
        }

    def fail(
        self,
        op: str,
        errno: int | str,
        path: str | None = None,
        after: int = 0,
        times: int | None = 1,
        sticky: bool = False,
    ) -> dict[str, int]:
        rule = self.ops.faults.add(
            "fail", op, path=path, errno=errno, after=after, times=times, sticky=sticky
        )
        return {"id": rule.id}

    def delay(
        self,
        op: str,
        seconds: float,
        path: str | None = None,
        after: int = 0,
        times: int | None = None,
    ) -> dict[str, int]:
        rule = self.ops.faults.add(
            "delay", op, path=path, seconds=seconds, after=after, times=times
        )
        return {"id": rule.id}

    def block(
        self, op: str, path: str | None = None, after: int = 0, times: int | None = None
    ) -> dict[str, int]:
        rule = self.ops.faults.add("block", op, path=path, after=after, times=times)
        return {"id": rule.id}

    def remove(self, id: int) -> None:
        self.ops.faults.remove(id)

    def set_quota(self, resource: str, **fields: Any) -> dict[str, Any]:
        self.ops.quota.configure(resource, **fields)
        return self.ops.quota.to_dict()

    def exempt_root(self, exempt: bool = True) -> None:
        self.ops.root_exempt = exempt

    def rescan(self) -> dict[str, Any]:
        self.ops.rescan()
        return self.ops.quota.to_dict()

    def set_statfs(self, fields: dict[str, int]) -> None:
        unknown = set(fields) - set(STATFS_FIELDS)
        if unknown:
            raise ValueError(f"unknown statfs fields {sorted(unknown)}; known: {STATFS_FIELDS}")
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fields.values()
        ):
            raise ValueError("statfs values must be ints >= 0")
        self.ops.statfs_overrides = dict(fields)

    def set_readonly(self, readonly: bool) -> None:
        self.ops.faults.readonly = bool(readonly)


class _ControlHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        try:
            for line in self.rfile:
                self.wfile.write(self.server.controller.handle(line))  # type: ignore[attr-defined]
                self.wfile.flush()
        except (ConnectionResetError, BrokenPipeError):
            return  # the client was killed mid-request (a fake `lfs` past its deadline): no bug


class ControlServer(socketserver.ThreadingUnixStreamServer):
    """The control socket: one thread per connection, so a slow client holds up no other."""

    daemon_threads = True

    def __init__(self, path: str, controller: Controller) -> None:
        self.controller = controller
        old_umask = os.umask(0o077)  # the socket is for its owner only
        try:
            super().__init__(path, _ControlHandler)
        finally:
            os.umask(old_umask)


# -- process -----------------------------------------------------------------------------------


def _watch_for_stop(ops: FaultOperations, mountpoint: str, finished: threading.Event) -> None:
    """Stop cleanly on SIGTERM/SIGHUP or when the parent dies, even with calls blocked.

    libfuse's own handlers would end the session and then wait forever for worker threads
    stuck in blocked calls. So Python handlers are installed first (libfuse then leaves
    those signals alone), the signal is noticed through the wakeup fd while the main thread
    sits in libfuse, and this thread releases every blocked call and detaches the mount,
    which ends the FUSE loop. If something still holds the mount after a few seconds, the
    process exits anyway: the kernel then fails the pending calls with ENOTCONN.
    """
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    signal.set_wakeup_fd(write_end)
    parent = os.getppid()

    def watch() -> None:
        while not finished.is_set():
            ready, _, _ = select.select([read_end], [], [], 0.5)
            if ready or os.getppid() != parent:
                break
        else:
            return
        log.warning("stopping: signal received or parent gone")
        ops.faults.shutdown()
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)
        if not finished.wait(5):
            os._exit(1)

    threading.Thread(target=watch, name="faultfs-stop", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.faultfs", description=__doc__.splitlines()[0]
    )
    parser.add_argument("backing", help="directory whose contents the mount shows")
    parser.add_argument("mountpoint", help="empty directory to mount on")
    parser.add_argument("--control", required=True, help="path of the control socket to create")
    parser.add_argument(
        "--direct-io", action="store_true", help="bypass the page cache (no mmap of files)"
    )
    parser.add_argument(
        "--max-block",
        type=float,
        default=DEFAULT_MAX_HOLD,
        help="let a blocked call go after this many seconds, with an error in the log",
    )
    # libfuse 3.14.0 ignores this (it starts threads as needed); later versions default to 10.
    parser.add_argument(
        "--hidden-removes",
        action="store_true",
        help="keep a file removed while open as .fuse_hidden* until its last close (as NFS does)",
    )
    parser.add_argument("--max-threads", type=int, default=64, help="libfuse worker threads")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output on stderr")
    args = parser.parse_args(argv)
    if mfusepy.fuse_version_major != 3:
        parser.error(
            f"mfusepy loaded libfuse {mfusepy.fuse_version_major}, this filesystem needs 3: "
            "set FUSE_LIBRARY_NAME=fuse3 (tests.support.faultmount does)"
        )

    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="faultfs %(levelname)s %(name)s: %(message)s",
    )
    os.umask(0)  # modes come from the caller, already masked by the kernel
    mountpoint = os.path.realpath(args.mountpoint)
    ops = FaultOperations(args.backing, args.max_block)
    server = ControlServer(args.control, Controller(ops, mountpoint))
    threading.Thread(target=server.serve_forever, name="faultfs-control", daemon=True).start()
    finished = threading.Event()
    _watch_for_stop(ops, mountpoint, finished)
    try:
        _FUSE(
            ops,
            mountpoint,
            foreground=True,
            debug=args.debug,
            fsname="faultfs",
            subtype="faultfs",
            allow_other=True,  # tests may run a writer as another user
            default_permissions=True,  # then the kernel checks modes, as a real filesystem
            auto_unmount=True,  # a killed daemon leaves no dead mount behind
            # No .fuse_hidden files unless asked: they would skew quota and listings.
            hard_remove=not args.hidden_removes,
            use_ino=True,
            attr_timeout=0,  # every stat reaches the rules, none is answered from a cache
            entry_timeout=0,
            negative_timeout=0,
            max_threads=args.max_threads,
            direct_io=args.direct_io,
        )
    finally:
        # The control threads are daemons and end with the process; waiting for them to
        # notice a shutdown would only cost their poll interval.
        finished.set()
        ops.faults.shutdown()
        os.unlink(args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
