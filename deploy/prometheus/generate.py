#!/usr/bin/env python3
"""Generate fsprobe's Prometheus rules from deploy/prometheus/fsprobe.rules.template.yml.

Two outputs from one source, so that they can never drift apart:

- ``deploy/prometheus/fsprobe.rules.yml``, for ``rule_files:`` (and promtool's unit tests);
- ``deploy/kubernetes/prometheusrule.yaml``, the same groups in a PrometheusRule object for the
  Prometheus Operator.

Two settings differ between sites and are filled in here, mixin style:

- ``--runbook-base``: where docs/runbook.md is published; every alert's ``runbook_url`` is this
  plus ``#<alert name in lower case>``. Default: the ``Runbook`` URL in pyproject.toml's
  ``[project.urls]``, so the package metadata and the alerts name the same place;
- ``--job-selector``: the label matchers of the node daemons' scrape job, for ``FsprobeDown``
  (default ``job="fsprobe"``: the DaemonSet's pods carry ``fsprobe.io/job: fsprobe``, which
  the PodMonitor's ``jobLabel`` makes the job); its absence is an alert;
- ``--sidecar-job-selector``: that of the sidecars beside training jobs (default
  ``job="fsprobe-sidecar"``): a sidecar that fails to answer is an alert, its absence is not
  (no sidecar runs while no training job does).

The rule groups are copied as text, so the comments survive.

    python deploy/prometheus/generate.py                   # rewrite both files in the repository
    python deploy/prometheus/generate.py --check           # exit 1 if either is out of date
    python deploy/prometheus/generate.py --job-selector 'job="node-fsprobe"' \\
        --runbook-base https://wiki.example.org/fsprobe/runbook --output-dir /etc/prometheus/fsprobe
    python deploy/prometheus/generate.py --kubernetes-dir ./k8s    # the PrometheusRule alone

`--output-dir` writes only the Prometheus rule file and `--kubernetes-dir` only the
PrometheusRule: a rules directory holds files that `promtool check rules` and Prometheus load,
and a PrometheusRule there fails them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python < 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "deploy" / "prometheus" / "fsprobe.rules.template.yml"
RULES = REPO / "deploy" / "prometheus" / "fsprobe.rules.yml"
PROMETHEUS_RULE = REPO / "deploy" / "kubernetes" / "prometheusrule.yaml"
DEFAULT_JOB_SELECTOR = 'job="fsprobe"'
DEFAULT_SIDECAR_JOB_SELECTOR = 'job="fsprobe-sidecar"'

GENERATED = """\
# GENERATED from deploy/prometheus/fsprobe.rules.template.yml by deploy/prometheus/generate.py:
# edit the template, then rerun the script. Settings:
#   --runbook-base {runbook_base}
#   --job-selector '{job_selector}'
#   --sidecar-job-selector '{sidecar_job_selector}'
"""
RULES_HEADER = """\
#
# Prometheus recording and alerting rules for fsprobe: load with `rule_files: [fsprobe.rules.yml]`.
# What each alert means and what to do: docs/runbook.md (linked by every runbook_url).
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


def default_runbook_base() -> str:
    """The ``Runbook`` URL of pyproject.toml: the one place the project says where it lives."""
    with open(REPO / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["project"]["urls"]["Runbook"]


def _groups(
    template: str, runbook_base: str, job_selector: str, sidecar_job_selector: str
) -> list[str]:
    """The template's lines from ``groups:`` on, with the settings filled in."""
    lines = template.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("groups:"))
    text = "\n".join(lines[start:])
    text = text.replace("@RUNBOOK_BASE@", runbook_base).replace("@JOB_SELECTOR@", job_selector)
    text = text.replace("@SIDECAR_JOB_SELECTOR@", sidecar_job_selector)
    leftover = re.search(r"@[A-Z_]+@", text)
    if leftover:
        raise SystemExit(f"{TEMPLATE}: unknown placeholder {leftover[0]}")
    return text.splitlines()


def render(
    template: str,
    runbook_base: str,
    job_selector: str,
    sidecar_job_selector: str = DEFAULT_SIDECAR_JOB_SELECTOR,
) -> dict[str, str]:
    """{file name: content} of both outputs."""
    groups = _groups(template, runbook_base, job_selector, sidecar_job_selector)
    generated = GENERATED.format(
        runbook_base=runbook_base,
        job_selector=job_selector,
        sidecar_job_selector=sidecar_job_selector,
    )
    indented = [f"  {line}" if line else "" for line in groups]
    return {
        RULES.name: generated + RULES_HEADER + "\n".join(groups) + "\n",
        PROMETHEUS_RULE.name: generated + PROMETHEUS_RULE_HEADER + "\n".join(indented) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runbook-base", help="URL of the runbook (default: pyproject.toml's)")
    parser.add_argument(
        "--job-selector",
        default=DEFAULT_JOB_SELECTOR,
        help="label matchers of the node daemons' scrape job, whose absence is an alert "
        f"(default: {DEFAULT_JOB_SELECTOR})",
    )
    parser.add_argument(
        "--sidecar-job-selector",
        default=DEFAULT_SIDECAR_JOB_SELECTOR,
        help="label matchers of the sidecars' scrape job, absent while no training job runs "
        f"(default: {DEFAULT_SIDECAR_JOB_SELECTOR})",
    )
    parser.add_argument(
        "--output-dir", type=Path, help=f"write {RULES.name} (for rule_files:) into this directory"
    )
    parser.add_argument(
        "--kubernetes-dir",
        type=Path,
        help=f"write {PROMETHEUS_RULE.name} (for the Prometheus Operator) into this directory",
    )
    parser.add_argument("--check", action="store_true", help="only check that they are current")
    args = parser.parse_args(argv)
    runbook_base = (args.runbook_base or default_runbook_base()).rstrip("#")
    outputs = render(
        TEMPLATE.read_text(encoding="utf-8"),
        runbook_base,
        args.job_selector,
        args.sidecar_job_selector,
    )
    places = {RULES.name: RULES, PROMETHEUS_RULE.name: PROMETHEUS_RULE}
    if args.output_dir is not None or args.kubernetes_dir is not None:
        wanted = {RULES.name: args.output_dir, PROMETHEUS_RULE.name: args.kubernetes_dir}
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
