"""Redirected checkpoints: where they go, where they are, how they come home.

The save path (`fsprobe.saving`) calls `fallback` (the fallback directories, and the user's own
area in one) and `manifest` (an entry per redirected save, with its sha256); `locate` finds the
newest committed copy for a resume; `sync` copies copies back once their target can take them
(`copies`: bounded, owner-checked), never over a newer checkpoint, and root does it for each user
as that user (`delegate`). This package imports nothing of `fsprobe.saving`: the sync is told
whether a target is ready (`sync.Readiness`) by its caller.
"""
