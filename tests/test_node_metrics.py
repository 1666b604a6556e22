"""Per-node visibility: which model predicts each node (own or the fleet fallback) in /explain,
/status, the logs and /metrics, and the per-node series the Grafana dashboard is built on
(predicted and measured power, energy level, scores and filter failures).

The service runs for real (uvicorn on 127.0.0.1, a real bundle through onnxruntime) on a
snapshot whose node-c has no model of its own in the bundle, so the fallback serves it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from extender.accuracy import FLEET_FALLBACK_MEANS
from extender.metrics import DecisionCounters
from extender.state import ClusterState, NodeInfo
from predictor.core_scaling import shipped_core_exponents
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import extender_service, write_snapshot

PREFIX = "power_aware_extender"
OWN_MAPE_PCT = {"node-a": 1.25, "node-b": 2.5}
FALLBACK_MAPE_PCT = 38.6  # the user: nothing said which nodes used this model
CURVES = {
    "node-a": PowerCurveSpec(100.0, 300.0, info={"metrics": {"mape_pct": 1.25, "mae_w": 2.0}}),
    "node-b": PowerCurveSpec(90.0, 350.0, exponent=2, info={"metrics": {"mape_pct": 2.5}}),
}
FLEET = PowerCurveSpec(80.0, 250.0, info={"metrics": {"mape_pct": 38.6, "mae_w": 41.0}})
TELEMETRY = {"cpu_util": 0.4, "ambient_temp_c": 22.0, "cpu1_temp_c": 55.0, "cpu2_temp_c": 54.0}
NODES = ["node-a", "node-b", "node-c", "node-d"]


@pytest.fixture(scope="module")
def service_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("node-metrics")
    bundle = make_bundle(root / "bundle", CURVES, fallback=FLEET)
    nodes = [
        {
            "name": "node-a",
            "allocatable_cpu": 8,
            "labels": {"energy-status": "vulnerable"},
            "telemetry": {**TELEMETRY, "power_w": 181.0},
        },
        {
            "name": "node-b",
            "allocatable_cpu": 8,
            "labels": {"energy-status": "powerless"},
            "telemetry": TELEMETRY,
        },
        {"name": "node-c", "allocatable_cpu": 8, "telemetry": {**TELEMETRY, "power_w": 150.0}},
        {"name": "node-d", "allocatable_cpu": 8},  # no telemetry: no curve, no power series
    ]
    return bundle.directory, write_snapshot(root / "cluster.json", nodes)


def body(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_fallback_nodes_are_visible_in_explain_status_logs_and_metrics(
    service_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    bundle_dir, snapshot = service_files
    with (
        caplog.at_level(logging.INFO, logger="extender.runtime"),
        extender_service(bundle_dir, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        rows = {r["node"]: r for r in client.post("/explain", content=body(NODES)).json()["nodes"]}
        status = client.get("/status").json()
        metrics = samples(client.get("/metrics").text)

    # /explain: per node, which model and its held-out error.
    assert (rows["node-a"]["model"], rows["node-a"]["model_mape_pct"]) == ("own", 1.25)
    assert (rows["node-b"]["model"], rows["node-b"]["model_mape_pct"]) == ("own", 2.5)
    assert (rows["node-c"]["model"], rows["node-c"]["model_mape_pct"]) == ("fallback", 38.6)
    assert (rows["node-d"]["model"], rows["node-d"]["model_mape_pct"]) == (None, None)

    # /status: the count, the names and the fallback's held-out error.
    curves = status["curves"]
    assert curves["own_model_nodes"] == 2
    assert curves["fallback"] == {
        "nodes": 1,
        "names": ["node-c"],
        "heldout_mape_pct": FALLBACK_MAPE_PCT,
        "heldout_mae_w": 41.0,
        "heldout_means": FLEET_FALLBACK_MEANS,
        # Every node has 8 cores: node-c's curve is scaled by (8 / 8)^b = 1.
        "core_scaling": {
            "enabled": True,
            "idle_exponent": shipped_core_exponents().idle,
            "dynamic_exponent": shipped_core_exponents().dynamic,
            "exponents_source": shipped_core_exponents().source,
            "anchor_cores": 8.0,
            "anchor_nodes": 2,
            "ratio_band": [0.25, 4.0],
            "nodes_by_reason": {"scaled": 1},
        },
    }
    assert rows["node-c"]["fallback_scale"]["ratio"] == 1.0
    assert rows["node-a"]["fallback_scale"] is None

    # The logs: once, at install, naming the node and the error.
    lines = [r.getMessage() for r in caplog.records if "fleet fallback model" in r.getMessage()]
    assert lines == [
        "1 node(s) have no model of their own in bundle "
        f"{status['bundle_version']} and are scored with its fleet fallback model (held-out "
        "MAPE 38.6 %, MAE 41.0 W), 1 scaled by their CPU count against the median 8 cores of "
        "2 own-model node(s): node-c"
    ]

    # /metrics: nodes by model, the fallback's error, and per node the model and its error.
    assert metrics[(f"{PREFIX}_nodes_by_model", (("model", "own"),))] == 2
    assert metrics[(f"{PREFIX}_nodes_by_model", (("model", "fallback"),))] == 1
    assert metrics[(f"{PREFIX}_fallback_model_heldout_mape_percent", ())] == FALLBACK_MAPE_PCT
    mape = {
        labels: value
        for (name, labels), value in metrics.items()
        if name == f"{PREFIX}_node_model_heldout_mape_percent"
    }
    assert mape == {
        (("model", "own"), ("node", "node-a")): 1.25,
        (("model", "own"), ("node", "node-b")): 2.5,
        (("model", "fallback"), ("node", "node-c")): 38.6,
    }


def test_per_node_power_energy_and_decisions_on_metrics(
    service_files: tuple[Path, Path],
) -> None:
    bundle_dir, snapshot = service_files
    with (
        extender_service(bundle_dir, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        explain = client.post("/explain", content=body(NODES)).json()["nodes"]
        for _ in range(3):
            client.post("/filter", content=body(NODES))
            scores = client.post("/prioritize", content=body([*NODES, "not-a-node"])).json()
        metrics = samples(client.get("/metrics").text)

    # Predicted power at the current telemetry: P(u) with u the measured utilisation, which
    # is /explain's power_before_w when no pod was bound recently (a = 0).
    predicted = {
        dict(labels)["node"]: (dict(labels)["model"], value)
        for (name, labels), value in metrics.items()
        if name == f"{PREFIX}_node_predicted_power_watts"
    }
    before = {row["node"]: row["power_before_w"] for row in explain}
    assert set(predicted) == {"node-a", "node-b", "node-c"}  # node-d has no telemetry
    for node, (model, watts) in predicted.items():
        assert watts == pytest.approx(before[node], rel=1e-6)  # u kept as float32 in the table
        assert model == ("fallback" if node == "node-c" else "own")
    assert predicted["node-a"][1] == pytest.approx(100.0 + 200.0 * 0.4, abs=0.05)
    measured = {
        dict(labels)["node"]: value
        for (name, labels), value in metrics.items()
        if name == f"{PREFIX}_node_measured_power_watts"
    }
    assert measured == {"node-a": 181.0, "node-c": 150.0}  # node-b's telemetry has no power_w

    levels = {
        dict(labels)["node"]: dict(labels)["level"]
        for (name, labels), value in metrics.items()
        if name == f"{PREFIX}_node_energy_level" and value == 1.0
    }
    assert levels == {
        "node-a": "vulnerable",
        "node-b": "powerless",
        "node-c": "grid",
        "node-d": "grid",
    }

    # Decisions: three answers each; the unknown name is never a series.
    score_of = {entry["Host"]: entry["Score"] for entry in scores}
    top = max(score_of[n] for n in NODES)
    for node in NODES:
        labels = (("node", node),)
        assert metrics[(f"{PREFIX}_node_score_count", labels)] == 3
        assert metrics[(f"{PREFIX}_node_score_sum", labels)] == 3 * score_of[node]
        assert metrics[(f"{PREFIX}_node_best_score_total", labels)] == 3 * (score_of[node] == top)
    assert not [key for key in metrics if ("node", "not-a-node") in key[1]]
    failed = (("node", "node-b"), ("plugin", "EnergyLevel"))
    assert metrics[(f"{PREFIX}_node_filter_failures_total", failed)] == 3
    assert metrics[(f"{PREFIX}_filter_failures_total", (("plugin", "EnergyLevel"),))] == 3
    assert metrics[(f"{PREFIX}_filter_failures_total", (("plugin", "PowerCap"),))] == 0
    assert metrics[(f"{PREFIX}_score_count", ())] == 3 * 5
    assert metrics[(f"{PREFIX}_score_sum", ())] == 3 * sum(score_of.values())
    assert metrics[(f"{PREFIX}_score_bucket", (("le", "+Inf"),))] == 15


def test_decision_counts_survive_node_set_changes_and_forget_removed_nodes() -> None:
    state = ClusterState()
    state.replace_nodes(NodeInfo(name, 8.0, {}, {}) for name in ("a", "b", "c"))
    counters = DecisionCounters(["EnergyLevel"])

    def prioritize(names: list[str], score: list[int]) -> None:
        view = state.view(0.0)
        counters.record_prioritize(view.names, view.candidates(names), np.array(score))

    prioritize(["a", "b", "c"], [10, 3, 10])
    state.upsert_node(NodeInfo("d", 8.0, {}, {}))  # a new layout: positions move on
    prioritize(["d", "c", "zzz"], [7, 2, 0])
    view = state.view(0.0)
    counters.record_filter(view.names, view.candidates(["c", "a"]), {"EnergyLevel": [1]})
    totals = counters.totals(["a", "b", "c", "d"])
    # [scored, score sum, best, EnergyLevel failures]
    assert totals == {
        "a": [1, 10, 1, 1],
        "b": [1, 3, 0, 0],
        "c": [2, 12, 1, 0],
        "d": [1, 7, 1, 0],
    }
    assert counters.score_buckets.tolist() == [1, 0, 1, 1, 0, 0, 0, 1, 0, 0, 2]
    # A node that left is forgotten (its series go); the others keep counting.
    prioritize(["a"], [4])
    assert counters.totals(["a", "c", "d"]) == {
        "a": [2, 14, 2, 1],
        "c": [2, 12, 1, 0],
        "d": [1, 7, 1, 0],
    }


def test_nodes_joining_the_fallback_later_are_named_once(
    service_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    bundle_dir, snapshot = service_files
    with extender_service(bundle_dir, snapshot) as (_url, runtime):
        runtime.stop()  # drive the refresher by hand
        with caplog.at_level(logging.WARNING, logger="extender.runtime"):
            runtime.state.upsert_node(NodeInfo("node-e", 8.0, {}, {}))
            runtime.state.set_telemetry("node-e", TELEMETRY, runtime.clock())
            assert runtime.refresh_curves()
            runtime.state.set_telemetry("node-e", {**TELEMETRY, "cpu_util": 0.5}, runtime.clock())
            assert runtime.refresh_curves()  # node-e again: not named twice
    lines = [r.getMessage() for r in caplog.records if "fleet fallback model" in r.getMessage()]
    assert lines[0].endswith(": node-c")  # at install
    lines = lines[1:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("1 more node(s) have no model of their own in bundle ")
    assert lines[0].endswith(
        "(held-out MAPE 38.6 %, MAE 41.0 W), 1 scaled by their CPU count against the median 8 "
        "cores of 2 own-model node(s): node-e"
    )
