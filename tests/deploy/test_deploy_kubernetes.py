"""The Kubernetes examples: they parse, hold the expected objects, wire the sidecar to the
trainer as the hook needs it, and carry exactly the rule groups of deploy/prometheus."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fsprobe.daemon import config
from tests.support.capability import need_module

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
RULES = REPO / "deploy" / "prometheus" / "fsprobe.rules.yml"

EXPECTED_KINDS = {
    "training-job.yaml": ["Job"],
    "daemonset.yaml": ["ConfigMap", "DaemonSet"],
    "podmonitor.yaml": ["PodMonitor"],
    "prometheusrule.yaml": ["PrometheusRule"],
}


def _documents(name: str) -> list[dict]:
    text = (KUBERNETES / name).read_text(encoding="utf-8")
    return [document for document in yaml.safe_load_all(text) if document is not None]


def _one(name: str, kind: str) -> dict:
    (document,) = [doc for doc in _documents(name) if doc["kind"] == kind]
    return document


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _mounts(container: dict) -> dict[str, dict]:
    return {mount["name"]: mount for mount in container.get("volumeMounts", [])}


def test_every_manifest_parses_with_the_expected_kinds() -> None:
    found = {path.name for path in KUBERNETES.glob("*.yaml")}
    assert found == set(EXPECTED_KINDS)
    for name, kinds in EXPECTED_KINDS.items():
        documents = _documents(name)
        assert [document["kind"] for document in documents] == kinds, name
        for document in documents:
            assert document["apiVersion"] and document["metadata"]["name"], name


@pytest.fixture(scope="module")
def job_pod() -> dict:
    return _one("training-job.yaml", "Job")["spec"]["template"]


def test_fsprobe_is_a_native_sidecar_of_the_trainer(job_pod: dict) -> None:
    spec = job_pod["spec"]
    (sidecar,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][0] == "run"
    assert "restartPolicy" not in trainer


def test_checkpoint_volume_and_state_dir_are_shared(job_pod: dict) -> None:
    spec = job_pod["spec"]
    (sidecar,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    volumes = {volume["name"]: volume for volume in spec["volumes"]}

    target = sidecar["args"][1]
    checkpoint_mounts = [
        name
        for name, mount in _mounts(sidecar).items()
        if target == mount["mountPath"] or target.startswith(mount["mountPath"] + "/")
    ]
    (checkpoints,) = checkpoint_mounts
    assert "persistentVolumeClaim" in volumes[checkpoints]
    assert _mounts(trainer)[checkpoints]["mountPath"] == _mounts(sidecar)[checkpoints]["mountPath"]
    assert not _mounts(sidecar)[checkpoints].get("readOnly"), "the write probe writes there"

    state_dir = _flag(sidecar["args"], "--state-dir")
    env = {item["name"]: item["value"] for item in trainer["env"]}
    assert env["FSPROBE_STATE_DIR"] == state_dir
    (state_volume,) = [
        name for name, mount in _mounts(sidecar).items() if state_dir.startswith(mount["mountPath"])
    ]
    assert "emptyDir" in volumes[state_volume]
    shared_root = _mounts(sidecar)[state_volume]["mountPath"]
    assert _mounts(trainer)[state_volume]["mountPath"] == shared_root
    # The root of an emptyDir is writable by others (or the fsGroup): the hook would refuse it.
    assert os.path.dirname(state_dir.rstrip("/")) == shared_root.rstrip("/")


def test_both_containers_run_as_one_uid(job_pod: dict) -> None:
    spec = job_pod["spec"]
    assert spec["securityContext"]["runAsUser"] > 0
    for container in [*spec["initContainers"], *spec["containers"]]:
        assert "runAsUser" not in container.get("securityContext", {}), container["name"]


def test_sidecar_serves_metrics_with_probes_and_resources(job_pod: dict) -> None:
    (sidecar,) = job_pod["spec"]["initContainers"]
    host, port = config.parse_listen(_flag(sidecar["args"], "--listen"))
    assert host not in ("127.0.0.1", "localhost", "::1"), "Prometheus scrapes the pod IP"
    ports = {item["name"]: item["containerPort"] for item in sidecar["ports"]}
    assert ports["metrics"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["port"] in ("metrics", port), probe
    resources = sidecar["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_podmonitor_selects_the_job_and_the_daemonset() -> None:
    monitor = _one("podmonitor.yaml", "PodMonitor")["spec"]
    wanted = monitor["selector"]["matchLabels"]
    (endpoint,) = monitor["podMetricsEndpoints"]
    job = _one("training-job.yaml", "Job")["spec"]["template"]
    daemon = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]
    for pod in (job, daemon):
        assert wanted.items() <= pod["metadata"]["labels"].items()
        containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
        port_names = {port["name"] for c in containers for port in c.get("ports", [])}
        assert endpoint["port"] in port_names


def test_prometheusrule_carries_the_same_groups_as_deploy_prometheus() -> None:
    rule = _one("prometheusrule.yaml", "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    expected = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    assert rule["spec"]["groups"] == expected


def test_the_node_daemon_is_a_node_agent_without_api_access() -> None:
    """Issue 11.8: scheduled first and evicted last like other node agents, and no service
    account token mounted into a root pod that never talks to the API."""
    spec = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["automountServiceAccountToken"] is False


def test_the_daemons_see_the_pids_of_the_trainers_that_send_them_saves(job_pod: dict) -> None:
    """Issue 35.9: in a pid namespace of its own, the kernel names every sender pid 0, and
    the daemon can neither tell a hung trainer from a killed one nor read its groups (held
    by tests/events/test_senders_outside_the_pid_namespace.py). The node daemon runs in the
    host's, the sidecar in its pod's shared one."""
    daemonset = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    assert daemonset["hostPID"] is True
    assert job_pod["spec"]["shareProcessNamespace"] is True


def test_daemonset_config_is_accepted_by_the_config_loader(tmp_path: Path) -> None:
    config_map = _one("daemonset.yaml", "ConfigMap")
    daemon = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]["spec"]
    (container,) = daemon["containers"]
    config_path = _flag(container["args"], "--config")
    (config_mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert os.path.join(config_mount["mountPath"], "fsprobe.toml") == config_path

    config_file = tmp_path / "fsprobe.toml"
    config_file.write_text(config_map["data"]["fsprobe.toml"], encoding="utf-8")
    loaded = config.load(config.Overrides(config_file=str(config_file)), environ={})

    volumes = {volume["name"]: volume for volume in daemon["volumes"]}
    mounts = _mounts(container)
    assert loaded.state_dir == mounts["state"]["mountPath"]
    assert volumes["state"]["hostPath"]["path"] == loaded.state_dir
    ports = {item["name"]: item["containerPort"] for item in container["ports"]}
    assert loaded.listen_address == ("0.0.0.0", ports["metrics"])
    assert loaded.targets
    for target in loaded.targets:
        assert any(
            target.path.startswith(mount["mountPath"] + "/")
            for mount in mounts.values()
            if "hostPath" in volumes[mount["name"]] and mount["name"] != "state"
        ), f"target {target.path} is on no host filesystem mounted into the daemon"
        assert target.quota_enabled


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("training-job.yaml", "Job"),
        ("daemonset.yaml", "DaemonSet"),
        ("daemonset.yaml", "ConfigMap"),
    ],
)
def test_manifest_validates_against_the_kubernetes_schema(name: str, kind: str) -> None:
    """Strict: an unknown or misspelt field fails. 1.29 is the first release with native
    sidecars (init containers with restartPolicy: Always) enabled by default."""
    validator = need_module("kubernetes_validate")
    validator.validate(_one(name, kind), "1.29.0", strict=True)


def test_the_podmonitor_names_the_jobs_that_the_rules_select() -> None:
    """Without jobLabel the Prometheus Operator names the job "<namespace>/fsprobe", and the
    rules' FsprobeDown (job="fsprobe") fired its absent() form forever; the sidecars, gone
    whenever no training job runs, must have a job of their own that no absent() watches."""
    monitor = _one("podmonitor.yaml", "PodMonitor")["spec"]
    label = monitor["jobLabel"]
    job = _one("training-job.yaml", "Job")["spec"]["template"]["metadata"]["labels"][label]
    node = _one("daemonset.yaml", "DaemonSet")["spec"]["template"]["metadata"]["labels"][label]
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "fsprobe.rules.yml").read_text())
    down = [
        rule["expr"].strip()
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "FsprobeDown"
    ]
    assert down[0] == f'up{{job="{node}"}} == 0 or up{{job="{job}"}} == 0'
    assert down[2].startswith(f'absent(up{{job="{node}"}})')
    assert (node, job) == ("fsprobe", "fsprobe-sidecar")
