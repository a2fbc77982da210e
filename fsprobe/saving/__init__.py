"""The save path: preflight, atomic writes with retry and redirect, fallbacks and sync-back."""
