"""Framework integrations, each importing its framework only when used.

- `fsprobe.integrations.lightning.FsprobeCheckpointIO`: a Lightning ``CheckpointIO`` plugin that
  saves through `fsprobe.atomic_write` (retry, redirect, stale-temp cleanup);
- `fsprobe.integrations.transformers.FsprobeCallback`: a Hugging Face ``TrainerCallback`` that
  runs the preflight before each save step and reports what it found.
"""
