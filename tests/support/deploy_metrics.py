"""Which metric names the shipped rules and dashboard use, and which ones the exporter promises.

A rule or a panel that names a metric the exporter never emits is silently empty: the alert never
fires, the panel shows "No data". This module extracts the metric names from PromQL (rule
expressions, the queries inside alert annotation templates, dashboard targets and template
variables), resolves recording-rule names to the metrics they are computed from, and holds the
metric contract, so a test can compare the two, and an end-to-end test can compare them with a
real ``/metrics`` page (`exposed_metric_names`).

The PromQL reader is a tokenizer, not a parser: it is enough to tell metric names from function
names, keywords, label names, durations and strings, and it refuses what it cannot resolve
(a regex on ``__name__``) rather than guessing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

#: Every sample name the exporter emits (histograms expanded to their sample series).
CONTRACT_METRICS: frozenset[str] = frozenset(
    {
        "fsprobe_build_info",
        "fsprobe_health_status",
        "fsprobe_probe_success",
        "fsprobe_probe_duration_seconds",
        "fsprobe_probe_last_success_timestamp_seconds",
        "fsprobe_probe_interval_seconds",
        "fsprobe_probe_last_run_timestamp_seconds",
        "fsprobe_probe_stale_after_seconds",
        "fsprobe_probe_errors_total",
        "fsprobe_mount_stuck",
        "fsprobe_filesystem_size_bytes",
        "fsprobe_filesystem_avail_bytes",
        "fsprobe_filesystem_inodes",
        "fsprobe_filesystem_inodes_free",
        "fsprobe_filesystem_readonly",
        "fsprobe_quota_used_bytes",
        "fsprobe_quota_soft_limit_bytes",
        "fsprobe_quota_hard_limit_bytes",
        "fsprobe_quota_used_inodes",
        "fsprobe_quota_soft_limit_inodes",
        "fsprobe_quota_hard_limit_inodes",
        "fsprobe_quota_grace_expiry_timestamp_seconds",
        "fsprobe_quota_grace_expired",
        "fsprobe_quota_exceeded",
        "fsprobe_lustre_target_avail_bytes",
        "fsprobe_lustre_target_size_bytes",
        "fsprobe_lustre_target_inodes_free",
        "fsprobe_lustre_target_inodes",
        "fsprobe_lustre_target_in_layout",
        "fsprobe_lustre_target_connected",
        "fsprobe_lustre_target_recovering",
        "fsprobe_lustre_target_active",
        "fsprobe_lustre_target_last_eviction_timestamp_seconds",
        "fsprobe_headroom_bytes",
        "fsprobe_headroom_inodes",
        "fsprobe_headroom_ratio",
        "fsprobe_headroom_limit",
        "fsprobe_write_latency_seconds_bucket",
        "fsprobe_write_latency_seconds_sum",
        "fsprobe_write_latency_seconds_count",
        "fsprobe_write_step_seconds",
        "fsprobe_tmpdir_same_device",
        "fsprobe_redirected_pending_bytes",
        "fsprobe_redirect_problems_total",
        "fsprobe_internal_errors_total",
        "fsprobe_saves_total",
        "fsprobe_save_failed_attempts_total",
        "fsprobe_save_duration_seconds_bucket",
        "fsprobe_save_duration_seconds_sum",
        "fsprobe_save_duration_seconds_count",
        "fsprobe_save_bytes_total",
        "fsprobe_last_save_timestamp_seconds",
        "fsprobe_last_successful_save_timestamp_seconds",
        "fsprobe_save_interval_seconds",
        "fsprobe_savers",
        "fsprobe_last_save_problem_timestamp_seconds",
        "fsprobe_config_last_reload_successful",
        "fsprobe_config_last_reload_success_timestamp_seconds",
        "fsprobe_save_events_dropped_total",
        "fsprobe_probe_skipped_total",
    }
)

#: What Prometheus itself records for every scrape and alert, and node_exporter's age of each
#: textfile (not the exporter's): FsprobeDown uses them, in either mode, and the consequences
#: of a filesystem cause look at its alert's state (ALERTS).
SCRAPE_METRICS: frozenset[str] = frozenset({"up", "node_textfile_mtime_seconds", "ALERTS"})

# Words that are PromQL syntax, not metrics, when they stand where a metric name could.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "atan2", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan"}
)
# Keywords followed by a parenthesised list of label names (optional for group_left/right).
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<comment>\#[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+(?::\w+)?\]\])
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\w*)
    | (?P<identifier>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<operator>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}\[\]@:])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """An expression that the reader cannot turn into a set of metric names."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    tokens = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise PromQLError(f"cannot read {expr[position : position + 20]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("space", "comment", "variable"):
            tokens.append((kind, match.group()))
        position = match.end()
    return tokens


def _unquote(literal: str) -> str:
    if literal.startswith("`"):
        return literal[1:-1]
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


def metric_names(expr: str) -> set[str]:
    """The metric names (recording-rule names included) that a PromQL expression selects.

    Function and aggregation names (an identifier followed by ``(``, ``by`` or ``without``),
    keywords, label names (in ``{...}`` and in ``by``/``on``/... lists), durations, numbers and
    strings are skipped; ``{__name__="x"}`` counts as ``x``. Grafana variables (``$path``,
    ``${path}``) are ignored.
    """
    tokens = _tokens(expr)
    texts = [text for kind, text in tokens if kind == "operator"]
    if texts.count("(") != texts.count(")"):
        raise PromQLError(f"unbalanced parentheses in {expr!r}")
    names: set[str] = set()
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if text == "{":
            index = _read_matchers(tokens, index + 1, names, expr)
            continue
        if text == "[":
            index = _skip_to(tokens, index + 1, "[", "]", expr)
            continue
        if kind == "identifier":
            word = text.lower()
            if word in _LABEL_LIST_KEYWORDS and following == "(":
                index = _skip_to(tokens, index + 2, "(", ")", expr)
                continue
            # A function call, or an aggregation written ``sum by (label) (expr)``.
            is_call = following == "(" or following.lower() in ("by", "without")
            if word not in _KEYWORDS and not is_call:
                names.add(text)
        index += 1
    return names


def _skip_to(
    tokens: list[tuple[str, str]], index: int, opening: str, closing: str, expr: str
) -> int:
    """Index just past the `closing` token that balances an already consumed `opening`."""
    depth = 1
    while index < len(tokens):
        text = tokens[index][1]
        depth += (text == opening) - (text == closing)
        index += 1
        if depth == 0:
            return index
    raise PromQLError(f"unbalanced {opening!r} in {expr!r}")


def _read_matchers(tokens: list[tuple[str, str]], index: int, names: set[str], expr: str) -> int:
    """Skip a ``{...}`` matcher list, collecting ``__name__="x"`` matchers into `names`."""
    end = _skip_to(tokens, index, "{", "}", expr)
    body = tokens[index : end - 1]
    for position, (kind, text) in enumerate(body):
        if kind == "identifier" and text == "__name__":
            operator = body[position + 1][1] if position + 1 < len(body) else ""
            value = body[position + 2] if position + 2 < len(body) else ("", "")
            if operator != "=" or value[0] != "string":
                raise PromQLError(f"cannot resolve a __name__ matcher other than = in {expr!r}")
            names.add(_unquote(value[1]))
    return end


# ---------------------------------------------------------------------------------------------
# Rule files


def load_rule_groups(path: str | Path) -> list[dict[str, Any]]:
    """The ``groups`` of a Prometheus rule file."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return list(document.get("groups") or [])


def iter_rules(groups: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for group in groups:
        yield from group.get("rules") or []


def recording_rules(groups: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Recording-rule name -> its expressions (a name may be recorded by several rules)."""
    recorded: dict[str, list[str]] = {}
    for rule in iter_rules(groups):
        if "record" in rule:
            recorded.setdefault(rule["record"], []).append(rule["expr"])
    return recorded


_TEMPLATE_ACTION = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_GO_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|`[^`]*`')
_PRINTF_VERB = re.compile(r"%[-+# 0]*\d*(?:\.\d+)?[a-zA-Z]")


def template_queries(text: str) -> list[str]:
    """The PromQL that a Go template (an alert annotation) runs through ``query``.

    In an action that calls ``query``, the first string literal is the query or its ``printf``
    format (later ones are arguments of other functions, e.g. ``sortByLabel "errno"``);
    ``printf`` verbs become an empty string, which only ever stands for a label value.
    """
    queries = []
    for action in _TEMPLATE_ACTION.findall(text):
        literal = _GO_STRING.search(action)
        if literal and re.search(r"\bquery\b", action):
            queries.append(_PRINTF_VERB.sub('""', _unquote(literal.group())))
    return queries


def rule_expressions(groups: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every PromQL expression of the rules: ``expr`` and the annotation template queries."""
    expressions = []
    for rule in iter_rules(groups):
        expressions.append(rule["expr"])
        for value in (rule.get("annotations") or {}).values():
            expressions.extend(template_queries(str(value)))
    return expressions


def resolve(names: Iterable[str], recorded: Mapping[str, list[str]]) -> set[str]:
    """Replace recording-rule names by the metrics they are computed from, recursively.

    Names that are not recorded are returned as they are (a ``fsprobe:...`` name left in the
    result is a recording rule that nobody defines).
    """
    resolved: set[str] = set()
    pending = list(names)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in recorded:
            for expr in recorded[name]:
                pending.extend(metric_names(expr))
        else:
            resolved.add(name)
    return resolved


def rules_metrics(rule_files: Iterable[str | Path]) -> set[str]:
    """The exporter metrics that the given rule files depend on (recording rules resolved)."""
    groups = [group for path in rule_files for group in load_rule_groups(path)]
    used: set[str] = set()
    for expr in rule_expressions(groups):
        used |= metric_names(expr)
    return resolve(used, recording_rules(groups))


# ---------------------------------------------------------------------------------------------
# Grafana dashboards

_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<args>.*)\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.DOTALL)
_METRICS_QUERY = re.compile(r"^\s*metrics\(.*\)\s*$", re.DOTALL)
_LABEL_NAMES = re.compile(r"^\s*label_names\(.*\)\s*$", re.DOTALL)


def iter_panels(panels: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Every panel, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels") or [])


def variable_query_expressions(query: str) -> list[str]:
    """The PromQL inside a Grafana Prometheus template-variable query.

    ``label_values(selector, label)`` holds a selector; ``label_values(label)``,
    ``label_names()`` and ``metrics(regex)`` hold none; ``query_result(expr)`` holds an
    expression; anything else is taken as PromQL.
    """
    match = _LABEL_VALUES.match(query)
    if match:
        args = match.group("args")
        selector, comma, _label = args.rpartition(",")
        return [selector] if comma else []
    match = _QUERY_RESULT.match(query)
    if match:
        return [match.group("expr")]
    if _METRICS_QUERY.match(query) or _LABEL_NAMES.match(query):
        return []
    return [query]


def dashboard_expressions(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets, variables, annotations."""
    expressions = []
    for panel in iter_panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                expressions.append(target["expr"])
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, Mapping):
            query = query.get("query")
        if query:
            expressions.extend(variable_query_expressions(query))
    for annotation in (dashboard.get("annotations") or {}).get("list") or []:
        if annotation.get("expr"):
            expressions.append(annotation["expr"])
    return expressions


def dashboard_metrics(path: str | Path, recorded: Mapping[str, list[str]]) -> set[str]:
    """The exporter metrics a dashboard file depends on (recording rules resolved)."""
    dashboard = json.loads(Path(path).read_text(encoding="utf-8"))
    used: set[str] = set()
    for expr in dashboard_expressions(dashboard):
        used |= metric_names(expr)
    return resolve(used, recorded)


# ---------------------------------------------------------------------------------------------
# A live exporter


def exposed_metric_names(exposition: str) -> set[str]:
    """The sample names on a ``/metrics`` page (text format), e.g. ``x_bucket``, ``y_total``."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
