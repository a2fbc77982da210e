#!/usr/bin/env python3
"""Write deploy/kubernetes/prometheusrule.yaml from deploy/prometheus/fsprobe.rules.yml.

The Prometheus Operator wants the rule groups wrapped in a PrometheusRule object; keeping one
source and generating the other means the two can never drift apart. The groups are copied as
text (indented under ``spec:``), so the comments in the rule file survive.

    python deploy/kubernetes/generate-prometheusrule.py           # rewrite the file
    python deploy/kubernetes/generate-prometheusrule.py --check   # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent
RULES = DEPLOY / "prometheus" / "fsprobe.rules.yml"
OUTPUT = DEPLOY / "kubernetes" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/fsprobe.rules.yml by
# deploy/kubernetes/generate-prometheusrule.py: edit the rule file, then rerun the script.
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


def render(rules_text: str) -> str:
    """The PrometheusRule document for the text of a rule file (from its ``groups:`` on)."""
    lines = rules_text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("groups:"))
    body = [f"  {line}" if line else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that it is up to date")
    args = parser.parse_args(argv)
    wanted = render(RULES.read_text(encoding="utf-8"))
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != wanted:
            print(f"{OUTPUT} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
