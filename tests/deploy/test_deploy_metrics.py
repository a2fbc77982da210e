"""The metric-name extraction of tests/support/deploy_metrics.py on the PromQL shapes that trip
naive readers: functions, aggregations, keywords, label lists, durations, strings, variables."""

from __future__ import annotations

import pytest

from tests.support.deploy_metrics import (
    PromQLError,
    dashboard_expressions,
    exposed_metric_names,
    metric_names,
    resolve,
    template_queries,
    variable_query_expressions,
)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("up", {"up"}),
        (
            'fsprobe_headroom_ratio{resource="bytes", path=~"/a|/b"} < 0.10',
            {"fsprobe_headroom_ratio"},
        ),
        ("rate(x_total[5m])", {"x_total"}),
        ("histogram_quantile(0.95, sum by (le, path) (rate(h_bucket[5m])))", {"h_bucket"}),
        ("sum by (path) (a) / on (path) group_left (mountpoint) b", {"a", "b"}),
        ("sum(a) without (instance) > ignoring (resource) b", {"a", "b"}),
        ("max by(instance,path)(a)", {"a"}),
        ('count_values("version", fsprobe_build_info)', {"fsprobe_build_info"}),
        ('label_replace(a / b, "resource", "bytes", "", "")', {"a", "b"}),
        ("a and b or c unless d", {"a", "b", "c", "d"}),
        ("a > bool 1 AND b", {"a", "b"}),
        ("a offset 1h30m + b @ 1609746000", {"a", "b"}),
        ("max_over_time(deriv(a[1h])[6h:5m])", {"a"}),
        ("predict_linear(a[6h], 24 * 3600) < -1e-3", {"a"}),
        ("vector(1) + time() - timestamp(a > 0)", {"a"}),
        ("a == Inf or b != NaN", {"a", "b"}),
        (
            "fsprobe:headroom_bytes:predict_linear24h < 0",
            {"fsprobe:headroom_bytes:predict_linear24h"},
        ),
        ('{__name__="fsprobe_mount_stuck", path="/x"}', {"fsprobe_mount_stuck"}),
        ("topk(20, a) # the largest\n+ b", {"a", "b"}),
        ('increase(a{path=~"$path", instance=~"${instance:regex}"}[$__rate_interval])', {"a"}),
        ("topk($limit, a)", {"a"}),
        ('a{path="}{[("}', {"a"}),
    ],
)
def test_metric_names(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


def test_a_regex_on_the_metric_name_is_refused_not_guessed() -> None:
    with pytest.raises(PromQLError):
        metric_names('{__name__=~"fsprobe_.*"}')


def test_unbalanced_brackets_are_an_error() -> None:
    with pytest.raises(PromQLError):
        metric_names("sum(rate(a[5m])")
    with pytest.raises(PromQLError):
        metric_names("a{path='/x'")


def test_recording_rules_resolve_to_their_sources_recursively() -> None:
    recorded = {
        "x:ratio": ["a / b"],
        "x:ratio:avg": ["avg_over_time(x:ratio[1h])", "c"],
        "loop:one": ["loop:two + d"],
        "loop:two": ["loop:one"],
    }
    assert resolve({"x:ratio:avg", "e"}, recorded) == {"a", "b", "c", "e"}
    assert resolve({"loop:one"}, recorded) == {"d"}
    assert resolve({"undefined:rule"}, recorded) == {"undefined:rule"}


def test_template_queries_take_the_query_not_other_string_arguments() -> None:
    annotation = (
        "Errors: {{ with printf `increase(e_total{path=%q}[15m]) > 0` $labels.path | query"
        ' | sortByLabel "errno" }}{{ range . }}{{ .Labels.errno }}{{ end }}{{ end }}'
        ' and {{ query "up" | first | value }}; {{ $labels.path }} {{ printf "%.1f" $value }}'
    )
    queries = template_queries(annotation)
    assert queries == ['increase(e_total{path=""}[15m]) > 0', "up"]
    assert set().union(*(metric_names(query) for query in queries)) == {"e_total", "up"}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("label_values(fsprobe_build_info, instance)", ["fsprobe_build_info"]),
        ('label_values(a{instance=~"$instance"}, path)', ['a{instance=~"$instance"}']),
        ("label_values(instance)", []),
        ("label_names()", []),
        ("metrics(fsprobe_.*)", []),
        ("query_result(topk(5, a))", ["topk(5, a)"]),
        ("sum(a)", ["sum(a)"]),
    ],
)
def test_grafana_variable_queries(query: str, expected: list[str]) -> None:
    assert variable_query_expressions(query) == expected


def test_dashboard_expressions_cover_nested_panels_variables_and_annotations() -> None:
    dashboard = {
        "panels": [
            {"type": "timeseries", "targets": [{"expr": "a"}, {"refId": "B"}]},
            {"type": "row", "collapsed": True, "panels": [{"targets": [{"expr": "b"}]}]},
        ],
        "templating": {
            "list": [
                {"type": "datasource", "query": "prometheus"},
                {"type": "query", "query": "label_values(c, path)"},
                {"type": "query", "query": {"query": "label_values(d, instance)", "refId": "x"}},
            ]
        },
        "annotations": {"list": [{"expr": "changes(e[5m]) > 0"}]},
    }
    assert dashboard_expressions(dashboard) == ["a", "b", "c", "d", "changes(e[5m]) > 0"]


def test_exposed_metric_names_lists_sample_names() -> None:
    exposition = (
        "# HELP h A histogram.\n# TYPE h histogram\n"
        'h_bucket{le="1.0"} 1\nh_bucket{le="+Inf"} 1\nh_sum 0.5\nh_count 1\n'
        "# HELP c_total A counter.\n# TYPE c_total counter\nc_total 3\n"
        "# HELP g A gauge.\n# TYPE g gauge\ng 1\n"
    )
    assert exposed_metric_names(exposition) == {"h_bucket", "h_sum", "h_count", "c_total", "g"}
