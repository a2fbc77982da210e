"""The Grafana dashboard: valid JSON, unique panel ids, the variables it promises, PromQL that
Prometheus parses, and only metrics the exporter emits (recording rules resolved)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import deploy_metrics
from tests.support.capability import need_command

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "fsprobe.json"
RULES = REPO / "deploy" / "prometheus" / "fsprobe.rules.yml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(dashboard: dict) -> list[dict]:
    return list(deploy_metrics.iter_panels(dashboard["panels"]))


def _exprs_of(panel: dict) -> str:
    return " ".join(target.get("expr", "") for target in panel.get("targets") or [])


def test_panel_ids_are_unique(dashboard: dict) -> None:
    ids = [panel["id"] for panel in _panels(dashboard)]
    assert len(ids) == len(set(ids)), sorted(ids)


def test_panels_do_not_overlap(dashboard: dict) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_variables_datasource_instance_and_path(dashboard: dict) -> None:
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "path"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["multi"] and variables[name]["includeAll"]
    assert "$instance" in variables["path"]["query"], "path should follow instance"


#: Families about the daemon itself, without a path label.
DAEMON_WIDE = ("fsprobe_build_info", "fsprobe_save_events_dropped_total")


def test_every_query_uses_the_datasource_variable_and_the_selection(dashboard: dict) -> None:
    for panel in _panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert 'instance=~"$instance"' in target["expr"], panel["title"]
            if not any(daemon_wide in target["expr"] for daemon_wide in DAEMON_WIDE):
                assert 'path=~"$path"' in target["expr"], panel["title"]


def test_dashboard_uses_only_metrics_of_the_exporter_contract() -> None:
    recorded = deploy_metrics.recording_rules(deploy_metrics.load_rule_groups(RULES))
    used = deploy_metrics.dashboard_metrics(DASHBOARD, recorded)
    assert used, "no metric found in the dashboard: the extraction is broken"
    assert used - deploy_metrics.CONTRACT_METRICS == set()


def _with_variables_filled_in(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "5m")
    return re.sub(r"\$\{[^}]*\}|\$\w+", ".*", expr)


@pytest.mark.prometheus
def test_prometheus_parses_every_dashboard_expression(dashboard: dict, tmp_path: Path) -> None:
    """promtool checks each expression as the body of a recording rule: Prometheus' own parser."""
    need_command("promtool", "prometheus")
    rules = [
        {"record": f"dashboard:expr{index}", "expr": _with_variables_filled_in(expr)}
        for index, expr in enumerate(deploy_metrics.dashboard_expressions(dashboard))
    ]
    rule_file = tmp_path / "dashboard.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_headroom_gauges_have_the_alert_thresholds(dashboard: dict) -> None:
    gauges = [
        panel
        for panel in _panels(dashboard)
        if panel["type"] == "gauge" and "fsprobe_headroom_ratio" in _exprs_of(panel)
    ]
    resources = {re.search(r'resource="(\w+)"', _exprs_of(panel)).group(1) for panel in gauges}
    assert resources == {"bytes", "inodes"}
    for panel in gauges:
        defaults = panel["fieldConfig"]["defaults"]
        assert defaults["unit"] == "percentunit"
        steps = [step["value"] for step in defaults["thresholds"]["steps"]]
        assert steps == [None, 0.03, 0.10], panel["title"]


@pytest.mark.parametrize(
    ("panel_type", "needle"),
    [
        ("stat", "fsprobe_health_status"),
        ("table", "fsprobe_quota_soft_limit_bytes"),
        ("table", "fsprobe_quota_hard_limit_bytes"),
        ("table", "fsprobe_quota_grace_expiry_timestamp_seconds"),
        ("timeseries", "fsprobe:headroom_inodes:predict_linear"),
        ("heatmap", "fsprobe_write_latency_seconds_bucket"),
        ("timeseries", "fsprobe:write_latency_seconds:p50_rate5m"),
        ("timeseries", "fsprobe:write_latency_seconds:p95_rate5m"),
        ("timeseries", "fsprobe_write_step_seconds"),
        ("timeseries", "sum by (probe, errno) (increase(fsprobe_probe_errors_total"),
        ("bargauge", "fsprobe:lustre_target_free:ratio"),
        ("bargauge", "fsprobe_lustre_target_in_layout"),  # only the OSTs new files meet
        ("timeseries", "fsprobe_redirected_pending_bytes"),
        ("timeseries", "sum by (outcome) (increase(fsprobe_saves_total"),
        ("timeseries", "sum by (errno) (increase(fsprobe_save_failed_attempts_total"),
        ("timeseries", "fsprobe_save_duration_seconds_bucket"),
        ("timeseries", "/ fsprobe_save_interval_seconds"),
    ],
)
def test_dashboard_has_the_promised_panel(dashboard: dict, panel_type: str, needle: str) -> None:
    assert any(
        panel["type"] == panel_type and needle in _exprs_of(panel) for panel in _panels(dashboard)
    ), f"no {panel_type} panel querying {needle}"


def test_latency_heatmap_reads_buckets_as_a_heatmap(dashboard: dict) -> None:
    (heatmap,) = [panel for panel in _panels(dashboard) if panel["type"] == "heatmap"]
    (target,) = heatmap["targets"]
    assert target["format"] == "heatmap"
    assert "sum by (le)" in target["expr"]
    assert heatmap["options"]["calculate"] is False
