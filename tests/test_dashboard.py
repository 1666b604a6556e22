"""The Grafana dashboard (manifests/dashboards/) against what the services really export.

Every query of every panel, and the query of every template variable, is run against a real
Prometheus that scrapes a real running extender and energy adapter: each must parse and return
series. The test walks the dashboard JSON, so a panel added later is checked without touching
this file; a panel on a metric nothing exports fails here, naming the panel.

The world: three tiny exporters stand in for node_exporter + ipmi_exporter on node-a, node-b
and node-c (node-a and node-c with a battery); the fake Kubernetes API serves the three nodes
(node-b with a power cap it always exceeds); the bundle has models for node-a and node-b, so
the fleet fallback serves node-c. The extender runs in live mode (Prometheus + Kubernetes), the
energy adapter labels the nodes from their batteries (node-c becomes powerless), and a client
plays kube-scheduler (filter, prioritize, one bad request) while the queries run.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
import yaml
from kubernetes import client

from bench.support.prometheus import RELOADABLE, set_scrape_targets
from controllers import energy_adapter as ea
from extender.__main__ import prepare
from extender.app import create_app
from extender.config import ExtenderConfig
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import FakeHost, serve, wait_until
from tests.support.fake_kube import FakeKube
from tests.support.manifests import dashboard
from tests.support.prometheus import PrometheusServer, start_prometheus
from tests.support.server import serve_app

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
CURVES = {
    "node-a": PowerCurveSpec(100.0, 300.0, info={"metrics": {"mape_pct": 1.5, "mae_w": 3.0}}),
    "node-b": PowerCurveSpec(90.0, 350.0, exponent=2, info={"metrics": {"mape_pct": 2.0}}),
}
FLEET = PowerCurveSpec(80.0, 250.0, info={"metrics": {"mape_pct": 38.6, "mae_w": 40.0}})


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
    for where, expr in queries():
        left = re.findall(r"\$\{?\w+\}?", as_prometheus_sees_it(expr))
        assert not left, f"{where}: variables {left} have no test value in GRAFANA_VARIABLES"


# ---- a real world to scrape -------------------------------------------------------------------


@dataclass
class World:
    prometheus: PrometheusServer
    extender_url: str


def _scheduler_body(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "probe", "namespace": "default", "uid": "probe-1"},
        "spec": {
            "schedulerName": "power-aware-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m"}}}],
        },
    }
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("dashboard")
    with contextlib.ExitStack() as stack:
        hosts = {
            "node-a": FakeHost(
                0.3, {"Inlet Temp": 22.0, "CPU1 Temp": 50.0}, 160.0, "node-a", battery_pct=60.0
            ),
            "node-b": FakeHost(0.6, {"Ambient": 24.0, "CPU1 Temp": 61.0}, 260.0),
            "node-c": FakeHost(
                0.2, {"Inlet Temp": 23.0, "CPU1 Temp": 45.0}, 120.0, "node-c", battery_pct=8.0
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
        kube = stack.enter_context(FakeKube())
        for name in hosts:
            annotations = {"power-aware-scheduler/max-power-w": "1"} if name == "node-b" else {}
            kube.create(
                "nodes",
                {
                    "metadata": {"name": name, "annotations": annotations},
                    "status": {"allocatable": {"cpu": "8"}},
                },
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
                kubeconfig=kube.write_kubeconfig(root / "kubeconfig"),
                collect_config=collect_config,
                refresh_interval_s=0.5,
                telemetry_ttl_s=10.0,
                curve_refresh_interval_s=0.2,
            ).validate()
        )
        runtime.start_background()
        stack.callback(runtime.stop)
        extender_url = stack.enter_context(serve_app(create_app(runtime)))

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
            client.CoreV1Api(kube.api_client()),
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
            ],
        )
        traffic = stack.enter_context(_scheduler_traffic(extender_url, list(hosts)))
        wait_until(lambda: traffic.answered > 0, "the extender answering the scheduler's calls")
        yield World(prometheus, extender_url)


@dataclass
class _Traffic:
    answered: int = 0


@contextlib.contextmanager
def _scheduler_traffic(url: str, names: list[str]) -> Iterator[_Traffic]:
    """kube-scheduler's calls in a loop (filter, prioritize) plus one request it cannot read."""
    traffic = _Traffic()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=url, timeout=10) as session:
            session.post("/filter", content=b"{not json")  # a refused request, once
            while not stop.is_set():
                session.post("/filter", content=_scheduler_body(names))
                session.post("/prioritize", content=_scheduler_body(names))
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
    assert fallback == {"node-c": 38.6}
    measured = value_by("max by (node) (power_aware_extender_node_measured_power_watts)", "node")
    assert measured == {"node-a": 160.0, "node-b": 260.0, "node-c": 120.0}
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


def test_queries_cover_every_section_of_the_issue() -> None:
    # What an operator opens the dashboard for (issue 16): each has at least one query.
    text = " ".join(expr for _, expr in queries())
    for metric in (
        "power_aware_extender_node_predicted_power_watts",  # predicted vs measured
        "ipmi_dcmi_power_consumption_watts",
        "power_aware_extender_node_score_sum",  # scores and decisions per node
        "power_aware_extender_node_filter_failures_total",
        "power_aware_extender_request_errors_total",  # refusals and latency
        "power_aware_extender_request_duration_seconds_bucket",
        "power_aware_extender_bundle_reloads_total",  # model swaps and fallback nodes
        "power_aware_extender_nodes_by_model",
        "power_aware_extender_node_energy_level",  # energy levels
        "energy_adapter_nodes",
    ):
        assert metric in text, metric
