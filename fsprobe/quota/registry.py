"""The known quota providers, and the choice among them for a target's filesystem."""

from __future__ import annotations

from fsprobe.probing.mounts import Mount
from fsprobe.quota.lustre import LustreQuotaProvider
from fsprobe.quota.provider import QuotaProvider
from fsprobe.quota.settings import PROVIDER_CHOICES, ServerProbeSettings

#: By --quota-provider name; "auto" tries them in this order. New filesystems go here.
PROVIDERS: dict[str, QuotaProvider] = {"lfs": LustreQuotaProvider()}


def select_provider(settings: ServerProbeSettings, mount: Mount | None) -> QuotaProvider | None:
    """The provider that `settings` asks for, or that fits `mount` for "auto"; None for none."""
    choice = settings.provider
    if choice == "none":
        return None
    if choice == "auto":
        return next((p for p in PROVIDERS.values() if p.applies_to(mount)), None)
    if choice not in PROVIDERS:
        known = ", ".join(PROVIDER_CHOICES)
        raise ValueError(f"unknown quota provider {choice!r} (known: {known})")
    return PROVIDERS[choice]
