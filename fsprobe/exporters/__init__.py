"""What Prometheus sees: metrics built from the daemon's view of each target, and their serving.

`view` (`TargetView`, one target as the daemon last saw it, which it also writes into the
state file), `metrics` (the families, as data), `exposition` (the text, encoded once per
change), `server` with `webconfig` and `auth`, `textfile`. They see views only
(tests/package/test_layout.py).
"""
