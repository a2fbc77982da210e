"""`fsprobe run`: the long-lived process that probes targets on a timetable and publishes.

How the pieces meet, in the order a probe result travels:

- `config` reads the TOML file, `FSPROBE_*` variables and flags into one checked `Config`;
- `schedule` is the pure timetable (intervals with jitter); `scheduler` is the one thread that
  starts probes on it through `fsprobe.probing.runner` and never waits for one;
- `tasks` is the work that is not a probe (sync-back, pending bytes): own schedule, own deadline,
  never judged by the policy's staleness rule; `readiness` says when a target may take a
  redirected checkpoint back;
- `store` keeps the latest results per target and asks `fsprobe.policy` for the verdict;
- `publish` writes the state file, the textfile and the scrape cache after each batch;
- `lifecycle` starts, reloads and stops the whole (signals, the state dir's writer lock);
  `logs` is its one-event-per-line log.

Nothing outside this package imports it (tests/test_layout.py holds that rule).
"""
