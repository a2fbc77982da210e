"""Quota that applies to a target directory: which IDs, which provider, and their settings.

`ServerProbeSettings` configures it (and `lfs df`); `fsprobe.probing.quota.probe_quota` is the
entry point; providers implement `fsprobe.quota.provider.QuotaProvider` (Lustre's `lfs` first).
"""

from __future__ import annotations

from fsprobe.quota.settings import PROVIDER_CHOICES, ServerProbeSettings

__all__ = ["PROVIDER_CHOICES", "ServerProbeSettings"]
