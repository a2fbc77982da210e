#!/usr/bin/env python3
"""Generate fsprobe's Prometheus rules and Grafana dashboard: the mixin of fsprobe, in Python.

From deploy/prometheus/fsprobe.rules.template.yml and deploy/grafana/fsprobe.template.json,
three outputs that can never drift apart:

- ``deploy/prometheus/fsprobe.rules.yml``, for ``rule_files:`` (and promtool's unit tests);
- ``deploy/kubernetes/prometheusrule.yaml``, the same groups in a PrometheusRule object for the
  Prometheus Operator;
- ``deploy/grafana/fsprobe.json``, the dashboard, with the variables a mixin user expects:
  datasource, cluster, job, instance (and path).

The settings that differ between sites, as a mixin's ``_config`` holds them:

- ``--selector``: label matchers added to every fsprobe_* series of the rules and the dashboard
  (default none), e.g. ``job=~"fsprobe|fsprobe-sidecar"`` where other jobs export look-alikes;
- ``--cluster-label``: the label that tells clusters apart (default ``cluster``): every join
  of the rules keeps it, the dashboard has a variable of it (a series without it matches);
- ``--runbook-base``: where docs/runbook.md is published; every alert's ``runbook_url`` is this
  plus ``#<alert name in lower case>``. Default: the ``Runbook`` URL in pyproject.toml's
  ``[project.urls]``, so the package metadata and the alerts name the same place;
- ``--grafana-url``: where Grafana is; every alert's ``dashboard_url`` opens the dashboard
  there on its instance and path (default ``http://localhost:3000``, Grafana's own default);
- ``--job-selector``: the label matchers of the node daemons' scrape job, for ``FsprobeDown``
  (default ``job="fsprobe"``: the DaemonSet's pods carry ``fsprobe.io/job: fsprobe``, which
  the PodMonitor's ``jobLabel`` makes the job); its absence is an alert, unless textfile
  mode serves fsprobe through node_exporter;
- ``--sidecar-job-selector``: that of the sidecars beside training jobs (default
  ``job="fsprobe-sidecar"``): a sidecar that fails to answer is an alert, its absence is not
  (no sidecar runs while no training job does);
- ``--textfile-selector``: node_exporter's ``node_textfile_mtime_seconds`` of fsprobe's
  textfile (default ``file=~".*/fsprobe.prom"``), for ``FsprobeDown`` in textfile mode.

The rule groups are copied as text, so the comments survive.

    python deploy/prometheus/generate.py                   # rewrite the three files
    python deploy/prometheus/generate.py --check           # exit 1 if one is out of date
    python deploy/prometheus/generate.py --job-selector 'job="node-fsprobe"' \\
        --runbook-base https://wiki.example.org/fsprobe/runbook --output-dir /etc/prometheus/fsprobe
    python deploy/prometheus/generate.py --kubernetes-dir ./k8s    # the PrometheusRule alone
    python deploy/prometheus/generate.py --grafana-dir ./dashboards --grafana-url https://grafana.example.org

`--output-dir` writes only the Prometheus rule file, `--kubernetes-dir` only the
PrometheusRule and `--grafana-dir` only the dashboard: a rules directory holds files that
`promtool check rules` and Prometheus load, and a PrometheusRule there fails them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from dataclasses import dataclass, fields
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "prometheus" / "fsprobe.rules.template.yml"
DASHBOARD_TEMPLATE = REPO / "deploy" / "grafana" / "fsprobe.template.json"
RULES = REPO / "deploy" / "prometheus" / "fsprobe.rules.yml"
PROMETHEUS_RULE = REPO / "deploy" / "kubernetes" / "prometheusrule.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "fsprobe.json"


@dataclass(frozen=True)
class Settings:
    """A site's settings (a mixin's ``_config``); the defaults render the shipped files."""

    runbook_base: str
    selector: str = ""
    cluster_label: str = "cluster"
    grafana_url: str = "http://localhost:3000"
    job_selector: str = 'job="fsprobe"'
    sidecar_job_selector: str = 'job="fsprobe-sidecar"'
    textfile_selector: str = 'file=~".*/fsprobe.prom"'

    def header(self, source: str) -> str:
        lines = [
            f"# GENERATED from {source} by deploy/prometheus/generate.py:",
            "# edit the template, then rerun the script. Settings:",
        ]
        for field in fields(self):
            value = getattr(self, field.name)
            lines.append(f"#   --{field.name.replace('_', '-')} '{value}'")
        return "\n".join(lines) + "\n"


RULES_HEADER = """\
#
# Prometheus recording and alerting rules for fsprobe: load with `rule_files: [fsprobe.rules.yml]`.
# What each alert means and what to do: docs/runbook.md (linked by every runbook_url); the
# Alertmanager inhibitions that make one cause one notification: deploy/alertmanager/.
"""
PROMETHEUS_RULE_HEADER = """\
#
# The fsprobe alerting and recording rules for the Prometheus Operator. The operator loads a
# PrometheusRule only if its labels match the Prometheus object's ruleSelector: adjust the
# labels below to your installation (kube-prometheus-stack selects release=<helm release>).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: fsprobe
  labels:
    app.kubernetes.io/name: fsprobe
    release: kube-prometheus-stack
spec:
"""
#: An fsprobe series in PromQL: its name and, if any, the opening brace of its matchers.
_SERIES = re.compile(r"\b(fsprobe_[a-z0-9_]+)\b(\{)?")
_RUNBOOK = re.compile(r"^(\s*)runbook_url: '.*'$")
#: The dashboard's selection in every query; the generator puts the site's in front.
_DASHBOARD_SELECTION = 'instance=~"$instance"'


def default_runbook_base() -> str:
    """The ``Runbook`` URL of pyproject.toml: the one place the project says where it lives."""
    with open(REPO / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["project"]["urls"]["Runbook"]


def with_selector(promql: str, selector: str) -> str:
    """`promql` with `selector` added to the matchers of every fsprobe_* series."""
    if not selector:
        return promql

    def add(match: re.Match) -> str:
        return f"{match[1]}{{{selector}, " if match[2] else f"{match[1]}{{{selector}}}"

    return _SERIES.sub(add, promql)


def _dashboard_link(settings: Settings) -> str:
    """The `dashboard_url` of an alert: the dashboard on its cluster, instance and path."""
    dashboard = json.loads(DASHBOARD_TEMPLATE.read_text(encoding="utf-8"))
    variables = "&".join(
        f"var-{name}={{{{ $labels.{label} | urlquery }}}}"
        for name, label in (("cluster", settings.cluster_label), ("instance", "instance"))
    )
    return (
        f"{settings.grafana_url.rstrip('/')}/d/{dashboard['uid']}/fsprobe?{variables}"
        "{{ with $labels.path }}&var-path={{ . | urlquery }}{{ end }}"
    )


def _groups(template: str, settings: Settings) -> list[str]:
    """The template's lines from ``groups:`` on, with the settings filled in."""
    lines = template.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("groups:"))
    link = _dashboard_link(settings)
    out: list[str] = []
    for line in lines[start:]:
        if not line.lstrip().startswith("#"):
            line = with_selector(line, settings.selector)
        out.append(line)
        runbook = _RUNBOOK.match(line)
        if runbook:  # every alert links the dashboard, next to its runbook section (folded
            # only at the spaces inside template actions, where one space is as good as another)
            indent = runbook[1] + "  "
            out.append(f"{runbook[1]}dashboard_url: >-")
            width = 98 - len(indent)  # 100 columns in the PrometheusRule too
            out += [
                indent + part
                for part in textwrap.wrap(
                    link, width, break_long_words=False, break_on_hyphens=False
                )
            ]
    text = "\n".join(out)
    for name, value in (
        ("RUNBOOK_BASE", settings.runbook_base),
        ("CLUSTER_LABEL", settings.cluster_label),
        ("JOB_SELECTOR", settings.job_selector),
        ("SIDECAR_JOB_SELECTOR", settings.sidecar_job_selector),
        ("TEXTFILE_SELECTOR", settings.textfile_selector),
    ):
        text = text.replace(f"@{name}@", value)
    leftover = re.search(r"@[A-Z_]+@", text)
    if leftover:
        raise SystemExit(f"{TEMPLATE}: unknown placeholder {leftover[0]}")
    return text.splitlines()


def _variable(name: str, label: str, query: str) -> dict:
    """A query variable of the dashboard, like its instance and path variables."""
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "definition": query,
        "query": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "regex": "",
        "hide": 0,
        "options": [],
    }


def render_dashboard(template: str, settings: Settings) -> str:
    """The dashboard: the site's selector and the cluster and job variables in every query."""
    dashboard = json.loads(template)
    cluster = f'{settings.cluster_label}=~"$cluster"'
    site = f"{settings.selector}, " if settings.selector else ""
    info = f"fsprobe_build_info{{{site}{cluster}}}"
    variables = dashboard["templating"]["list"]
    names = [variable["name"] for variable in variables]
    if "cluster" in names or "job" in names:
        raise SystemExit(f"{DASHBOARD_TEMPLATE}: the generator adds the cluster and job variables")
    at = names.index("instance")
    variables[at:at] = [
        _variable("cluster", "Cluster", f"label_values({info}, {settings.cluster_label})"),
        _variable("job", "Job", f"label_values(fsprobe_build_info{{{site}{cluster}}}, job)"),
    ]
    text = json.dumps(dashboard, indent=2, ensure_ascii=False)
    selection = json.dumps(f'{site}{cluster}, job=~"$job", {_DASHBOARD_SELECTION}')[1:-1]
    text = text.replace(json.dumps(_DASHBOARD_SELECTION)[1:-1], selection)
    return text + "\n"


def render(template: str, settings: Settings) -> dict[str, str]:
    """{file name: content} of the three outputs."""
    groups = _groups(template, settings)
    generated = settings.header("deploy/prometheus/fsprobe.rules.template.yml")
    indented = [f"  {line}" if line else "" for line in groups]
    return {
        RULES.name: generated + RULES_HEADER + "\n".join(groups) + "\n",
        PROMETHEUS_RULE.name: generated + PROMETHEUS_RULE_HEADER + "\n".join(indented) + "\n",
        DASHBOARD.name: render_dashboard(DASHBOARD_TEMPLATE.read_text(encoding="utf-8"), settings),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings(runbook_base="")
    for field in fields(Settings):
        if field.name == "runbook_base":
            parser.add_argument("--runbook-base", help="URL of the runbook (default: pyproject's)")
            continue
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            default=getattr(defaults, field.name),
            help=f"(default: {getattr(defaults, field.name)!r})",
        )
    parser.add_argument(
        "--output-dir", type=Path, help=f"write {RULES.name} (for rule_files:) into this directory"
    )
    parser.add_argument(
        "--kubernetes-dir",
        type=Path,
        help=f"write {PROMETHEUS_RULE.name} (for the Prometheus Operator) into this directory",
    )
    parser.add_argument("--grafana-dir", type=Path, help=f"write {DASHBOARD.name} there")
    parser.add_argument("--check", action="store_true", help="only check that they are current")
    args = parser.parse_args(argv)
    settings = Settings(
        **{
            field.name: getattr(args, field.name)
            for field in fields(Settings)
            if field.name != "runbook_base"
        },
        runbook_base=(args.runbook_base or default_runbook_base()).rstrip("#"),
    )
    outputs = render(TEMPLATE.read_text(encoding="utf-8"), settings)
    places = {RULES.name: RULES, PROMETHEUS_RULE.name: PROMETHEUS_RULE, DASHBOARD.name: DASHBOARD}
    chosen = (args.output_dir, args.kubernetes_dir, args.grafana_dir)
    if any(where is not None for where in chosen):
        wanted = dict(zip(places, chosen))
        places = {name: where / name for name, where in wanted.items() if where is not None}
    stale = []
    for name, path in places.items():
        content = outputs[name]
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != content:
                stale.append(path)
        else:  # a site's rules directory may not exist yet (/etc/prometheus/rules/fsprobe)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
    for path in stale:
        print(f"{path} is out of date: run {Path(__file__).name}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
