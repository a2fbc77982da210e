"""Compressed time for the on-call scenarios (tests/deploy/test_deploy_week.py).

`SCALE` times faster than real time, alike everywhere: every `for:`, range, horizon and
threshold in seconds of the shipped rules (`scaled_rules`), every timer of the shipped
Alertmanager configuration (`scaled_alertmanager`), Prometheus' own timers (`PROMETHEUS_FLAGS`:
scrape and evaluation every compressed minute, the lookback, the `for:` state restored after a
restart), the textfile's age node_exporter reports, and the daemon's probe intervals
(`daemon_defaults`). At 60, a minute is a second. Not compressed alike: how long a restart
takes (real), and a probe's deadline. The deadline (10 s by default, 0.17 s at 60)
is `DEADLINE`: long enough for a loaded machine, and, as the default is, shorter than three
intervals of the most frequent probes (statvfs and imports), so that a hung mount is stuck
before its probes are stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from fsprobe.daemon.config import REDIRECT_INTERVAL
from fsprobe.policy import DEFAULT_INTERVALS, Policy
from tests.support.alertmanager import Webhook, pointed_at

#: How many times faster than real time the scenarios run.
SCALE = 60
#: Prometheus at compressed time: Prometheus' defaults (1 m evaluation, 5 m lookback, 1 m
#: resend, `for:` state kept through a 1 h outage, 10 m grace after a restart) scaled; a
#: 1 m scrape interval, as common for node exporters, likewise.
PROMETHEUS_FLAGS = (
    "--query.lookback-delta=5s",
    "--rules.alert.for-outage-tolerance=60s",
    "--rules.alert.for-grace-period=10s",
)

#: The probes' deadline, in real seconds (see above).
DEADLINE = 0.5

_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = r"(\d+)(ms|s|m|h|d)"


def _scaled(amount: str, unit: str) -> str:
    """A Prometheus duration `SCALE` times shorter, in milliseconds."""
    return f"{round(int(amount) * _UNIT[unit] * 1000 / SCALE)}ms"


#: A number in an expression, outside a range selector, not part of a name: one of 60 or more
#: may be a length of time in seconds.
_SECONDS = re.compile(r"(?<![\w.\[])(\d+(?:\.\d+)?)(?![\w\]])")


def _exprs(text: str) -> list[str]:
    groups = yaml.safe_load(text)["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def scaled_rules(shipped: Path, directory: Path) -> Path:
    """The rule file `shipped` with every duration `SCALE` times shorter, written into
    `directory`: `for:` and `keep_firing_for:`, range selectors and subqueries (also those in
    the descriptions' queries), and the lengths of time written in seconds (``24 * 3600``, the
    textfile's ``> 600``). Fails on a duration it does not know how to scale."""
    text = shipped.read_text(encoding="utf-8")
    text = re.sub(
        rf"^(\s+(?:keep_firing_)?for:) {_DURATION}$",
        lambda m: f"{m[1]} {_scaled(m[2], m[3])}",
        text,
        flags=re.MULTILINE,
    )
    text = re.sub(
        rf"\[{_DURATION}(?::{_DURATION})?\]",
        lambda m: f"[{_scaled(m[1], m[2])}" + (f":{_scaled(m[3], m[4])}]" if m[3] else "]"),
        text,
    )
    text = re.sub(r"\b(\d+) \* 3600\b", lambda m: str(int(m[1]) * 3600 / SCALE), text)
    text = re.sub(
        r"(node_textfile_mtime_seconds\{[^}]*\} > )(\d+)\b",
        lambda m: f"{m[1]}{int(m[2]) / SCALE}",
        text,
    )
    unscaled = re.findall(r"^\s+(?:keep_firing_)?for: .*[^s]$|offset \d", text, re.MULTILINE)
    for before, after in zip(_exprs(shipped.read_text()), _exprs(text), strict=True):
        left = set(_SECONDS.findall(after))
        unscaled += [n for n in _SECONDS.findall(before) if float(n) >= 60 and n in left]
    assert not unscaled, f"durations left unscaled in {shipped}: {unscaled}"
    path = directory / shipped.name
    path.write_text(text, encoding="utf-8")
    return path


def scaled_alertmanager(shipped: Path, webhook: Webhook) -> str:
    """The Alertmanager configuration `shipped`, `pointed_at` the webhook, with every timer
    `SCALE` times shorter; inhibit rules and route tree as shipped."""
    config = pointed_at(shipped, webhook)

    def scale(node: dict) -> None:
        for key in ("group_wait", "group_interval", "repeat_interval", "resolve_timeout"):
            if key in node:
                duration = re.fullmatch(_DURATION, str(node[key]))
                assert duration, f"{key}: {node[key]} is not a duration this scales"
                node[key] = _scaled(duration[1], duration[2])
        for child in node.get("routes", ()):
            scale(child)

    scale(config.get("global", {}))
    scale(config["route"])
    return yaml.safe_dump(config)


def daemon_defaults() -> str:
    """The `[defaults]` of a daemon on compressed time: each probe interval and the grace
    warning `SCALE` times shorter, the probes' deadline `DEADLINE`."""
    intervals = "".join(
        f"{kind}_interval = {seconds / SCALE}\n" for kind, seconds in DEFAULT_INTERVALS.items()
    )
    return (
        "[defaults]\n"
        + intervals
        + f"redirect_interval = {REDIRECT_INTERVAL / SCALE}\n"
        + f'deadline = {DEADLINE}\nwrite_bytes = "4K"\n'
        + "[defaults.thresholds]\n"
        + f"grace_expiring_seconds = {Policy().grace_expiring_seconds / SCALE}\n"
    )
