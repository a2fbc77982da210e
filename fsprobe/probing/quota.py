"""The quota probe: the quota of every ID a new file in the target is charged to (§4).

All `lfs` calls of one probe share one deadline; `lfs quota` is asked as who probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fsprobe.lustre.caches import LustreCaches
from fsprobe.lustre.provider import LustreQuotaProvider
from fsprobe.model import Mount, QuotaReport
from fsprobe.posix.identity import Identity
from fsprobe.probing.mounts import find_mount
from fsprobe.probing.target import OWNER, open_target
from fsprobe.quota.ids import resolve_ids
from fsprobe.quota.provider import Deadline, QuotaProvider, QuotaRequest, assemble
from fsprobe.quota.settings import PROVIDER_CHOICES, ServerProbeSettings

#: By --quota-provider name, made with the caches they keep their answers in; "auto" tries
#: them in this order. New filesystems go here.
PROVIDERS: dict[str, Callable[[LustreCaches], QuotaProvider]] = {"lfs": LustreQuotaProvider}


def select_provider(
    settings: ServerProbeSettings, mount: Mount | None, caches: LustreCaches
) -> QuotaProvider | None:
    """The provider that `settings` asks for, or that fits `mount` for "auto"; None for none."""
    choice = settings.provider
    if choice == "none":
        return None
    if choice == "auto":
        providers = (make(caches) for make in PROVIDERS.values())
        return next((p for p in providers if p.applies_to(mount)), None)
    if choice not in PROVIDERS:
        known = ", ".join(PROVIDER_CHOICES)
        raise ValueError(f"unknown quota provider {choice!r} (known: {known})")
    return PROVIDERS[choice](caches)


@dataclass(frozen=True)
class QuotaLookup:
    """A quota probe with its context, as `fsprobe quota` shows it.

    `provider` and `report` are None when no provider applies (not Lustre, or provider none).
    """

    path: str
    directory: str
    mount: Mount | None
    provider: str | None
    report: QuotaReport | None


def locate(target: str, probe_as: str = OWNER) -> tuple[str, Mount | None, Identity]:
    """The existing directory that stands in for `target`, its mount, and who probes it."""
    with open_target(target, probe_as) as directory:
        return directory.path, find_mount(directory.path), directory.identity


def lookup_quota(
    target: str,
    settings: ServerProbeSettings,
    probe_as: str = OWNER,
    *,
    caches: LustreCaches,
) -> QuotaLookup:
    """Read the quota of `target`; raises as `probe_quota` does when nothing could be read.
    Answers are kept in `caches`."""
    directory, mount, identity = locate(target, probe_as)
    provider = select_provider(settings, mount, caches)
    if provider is None:
        return QuotaLookup(target, directory, mount, None, None)
    deadline = Deadline.after(settings.timeout)
    ids = resolve_ids(
        directory,
        user=settings.user,
        group=settings.group,
        project=settings.project,
        project_fallback=lambda path: provider.project(path, settings, deadline),
        writer=identity,
    )
    request = QuotaRequest(directory, mount, ids.queries(), settings, deadline, identity)
    reading = provider.read(request)
    report = assemble(provider.name, reading, ids.errors, ids.notes)
    return QuotaLookup(target, directory, mount, provider.name, report)


def probe_quota(
    target: str,
    settings: ServerProbeSettings,
    probe_as: str = OWNER,
    *,
    caches: LustreCaches,
) -> QuotaReport | None:
    """The quota report of `target`; None when no provider applies.

    Raises ProbeFailure when no ID could be read: ENOENT for a missing `lfs` (the message says
    how to name it), the errno name of lfs's exit status, TIMEOUT, E2BIG or PARSE; OSError when
    the target itself cannot be reached. A partial result is returned with `errors` (and
    `inaccurate`) set.
    """
    return lookup_quota(target, settings, probe_as, caches=caches).report
