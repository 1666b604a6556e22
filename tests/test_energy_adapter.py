"""The energy adapter against a real Prometheus (backfilled battery series) and the real API
server (envtest), as ServiceAccount energy-adapter with the rights
manifests/base/energy-adapter.yaml gives it.

The battery history is backfilled with promtool at known times, and each pass evaluates its
queries at one of those times: the test walks a node through the levels, holds another at the
75 % boundary, and checks the labels, taints and PATCH requests (recorded as the adapter sent
them) after every pass. The nodes are a NodeAgent's (Ready, so the node lifecycle controller
leaves their taints alone), named for this module's run, as the control plane is shared.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client

from controllers import energy_adapter as ea
from envtest import ControlPlane, NodeAgent
from livedata.labels import ENERGY_BAND_BY_NAME, ENERGY_LABEL
from tests.support.exporters import wait_until
from tests.support.fault_proxy import FaultProxy
from tests.support.kube_api import (
    RequestLog,
    component_client,
    component_kubeconfig,
    kubeconfig_via,
)
from tests.support.prometheus import PrometheusServer, start_prometheus, write_openmetrics

ADAPTER = "energy-adapter"
RUN = f"ea-{uuid.uuid4().hex[:6]}"  # this module's node names: <RUN>-node-a, ...

T0_S = 1_767_571_200  # 2026-01-05T00:00:00Z
STEP_S = 60
HYSTERESIS_PCT = 3.0

# Stored energy per pass (one sample per STEP_S). node-d has two batteries, averaged.
NODE_A = [90, 80, 60, 30, 10, 20, 50, 90, 90, 90, 90]  # walks through every level
NODE_B = [76, 74, 73, 76, 77, 72.5, 71.9, 74, 77.9, 78, 79]  # hovers at the 75 % boundary
NODE_C = [50] * 11  # never changes
NODE_D_BAT0 = [10, 10, 10] + [30] * 8
NODE_D_BAT1 = [14, 14, 14] + [34] * 8
PASSES = len(NODE_A)

EXPECTED = {
    "node-a": [
        "well-powered",
        "well-powered",
        "vulnerable",
        "low-powered",
        "powerless",
        "low-powered",  # 20 % is past powerless's 15 % boundary by more than 3 points
        "vulnerable",
        "well-powered",
        "well-powered",
        "well-powered",
        "well-powered",
    ],
    "node-b": [
        "well-powered",
        "well-powered",  # 74: within 3 points of 75, stays
        "well-powered",  # 73
        "well-powered",
        "well-powered",
        "well-powered",  # 72.5
        "vulnerable",  # 71.9 < 72: leaves
        "vulnerable",  # 74
        "vulnerable",  # 77.9 < 78: stays
        "well-powered",  # 78
        "well-powered",  # 79: nothing to do in the last pass
    ],
    "node-c": ["vulnerable"] * PASSES,
    "node-d": ["powerless"] * 3 + ["low-powered"] * 8,
}

INSTANCES = {
    "node-a": "10.0.0.1:9100",
    "node-b": "10.0.0.2:9100",
    "node-c": "10.0.0.3:9100",
    "node-d": "10.0.0.4:9100",
    "node-grid": "10.0.0.5:9100",  # on grid power: no battery series
}
OTHER_TAINT = {"key": "dedicated", "value": "edge", "effect": "NoSchedule"}
# Each node's last reading, evaluated now (long after the backfilled samples), its node name
# brought along by the query itself (--node-from label).
LATEST_QUERY = (
    "last_over_time(node_power_supply_capacity[3650d]) * on (instance) "
    "group_left (nodename) last_over_time(node_uname_info[3650d])"
)
NOT_READY_TAINT = "node.kubernetes.io/not-ready"  # on every new Node until it is seen Ready


def full(short: str) -> str:
    return f"{RUN}-{short}"


def short(name: str) -> str:
    return name.removeprefix(f"{RUN}-")


def at(pass_index: int) -> float:
    """Evaluation time of a pass: just after that pass's samples."""
    return T0_S + pass_index * STEP_S + 1


def battery_samples() -> list[tuple[str, dict[str, str], float, float]]:
    samples = []
    series = {
        ("node-a", "BAT0"): NODE_A,
        ("node-b", "BAT0"): NODE_B,
        ("node-c", "BAT0"): NODE_C,
        ("node-d", "BAT0"): NODE_D_BAT0,
        ("node-d", "BAT1"): NODE_D_BAT1,
        # An exporter no node_uname_info names: reported as unmapped, never labelled.
        ("stray", "BAT0"): [5] * PASSES,
    }
    for (node, supply), values in series.items():
        instance = INSTANCES.get(node, "10.9.9.9:9100")  # "stray": no node of ours
        for index, value in enumerate(values):
            labels = {"instance": instance, "job": "node", "power_supply": supply}
            samples.append(("node_power_supply_capacity", labels, T0_S + index * STEP_S, value))
    for node, instance in INSTANCES.items():
        for index in range(PASSES):
            labels = {"instance": instance, "job": "node", "nodename": full(node)}
            samples.append(("node_uname_info", labels, T0_S + index * STEP_S, 1.0))
    return samples


@pytest.fixture(autouse=True)
def restore_root_logging() -> Iterator[None]:
    """main() configures the root logger; put pytest's handlers back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    text = write_openmetrics(battery_samples())
    with start_prometheus(tmp_path_factory.mktemp("prom"), openmetrics_text=text) as server:
        yield server


class Kube:
    """The nodes of this module's run (admin reads) and the adapter's requests, as sent."""

    def __init__(self, plane: ControlPlane, sent: RequestLog) -> None:
        self.plane = plane
        self.core = client.CoreV1Api(plane.api_client())
        self.sent = sent

    def node(self, name: str) -> dict:
        response = self.core.read_node(full(name), _preload_content=False)
        return json.loads(response.data)

    def nodes(self) -> list[dict]:
        items = json.loads(self.core.list_node(_preload_content=False).data)["items"]
        return [n for n in items if n["metadata"]["name"].startswith(f"{RUN}-")]

    def clear_requests(self) -> None:
        self.sent.clear()


@pytest.fixture
def kube(control_plane: ControlPlane, node_agent: NodeAgent) -> Iterator[Kube]:
    for name in INSTANCES:
        taints = [OTHER_TAINT] if name == "node-a" else []
        node_agent.add_node(full(name), taints=taints)
    admin = Kube(control_plane, RequestLog())

    def settled() -> bool:  # Ready, and the node lifecycle controller's taint gone
        nodes = admin.nodes()
        taints = [t["key"] for n in nodes for t in (n.get("spec") or {}).get("taints") or []]
        return len(nodes) == len(INSTANCES) and NOT_READY_TAINT not in taints

    wait_until(settled, "the nodes Ready and untainted")
    with admin.sent.recording():
        yield admin


def adapter_api(kube: Kube) -> client.CoreV1Api:
    return client.CoreV1Api(component_client(kube.plane, ADAPTER))


def make_adapter(prometheus: PrometheusServer, kube: Kube, **overrides: object):
    settings = ea.AdapterSettings(
        prometheus_url=prometheus.url,
        hysteresis_pct=HYSTERESIS_PCT,
        timeout_s=5.0,
        **overrides,
    )
    return ea.EnergyAdapter(settings, adapter_api(kube))


def labels_of(kube: Kube) -> dict[str, str | None]:
    return {
        short(node["metadata"]["name"]): (node["metadata"].get("labels") or {}).get(ENERGY_LABEL)
        for node in kube.nodes()
    }


def taints_of(kube: Kube, name: str) -> list[dict]:
    return (kube.node(name).get("spec") or {}).get("taints") or []


def patches(kube: Kube) -> list[tuple[str, dict, str]]:
    """(node, patch body, content type) of every PATCH the adapter sent."""
    return [
        (short(request.path.rsplit("/", 1)[-1]), request.body, request.content_type)
        for request in kube.sent.by(ADAPTER)
        if request.method == "PATCH"
    ]


# ---------------------------------------------------------------------------------------------
# Pure: levels and hysteresis


@pytest.mark.parametrize(
    ("pct", "level"),
    [
        (0, "powerless"),
        (14.99, "powerless"),
        (15, "low-powered"),
        (39.9, "low-powered"),
        (40, "vulnerable"),
        (74.99, "vulnerable"),
        (75, "well-powered"),
        (100, "well-powered"),
    ],
)
def test_level_for_follows_the_design_bands(pct: float, level: str) -> None:
    assert ea.level_for(pct) == level


@pytest.mark.parametrize("pct", [-0.1, 100.5, float("nan")])
def test_level_for_refuses_readings_outside_0_to_100(pct: float) -> None:
    with pytest.raises(ValueError, match=r"0\.\.100"):
        ea.level_for(pct)


percentages = st.floats(min_value=0, max_value=100, allow_nan=False)
levels = st.sampled_from([None, "charging", *ENERGY_BAND_BY_NAME])


@given(pct=percentages, current=levels, hysteresis=st.floats(0, 7.4))
def test_next_level_is_stable_and_never_far_from_the_plain_level(
    pct: float, current: str | None, hysteresis: float
) -> None:
    new = ea.next_level(pct, current, hysteresis)
    # Applying it again with the same reading changes nothing: no flapping without new data.
    assert ea.next_level(pct, new, hysteresis) == new
    band = ENERGY_BAND_BY_NAME[new]
    assert band.low_pct - hysteresis <= pct <= max(100.0, band.high_pct + hysteresis)
    if new != ea.level_for(pct):
        assert new == current  # only hysteresis may keep a level the reading has left


@given(boundary=st.sampled_from([15.0, 40.0, 75.0]), wobble=st.lists(st.floats(-2.9, 2.9)))
def test_readings_wobbling_within_the_margin_never_change_the_level(
    boundary: float, wobble: Sequence[float]
) -> None:
    for start in (ea.level_for(boundary - 0.01), ea.level_for(boundary)):
        level = start
        for delta in wobble:
            level = ea.next_level(boundary + delta, level, HYSTERESIS_PCT)
        assert level == start


def test_patch_adds_and_removes_only_our_taint() -> None:
    node = ea.NodeEnergy("n", "low-powered", (OTHER_TAINT,), "17")
    to_powerless = ea.plan_node_patch(node, "powerless", taint_powerless=True)
    assert to_powerless == {
        "metadata": {"labels": {ENERGY_LABEL: "powerless"}, "resourceVersion": "17"},
        "spec": {
            "taints": [
                OTHER_TAINT,
                {"key": ea.POWERLESS_TAINT_KEY, "effect": ea.POWERLESS_TAINT_EFFECT},
            ]
        },
    }
    tainted = ea.NodeEnergy("n", "powerless", tuple(to_powerless["spec"]["taints"]), "18")
    back = ea.plan_node_patch(tainted, "low-powered", taint_powerless=True)
    assert back["spec"] == {"taints": [OTHER_TAINT]}
    assert ea.plan_node_patch(tainted, "powerless", taint_powerless=True) is None
    # Labels only: the label changes, no taint is added.
    assert ea.plan_node_patch(node, "powerless", taint_powerless=False) == {
        "metadata": {"labels": {ENERGY_LABEL: "powerless"}}
    }


# ---------------------------------------------------------------------------------------------
# Real Prometheus + fake API


def test_labels_follow_the_data_with_hysteresis_and_patch_only_on_change(
    prometheus: PrometheusServer, kube: Kube
) -> None:
    adapter = make_adapter(prometheus, kube)
    seen: dict[str, list[str | None]] = {node: [] for node in EXPECTED}
    patch_counts: list[dict[str, int]] = []
    for index in range(PASSES):
        kube.clear_requests()
        result = adapter.run_pass(at_s=at(index))
        labels = labels_of(kube)
        for node in EXPECTED:
            seen[node].append(labels[node])
        counts: dict[str, int] = {}
        for node, body, content_type in patches(kube):
            counts[node] = counts.get(node, 0) + 1
            assert content_type == ea.MERGE_PATCH
            assert body["metadata"]["labels"][ENERGY_LABEL] == labels[node]
        patch_counts.append(counts)
        assert {short(c.node) for c in result.changes} == set(counts)
        assert labels["node-grid"] is None  # no battery reading: never labelled
        # node-a is powerless (and tainted) exactly when its label says so; the other
        # taint it carried from the start is kept throughout.
        taint_keys = [t["key"] for t in taints_of(kube, "node-a")]
        assert (ea.POWERLESS_TAINT_KEY in taint_keys) == (labels["node-a"] == "powerless")
        assert OTHER_TAINT in taints_of(kube, "node-a")
        taint_keys_d = [t["key"] for t in taints_of(kube, "node-d")]
        assert (ea.POWERLESS_TAINT_KEY in taint_keys_d) == (labels["node-d"] == "powerless")

    assert seen == EXPECTED
    # One PATCH per label change, none for a node whose level stayed.
    for index, counts in enumerate(patch_counts):
        for node, expected in EXPECTED.items():
            previous = expected[index - 1] if index else None
            assert counts.get(node, 0) == (1 if expected[index] != previous else 0), (index, node)
        assert "node-grid" not in counts
    assert sum(patch_counts[-1].values()) == 0


def test_no_patch_when_nothing_changed_even_after_a_restart(
    prometheus: PrometheusServer, kube: Kube
) -> None:
    make_adapter(prometheus, kube).run_pass(at_s=at(6))
    assert patches(kube)
    kube.clear_requests()
    # A new process (no memory but the labels) at the same data: nothing to do.
    result = make_adapter(prometheus, kube).run_pass(at_s=at(6))
    assert result.changes == []
    assert result.nodes_with_reading == 4
    assert patches(kube) == []
    # Hysteresis survives the restart too: node-b at 74 % stays vulnerable, as labelled;
    # only node-a (back to 90 %) changes.
    make_adapter(prometheus, kube).run_pass(at_s=at(7))
    assert labels_of(kube)["node-b"] == "vulnerable"
    assert [node for node, _, _ in patches(kube)] == ["node-a"]


def test_dry_run_patches_nothing(prometheus: PrometheusServer, kube: Kube) -> None:
    result = make_adapter(prometheus, kube, dry_run=True).run_pass(at_s=at(4))
    assert {short(c.node): c.new_label for c in result.changes}["node-a"] == "powerless"
    assert patches(kube) == []
    assert set(labels_of(kube).values()) == {None}


def test_a_node_changed_meanwhile_gets_409_and_keeps_its_new_taint(
    prometheus: PrometheusServer, kube: Kube
) -> None:
    adapter = make_adapter(prometheus, kube)
    stale = ea.NodeEnergy.from_object(kube.node("node-a"))
    someone_elses = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    kube.core.patch_node(full("node-a"), {"spec": {"taints": [OTHER_TAINT, someone_elses]}})
    patch = ea.plan_node_patch(stale, "powerless", taint_powerless=True)
    change = ea.LabelChange(full("node-a"), None, "powerless", 10.0, True)

    assert adapter._apply(stale, patch, change) is False

    assert someone_elses in taints_of(kube, "node-a")
    # The next pass reads the node afresh and keeps both taints. Other writers of the Node
    # (the node lifecycle controller, the node agent on a loaded machine) may change it
    # between a pass's read and its patch: that pass gets a 409 again and the next retries,
    # which is what a few passes here allow for.
    for _ in range(5):
        adapter.run_pass(at_s=at(4))
        taints = taints_of(kube, "node-a")
        if any(t["key"] == ea.POWERLESS_TAINT_KEY for t in taints):
            break
    assert someone_elses in taints and OTHER_TAINT in taints
    assert any(t["key"] == ea.POWERLESS_TAINT_KEY for t in taints)


def test_unreachable_prometheus_fails_the_pass_and_changes_nothing(kube: Kube) -> None:
    settings = ea.AdapterSettings(prometheus_url="http://127.0.0.1:9", timeout_s=2.0)
    adapter = ea.EnergyAdapter(settings, adapter_api(kube))
    with pytest.raises(ea.CollectError, match=r"127\.0\.0\.1:9"):
        adapter.run_pass(at_s=at(0))
    assert patches(kube) == []


def test_an_unreachable_api_server_fails_passes_and_they_go_on(
    prometheus: PrometheusServer, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    # The API server stops answering (a stall: connections open, no bytes back), then comes
    # back: every pass in between fails, the loop keeps going, and the log says so twice:
    # when the cause starts and when a pass succeeds again.
    caplog.set_level(logging.INFO, logger="controllers.energy_adapter")
    with FaultProxy("127.0.0.1", kube.plane.apiserver_port) as proxy:
        api = client.CoreV1Api(component_client(kube.plane, ADAPTER, host=proxy.url))
        settings = ea.AdapterSettings(
            prometheus_url=prometheus.url,
            hysteresis_pct=HYSTERESIS_PCT,
            timeout_s=0.5,
            interval_s=0.2,
            query=LATEST_QUERY,
            node_from="label",
            node_label="nodename",
        )
        adapter = ea.EnergyAdapter(settings, api)
        proxy.stall()
        stop = threading.Event()
        loop = threading.Thread(target=adapter.run_forever, args=(stop,), daemon=True)
        loop.start()
        try:
            registry = adapter.metrics.registry
            wait_until(
                lambda: (
                    (
                        registry.get_sample_value(
                            "energy_adapter_passes_total", {"result": "error"}
                        )
                        or 0
                    )
                    >= 2
                ),
                "two failed passes",
                timeout_s=60,
            )
            assert loop.is_alive()
            assert adapter.last_error is not None and "\n" not in adapter.last_error
            assert adapter.last_error.startswith("Kubernetes API unreachable")
            assert not adapter.health()[1]  # not ready
            assert patches(kube) == []
            proxy.resume()
            wait_until(lambda: adapter.last_error is None, "a pass to succeed again", 60)
            assert labels_of(kube)["node-c"] == "vulnerable"
            failed = registry.get_sample_value("energy_adapter_passes_total", {"result": "error"})
            wait_until(
                lambda: any("succeeded again" in r.getMessage() for r in caplog.records),
                "the line that says passes succeed again",
                10,
            )
            messages = [r.getMessage() for r in caplog.records]
            assert sum("pass failed" in m for m in messages) == 1  # not one per failed pass
            recovered = f"pass succeeded again after {int(failed or 0)} failed; labels follow"
            assert recovered in messages
        finally:
            stop.set()
            proxy.resume()
            loop.join(timeout=30)
        assert not loop.is_alive()


def once_args(prometheus: PrometheusServer, kubeconfig: Path) -> list[str]:
    """One pass now, node names from the query (LATEST_QUERY), warnings only."""
    return [
        *("--prometheus", prometheus.url, "--query", LATEST_QUERY),
        *("--node-from", "label", "--node-label", "nodename"),
        *("--kubeconfig", str(kubeconfig), "--once", "--log-level", "warning"),
    ]


def test_cli_once_with_the_api_server_unreachable_is_one_line(
    prometheus: PrometheusServer, kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy("127.0.0.1", kube.plane.apiserver_port) as proxy:
        proxy.refuse()
        kubeconfig = kubeconfig_via(component_kubeconfig(kube.plane, ADAPTER), proxy.url)
        code = ea.main(once_args(prometheus, kubeconfig))
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert "\n" not in err and err.startswith("error: Kubernetes API unreachable")


# ---------------------------------------------------------------------------------------------
# CLI and health


def test_cli_once_labels_the_nodes(
    tmp_path: Path, prometheus: PrometheusServer, kube: Kube
) -> None:
    # --once evaluates now, long after the backfilled samples: the query looks back far
    # enough and brings the node name along itself (--node-from label), as an operator
    # whose battery series lack a usable instance would configure it.
    code = ea.main(once_args(prometheus, component_kubeconfig(kube.plane, ADAPTER)))
    assert code == 0
    # Each node's last reading: node-a 90, node-b 78, node-c 50, node-d (30+34)/2.
    assert labels_of(kube) == {
        "node-a": "well-powered",
        "node-b": "well-powered",
        "node-c": "vulnerable",
        "node-d": "low-powered",
        "node-grid": None,
    }


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--interval", "soon", "--interval"),
        ("--hysteresis-pct", "9", "--hysteresis-pct"),
        ("--timeout", "0", "--timeout"),
    ],
)
def test_cli_bad_settings_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, words: str
) -> None:
    code = ea.main(["--prometheus", "http://127.0.0.1:9", flag, value, "--once"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and words in err


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_endpoints_follow_the_passes(prometheus: PrometheusServer, kube: Kube) -> None:
    adapter = make_adapter(prometheus, kube)
    server = ea.serve_health(adapter, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(f"{base}/healthz")[0] == 200
        assert _get(f"{base}/readyz")[0] == 503  # no pass yet
        adapter.run_pass(at_s=at(4))
        assert _get(f"{base}/readyz")[0] == 200
        status, metrics = _get(f"{base}/metrics")
        assert status == 200
        assert 'energy_adapter_label_changes_total{level="powerless"} 1.0' in metrics
        # node-grid has no battery reading, nor has any node of the cluster not ours.
        unread = len(kube.core.list_node().items) - len(INSTANCES) + 1
        assert f'energy_adapter_nodes{{level="none"}} {unread:.1f}' in metrics
    finally:
        server.shutdown()
        server.server_close()


def test_manifest_args_parse_and_taint_matches_the_descheduler_policy() -> None:
    manifests = Path(__file__).resolve().parent.parent / "manifests" / "base"
    documents = list(yaml.safe_load_all((manifests / "energy-adapter.yaml").read_text()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "controllers.energy_adapter"]
    args = [a.replace("$(PROMETHEUS_URL)", "http://prom:9090") for a in container["args"]]
    parsed = ea.build_parser().parse_args(args)
    settings = ea.settings_from_args(parsed)
    assert settings.taint_powerless and parsed.in_cluster
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert parsed.listen_port == ports[container["livenessProbe"]["httpGet"]["port"]]
    policy_map = next(
        d
        for d in yaml.safe_load_all((manifests / "descheduler.yaml").read_text())
        if d["kind"] == "ConfigMap"
    )
    policy = yaml.safe_load(policy_map["data"]["policy.yaml"])
    taint_args = next(
        c["args"]
        for c in policy["profiles"][0]["pluginConfig"]
        if c["name"] == "RemovePodsViolatingNodeTaints"
    )
    assert taint_args["includedTaints"] == [ea.POWERLESS_TAINT_KEY]
    assert ea.POWERLESS_TAINT_EFFECT == "NoSchedule"  # the plugin only acts on NoSchedule
