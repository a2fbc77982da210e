"""A fleet, not a node: deploy/prometheus/agent.yml in real Prometheus agents, one per node,
remote-writing to a Prometheus that receives the fleet's series and evaluates the shipped rules,
alerting the shipped Alertmanager configuration (docs/deployment.md, "A fleet, not a node").

Two nodes' daemons watch the same shared filesystem (a tmpfs both see, as every node sees a
Lustre or NFS mount) and a directory of their own. Time is compressed as in the on-call
scenarios (tests/support/oncall.py). The shared filesystem fills up: the rules fire for both
nodes, labelled with the agents' `cluster`, and the pager gets one incident (one Alertmanager
group) that names the path and lists both nodes, instead of one incident per node. The
dashboard's cluster variable and panels, run against the same storage, show both nodes.
Then one node's agent is killed: its silence is one page of its own (FsprobeAgentSilent), and
the node's part of the open incident is never resolved while nothing is known of it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_deploy_alertmanager import fill_to
from tests.support.alertmanager import Alertmanager, Webhook
from tests.support.capability import need_command
from tests.support.daemon_process import PATIENCE, REPO_ROOT, DaemonProcess, clean_environment
from tests.support.oncall import (
    PROMETHEUS_FLAGS,
    SCALE,
    daemon_defaults,
    scaled_alertmanager,
    scaled_rules,
)
from tests.support.prometheus import Prometheus, PrometheusAgent

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

AGENT = REPO_ROOT / "deploy" / "prometheus" / "agent.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "fsprobe.json"
RULES = REPO_ROOT / "deploy" / "prometheus" / "fsprobe.rules.yml"
ALERTMANAGER = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
NODES = ("node-a", "node-b")


def agent_config(name: str, scraped: str, receiver: str) -> str:
    """The shipped agent configuration, named `name`, scraping `scraped` instead of its file_sd
    nodes and writing to `receiver`, on compressed time (a 1 m scrape, a batch sent within 6 s,
    60 times faster); the rest as shipped."""
    config = yaml.safe_load(AGENT.read_text(encoding="utf-8"))
    config["global"].update(scrape_interval="1s", scrape_timeout="1s")
    config["global"]["external_labels"]["agent"] = name
    (job,) = config["scrape_configs"]
    del job["file_sd_configs"]
    job["static_configs"] = [{"targets": [scraped]}]
    (remote,) = config["remote_write"]
    remote["url"] = f"http://{receiver}/api/v1/write"
    remote["queue_config"] = {"batch_send_deadline": f"{round(6000 / SCALE)}ms"}
    return yaml.safe_dump(config)


def _address(daemon: DaemonProcess) -> str:
    return daemon.url.split("//")[1].split("/")[0]


def test_a_shared_filesystem_filling_up_pages_once_for_the_whole_fleet(tmp_path, tmpfs):
    shared = tmpfs(size="8M").path
    started: list = []
    try:
        webhook = Webhook()
        started.append(webhook)
        (tmp_path / "alertmanager").mkdir()
        alertmanager = Alertmanager(
            tmp_path / "alertmanager", scaled_alertmanager(ALERTMANAGER, webhook)
        )
        started.append(alertmanager)
        alertmanager.wait_ready()
        (tmp_path / "central").mkdir()
        central = Prometheus(
            tmp_path / "central",
            "",
            [scaled_rules(RULES, tmp_path)],
            alertmanager.address,
            jobs={},
            flags=(*PROMETHEUS_FLAGS, "--web.enable-remote-write-receiver"),
        )
        started.append(central)
        central.wait_ready()
        instances, agents = [], []
        for node in NODES:
            home = tmp_path / node
            (home / "local").mkdir(parents=True)
            (home / "daemon").mkdir()
            config = home / "fsprobe.toml"
            config.write_text(
                daemon_defaults()
                + "".join(
                    f'[[targets]]\npath = "{t}"\nquota_probe = "never"\n'
                    for t in (shared, home / "local")
                )
            )
            daemon = DaemonProcess(
                home / "daemon", "--config", str(config), env=clean_environment(TMPDIR=str(home))
            )
            started.append(daemon.start())
            instances.append(_address(daemon))
            agent = PrometheusAgent(
                home, agent_config(f"rack-{node}", _address(daemon), central.address)
            )
            started.append(agent)
            agent.wait_ready()
            agents.append(agent)

        # The rules evaluate the fleet's series: every node's, with the agents' cluster.
        held = f'fsprobe:headroom_ratio:held{{cluster="hpc-a",path="{shared}",resource="bytes"}}'
        central.wait_for(f"count({held})", 2.0, timeout=PATIENCE)
        central.wait_for('count(up{cluster="hpc-a",job="fsprobe"} == 1)', 2.0)
        # The dashboard on the fleet's storage: its cluster variable offers the agents' cluster,
        # and its panels show every node of it.
        for title in ("Status", "Space headroom", "Filesystems", "Probe duration"):
            assert _instances_in_panel(central, title) == set(instances), title

        fill_to(shared, 0.02)  # under 3 %: critical, yet test writes still fit
        expected = {("FsprobeSpaceHeadroomLow", "critical", i) for i in instances}
        deadline = time.monotonic() + PATIENCE
        while not expected <= _firing(central, shared):
            assert time.monotonic() < deadline, central.alerts()
            time.sleep(0.25)
        time.sleep(20 * 60 / SCALE)  # 20 compressed minutes: what else would be sent
        agents[0].proc.kill()  # node-a's agent crashes: nothing more of node-a arrives
        silent = {"alertname": "FsprobeAgentSilent", "agent": "rack-node-a"}
        central.wait_for(
            "count(ALERTS{"
            + ",".join(f'{k}="{v}"' for k, v in silent.items())
            + ',alertstate="firing"})',
            1.0,
            timeout=PATIENCE,
        )
        time.sleep(20 * 60 / SCALE)  # node-a's alerts would have ended (keep_firing_for 10m)
    finally:
        for thing in reversed(started):
            thing.stop()
    everything = [a for _, n in webhook.notifications() for a in n["alerts"]]
    assert [a for a in everything if a["status"] == "resolved"] == [], "resolved while unknown"
    silences = [
        page
        for page in _sent(webhook, "fsprobe-pager")
        if page["groupLabels"].get("alertname") == "FsprobeAgentSilent"
    ]
    assert len(silences) == 1, silences
    (alert,) = silences[0]["alerts"]
    assert {k: alert["labels"][k] for k in silent} == silent
    assert "rack-node-a" in alert["annotations"]["summary"]
    assert "1 fsprobe daemon(s)" in alert["annotations"]["description"]
    assert "systemctl status prometheus-agent" in alert["annotations"]["action"]
    pages = [page for page in _sent(webhook, "fsprobe-pager") if page not in silences]
    print(f"\n{len(pages)} notification(s) of {len({p['groupKey'] for p in pages})} group(s)")
    # One incident: every paging integration keys it by the group (PagerDuty's dedup_key,
    # Opsgenie's alias); a node whose `for:` ended after the group's first notification joins
    # it in a later one, the same incident.
    assert len({page["groupKey"] for page in pages}) == 1, pages
    assert all(a["status"] == "firing" for page in pages for a in page["alerts"]), pages
    assert {a["labels"]["alertname"] for p in pages for a in p["alerts"]} == {
        "FsprobeSpaceHeadroomLow"
    }
    assert {a["labels"]["instance"] for a in pages[-1]["alerts"]} == set(instances)
    assert pages[-1]["groupLabels"] == {
        "alertname": "FsprobeSpaceHeadroomLow",
        "cluster": "hpc-a",
        "path": str(shared),
    }
    assert _sent(webhook, "fsprobe-tickets") == []


def _instances_in_panel(central: Prometheus, title: str) -> set[str]:
    """The instances the dashboard's panel `title` shows for cluster hpc-a, every job,
    instance and path."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "cluster"]
    query = variable["query"].removeprefix("label_values(").removesuffix(", cluster)")
    clusters = {r["metric"]["cluster"] for r in central.query(query.replace("$cluster", ".*"))}
    assert clusters == {"hpc-a"}, clusters
    (panel,) = [p for p in dashboard["panels"] if p.get("title") == title]
    shown: set[str] = set()
    for target in panel["targets"]:
        expr = target["expr"].replace("$cluster", "hpc-a").replace("$__rate_interval", "4s")
        expr = re.sub(r"\$\w+", ".*", expr)
        shown |= {result["metric"]["instance"] for result in central.query(expr)}
    return shown


def _firing(central: Prometheus, path: Path) -> set[tuple[str, str, str]]:
    return {
        (a["labels"]["alertname"], a["labels"]["severity"], a["labels"]["instance"])
        for a in central.alerts()
        if a["state"] == "firing" and a["labels"].get("path") == str(path)
    }


def _sent(webhook: Webhook, receiver: str) -> list[dict]:
    """The notifications `receiver` got with a firing alert in them."""
    return [
        notification
        for name, notification in webhook.notifications()
        if name == receiver and any(a["status"] == "firing" for a in notification["alerts"])
    ]


def test_the_shipped_agent_configuration_is_valid():
    """promtool accepts deploy/prometheus/agent.yml as it is shipped, in agent mode."""
    promtool = need_command("promtool", "prometheus")
    done = subprocess.run(
        [promtool, "check", "config", "--agent", str(AGENT)],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
