"""The Grafana dashboard (manifests/base/dashboards/) against what the services really export.

Every query of every panel, and the query of every template variable, is run against a real
Prometheus that scrapes a real running extender, energy adapter and node power controller:
each must parse and return series. The test walks the dashboard JSON, so a panel added later is
checked without touching this file; a panel on a metric nothing exports fails here, naming the
panel.

The world: three tiny exporters stand in for node_exporter + ipmi_exporter on node-a, node-b
and node-c (node-a and node-c with a battery); the real control plane (tests/conftest.py)
holds the three nodes, kept alive by a node agent and named after this run (the cluster is
shared with other tests) (node-b with a power cap it always exceeds; node-a and node-b in grid
zone eu-north, node-c in eu-south), and pods with a history that the real ReplicaSet and Job
controllers create and the test reports as kubelets would (a crash-looping one on node-b, a
finished Job on node-a, an image that cannot be pulled); the bundle has models for node-a and
node-b, so the fleet fallback serves node-c. Every component runs as its own ServiceAccount.
The extender runs in live mode (Prometheus + Kubernetes) with a
profile that adds Carbon (a static intensity file with a forecast), Delay (a static RTT file)
and Reward (the pod watch, evidence saved to a ConfigMap). The energy adapter labels the nodes
from their batteries (node-c becomes powerless). The node power controller
(`python -m controllers.node_power --apply`, the dry-run driver) powers off idle node-c, wakes
it for a pod the real scheduler finds no room for, and powers it off again once that pod is
gone; node-b is opted in with the redfish driver but has no entry in the BMC Secret, so its
power-off fails before anything is touched; node-a comes cordoned in the middle of a drain a
previous leader began, with the kill switch set since, and the drain is given up. A client
plays kube-scheduler (filter, prioritize, a pod that may wait for cleaner power, one bad
request) while the queries run.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.support import pods
from bench.support.prometheus import RELOADABLE, set_scrape_targets
from controllers import energy_adapter as ea
from envtest import ControlPlane, NodeAgent
from extender.__main__ import prepare
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.plugins.reward import DEFAULT_CONFIG_MAP
from livedata.labels import (
    DEFER_UNTIL_ANNOTATION,
    POWER_DRAINING,
    POWER_DRIVER_LABEL,
    POWER_DRIVER_REDFISH,
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_STATE_ANNOTATION,
    POWER_STATE_REASON_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
    REGION_LABEL,
)
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import FakeHost, serve, wait_until
from tests.support.manifests import dashboard
from tests.support.prometheus import PrometheusServer, free_port, start_prometheus
from tests.support.server import REPO_ROOT, serve_app

# How the test stands in for Grafana's variables: every node, and windows that hold several
# scrapes of the 1 s test interval. A query using a variable not listed here fails the
# structure test: add it here with a value Grafana would give.
GRAFANA_VARIABLES = {
    "$__rate_interval": "10s",
    "$__interval": "2s",
    "$__range": "1m",
    '"$node"': '".*"',
}
WAIT_FOR_SERIES_S = 60.0
BATTERY_BY_NODE = "node_power_supply_capacity * on (instance) group_left (nodename) node_uname_info"
# Unique in the shared cluster: the nodes carry this run's id (and a label naming it).
RUN = f"dash{uuid.uuid4().hex[:6]}"
NODE_A, NODE_B, NODE_C = (f"{RUN}-node-{x}" for x in "abc")
RUN_LABEL = "power-aware-scheduler.test/run"
CURVES = {
    NODE_A: PowerCurveSpec(100.0, 300.0, info={"metrics": {"mape_pct": 1.5, "mae_w": 3.0}}),
    NODE_B: PowerCurveSpec(90.0, 350.0, exponent=2, info={"metrics": {"mape_pct": 2.0}}),
}
FLEET = PowerCurveSpec(80.0, 250.0, info={"metrics": {"mape_pct": 38.6, "mae_w": 40.0}})
NAMESPACE = "power-aware-scheduler"
ZONES = {NODE_A: "eu-north", NODE_B: "eu-north", NODE_C: "eu-south"}
# Grid intensity now (g/kWh) and hourly from the current hour: wind makes both zones cleaner two
# hours from now, so a pod that may wait six hours is held for that window.
CARBON_NOW = {"eu-north": 300.0, "eu-south": 450.0}
CARBON_FORECAST = {
    "eu-north": (300.0, 290.0, 90.0, 100.0, 300.0, 300.0),
    "eu-south": (450.0, 440.0, 150.0, 160.0, 450.0, 450.0),
}
RTT_FILE = f"""\
nodes: [{NODE_A}, {NODE_B}, {NODE_C}]
rttMs:
  - [0, 0.4, 12]
  - [0.4, 0, 12.5]
  - [12, 12.5, 0]
"""
POD_HASH = "6f8b9c7d54"
# The node power controller's flags: acting (--apply) with the dry-run driver (the whole cycle
# except the power switch), deciding at once (no unneeded time), with a short cool-down, quick
# rounds and a long backoff (a node that failed is not tried again meanwhile). Arrivals are
# measured over ten minutes, with a margin of one standard deviation: in this three-node world
# the pods created at its start (10 cores, then a 6-core burst) are a lot of noise, and at the
# defaults node-c would rightly stay on for the six minutes they count.
NODE_POWER_FLAGS = (
    "--apply",
    f"--namespace={NAMESPACE}",
    "--default-driver=dry-run",
    "--scan-interval=0.5",
    "--scale-down-unneeded-time=0",
    "--node-cooldown=3s",
    "--min-on-nodes=1",
    "--max-off-fraction=1",
    "--min-headroom-cores=1",
    "--boot-time=60s",
    "--arrival-windows=10m",
    "--off-margin-sd=1",
    "--retry-backoff=1h",
    "--max-retry-backoff=1h",
    "--identity=power-node-controller-0",
    "--listen-host=127.0.0.1",
)


# ---- the dashboard's structure ----------------------------------------------------------------


def panels() -> list[dict]:
    """Every panel that shows data (rows are layout only), including panels inside rows."""
    found = []
    for panel in dashboard()["panels"]:
        found += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return found


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    found = [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in panels()
        for target in panel["targets"]
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else None
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query or "")
            assert match, f"variable {variable['name']}: expected label_values(metric, label)"
            found.append((f"variable ${variable['name']}", match.group(1)))
    return found


def as_prometheus_sees_it(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_panel_is_well_formed_and_uses_known_variables() -> None:
    board = dashboard()
    ids = [panel["id"] for panel in board["panels"]] + [
        inner["id"] for panel in board["panels"] for inner in panel.get("panels", [])
    ]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert board["uid"] == "power-aware-scheduler"
    variables = {variable["name"] for variable in board["templating"]["list"]}
    assert {"datasource", "node"} <= variables
    for panel in panels():
        where = f"panel {panel['id']} {panel['title']!r}"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel.get("description"), f"{where}: say what it shows and what is healthy"
        assert panel["targets"], where
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where
    taken: dict[tuple[int, int], str] = {}  # grid cell (x, y) -> the panel there
    for panel in board["panels"]:
        where = f"panel {panel['id']} {panel['title']!r}"
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{where}: outside the 24 columns"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{where} overlaps {taken[(x, y)]}"
                taken[(x, y)] = where
    for where, expr in queries():
        left = re.findall(r"\$\{?\w+\}?", as_prometheus_sees_it(expr))
        assert not left, f"{where}: variables {left} have no test value in GRAFANA_VARIABLES"


# ---- a real world to scrape -------------------------------------------------------------------


@dataclass
class World:
    prometheus: PrometheusServer
    extender_url: str


def _scheduler_body(names: list[str], pod: dict[str, Any] | None = None) -> bytes:
    pod = pod or {
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe-1"},
        "spec": {
            "schedulerName": "power-aware-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
        },
    }
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def _deferrable_pod() -> dict[str, Any]:
    """A batch pod that may wait up to six hours for cleaner power."""
    return {
        "metadata": {
            "name": "nightly-report",
            "namespace": "default",
            "uid": "deferrable-1",
            "creationTimestamp": pods.rfc3339(time.time() - 30),
            "annotations": {DEFER_UNTIL_ANNOTATION: "6h"},
        },
        "spec": {
            "schedulerName": "power-aware-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
    }


def _register(agent: NodeAgent, core: client.CoreV1Api, name: str) -> None:
    labels = {REGION_LABEL: ZONES[name], RUN_LABEL: RUN}
    annotations = {}
    unschedulable = False
    if name == NODE_A:  # a drain a previous leader began, and the operator's kill switch
        labels |= {POWER_MANAGEMENT_LABEL: POWER_MANAGEMENT_ENABLED}
        annotations |= {
            POWER_STATE_ANNOTATION: POWER_DRAINING,
            POWER_STATE_SINCE_ANNOTATION: pods.rfc3339(time.time() - 120),
            POWER_MANAGEMENT_DISABLED_ANNOTATION: "true",
        }
        unschedulable = True  # cordoned by that drain
    if name == NODE_B:  # opted in, with a driver whose BMC Secret entry is missing
        labels |= {POWER_MANAGEMENT_LABEL: POWER_MANAGEMENT_ENABLED}
        labels |= {POWER_DRIVER_LABEL: POWER_DRIVER_REDFISH}
        annotations |= {"power-aware-scheduler/max-power-w": "1"}
    if name == NODE_C:  # opted in, the controller's default (dry-run) driver
        labels |= {POWER_MANAGEMENT_LABEL: POWER_MANAGEMENT_ENABLED}
    agent.add_node(name, cpu=8, memory="32Gi", labels=labels, annotations=annotations)
    if unschedulable:
        core.patch_node(name, {"spec": {"unschedulable": True}})


def _write_plugin_files(root: Path, pod_namespace: str) -> Path:
    """The extender's profile with Carbon, Delay and Reward, and the files they read."""
    hour_s = time.time() // 3600 * 3600
    carbon = root / "carbon.yaml"
    carbon.write_text(
        yaml.safe_dump(
            {
                "intensities": [
                    {
                        "zone": zone,
                        "signal": "average",
                        "g_per_kwh": CARBON_NOW[zone],
                        "forecast": [
                            {
                                "start": pods.rfc3339(hour_s + 3600 * k),
                                "end": pods.rfc3339(hour_s + 3600 * (k + 1)),
                                "g_per_kwh": value,
                            }
                            for k, value in enumerate(values)
                        ],
                    }
                    for zone, values in CARBON_FORECAST.items()
                ]
            }
        )
    )
    rtt = root / "rtt.yaml"
    rtt.write_text(RTT_FILE)
    profile = root / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "power-aware-scheduler/v1alpha1",
                "kind": "ExtenderConfiguration",
                "plugins": {
                    "filter": {"enabled": [{"name": "Carbon"}, {"name": "Delay"}]},
                    "score": {
                        "enabled": [
                            {"name": "Carbon", "weight": 0.2},
                            {"name": "Reward", "weight": 0.2},
                        ]
                    },
                },
                "pluginConfig": [
                    {
                        "name": "Carbon",
                        "args": {
                            "pollSeconds": 1,
                            "sources": [{"kind": "file", "path": str(carbon)}],
                        },
                    },
                    {"name": "Delay", "args": {"rttFile": str(rtt), "refreshIntervalS": 1}},
                    {
                        "name": "Reward",
                        "args": {
                            "configMapNamespace": NAMESPACE,
                            # Other tests' pods share the cluster: learn from this one's only.
                            "namespaces": [pod_namespace],
                            "saveIntervalS": 1,
                            "publishIntervalS": 0.2,
                        },
                    },
                ],
            }
        )
    )
    return profile


def _pods_with_a_history(kube_api: client.ApiClient, namespace: str, extender_url: str) -> None:
    """Pods as the kubelets report them, for the reward source to learn from and the node power
    controller to see as load: a web Deployment's pod using 6 of node-a's 8 cores, a Job that
    finished there, a batch pod on node-b killed for memory three times, and a pod on node-b
    whose image cannot be pulled (not the node's fault). The real ReplicaSet and Job
    controllers create them (pinned to their nodes); the test writes what their kubelets
    would have reported over the last minute."""
    wait_until(
        lambda: _reward_status(extender_url).get("persistence", {}).get("loaded"),
        "the reward source loading its ConfigMap",
    )
    core, apps, batch_api = (
        client.CoreV1Api(kube_api), client.AppsV1Api(kube_api), client.BatchV1Api(kube_api)
    )  # fmt: skip
    began_s = time.time() - 60

    def report(pod: dict[str, Any]) -> dict[str, Any]:
        """Write the pod's status as its kubelet does (the status subresource)."""
        written = core.replace_namespaced_pod_status(pod["metadata"]["name"], namespace, pod)
        return kube_api.sanitize_for_serialization(written)

    def template(app: str, node: str, cpu: str, restart: str) -> dict[str, Any]:
        container = {"name": pods.CONTAINER, "image": pods.IMAGE,
                     "resources": {"requests": {"cpu": cpu}}}  # fmt: skip
        return {
            "metadata": {"labels": {"app": app, "pod-template-hash": POD_HASH}},
            "spec": {"nodeName": node, "restartPolicy": restart, "containers": [container],
                     "schedulerName": "power-aware-scheduler"},
        }  # fmt: skip

    def created(app: str) -> dict[str, Any]:
        """The controller's pod, just bound: Pending, its container being created."""

        def listed() -> list[Any]:
            return core.list_namespaced_pod(namespace, label_selector=f"app={app}").items

        wait_until(listed, f"the {app} pod to be created")
        pod = kube_api.sanitize_for_serialization(listed()[0])
        status = pods.bound_pod(pod["metadata"], pod["spec"]["nodeName"], at_s=began_s)["status"]
        status["qosClass"] = pod["status"]["qosClass"]  # the API server's to decide
        return report(pod | {"status": status})

    def deployment_pod(app: str, node: str, cpu: str) -> dict[str, Any]:
        name = f"{app}-{POD_HASH}"  # a Deployment's ReplicaSet
        spec = {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                "template": template(app, node, cpu, "Always")}  # fmt: skip
        apps.create_namespaced_replica_set(namespace, {"metadata": {"name": name}, "spec": spec})
        return created(app)

    web = deployment_pod("web", NODE_A, "6")
    report(pods.running_pod(web, started_at_s=began_s + 1))
    batch_api.create_namespaced_job(namespace, {
        "metadata": {"name": "report"},
        "spec": {"backoffLimit": 0, "template": template("report", NODE_A, "1", "Never")},
    })  # fmt: skip
    job = report(pods.running_pod(created("report"), started_at_s=began_s + 1))
    report(pods.succeeded_pod(job, started_at_s=began_s + 1, finished_at_s=began_s + 20))
    batch = report(pods.running_pod(deployment_pod("batch", NODE_B, "3"), started_at_s=began_s + 1))
    report(
        pods.crash_looping_pod(
            batch,
            restarts=3,
            reason="OOMKilled",
            exit_code=137,
            finished_at_s=began_s + 30,
            started_at_s=began_s + 20,
        )
    )
    report(
        pods.waiting_pod(deployment_pod("api", NODE_B, "0"), "ImagePullBackOff", "Back-off pulling")
    )
    wait_until(
        lambda: _reward_status(extender_url).get("outcomes") == {"oom_killed": 3, "succeeded": 1},
        "the reward source learning from the pods",
    )


def _reward_status(extender_url: str) -> dict[str, Any]:
    return httpx.get(f"{extender_url}/status", timeout=10).json()["plugins"]["Reward"]


@contextlib.contextmanager
def _node_power_controller(root: Path, kubeconfig: Path, bundle: Path) -> Iterator[str]:
    """`python -m controllers.node_power` in a subprocess; yields its metrics address."""
    secret = root / "bmc-secret"  # the mounted BMC Secret, without an entry for node-b
    secret.mkdir()
    # Ranking by grams, from the file the extender's Carbon plugin reads too.
    carbon_sources = root / "node-power-carbon.yaml"
    carbon_sources.write_text(
        yaml.safe_dump(
            {"sources": [{"kind": "file", "name": "site", "path": str(root / "carbon.yaml")}]}
        )
    )
    port = free_port()
    log = root / "node-power.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "controllers.node_power", *NODE_POWER_FLAGS,
                f"--kubeconfig={kubeconfig}", f"--bundle={bundle}",
                f"--bmc-secret-dir={secret}", f"--listen-port={port}",
                "--rank-by=grams", f"--carbon-sources={carbon_sources}",
                "--carbon-poll-interval=1s",
            ],
            cwd=REPO_ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield f"127.0.0.1:{port}"
    except AssertionError as error:
        raise AssertionError(f"{error}\nnode power controller log:\n{log.read_text()}") from None
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _power_cycle(core: client.CoreV1Api, namespace: str) -> None:
    """node-c off, woken for a pod that fits on no other node, off again once it is gone; by
    then node-b's power-off has failed and node-a's drain has been given up."""

    def annotation(node: str, key: str) -> str:
        return (core.read_node(node).metadata.annotations or {}).get(key, "")

    def state(node: str) -> str:
        return annotation(node, POWER_STATE_ANNOTATION)

    wait_until(lambda: state(NODE_C) == "off", "the controller powering off idle node-c")
    burst = {
        "metadata": {"name": "burst-1", "labels": {"app": "burst"}},
        "spec": {
            "schedulerName": "power-aware-scheduler",
            # This test's nodes only: the real scheduler finds room on none that is on, and
            # marks the pod Unschedulable.
            "nodeSelector": {RUN_LABEL: RUN},
            "containers": [
                {"name": "c", "image": "burst", "resources": {"requests": {"cpu": "6"}}}
            ],
        },
    }
    core.create_namespaced_pod(namespace, burst)  # 6 cores: room on no node that is on
    wait_until(lambda: state(NODE_C) in ("waking", "on"), "node-c woken for the pending pod")
    # The pod goes (scheduled elsewhere, or given up) while node-c boots, or at the latest
    # within its cool-down: node-c comes on, stays the cool-down, then goes off again.
    core.delete_namespaced_pod("burst-1", namespace, grace_period_seconds=0)
    wait_until(lambda: state(NODE_C) == "off", "node-c powered off again")
    wait_until(
        lambda: "power-off not started" in annotation(NODE_B, POWER_STATE_REASON_ANNOTATION),
        "node-b's power-off failing on its missing BMC Secret entry",
    )
    assert state(NODE_A) == "on"  # its drain given up: kill switch
    assert "kill switch" in annotation(NODE_A, POWER_STATE_REASON_ANNOTATION)


def _delete_config_map(core: client.CoreV1Api, name: str, namespace: str) -> None:
    with contextlib.suppress(ApiException):
        core.delete_namespaced_config_map(name, namespace)


def _delete_namespace(core: client.CoreV1Api, namespace: str) -> None:
    """The namespace, then its pods at once: no kubelet finishes their graceful deletion (and
    a terminating namespace takes no replacements from their controllers)."""
    with contextlib.suppress(ApiException):
        core.delete_namespace(namespace)
    for pod in core.list_namespaced_pod(namespace).items:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[World]:
    root = tmp_path_factory.mktemp("dashboard")
    with contextlib.ExitStack() as stack:
        hosts = {
            NODE_A: FakeHost(
                0.3, {"Inlet Temp": 22.0, "CPU1 Temp": 50.0}, 160.0, NODE_A, battery_pct=60.0
            ),
            NODE_B: FakeHost(0.6, {"Ambient": 24.0, "CPU1 Temp": 61.0}, 260.0),
            NODE_C: FakeHost(
                0.2, {"Inlet Temp": 23.0, "CPU1 Temp": 45.0}, 120.0, NODE_C, battery_pct=8.0
            ),
        }
        exporters = {}
        for name, host in hosts.items():
            exporters[name] = serve(host)
            stack.callback(exporters[name].stop)
        prometheus = start_prometheus(
            root, scrape_targets=[e.target for e in exporters.values()], extra_args=RELOADABLE
        )
        stack.callback(prometheus.stop)
        admin = client.CoreV1Api(control_plane.api_client())
        namespace = RUN  # the pods' namespace
        admin.create_namespace({"metadata": {"name": namespace}})
        stack.callback(_delete_namespace, admin, namespace)
        # The extender saves its evidence under the one name its Role allows: gone after.
        stack.callback(_delete_config_map, admin, DEFAULT_CONFIG_MAP, NAMESPACE)
        # Kubelets that keep the nodes alive but leave their pods alone: the test writes the
        # pods' statuses as kubelets would have over the last minute (a Job that finished,
        # restarts, an image that cannot be pulled), which running them would start afresh.
        agent = NodeAgent(control_plane.api_client(), heartbeat_s=1.0, run_pods=False).start()
        for name in hosts:
            stack.callback(agent.remove_node, name)
        stack.callback(agent.stop)
        for name in hosts:
            _register(agent, admin, name)

        def kubeconfig_of(account: str) -> Path:
            """Each component runs as the ServiceAccount the manifests give it."""
            return control_plane.service_account_kubeconfig(
                NAMESPACE, account, root / f"{account}.kubeconfig"
            )

        collect_config = root / "collect.yaml"
        # All exporters share the host 127.0.0.1, which node_uname_info cannot tell apart:
        # map each instance (host and port) to its node.
        instance_nodes = {exporter.target: name for name, exporter in exporters.items()}
        collect_config.write_text(
            yaml.safe_dump({"cpu_rate_window": "5s", "instance_nodes": instance_nodes})
        )
        bundle = make_bundle(root / "bundle", CURVES, fallback=FLEET)
        prometheus.wait_for('rate(node_cpu_seconds_total{mode="idle"}[5s])')

        runtime = prepare(
            ExtenderConfig(
                port=0,
                bundle_dir=bundle.directory,
                prometheus_url=prometheus.url,
                kubeconfig=kubeconfig_of("power-extender"),
                collect_config=collect_config,
                config_file=_write_plugin_files(root, namespace),
                refresh_interval_s=0.5,
                telemetry_ttl_s=10.0,
                curve_refresh_interval_s=0.2,
            ).validate()
        )
        runtime.start_background()
        stack.callback(runtime.stop)
        extender_url = stack.enter_context(serve_app(create_app(runtime)))
        _pods_with_a_history(control_plane.api_client(), namespace, extender_url)
        node_power = stack.enter_context(
            _node_power_controller(root, kubeconfig_of("power-node-controller"), bundle.directory)
        )

        adapter = ea.EnergyAdapter(
            ea.AdapterSettings(
                prometheus_url=prometheus.url,
                # Every exporter here listens on 127.0.0.1: join by instance (host and port),
                # not by host as the default does, and read the node from the joined label.
                query=BATTERY_BY_NODE,
                node_from="label",
                node_label="nodename",
                interval_s=1.0,
                timeout_s=5.0,
            ),
            client.CoreV1Api(control_plane.api_client(kubeconfig_of("energy-adapter"))),
        )
        health = ea.serve_health(adapter, "127.0.0.1", 0)
        stack.callback(health.server_close)
        stack.callback(health.shutdown)
        stop = threading.Event()
        stack.callback(stop.set)
        threading.Thread(target=adapter.run_forever, args=(stop,), daemon=True).start()

        set_scrape_targets(
            prometheus,
            [
                *(e.target for e in exporters.values()),
                extender_url.removeprefix("http://"),
                f"127.0.0.1:{health.server_address[1]}",
                node_power,
            ],
        )
        _power_cycle(admin, namespace)
        traffic = stack.enter_context(_scheduler_traffic(extender_url, list(hosts)))
        wait_until(lambda: traffic.answered > 0, "the extender answering the scheduler's calls")
        yield World(prometheus, extender_url)


@dataclass
class _Traffic:
    answered: int = 0


@contextlib.contextmanager
def _scheduler_traffic(url: str, names: list[str]) -> Iterator[_Traffic]:
    """kube-scheduler's calls in a loop (filter, prioritize; filter for a pod that may wait for
    cleaner power) plus one request it cannot read."""
    traffic = _Traffic()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=url, timeout=10) as session:
            session.post("/filter", content=b"{not json")  # a refused request, once
            while not stop.is_set():
                session.post("/filter", content=_scheduler_body(names))
                session.post("/prioritize", content=_scheduler_body(names))
                session.post("/filter", content=_scheduler_body(names, _deferrable_pod()))
                traffic.answered += 1
                stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield traffic
    finally:
        stop.set()
        thread.join(timeout=15)


def _instant(prometheus: PrometheusServer, expr: str) -> tuple[str | None, list]:
    """(error, result) of an instant query: Prometheus's own parse or evaluation error."""
    url = f"{prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return None, json.load(response)["data"]["result"]
    except urllib.error.HTTPError as error:
        return json.load(error).get("error", str(error)), []


@pytest.mark.prometheus
@pytest.mark.slow
def test_every_panel_query_parses_and_returns_series(world: World) -> None:
    pending = {where: as_prometheus_sees_it(expr) for where, expr in queries()}
    errors: dict[str, str] = {}

    def all_answered() -> bool:
        for where, expr in list(pending.items()):
            error, result = _instant(world.prometheus, expr)
            if error is not None:
                errors[where] = f"{expr}\n    {error}"
                del pending[where]
            elif result:
                del pending[where]
        return not pending

    with contextlib.suppress(AssertionError):
        wait_until(all_answered, "every panel's query to return series", WAIT_FOR_SERIES_S)
    assert not errors, "queries Prometheus refused:\n" + "\n".join(
        f"  {where}: {error}" for where, error in errors.items()
    )
    assert not pending, "queries that returned no series (a metric nothing exports?):\n" + (
        "\n".join(f"  {where}: {expr}" for where, expr in pending.items())
    )


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_world_shows_what_the_panels_are_about(world: World) -> None:
    # The panels returning series is only worth something if the series mean what they say.
    def value_by(expr: str, label: str) -> dict[str, float]:
        _, result = _instant(world.prometheus, expr)
        return {series["metric"].get(label, ""): float(series["value"][1]) for series in result}

    wait_until(
        lambda: (
            value_by(
                "max by (node, level) (power_aware_extender_node_energy_level)", "level"
            ).keys()
            >= {"powerless", "vulnerable"}
        ),
        "the adapter's labels reaching the extender",
    )
    fallback = value_by(
        'max by (node) (power_aware_extender_node_model_heldout_mape_percent{model="fallback"})',
        "node",
    )
    assert fallback == {NODE_C: 38.6}
    measured = value_by("max by (node) (power_aware_extender_node_measured_power_watts)", "node")
    assert measured == {NODE_A: 160.0, NODE_B: 260.0, NODE_C: 120.0}
    wait_until(
        lambda: (
            value_by("sum by (plugin) (power_aware_extender_filter_failures_total)", "plugin").get(
                "EnergyLevel", 0
            )
            > 0
        ),
        "node-c failing the filter as powerless",
    )
    failures = value_by("sum by (plugin) (power_aware_extender_filter_failures_total)", "plugin")
    assert failures["PowerCap"] > 0  # node-b's 1 W cap


def _values(prometheus: PrometheusServer, expr: str, *labels: str) -> dict[str, float]:
    """An instant query's values by the given labels (joined with a space), NaN left out."""
    _, result = _instant(prometheus, expr)
    values = {
        " ".join(series["metric"].get(label, "") for label in labels): float(series["value"][1])
        for series in result
    }
    return {key: value for key, value in values.items() if value == value}


@pytest.mark.prometheus
@pytest.mark.slow
def test_the_world_shows_what_the_later_rows_are_about(world: World) -> None:
    # Node power, carbon, delay and rewards: the series say what the world did.
    def values(expr: str, *labels: str) -> dict[str, float]:
        return _values(world.prometheus, expr, *labels)

    # A round reports what it read before it acts: the gauges show node-c off a round after
    # the power cycle that put it there is counted.
    wait_until(
        lambda: (
            values("max(power_aware_node_power_cycles_total)") == {"": 2.0}
            and values("max by (state) (power_aware_node_power_nodes)", "state")
            == {"on": 2.0, "off": 1.0, "draining": 0.0, "waking": 0.0}
        ),
        "both of node-c's power-offs scraped, and node-c off",
    )
    actions = values(
        "sum by (action, result) (power_aware_node_power_actions_total)", "action", "result"
    )
    # node-c drained (nothing to evict) and powered off twice, woken once; node-b's drain
    # refused by its driver; node-a's drain given up.
    assert actions == {
        "drain ok": 2.0,
        "power_off ok": 2.0,
        "wake ok": 1.0,
        "drain failed": 1.0,
        "abort ok": 1.0,
    }
    errors = values(
        "sum by (driver, kind) (power_aware_node_power_driver_errors_total)", "driver", "kind"
    )
    assert errors == {"redfish config": 1.0}
    causes = values("sum by (cause) (power_aware_node_power_drain_failures_total)", "cause")
    assert causes == {"disabled": 1.0}
    assert values("max(power_aware_node_power_wake_latency_seconds_count)") == {"": 1.0}
    assert values("max(power_aware_node_power_saved_watts)") == {"": 80.0}  # the fleet's idle
    assert values("max(power_aware_node_power_leader)") == {"": 1.0}
    assert values("max(power_aware_node_power_apply)") == {"": 1.0}
    # Only node-c is managed: node-a has the kill switch, node-b backs off after its failure.
    assert values("max(power_aware_node_power_managed_nodes)") == {"": 1.0}
    (free,) = values("max(power_aware_node_power_free_cores)").values()
    assert 6.5 < free <= 7.0  # 2 cores on node-a, 5 on node-b less 100m for its pod asking none
    (arrival,) = values("max(power_aware_node_power_arrival_cores_per_second)").values()
    (target,) = values("max(power_aware_node_power_headroom_target_cores)").values()
    assert arrival > 0 and target == pytest.approx(max(1.0, 60 * arrival))  # --boot-time=60s
    # The power-off target adds the noise of a boot time's arrivals to the wake target.
    (off_target,) = values("max(power_aware_node_power_off_headroom_target_cores)").values()
    assert off_target > target

    zones = values("max by (zone) (power_aware_extender_carbon_intensity_g_per_kwh)", "zone")
    assert zones == CARBON_NOW
    # The node power controller, ranking by grams, reads the same file for itself.
    ranked = values("max by (zone) (power_aware_node_power_carbon_intensity_g_per_kwh)", "zone")
    assert ranked == CARBON_NOW
    horizons = values(
        "min by (zone) (power_aware_extender_carbon_forecast_horizon_seconds)", "zone"
    )
    assert set(horizons) == set(CARBON_NOW) and all(h > 4 * 3600 for h in horizons.values())
    decisions = values(
        "sum by (decision) (power_aware_extender_carbon_deferral_decisions_total)", "decision"
    )
    assert set(decisions) == {"held"}  # the forecast's cleaner window, two hours from now

    assert values("max by (state) (power_aware_extender_delay_rtt_pairs)", "state") == {
        "known": 3.0,
        "expired": 0.0,
    }
    reads = values("sum by (outcome) (power_aware_extender_delay_rtt_reads_total)", "outcome")
    assert reads["ok"] > 0  # Prometheus answered (no Goldpinger series here: nothing mapped)

    # The saved evidence the extender loaded may hold other tests' nodes: this test's only.
    ours = f'node=~"{RUN}-.*"'
    reward = values(f"max by (node) (power_aware_extender_reward_node{{{ours}}})", "node")
    assert set(reward) == {NODE_A, NODE_B}  # node-c never ran a pod: no evidence
    assert reward[NODE_B] < 0.5 < reward[NODE_A]
    evidence = values(
        f"max by (node) (power_aware_extender_reward_node_evidence{{{ours}}})", "node"
    )
    assert evidence == {NODE_A: pytest.approx(1, rel=1e-2), NODE_B: pytest.approx(3, rel=1e-2)}
    outcomes = values("sum by (kind) (power_aware_extender_reward_outcomes_total > 0)", "kind")
    assert outcomes == {"oom_killed": 3.0, "succeeded": 1.0}
    ignored = values(
        "sum by (reason) (power_aware_extender_reward_ignored_signals_total)", "reason"
    )
    assert ignored == {"ImagePullBackOff": 1.0}
    assert values("max(power_aware_extender_reward_saves_total)")[""] > 0


# What an operator opens the dashboard for, row by row: the sections of issue 16, then a row
# per feature that came later. Each metric must be queried by a panel of its row.
SECTIONS = {
    "Power: predicted vs measured": (
        "power_aware_extender_node_predicted_power_watts",
        "ipmi_dcmi_power_consumption_watts",
    ),
    "Scores and decisions per node": (
        "power_aware_extender_node_score_sum",
        "power_aware_extender_node_filter_failures_total",
    ),
    "Requests, refusals and latency": (
        "power_aware_extender_request_errors_total",
        "power_aware_extender_request_duration_seconds_bucket",
    ),
    "Models: swaps and fallback nodes": (
        "power_aware_extender_bundle_reloads_total",
        "power_aware_extender_nodes_by_model",
    ),
    "Energy levels": ("power_aware_extender_node_energy_level", "energy_adapter_nodes"),
    "Node power controller": (
        "power_aware_node_power_nodes",  # nodes per power state
        "power_aware_node_power_managed_nodes",
        "power_aware_node_power_actions_total",  # actions by kind and result
        "power_aware_node_power_cycles_total",
        "power_aware_node_power_saved_watts",  # watts saved by nodes off
        "power_aware_node_power_free_cores",  # headroom: free cores vs target
        "power_aware_node_power_headroom_target_cores",
        "power_aware_node_power_off_headroom_target_cores",
        "power_aware_node_power_pending_pods",
        "power_aware_node_power_arrival_cores_per_second",
        "power_aware_node_power_wake_latency_seconds_bucket",  # wake latency
        "power_aware_node_power_driver_errors_total",  # failures
        "power_aware_node_power_drain_failures_total",
        "power_aware_node_power_api_errors_total",
        "power_aware_node_power_leader",  # leader, dry run, rounds
        "power_aware_node_power_apply",
        "power_aware_node_power_rounds_total",
        "power_aware_node_power_last_round_timestamp_seconds",
    ),
    "Carbon": (
        "power_aware_extender_carbon_intensity_g_per_kwh",  # intensity per zone
        "power_aware_extender_carbon_deferral_decisions_total",  # deferral decisions
        "power_aware_extender_carbon_intensity_age_seconds",  # data age
        "power_aware_extender_carbon_forecast_horizon_seconds",
        "power_aware_extender_carbon_source_polls_total",
        "power_aware_extender_carbon_source_last_success_timestamp_seconds",
        "power_aware_extender_carbon_nodes_scored_neutral_total",
    ),
    "Delay: round-trip times": (
        "power_aware_extender_delay_rtt_pairs",  # known / expired
        "power_aware_extender_delay_rtt_age_seconds",
        "power_aware_extender_delay_rtt_reads_total",
        "power_aware_extender_delay_rtt_file_errors_total",
        "power_aware_extender_delay_unmapped_series",
    ),
    "Rewards": (
        "power_aware_extender_reward_node",  # reward per node
        "power_aware_extender_reward_node_evidence",  # evidence per node
        "power_aware_extender_reward_outcomes_total",  # outcomes by kind
        "power_aware_extender_reward_ignored_signals_total",
        "power_aware_extender_reward_evictions_total",
        "power_aware_extender_reward_saves_total",
        "power_aware_extender_reward_save_failures_total",
        "power_aware_extender_reward_resets_total",
    ),
}


def queries_by_row() -> dict[str, str]:
    """Row title -> the PromQL of the panels under it (up to the next row), space-joined."""
    by_row: dict[str, list[str]] = {}
    current: list[str] = by_row.setdefault("", [])
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            current = by_row.setdefault(panel["title"], [])
            current += [t["expr"] for inner in panel.get("panels", []) for t in inner["targets"]]
        else:
            current += [target["expr"] for target in panel["targets"]]
    return {title: " ".join(exprs) for title, exprs in by_row.items()}


def test_queries_cover_every_section_of_the_issue() -> None:
    by_row = queries_by_row()
    assert not by_row.pop(""), "every panel belongs to a row"
    assert list(by_row) == list(SECTIONS), "the rows, in order"
    for title, metrics in SECTIONS.items():
        for metric in metrics:  # the whole name: _node is not _node_evidence
            assert re.search(rf"\b{metric}\b", by_row[title]), f"{title}: {metric}"
