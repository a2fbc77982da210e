"""The table of defaults in docs/reference.md is what the code does, and the example config agrees.

A default is a promise to users (alert runbooks quote 3 % and 10 %, job scripts rely on 5
attempts): moving one must fail here until the reference says so. The table is parsed as written;
each row's key is looked up in the code *as a user meets it* (a config loaded from nothing, the
signature of `fsprobe.save`, the CLI option), and every config key must have a row.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, Callable

import fsprobe
from fsprobe.daemon import schedule
from fsprobe.daemon.config import Config, Overrides, TargetConfig, load
from fsprobe.policy import DEFAULT_INTERVALS, Policy
from fsprobe.saving.options import Backoff
from fsprobe.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
_ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| `(?P<value>[^`]+)` \| (?P<what>.*) \|$")


def documented() -> dict[str, tuple[Any, str]]:
    """The reference's defaults table: key -> (value as TOML reads it, the description)."""
    text = (REPO / "docs" / "reference.md").read_text()
    section = text.split("\n### Defaults\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = {}
    for line in rows:
        match = _ROW.match(line)
        assert match, f"a row of the defaults table that does not parse: {line}"
        value = tomllib.loads(f"v = {match['value']}")["v"]
        table[match["key"]] = (value, match["what"])
    return table


def effective() -> tuple[Config, TargetConfig]:
    """What `fsprobe run PATH` runs with: no file, no environment, no flags."""
    config = load(Overrides(paths=("/srv/ckpt",)), environ={})
    (target,) = config.targets
    return config, target


def _quota_probe() -> str:
    """The `quota_probe` mode in force, told by where it sends the server probes of rank 1."""
    config = load(Overrides(paths=("/srv/ckpt",)), environ={"RANK": "1"})
    elsewhere = config.targets[0].server_probes_elsewhere
    if elsewhere is None:
        return "always"
    return "never" if elsewhere == 'quota_probe = "never"' else "auto"


def _threshold(name: str) -> Callable[[Config, TargetConfig], Any]:
    return lambda config, target: getattr(target.settings.policy, name)


def _interval(kind: str) -> Callable[[Config, TargetConfig], Any]:
    return lambda config, target: target.intervals[kind]


#: How the code answers for each documented key: (config, target) -> the value in force.
ACTUAL: dict[str, Callable[[Config, TargetConfig], Any]] = {
    **{f.name: _threshold(f.name) for f in dataclasses.fields(Policy) if f.name != "intervals"},
    **{f"{kind}_interval": _interval(kind) for kind in DEFAULT_INTERVALS},
    "redirect_interval": lambda config, target: target.redirect_interval,  # a task, not a probe
    "deadline": lambda config, target: target.settings.deadline,
    "quota_timeout": lambda config, target: target.settings.server_probes.timeout,
    "write_bytes": lambda config, target: target.settings.write_bytes,
    "write_probe": lambda config, target: target.settings.write_probe,
    "probe_as": lambda config, target: target.settings.probe_as,
    "quota_provider": lambda config, target: target.settings.server_probes.provider,
    "quota_probe": lambda config, target: _quota_probe(),
    "lfs_df_probe": lambda config, target: target.lfs_df_enabled,
    "lfs_df_tight_ratio": lambda config, target: target.lfs_df_tight_ratio,
    "listen": lambda config, target: config.listen,
    "log_level": lambda config, target: config.log_level,
    "sync_redirected": lambda config, target: config.sync_redirected,
    "fsprobe.save(attempts=)": lambda config, target: fsprobe.SaveOptions().attempts,
    "fsprobe.save(max_wait=)": lambda config, target: fsprobe.SaveOptions().max_wait,
}


def _normal(key: str, value: Any) -> Any:
    return parse_size(value) if key == "write_bytes" else value


def test_every_row_of_the_readme_table_is_what_the_code_does():
    config, target = effective()
    table = documented()
    assert set(table) <= set(ACTUAL), f"rows the test cannot check: {set(table) - set(ACTUAL)}"
    actual = {key: ACTUAL[key](config, target) for key in table}
    wrong = {
        key: (value, actual[key])
        for key, (value, _) in table.items()
        if actual[key] != _normal(key, value)
        or isinstance(actual[key], bool) != isinstance(value, bool)  # 1 == True, but not here
    }
    assert wrong == {}, "documented value, code value"


def test_every_setting_has_a_row():
    assert set(ACTUAL) - set(documented()) == set()


def test_the_numbers_in_the_descriptions_are_the_code_s_too():
    table = documented()
    jitter = re.search(r"±(\d+) %", table["statvfs_interval"][1])
    assert jitter and int(jitter[1]) / 100 == schedule.JITTER
    backoff = re.search(
        r"backoff (\d+) s doubling, at most (\d+) s", table["fsprobe.save(attempts=)"][1]
    )
    assert backoff and (float(backoff[1]), float(backoff[2])) == (Backoff().base, Backoff().cap)
    for key in ("headroom_unhealthy_ratio", "headroom_degraded_ratio"):
        value, what = table[key]
        assert f"{round(value * 100)} %" in what


def test_the_example_config_shows_the_defaults():
    """docs/fsprobe.example.toml says "every key, with its default": its [defaults] and
    [defaults.thresholds] tables, and the top-level keys the reference lists, are the defaults."""
    example = tomllib.loads((REPO / "docs" / "fsprobe.example.toml").read_text())
    table = documented()
    shown = {**example["defaults"], **example["defaults"].pop("thresholds")}
    shown.pop("thresholds", None)
    shown.update({key: value for key, value in example.items() if key in table})
    assert set(shown) <= set(table), (
        f"example keys missing from the reference: {set(shown) - set(table)}"
    )
    differ = {
        key: (value, table[key][0])
        for key, value in shown.items()
        if _normal(key, value) != _normal(key, table[key][0])
    }
    assert differ == {}, "example value, documented value"
