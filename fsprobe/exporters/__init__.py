"""What Prometheus sees: metrics built from the daemon's view of each target, and their serving.

- `view` is the immutable picture of one target the daemon hands over; the exporters see nothing
  else, never a probe, `lfs` or the save path (tests/test_layout.py holds that rule);
- `metrics` turns views into the metric families of the contract, as plain data;
- `exposition` encodes them in the text format once per change, so a scrape only sends bytes;
- `server` serves ``/metrics`` (one event loop thread, bounded connections, time and memory),
  with TLS and basic auth from `webconfig` and `auth`; `textfile` writes the same text for
  node_exporter's textfile collector.
"""
