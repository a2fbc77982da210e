"""Exit statuses beyond the health statuses 0-3 (ok, degraded, unhealthy, unknown)."""

#: A usage error: a bad option, a bad config file (sysexits EX_USAGE).
EXIT_USAGE = 64
#: The command cannot do its work here: address in use, state dir not ours, a second writer
#: (sysexits EX_UNAVAILABLE).
EXIT_UNAVAILABLE = 69
#: The daemon's scheduler died of a bug: restart it (sysexits EX_SOFTWARE).
EXIT_SOFTWARE = 70
