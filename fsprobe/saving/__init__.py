"""The save path: everything between a trainer's save call and a checkpoint it can resume from.

- before: `preflight` (can the target take it now; if not, wait or where to), `fallback` (which
  fallback directories, and the user's own area in one);
- a save: `file` (one file: `fsprobe.save`, `atomic_write`), `directory` with `tree` and `swap`
  (a directory committed whole), `distributed` (one directory written by many ranks),
  `background` with `snapshot` (`save_async`); every kind runs its attempts through `retry`
  (errno classes, backoff, redirect) and may be bounded by `deadline` (`save_timeout`);
- after: `manifest` (where redirected checkpoints went, per user), `resume` (`locate`: the newest
  copy), `sync` (bringing copies home, never over a newer checkpoint), with `delegate` when root
  does it for a user; `stale` cleans up after crashed saves, only what it can prove is theirs.

The policy (`fsprobe.policy`) is the only judge of a target's health here too; this package
only acts on its verdicts.
"""
