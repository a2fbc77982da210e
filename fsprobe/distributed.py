"""Collective saves for jobs of many ranks: ``fsprobe.distributed.save_dir``.

See docs/design.md §6 and §7.

::

    import fsprobe.distributed

    def write(staging_dir):  # every rank writes its own shard
        path = os.path.join(staging_dir, f"shard-{rank}.pt")
        with open(path, "wb") as stream:  # a file object: a failed write keeps its errno
            torch.save(model.state_dict(), stream)
        return [path]  # the files this rank wrote: this rank fsyncs them

    fsprobe.distributed.save_dir("/lustre/run7/step-1000", write)  # on every rank

Importing this module imports `torch.distributed`; `import fsprobe` alone does not.
"""

from __future__ import annotations

from fsprobe.saving.distributed import save_dir

__all__ = ["save_dir"]
