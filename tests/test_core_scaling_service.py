"""Fallback core scaling through the whole service: /explain, /status, /metrics, the flag.

A snapshot cluster with three own-model nodes (16, 32 and 64 cores: the anchor is their median,
32) and fallback nodes of 64, 32 and 16 cores, all at the same telemetry. With scaling on, the
64-core fallback node's predicted power is the fleet curve scaled by 2 (idle by 2^b_idle, range
by 2^b_dyn), the 16-core one's by 0.5; with `--no-fallback-core-scaling` they all get the fleet
curve, as before the feature. Real ONNX models, the real runtime and app; no mocks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.app import create_app
from extender.config import ConfigError, ExtenderConfig, build_parser, parse_config
from extender.runtime import Runtime
from extender.state import NodeInfo
from predictor.core_scaling import shipped_core_exponents
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import write_snapshot

FLEET = PowerCurveSpec(80.0, 250.0)  # P_fleet(u) = 80 + 170 u, temperature-blind
OWN = PowerCurveSpec(100.0, 300.0)
OWN_CORES = {"own-16": 16, "own-32": 32, "own-64": 64}
FALLBACK_CORES = {"fb-64": 64, "fb-32": 32, "fb-16": 16}
UTIL = 0.4
TELEMETRY = {"cpu_util": UTIL, "ambient_temp_c": 22.0, "cpu1_temp_c": 55.0, "cpu2_temp_c": 54.0}
FLOAT32_W = 0.05
PREFIX = "power_aware_extender"


def fleet_w(util: float) -> float:
    return 80.0 + 170.0 * util


def scaled_w(util: float, ratio: float) -> float:
    exponents = shipped_core_exponents()
    return 80.0 * ratio**exponents.idle + 170.0 * util * ratio**exponents.dynamic


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("core-scaling-service")
    return make_bundle(root / "bundle", dict.fromkeys(OWN_CORES, OWN), fallback=FLEET).directory


def snapshot(directory: Path, cores: dict[str, int]) -> Path:
    nodes = [
        {"name": name, "allocatable_cpu": count, "telemetry": TELEMETRY}
        for name, count in cores.items()
    ]
    return write_snapshot(directory / f"cluster-{len(cores)}.json", nodes)


@contextmanager
def service(
    bundle_dir: Path, cluster: Path, **settings: object
) -> Iterator[tuple[TestClient, Runtime]]:
    runtime = Runtime(ExtenderConfig(bundle_dir=bundle_dir, cluster_file=cluster, **settings))
    runtime.load_cluster()
    assert runtime.load_bundle()
    with TestClient(create_app(runtime)) as client:
        yield client, runtime


def explain(client: TestClient, names: list[str], cpu: str = "1") -> dict[str, dict]:
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }
    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
    response = client.post("/explain", content=body)
    assert response.status_code == 200, response.text
    return {row["node"]: row for row in response.json()["nodes"]}


def test_fallback_nodes_are_scaled_by_their_cores_and_explain_says_how(
    bundle_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    exponents = shipped_core_exponents()
    cluster = snapshot(tmp_path, {**OWN_CORES, **FALLBACK_CORES})
    names = [*OWN_CORES, *FALLBACK_CORES]
    with (
        caplog.at_level(logging.WARNING, logger="extender.runtime"),
        service(bundle_dir, cluster) as (client, _runtime),
    ):
        rows = explain(client, names)
        status = client.get("/status").json()
        metrics = client.get("/metrics").text

    before = {name: rows[name]["power_before_w"] for name in names}
    assert before["fb-64"] == pytest.approx(scaled_w(UTIL, 2.0), abs=FLOAT32_W)
    assert before["fb-16"] == pytest.approx(scaled_w(UTIL, 0.5), abs=FLOAT32_W)
    assert before["fb-32"] == pytest.approx(fleet_w(UTIL), abs=FLOAT32_W)
    assert before["fb-64"] > before["fb-32"] + 20.0 > before["fb-16"] + 40.0
    # The same pod on the 64-core node: d is half the 32-core node's, the range 2^b_dyn wider.
    increase = {name: rows[name]["increase_w"] for name in FALLBACK_CORES}
    assert increase["fb-64"] == pytest.approx(170.0 * 2.0**exponents.dynamic / 64, rel=1e-3)
    assert increase["fb-32"] == pytest.approx(170.0 / 32, rel=1e-3)
    assert rows["own-64"]["power_before_w"] == pytest.approx(100.0 + 200.0 * UTIL, abs=FLOAT32_W)

    scale = rows["fb-64"]["fallback_scale"]
    assert scale["applied"] is True and scale["reason"] == "scaled"
    assert (scale["allocatable_cores"], scale["anchor_cores"], scale["ratio"]) == (64, 32, 2)
    assert scale["idle_factor"] == pytest.approx(2.0**exponents.idle)
    assert scale["dynamic_factor"] == pytest.approx(2.0**exponents.dynamic)
    assert rows["fb-16"]["fallback_scale"]["ratio"] == 0.5
    assert rows["own-64"]["fallback_scale"] is None
    assert rows["fb-64"]["model"] == "fallback"

    core_scaling = status["curves"]["fallback"]["core_scaling"]
    assert core_scaling["enabled"] is True
    assert (core_scaling["anchor_cores"], core_scaling["anchor_nodes"]) == (32.0, 3)
    assert core_scaling["nodes_by_reason"] == {"scaled": 3}
    assert core_scaling["dynamic_exponent"] == exponents.dynamic

    # /metrics: a fallback node's predicted power is its scaled curve's, labelled fallback.
    line = f'{PREFIX}_node_predicted_power_watts{{model="fallback",node="fb-64"}} '
    predicted = [float(row.split()[-1]) for row in metrics.splitlines() if row.startswith(line)]
    assert predicted == [pytest.approx(before["fb-64"], rel=1e-6)]

    logged = [r.getMessage() for r in caplog.records if "fleet fallback model" in r.getMessage()]
    assert len(logged) == 1
    assert (
        "3 scaled by their CPU count against the median 32 cores of 3 own-model node(s)"
        in (logged[0])
    )


def test_turning_the_flag_off_restores_one_fleet_curve(
    bundle_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = snapshot(tmp_path, {**OWN_CORES, **FALLBACK_CORES})
    names = [*OWN_CORES, *FALLBACK_CORES]
    with (
        caplog.at_level(logging.WARNING, logger="extender.runtime"),
        service(bundle_dir, cluster, fallback_core_scaling=False) as (client, _runtime),
    ):
        rows = explain(client, names)
        status = client.get("/status").json()
    for name, cores in FALLBACK_CORES.items():
        assert rows[name]["power_before_w"] == pytest.approx(fleet_w(UTIL), abs=FLOAT32_W)
        assert rows[name]["increase_w"] == pytest.approx(170.0 / cores, rel=1e-3)
        assert rows[name]["fallback_scale"]["reason"] == "off"
        assert rows[name]["fallback_scale"]["applied"] is False
    # Byte-for-byte what the fleet curve gives, whatever the node's size.
    assert rows["fb-64"]["power_before_w"] == rows["fb-16"]["power_before_w"]
    core_scaling = status["curves"]["fallback"]["core_scaling"]
    assert core_scaling["enabled"] is False and core_scaling["nodes_by_reason"] == {"off": 3}
    logged = [r.getMessage() for r in caplog.records if "fleet fallback model" in r.getMessage()]
    assert "unscaled (fallback core scaling is off)" in logged[0]


def test_no_own_model_node_or_unknown_cores_leave_the_curve_unscaled(
    bundle_dir: Path, tmp_path: Path
) -> None:
    cluster = snapshot(tmp_path, FALLBACK_CORES)  # nothing to anchor on
    with service(bundle_dir, cluster) as (client, runtime):
        rows = explain(client, list(FALLBACK_CORES))
        for name in FALLBACK_CORES:
            assert rows[name]["power_before_w"] == pytest.approx(fleet_w(UTIL), abs=FLOAT32_W)
            assert rows[name]["fallback_scale"]["reason"] == "no_own_model_nodes"
            assert rows[name]["fallback_scale"]["ratio"] is None
        runtime.state.replace_nodes(
            [
                *(NodeInfo(name, float(cores)) for name, cores in OWN_CORES.items()),
                # A Node object without a usable allocatable CPU (the watch keeps it as NaN).
                NodeInfo("fb-64", math.nan),
                NodeInfo("fb-32", 32.0),
                NodeInfo("fb-16", 16.0),
            ]
        )
        for name in OWN_CORES:
            runtime.state.set_telemetry(name, TELEMETRY, runtime.clock())
        assert runtime.refresh_curves()
        curves = runtime.model.curves
        scaling = curves.fallback_scaling
        assert scaling.anchor_cores == 32.0
        row = curves.row_of("fb-64")
        assert scaling.describe(row)["reason"] == "allocatable_unknown"
        assert curves.power_w([row], [UTIL])[0] == pytest.approx(fleet_w(UTIL), abs=FLOAT32_W)
        row = curves.row_of("fb-16")
        assert curves.power_w([row], [UTIL])[0] == pytest.approx(scaled_w(UTIL, 0.5), abs=FLOAT32_W)


def test_a_node_resized_without_new_telemetry_gets_its_curve_rebuilt(
    bundle_dir: Path, tmp_path: Path
) -> None:
    cluster = snapshot(tmp_path, {**OWN_CORES, **FALLBACK_CORES})
    with service(bundle_dir, cluster) as (_client, runtime):
        runtime.stop()  # drive the refresher by hand
        row = runtime.model.curves.row_of("fb-32")
        assert runtime.model.curves.power_w([row], [UTIL])[0] == pytest.approx(
            fleet_w(UTIL), abs=FLOAT32_W
        )
        assert not runtime.refresh_curves()  # nothing moved
        runtime.state.upsert_node(NodeInfo("fb-32", 128.0))  # resized: 4 x the anchor
        assert runtime.refresh_curves()
        curves = runtime.model.curves
        row = curves.row_of("fb-32")
        assert curves.power_w([row], [UTIL])[0] == pytest.approx(scaled_w(UTIL, 4.0), abs=FLOAT32_W)
        assert curves.computed_rows == 1


def test_the_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config([]).fallback_core_scaling is True
    assert parse_config(["--no-fallback-core-scaling"]).fallback_core_scaling is False
    monkeypatch.setenv("PAS_FALLBACK_CORE_SCALING", "false")
    assert parse_config([]).fallback_core_scaling is False
    assert parse_config(["--fallback-core-scaling"]).fallback_core_scaling is True  # flag wins
    monkeypatch.setenv("PAS_FALLBACK_CORE_SCALING", "flase")
    with pytest.raises(ConfigError, match="PAS_FALLBACK_CORE_SCALING='flase'"):
        parse_config([])
    monkeypatch.delenv("PAS_FALLBACK_CORE_SCALING")
    assert "--no-fallback-core-scaling" in build_parser().format_help()
