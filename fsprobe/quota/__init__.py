"""Quota that applies to a target directory: which IDs, which provider, and their settings.

`QuotaSettings` configures it; `fsprobe.probing.quota.probe_quota` is the entry point; providers
implement `fsprobe.quota.provider.QuotaProvider` (Lustre's `lfs` first).
"""

from __future__ import annotations

from fsprobe.quota.settings import PROVIDER_CHOICES, QuotaSettings

__all__ = ["PROVIDER_CHOICES", "QuotaSettings"]
