"""Every MDT and OST of a filesystem from ``lfs df -v`` and ``lfs df -i -v``, cached per fs."""

from __future__ import annotations

import shlex

from fsprobe.errors import ProbeFailure
from fsprobe.lustre.df_parser import parse_df
from fsprobe.lustre.df_targets import merge_targets, pick_block
from fsprobe.lustre.runner import run_lfs
from fsprobe.model import TIMEOUT, LustreTarget, Mount
from fsprobe.quota.cache import SingleFlight
from fsprobe.quota.provider import Deadline
from fsprobe.quota.settings import ServerProbeSettings


def lfs_df_applies(settings: ServerProbeSettings, mount: Mount | None) -> bool:
    """On Lustre with provider auto, or anywhere when `lfs` is forced (provider lfs)."""
    if settings.provider == "lfs":
        return True
    return settings.provider == "auto" and mount is not None and mount.fstype == "lustre"


def _read(
    directory: str, mountpoint: str | None, binary: str, deadline: Deadline
) -> tuple[LustreTarget, ...] | ProbeFailure:
    """Run both `lfs df` and merge them; failures are returned (they are cached and shared)."""
    blocks = []
    try:
        for args in (("df", "-v", directory), ("df", "-i", "-v", directory)):
            run = run_lfs(args, binary=binary, timeout=deadline.remaining())
            output = parse_df(run.stdout, run.stderr, run.status)
            command = shlex.join(("lfs", *args))
            blocks.append(pick_block(output, mountpoint, command, directory))
        return merge_targets(blocks[0], blocks[1])
    except (OSError, ProbeFailure) as error:
        return ProbeFailure.of(error)


def read_targets(
    directory: str,
    mount: Mount | None,
    binary: str,
    settings: ServerProbeSettings,
    deadline: Deadline,
    cache: SingleFlight[tuple[LustreTarget, ...] | ProbeFailure],
) -> tuple[LustreTarget, ...]:
    """Every MDT and OST of the filesystem of `directory`, from `cache` or from `lfs df`.

    Raises ProbeFailure (ENOENT for a missing `lfs`, the errno name of the exit status, TIMEOUT,
    E2BIG, PARSE) when the tables cannot be read.
    """
    mountpoint = mount.mountpoint if mount is not None else None
    key = ((mount.device, mount.mountpoint) if mount else directory, binary)
    try:
        result = cache.get(
            key,
            lambda: _read(directory, mountpoint, binary, deadline),
            ttl=settings.cache_seconds,
            wait=deadline.remaining(),
        )
    except TimeoutError:
        raise ProbeFailure(TIMEOUT, "lfs df: another probe's call was still running") from None
    if isinstance(result, ProbeFailure):
        raise result.again()
    return result
