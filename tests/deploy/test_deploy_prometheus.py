"""The shipped Prometheus rules: promtool accepts them, their unit tests pass, and they keep the
promises of docs/design.md §6 (every alert, its labels and annotations, only metrics the exporter
emits, a runbook section behind every runbook_url)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import deploy_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

from tests.support.capability import need_command

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "fsprobe.rules.yml"
GENERATE = PROMETHEUS / "generate.py"
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
RUNBOOK = REPO / "docs" / "runbook.md"
#: The runbook's published address: the project URL that the rule generator reads.
RUNBOOK_URL = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Runbook"]

#: docs/design.md §6, "Alert names".
DESIGN_ALERTS = {
    "FsprobeAgentSilent",
    "FsprobeLustreTargetDisconnected",
    "FsprobeLustreTargetRecovering",
    "FsprobeSpaceHeadroomLow",
    "FsprobeInodeHeadroomLow",
    "FsprobeSpaceFillingUp",
    "FsprobeInodesFillingUp",
    "FsprobeQuotaSoftLimitExceeded",
    "FsprobeQuotaGraceExpiring",
    "FsprobeLustreTargetAlmostFull",
    "FsprobeWriteProbeFailing",
    "FsprobeWriteLatencyHigh",
    "FsprobeMountStuck",
    "FsprobeProbeStale",
    "FsprobeProbeFailing",
    "FsprobeTmpdirCrossDevice",
    "FsprobeRedirectedCheckpointsPending",
    "FsprobeDown",
    "FsprobeSaveRetried",
    "FsprobeSaveRedirected",
    "FsprobeSaveFailed",
    "FsprobeCheckpointOverdue",
    "FsprobeConfigReloadFailed",
    "FsprobeInternalErrors",
    "FsprobeRedirectProblems",
}
#: Alerts about fsprobe itself, not about a watched path.
SELF_ALERTS = {"FsprobeDown", "FsprobeConfigReloadFailed", "FsprobeAgentSilent"}


def _alert_rules() -> list[dict]:
    groups = deploy_metrics.load_rule_groups(RULES)
    return [rule for rule in deploy_metrics.iter_rules(groups) if "alert" in rule]


def _run_promtool(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [need_command("promtool", "prometheus"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


@pytest.mark.prometheus
def test_promtool_check_rules_accepts_the_rule_file() -> None:
    _run_promtool("check", "rules", str(RULES), cwd=REPO)


@pytest.mark.prometheus
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    _run_promtool("test", "rules", test_file.name, cwd=test_file.parent)


def test_the_unit_tests_load_the_shipped_rule_file() -> None:
    assert RULE_TESTS, "no promtool unit tests found"
    for test_file in RULE_TESTS:
        document = yaml.safe_load(test_file.read_text(encoding="utf-8"))
        loaded = {(test_file.parent / name).resolve() for name in document["rule_files"]}
        assert loaded == {RULES.resolve()}, test_file.name


def test_every_design_alert_exists_and_nothing_else() -> None:
    assert {rule["alert"] for rule in _alert_rules()} == DESIGN_ALERTS


@pytest.mark.parametrize("rule", _alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_has_severity_summary_description_action_and_links(rule: dict) -> None:
    """What a person on call needs at 3 am: the path and node, the cause (with its value), the
    first thing to do, the runbook section and the dashboard on that instance and path."""
    assert rule["labels"]["severity"] in ("info", "warning", "critical")
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "action", "runbook_url", "dashboard_url"}
    description = annotations["description"]
    scope = {"not_scraped": None, "agent_silent": "$labels.agent"}  # no instance: no node's
    reason = rule["labels"].get("reason")
    named = scope.get(reason, "$labels.instance")
    assert named is None or named in description + annotations["summary"], (
        f"{rule['alert']}: names no {named}"
    )
    if rule["alert"] not in SELF_ALERTS:
        for needed in ("$labels.path", "$labels.instance"):
            assert needed in description, f"{rule['alert']}: description lacks {needed}"
            assert needed in annotations["dashboard_url"]
    assert len(annotations["action"].split()) >= 8, f"{rule['alert']}: says not what to do"
    # The value, through a formatting function, or (for a 0/1 condition) a stated duration.
    formatted = re.search(r"\$value \| humanize\w*|printf \"%[^\"]*\" \$value", description)
    assert formatted or rule.get("for"), f"{rule['alert']}: description shows no value"
    assert annotations["runbook_url"] == f"{RUNBOOK_URL}#{rule['alert'].lower()}"


def test_the_tmpdir_hint_never_pages():
    """Node-local /tmp with checkpoints on Lustre is the usual layout (issue 11.1)."""
    (rule,) = [rule for rule in _alert_rules() if rule["alert"] == "FsprobeTmpdirCrossDevice"]
    assert rule["labels"]["severity"] == "info"


def test_the_shipped_rules_are_generated_from_the_template() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATE), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_a_site_sets_its_runbook_and_job_in_one_place(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable, str(GENERATE), "--output-dir", str(tmp_path),
            "--kubernetes-dir", str(tmp_path),
            "--runbook-base", "https://wiki.example.org/ops/fsprobe",
            "--job-selector", 'job="node-fsprobe", cluster="a"',
        ],
        check=True, timeout=60,
    )  # fmt: skip
    rules = yaml.safe_load((tmp_path / "fsprobe.rules.yml").read_text())
    operator = yaml.safe_load((tmp_path / "prometheusrule.yaml").read_text())
    assert operator["spec"]["groups"] == rules["groups"]
    alerts = [r for r in deploy_metrics.iter_rules(rules["groups"]) if "alert" in r]
    assert {r["annotations"]["runbook_url"].split("#")[0] for r in alerts} == {
        "https://wiki.example.org/ops/fsprobe"
    }
    down = [r["expr"].strip() for r in alerts if r["alert"] == "FsprobeDown"]
    assert down == [
        'up{job="node-fsprobe", cluster="a"} == 0 or up{job="fsprobe-sidecar"} == 0',
        "(\n"
        '    timestamp(node_textfile_mtime_seconds{file=~".*/fsprobe.prom"})\n'
        '    - node_textfile_mtime_seconds{file=~".*/fsprobe.prom"}\n'
        "  > on (cluster, instance) group_left ()\n"
        "    3 * min by (cluster, instance) (fsprobe_probe_interval_seconds)\n"
        ")\n"
        "or\n"
        'timestamp(node_textfile_mtime_seconds{file=~".*/fsprobe.prom"})\n'
        '- node_textfile_mtime_seconds{file=~".*/fsprobe.prom"} > 600',
        'absent(up{job="node-fsprobe", cluster="a"})\n'
        'unless on () count(node_textfile_mtime_seconds{file=~".*/fsprobe.prom"})',
    ]
    shipped = RULES.read_text()
    assert "@" + "RUNBOOK_BASE@" not in shipped and "@" + "JOB_SELECTOR@" not in shipped


def test_critical_and_warning_variants_are_distinct() -> None:
    seen = set()
    for rule in _alert_rules():
        key = (rule["alert"], tuple(sorted(rule["labels"].items())))
        assert key not in seen, f"duplicate alert rule {key}"
        seen.add(key)


def test_headroom_pairs_use_ten_and_three_percent() -> None:
    for name in ("FsprobeSpaceHeadroomLow", "FsprobeInodeHeadroomLow"):
        by_severity = {
            r["labels"]["severity"]: r["expr"] for r in _alert_rules() if r["alert"] == name
        }
        assert by_severity["warning"].rstrip().endswith("< 0.10"), by_severity
        assert by_severity["critical"].rstrip().endswith("< 0.03"), by_severity


def _github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (lower case, punctuation dropped)."""
    anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return anchor.replace(" ", "-")


def test_every_runbook_url_has_a_runbook_section() -> None:
    headings = re.findall(r"^#{2,3} (.+)$", RUNBOOK.read_text(encoding="utf-8"), re.MULTILINE)
    anchors = {_github_anchor(heading) for heading in headings}
    for rule in _alert_rules():
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: docs/runbook.md has no section #{anchor}"


def test_runbook_sections_say_what_it_means_and_what_to_do() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    for alert in DESIGN_ALERTS:
        section = text.split(f"## {alert}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**What it means.**", "**What the user should do.**", "**What the admin"):
            assert part in section, f"runbook section {alert} lacks {part}"


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    """Each alert (each severity) must be expected to fire somewhere, and each alert expected
    to stay quiet somewhere (an empty exp_alerts)."""
    firing: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for test_file in RULE_TESTS:
        document = yaml.safe_load(test_file.read_text(encoding="utf-8"))
        for test in document["tests"]:
            for case in test.get("alert_rule_test") or []:
                expected = case.get("exp_alerts") or []
                if not expected:
                    quiet.add(case["alertname"])
                for alert in expected:
                    firing.add((case["alertname"], alert["exp_labels"]["severity"]))
    variants = {(rule["alert"], rule["labels"]["severity"]) for rule in _alert_rules()}
    assert variants - firing == set(), "never expected to fire"
    assert DESIGN_ALERTS - quiet == set(), "never expected to stay quiet"


def test_every_recording_rule_is_unit_tested() -> None:
    tested = set()
    for test_file in RULE_TESTS:
        document = yaml.safe_load(test_file.read_text(encoding="utf-8"))
        for test in document["tests"]:
            for case in test.get("promql_expr_test") or []:
                tested |= deploy_metrics.metric_names(case["expr"])
    recorded = set(deploy_metrics.recording_rules(deploy_metrics.load_rule_groups(RULES)))
    assert recorded - tested == set()


def test_rules_use_only_metrics_of_the_exporter_contract() -> None:
    used = deploy_metrics.rules_metrics([RULES])
    assert used, "no metric found in the rules: the extraction is broken"
    assert used - deploy_metrics.CONTRACT_METRICS - deploy_metrics.SCRAPE_METRICS == set()


def test_every_recording_rule_is_used_by_an_alert_or_the_dashboard() -> None:
    groups = deploy_metrics.load_rule_groups(RULES)
    used: set[str] = set()
    for rule in deploy_metrics.iter_rules(groups):
        if "alert" in rule:
            used |= deploy_metrics.metric_names(rule["expr"])
    dashboard = (REPO / "deploy" / "grafana" / "fsprobe.json").read_text(encoding="utf-8")
    for name in deploy_metrics.recording_rules(groups):
        assert name in used or name in dashboard, f"recording rule {name} is used nowhere"


def test_generate_writes_the_rule_file_and_the_prometheusrule_to_separate_places(
    tmp_path: Path,
) -> None:
    """`--output-dir` is a Prometheus rules directory: on main it also got the Kubernetes
    PrometheusRule, on which `promtool check rules DIR/*` fails."""
    rules_dir, kubernetes_dir = tmp_path / "rules", tmp_path / "k8s"
    rules_dir.mkdir()
    kubernetes_dir.mkdir()
    generate = [sys.executable, str(PROMETHEUS / "generate.py")]
    subprocess.run([*generate, "--output-dir", str(rules_dir)], check=True)
    assert [p.name for p in rules_dir.iterdir()] == ["fsprobe.rules.yml"]
    _run_promtool("check", "rules", *map(str, rules_dir.iterdir()), cwd=tmp_path)
    subprocess.run([*generate, "--kubernetes-dir", str(kubernetes_dir)], check=True)
    assert [p.name for p in kubernetes_dir.iterdir()] == ["prometheusrule.yaml"]
    shipped = REPO / "deploy" / "kubernetes" / "prometheusrule.yaml"
    assert (kubernetes_dir / "prometheusrule.yaml").read_text() == shipped.read_text()


def test_a_site_sets_selector_cluster_label_and_grafana_like_a_mixin(tmp_path: Path) -> None:
    """The mixin's `_config`: a selector on every fsprobe series, the cluster label in every
    join and in the dashboard's variables, the Grafana every alert links to."""
    subprocess.run(
        [
            sys.executable, str(GENERATE), "--output-dir", str(tmp_path),
            "--grafana-dir", str(tmp_path), "--selector", 'job=~"fsprobe.*"',
            "--cluster-label", "k8s_cluster", "--grafana-url", "https://grafana.example.org/",
        ],
        check=True, timeout=60,
    )  # fmt: skip
    rules_file = tmp_path / "fsprobe.rules.yml"
    _run_promtool("check", "rules", str(rules_file), cwd=tmp_path)
    groups = deploy_metrics.load_rule_groups(rules_file)
    for rule in deploy_metrics.iter_rules(groups):
        series = re.findall(r"\bfsprobe_[a-z0-9_]+\b(?:\{[^}]*\})?", rule["expr"])
        assert all('job=~"fsprobe.*"' in s for s in series), rule["expr"]
        assert "on (instance" not in rule["expr"], "a join that drops the cluster label"
        if "alert" in rule:
            link = " ".join(rule["annotations"]["dashboard_url"].split())
            assert link.startswith("https://grafana.example.org/d/fsprobe-overview/")
            assert "var-cluster={{ $labels.k8s_cluster | urlquery }}" in link
    dashboard = json.loads((tmp_path / "fsprobe.json").read_text())
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert variables == ["datasource", "cluster", "job", "instance", "path"]
    cluster = dashboard["templating"]["list"][1]
    info = 'fsprobe_build_info{job=~"fsprobe.*", k8s_cluster=~"$cluster"}'
    assert cluster["query"] == f"label_values({info}, k8s_cluster)"
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    selection = 'job=~"fsprobe.*", k8s_cluster=~"$cluster", job=~"$job", instance=~"$instance"'
    assert queries and all(selection in q for q in queries if 'instance=~"$instance"' in q)
