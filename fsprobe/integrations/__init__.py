"""Framework integrations, each importing its framework only when used.

- `fsprobe.integrations.lightning.FsprobeCheckpointIO`: a Lightning ``CheckpointIO`` plugin that
  saves through `fsprobe.atomic_write` (retry, redirect, stale-temp cleanup);
- `fsprobe.integrations.transformers.protect`: a Hugging Face ``Trainer`` whose
  ``checkpoint-N/`` directories are saved through `fsprobe.save_dir` (staged, committed whole,
  retried, redirected), one process or many;
- `fsprobe.integrations.transformers.FsprobeCallback`: a Hugging Face ``TrainerCallback`` that
  runs the preflight before each save step and reports what it found;
- `fsprobe.integrations.dcp`: PyTorch Distributed Checkpoint through `FsprobeWriter`;
- `fsprobe.integrations.returnn.protect`: RETURNN's epoch saves through `fsprobe.save`, and its
  resume finding redirected epochs (one call from the config).
"""
