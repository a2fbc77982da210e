"""Durability asserted, not assumed: what the fault filesystem's journal says a save did.

A save is durable when a crash at any moment leaves the final name with either the old content
or the whole new one, and a finished save survives a crash right after it returns. For content
published by a rename that takes, in this order (docs/design.md §7):

1. every file of the new content fsynced after its last write (else the rename can reach the
   disk before the data, and a crash leaves a name pointing at zeros);
2. every new directory of it fsynced after its last entry changed (a directory save);
3. the rename over the final name;
4. the directory holding the final name fsynced (else the rename itself may be undone).

Counting fsync calls cannot tell step 1 done on the wrong file, or after the rename, from the
real thing; the journal (:mod:`tests.support.journal`) keeps the order. Use::

    faultfs.ctl.clear_journal()
    fsprobe.save(obj, faultfs.mountpoint / "ckpt" / "model.pt")
    assert_file_saved(faultfs, faultfs.mountpoint / "ckpt" / "model.pt")

    assert_directory_saved(faultfs, faultfs.mountpoint / "ckpt" / "checkpoint-100")

Both check the *last* rename onto the final name and return it, so a test with failed attempts
before the one that succeeded checks the attempt that counts. The checks themselves are plain
functions of a list of :class:`Call` (``check_file_published``, ``check_directory_published``),
so that tests/saving/test_durability_helper.py can show each rule failing on a journal that
breaks it.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .faultctl import FaultControl

#: Calls that change a file's content (after them, the data needs another fsync).
_CONTENT_OPS = frozenset({"write", "truncate", "create"})
#: Calls that change a directory's entries (after them, the directory needs another fsync).
_ENTRY_OPS = frozenset({"create", "mknod", "mkdir", "symlink", "link", "unlink", "rmdir"})


class NotDurable(AssertionError):
    """The journal shows a save that a crash could lose or tear."""


@dataclass(frozen=True)
class Call:
    """One journaled call: its place in the sequence, the operation, its paths, its errno."""

    index: int
    op: str
    paths: tuple[str, ...]
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    def __str__(self) -> str:
        outcome = "ok" if self.ok else self.error
        return f"#{self.index} {self.op}({', '.join(self.paths)}) -> {outcome}"


class _Mounted(Protocol):
    mountpoint: Path
    ctl: FaultControl


def read_journal(fs: _Mounted) -> list[Call]:
    """The filesystem's journal as calls; refuses a journal that dropped its oldest entries."""
    journal = fs.ctl.journal()
    if journal["dropped"]:
        raise NotDurable(
            f"the journal dropped {journal['dropped']} calls: clear it closer to the save"
        )
    return [
        Call(index, op, tuple(paths), error)
        for index, (op, paths, error) in enumerate(journal["entries"])
    ]


def inside(fs: _Mounted, path: str | os.PathLike[str]) -> str:
    """`path` (absolute, under the mount) as the filesystem names it: ``/ckpt/model.pt``."""
    relative = Path(os.path.abspath(path)).relative_to(fs.mountpoint)
    return "/" + relative.as_posix() if relative.parts else "/"


def _is_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _moved(path: str, old: str, new: str) -> str:
    """`path` after a rename of `old` to `new` (`path` is `old` or lies under it)."""
    return new + path[len(old) :]


def _explain(calls: Iterable[Call], message: str) -> NotDurable:
    listing = "\n".join(f"  {call}" for call in calls)
    return NotDurable(f"{message}\njournal:\n{listing}")


def last_rename_onto(calls: list[Call], final: str) -> Call:
    """The last successful rename whose destination is `final`.

    A hard link onto `final` publishes a file just as a rename does (sync-back links its copy
    in, because link(2) never replaces a newer save); it is returned as ``(source, final)``.
    """
    for call in reversed(calls):
        if call.op == "rename" and call.ok and call.paths[1] == final:
            return call
        if call.op == "link" and call.ok and call.paths[0] == final:
            return Call(call.index, call.op, (call.paths[1], final), call.error)
    raise _explain(calls, f"nothing was renamed onto {final}")


def _check_directory_synced_after(calls: list[Call], rename: Call) -> None:
    parent = posixpath.dirname(rename.paths[1])
    for call in calls[rename.index + 1 :]:
        if call.op == "fsyncdir" and call.ok and call.paths[0] == parent:
            return
    raise _explain(calls, f"{parent} was not fsynced after {rename}: a crash can undo the rename")


def check_rename_durable(calls: list[Call], rename: Call) -> None:
    """The file renamed by `rename` was fsynced after its last change and before the rename,
    and the destination's directory was fsynced after it."""
    source = rename.paths[0]
    synced = False
    for call in calls[: rename.index]:
        if call.paths[:1] != (source,):
            continue
        if call.op in _CONTENT_OPS:
            synced = False
        elif call.op == "fsync" and call.ok:
            synced = True
    if not synced:
        raise _explain(
            calls,
            f"{source} was not fsynced after its last write and before {rename}: "
            "a crash can leave the final name with a torn file",
        )
    _check_directory_synced_after(calls, rename)


def check_file_published(calls: list[Call], final: str) -> Call:
    """Steps 1, 3 and 4 for a file published at `final`; returns the rename."""
    rename = last_rename_onto(calls, final)
    check_rename_durable(calls, rename)
    return rename


class _Tree:
    """What in a staging tree still needs a fsync: files by content, directories by entries.

    Each maps a path to the call that left it unsynced, for the message.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.files: dict[str, Call] = {}
        self.dirs: dict[str, Call] = {}

    def entry_changed(self, path: str, call: Call) -> None:
        if path != self.root:  # the root's own entry is in the final parent, synced after
            self.dirs[posixpath.dirname(path)] = call

    def moved(self, call: Call) -> None:
        old, new = call.paths
        for dirty in (self.files, self.dirs):
            for name in [name for name in dirty if _is_under(name, old)]:
                since = dirty.pop(name)
                if _is_under(_moved(name, old, new), self.root):
                    dirty[_moved(name, old, new)] = since
        for side in (old, new):
            if _is_under(side, self.root):
                self.entry_changed(side, call)

    def apply(self, call: Call) -> None:
        if call.op == "rename":
            if call.ok:
                self.moved(call)
            return
        path = call.paths[0]
        if call.op in _CONTENT_OPS:  # even a failed write may have written part
            self.files[path] = call
        if not call.ok:
            return
        if call.op == "mkdir":
            self.dirs[path] = call
        if call.op in _ENTRY_OPS:
            self.entry_changed(path, call)
        if call.op in ("unlink", "rmdir"):
            self.files.pop(path, None)
            self.dirs.pop(path, None)
        elif call.op == "fsync":
            self.files.pop(path, None)
        elif call.op == "fsyncdir":
            self.dirs.pop(path, None)


def check_directory_published(calls: list[Call], final: str) -> Call:
    """Steps 1 to 4 for a directory published at `final` (renamed from a staging directory).

    Follows every file and directory of the staging tree through the journal up to the
    rename: each file must be fsynced after its last write, each directory after its last
    entry changed; renames inside the tree carry that state along, unlinks drop it.
    """
    rename = last_rename_onto(calls, final)
    tree = _Tree(rename.paths[0])
    for call in calls[: rename.index]:
        if any(_is_under(path, tree.root) for path in call.paths):
            tree.apply(call)
    problems = [f"file {path} not fsynced after {since}" for path, since in tree.files.items()]
    problems += [f"directory {path} not fsynced after {since}" for path, since in tree.dirs.items()]
    if problems:
        raise _explain(calls, f"{tree.root} renamed onto {final} but: " + "; ".join(problems))
    _check_directory_synced_after(calls, rename)
    return rename


def assert_file_saved(fs: _Mounted, final: str | os.PathLike[str]) -> Call:
    """The file at `final` (a path under `fs.mountpoint`) was published durably."""
    return check_file_published(read_journal(fs), inside(fs, final))


def assert_directory_saved(fs: _Mounted, final: str | os.PathLike[str]) -> Call:
    """The directory at `final` (a path under `fs.mountpoint`) was published durably."""
    return check_directory_published(read_journal(fs), inside(fs, final))
