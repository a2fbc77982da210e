"""Every YAML file of the repository keeps the house style that `.yamllint` states (issue 11.8).

The rule files, their promtool tests and the Kubernetes manifests are read and edited by
people at sites: 100 columns like the code, and only an unbreakable token (a URL, a PromQL
selector, a promtool series) may run longer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from yamllint.config import YamlLintConfig

REPO = Path(__file__).resolve().parents[2]


def test_yamllint_finds_nothing_in_deploy() -> None:
    """deploy/ holds every YAML file of the repository; `.yamllint` itself is YAML too."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "yamllint",
            "--strict",
            "--format",
            "parsable",
            "deploy",
            ".yamllint",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_house_style_is_stated_not_defaulted() -> None:
    """A `.yamllint` that only extended the default would fail every rule file at 80 columns."""
    config = YamlLintConfig(file=str(REPO / ".yamllint"))
    assert config.rules["line-length"]["max"] == 100
    assert config.rules["document-start"] is False
    assert any(rule.ID == "trailing-spaces" for rule in config.enabled_rules(None))
    for shipped in ("deploy/prometheus/fsprobe.rules.yml", "deploy/kubernetes/daemonset.yaml"):
        assert not config.is_file_ignored(shipped)
    assert config.is_file_ignored(".venv/lib/some-package/config.yml")
