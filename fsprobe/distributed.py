"""Collective saves for jobs of many ranks: ``fsprobe.distributed.save_dir`` (docs/saving.md).

Importing this module imports `torch.distributed`; `import fsprobe` alone does not.
"""

from __future__ import annotations

from fsprobe.saving.distributed import save_dir

__all__ = ["save_dir"]
