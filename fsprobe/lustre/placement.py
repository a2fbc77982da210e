"""Where a new checkpoint in a directory can land: its layout's pools and their OSTs, and the
MDTs its inode can be created on (where there are several), cached.

Asked by the quota and `lfs df` probes, never by a save; its costs: docs/reference.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.dirstripe import parse_dirstripe
from fsprobe.lustre.layout import Layout, parse_layout
from fsprobe.lustre.pools import (
    OLDEST_VERSION,
    POOL_QUOTA_VERSION,
    fsname_from_mount,
    parse_getname_instance,
    parse_pool_members,
    parse_printed_version,
    too_old,
)
from fsprobe.lustre.runner import run_lfs
from fsprobe.model import TIMEOUT, LustreTarget, Mount
from fsprobe.quota.cache import SingleFlight
from fsprobe.quota.provider import Deadline
from fsprobe.quota.settings import ServerProbeSettings

#: How long a version answer is kept: an `lfs` binary is replaced only by an upgrade.
VERSION_SECONDS = 3600.0


@dataclass(frozen=True)
class Placement:
    """A directory's default layout and the OSTs of each pool it names."""

    layout: Layout
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def pools_of(self, ost: str) -> tuple[str, ...]:
        """The layout's pools that hold `ost` (a name without ``_UUID``)."""
        return tuple(pool for pool in self.layout.pools if ost in self.members.get(pool, ()))

    def reaches(self, ost: str) -> bool:
        """Whether a new file's data can land on `ost`."""
        return self.layout.anywhere or bool(self.pools_of(ost))

    def mark(self, targets: tuple[LustreTarget, ...]) -> tuple[LustreTarget, ...]:
        """`targets` with each OST's pools and whether the layout reaches it."""
        return tuple(
            replace(t, pools=self.pools_of(t.name), in_layout=self.reaches(t.name))
            if t.kind == "OST"
            else t
            for t in targets
        )


def meets_mdt(index: int, mdts: frozenset[int] | None) -> bool:
    """Whether a new file in a directory on `mdts` meets MDT `index`: its inode goes to one of
    them, and every path lookup starts at the root, on MDT0000 (all count where `mdts` is not
    known)."""
    return mdts is None or index == 0 or index in mdts


def _filesystem_key(directory: str, mount: Mount | None) -> object:
    return (mount.device, mount.mountpoint) if mount is not None else directory


class Placements:
    """Reads placements and remembers them, for every target whose probes share this instance."""

    def __init__(self) -> None:
        self._layouts: SingleFlight[Layout | ProbeFailure] = SingleFlight()
        self._names: SingleFlight[tuple[str, str] | ProbeFailure] = SingleFlight()
        self._members: SingleFlight[frozenset[str] | ProbeFailure] = SingleFlight()
        self._versions: SingleFlight[tuple[tuple[int, int], str] | ProbeFailure] = SingleFlight()
        self._mdts: SingleFlight[frozenset[int] | ProbeFailure] = SingleFlight()

    def clear(self) -> None:
        for cache in (self._layouts, self._names, self._members, self._versions, self._mdts):
            cache.clear()

    def _get(self, cache: SingleFlight, key: object, compute, ttl: float, deadline: Deadline):
        try:
            value = cache.get(key, compute, ttl=ttl, wait=deadline.remaining())
        except TimeoutError:
            raise ProbeFailure(TIMEOUT, "another probe's lfs call was still running") from None
        if isinstance(value, ProbeFailure):
            raise value.again()
        return value

    @staticmethod
    def _run(args: tuple[str, ...], binary: str, deadline: Deadline, parse):
        """Run lfs and parse; failures are returned (they are cached and shared), not raised."""
        try:
            return parse(run_lfs(args, binary=binary, timeout=deadline.remaining()))
        except (OSError, ProbeFailure) as error:
            return ProbeFailure.of(error)

    def read(
        self,
        directory: str,
        mount: Mount | None,
        binary: str,
        settings: ServerProbeSettings,
        deadline: Deadline,
    ) -> Placement:
        """The placement of new files in `directory`; ProbeFailure when it cannot be read."""
        ttl = max(settings.cache_seconds, settings.timeout)
        layout = self._layout(directory, binary, ttl, deadline)
        root = mount.mountpoint if mount is not None else None
        if layout.inherits_pool and root is not None and root != directory:
            inherited = self._layout(root, binary, ttl, deadline)
            if not inherited.composite and inherited.pools:
                layout = inherited  # the root's plain default names the pool new files get
        if not layout.pools:
            return Placement(layout)
        filesystem = _filesystem_key(directory, mount)
        fsname = (
            fsname_from_mount(mount) or self.instance(directory, mount, binary, ttl, deadline)[0]
        )
        members = {
            pool: self._get(
                self._members,
                (filesystem, pool, binary),
                lambda pool=pool: self._run(
                    ("pool_list", f"{fsname}.{pool}"),
                    binary,
                    deadline,
                    lambda run, pool=pool: parse_pool_members(run, fsname, pool),
                ),
                ttl,
                deadline,
            )
            for pool in layout.pools
        }
        return Placement(layout, members)

    def known_mdts(
        self, directory: str, binary: str, ttl: float, deadline: Deadline
    ) -> frozenset[int] | None:
        """The MDTs a new file's inode in `directory` can go to (``lfs getdirstripe``); None
        when they cannot be read (a hung filesystem's TIMEOUT is raised)."""
        try:
            return self._get(
                self._mdts,
                (directory, binary),
                lambda: self._run(("getdirstripe", directory), binary, deadline, parse_dirstripe),
                ttl,
                deadline,
            )
        except ProbeFailure as failure:
            if failure.error == TIMEOUT:
                raise
            return None

    def instance(
        self, directory: str, mount: Mount | None, binary: str, ttl: float, deadline: Deadline
    ) -> tuple[str, str]:
        """(fsname, instance) of the mount of `directory` (``lfs getname``, no RPC)."""
        return self._get(
            self._names,
            (_filesystem_key(directory, mount), binary),
            lambda: self._run(("getname", directory), binary, deadline, parse_getname_instance),
            ttl,
            deadline,
        )

    def _layout(self, directory: str, binary: str, ttl: float, deadline: Deadline) -> Layout:
        return self._get(
            self._layouts,
            (directory, binary),
            lambda: self._run(("getstripe", "-d", "-y", directory), binary, deadline, parse_layout),
            ttl,
            deadline,
        )

    def version(self, binary: str, deadline: Deadline) -> tuple[tuple[int, int], str]:
        """(major, minor) of this `lfs` and the version as printed; ProbeFailure when it
        cannot tell."""
        return self._get(
            self._versions,
            binary,
            lambda: self._run(("--version",), binary, deadline, parse_printed_version),
            VERSION_SECONDS,
            deadline,
        )

    def check_supported(self, binary: str, deadline: Deadline) -> None:
        """Raise the `too_old` failure for an `lfs` before 2.10; one whose version cannot be
        read is tried (its output says the rest)."""
        try:
            version, printed = self.version(binary, deadline)
        except ProbeFailure as failure:
            if failure.error == TIMEOUT:
                raise
            return
        if version < OLDEST_VERSION:
            raise too_old(printed)

    def has_pool_quotas(self, binary: str, deadline: Deadline) -> bool:
        """Whether this `lfs` takes ``quota --pool`` (2.14+); ProbeFailure when it cannot tell."""
        return self.version(binary, deadline)[0] >= POOL_QUOTA_VERSION
