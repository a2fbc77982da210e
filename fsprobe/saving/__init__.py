"""The save inside the trainer: everything between a save call and a checkpoint it can resume from.

- `options` (`SaveOptions`, checked when made); `preflight` (can the target take it now; if
  not, wait or where to) and its `SaveContext`, what a process keeps between saves;
- a save: `file` (one file: `fsprobe.save`, `atomic_write`), `directory` (a directory committed
  whole, through `fsprobe.posix.staging`), `distributed` (one directory written by many ranks),
  `background` with `cpu_copy` (`save_async`, on the context's `writers`); every kind runs its
  attempts through the one loop of `retry` (errno classes, backoff, redirect) and may be
  bounded by `deadline` (`save_timeout`); `stale` cleans up after crashed saves, only what it
  can prove is theirs; `commit` names what the integrations use.

Where a redirected save goes and how it comes back is `fsprobe.redirect`'s. The policy
(`fsprobe.policy`) is the only judge of a target's health here too; this package only acts on
its verdicts.
"""
