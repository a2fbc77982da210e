"""`fsprobe run`: the long-lived process that probes targets on a timetable and publishes.

`config` → `scheduler` (on `schedule`) → `store` → `publish`; `tasks` and `readiness` for
redirected checkpoints; `lifecycle` starts, reloads and stops; `logs` logs. docs/design.md §8.
"""
