"""Redirected checkpoints: where they go, where they are, how they come home.

`fallback`, `manifest`, `locate`, `sync` (with `copies`, and `delegate` for root). Imports
nothing of `fsprobe.saving` (docs/design.md §3).
"""
