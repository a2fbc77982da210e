"""Operating-system primitives that know nothing of checkpoints' policy.

`atomic` (temp names, `TempFile`, publishing a file), `outputdir` (a directory fsprobe
publishes into, opened once), `staging` (a directory published in one rename) with `swap`
(exchange, rename without replacing) and `tree` (walking a directory from its descriptor:
fsync, measure, hash, remove), `owned` (opening through a user's own directories only), `paths`
(path predicates), `children` (the processes fsprobe starts and the orphans they leave),
`identity` (who a probe acts as, and how a program started for it becomes that user).
Everything here works from descriptors, never through a path a symlink could redirect, and
imports nothing of fsprobe outside this folder.
"""
