"""PowerState (filter) and Consolidation (score) over real curve tables, and through the service."""

from __future__ import annotations

import logging
import math
import textwrap
from pathlib import Path
from types import MappingProxyType

import httpx
import numpy as np
import pytest

from extender.config import DEFAULT_BUNDLE_DIR
from extender.node_requests import REQUESTED_CPU_SIGNAL, NodeRequests
from extender.plugins.power_state import PowerStateCode, power_state_of
from extender.profile import DEFAULT_PROFILE, Profile, ProfileError, build_profile
from extender.scoring import assess
from extender.state import ClusterState, NodeInfo
from livedata.labels import POWER_STATE_ANNOTATION
from predictor.curves import CurveBuilder
from predictor.model import Predictor
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import extender_service, write_snapshot

NOW_S = 1_700_000_000.0
MODELS = DEFAULT_BUNDLE_DIR
CURVES = {name: PowerCurveSpec(100.0, 300.0) for name in ("a", "b", "c", "d")}
CONSOLIDATING = """
    plugins:
      score:
        enabled:
          - name: Consolidation
            weight: 1
    pluginConfig:
      - name: Consolidation
        args:
          busyShare: 0.5
"""


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    directory: Path = tmp_path_factory.mktemp("power-plugins") / "bundle"
    make_bundle(directory, CURVES)
    return Predictor.load(directory)


def state_of(nodes: dict[str, dict], util: float = 0.3) -> ClusterState:
    state = ClusterState(node_attributes=DEFAULT_PROFILE.node_attributes)
    state.replace_nodes(
        NodeInfo(name, spec.get("cpu", 8.0), {}, spec.get("annotations", {}))
        for name, spec in nodes.items()
    )
    for name, spec in nodes.items():
        values = {"cpu_util": spec.get("util", util), "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}
        state.set_telemetry(name, values, NOW_S - 5)
    return state


def run(predictor: Predictor, state: ClusterState, profile: Profile, demand_cores: float = 1.0):
    _, snapshot = state.telemetry_snapshot()
    curves = CurveBuilder().build(predictor, {n: v for n, (v, _) in snapshot.items()}, None)
    view = state.view(NOW_S)
    return assess(
        view, curves, list(view.names), demand_cores, profile, now_s=NOW_S, telemetry_ttl_s=90.0
    )


def power_state(value: str) -> dict:
    return {"annotations": {POWER_STATE_ANNOTATION: value}}


# ---- PowerState -------------------------------------------------------------------------------


def test_nodes_off_waking_or_draining_fail_unresolvably_with_a_reason(predictor) -> None:
    state = state_of(
        {
            "a": power_state("off"),
            "b": power_state("waking"),
            "c": power_state("draining"),
            "d": power_state("on"),
        }
    )
    result = run(predictor, state, DEFAULT_PROFILE)
    assert set(result.failed) == {"a", "b", "c"} == set(result.unresolvable)
    assert "powered off" in result.failed["a"] and POWER_STATE_ANNOTATION in result.failed["a"]
    assert "booting" in result.failed["b"]
    assert "emptied to power off" in result.failed["c"]
    assert result.passes() == [False, False, False, True]
    assert [r["power_state"] for r in result.explain()] == ["off", "waking", "draining", "on"]


def test_a_node_powering_off_is_filtered_from_the_next_request_on(predictor) -> None:
    # With no node off, waking or draining anywhere the filter passes every candidate without
    # looking at them; that shortcut must end as soon as a node's state changes.
    state = state_of({name: power_state("on") for name in ("a", "b", "c")})
    assert run(predictor, state, DEFAULT_PROFILE).failed == {}
    state.upsert_node(NodeInfo("b", 8.0, {}, power_state("draining")["annotations"]))
    assert set(run(predictor, state, DEFAULT_PROFILE).failed) == {"b"}
    state.upsert_node(NodeInfo("b", 8.0, {}, power_state("on")["annotations"]))
    assert run(predictor, state, DEFAULT_PROFILE).failed == {}


def test_unmanaged_and_unknown_power_states_pass_and_the_unknown_is_logged(
    predictor, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="extender.state"):
        state = state_of({"a": {}, "b": power_state("hibernating"), "c": power_state(" OFF ")})
    assert "unknown power-aware-scheduler/power-state annotation 'hibernating'" in caplog.text
    result = run(predictor, state, DEFAULT_PROFILE)
    assert set(result.failed) == {"c"}  # values are read trimmed and case-blind
    assert [r["power_state"] for r in result.explain()] == ["unmanaged", "unknown", "off"]


def test_power_state_parsing() -> None:
    assert power_state_of(None) == PowerStateCode.UNMANAGED
    assert power_state_of({POWER_STATE_ANNOTATION: "waking"}) == PowerStateCode.WAKING
    assert power_state_of({POWER_STATE_ANNOTATION: ""}) == PowerStateCode.UNKNOWN


# ---- Consolidation ----------------------------------------------------------------------------


def consolidating(busy_share: float = 0.5, weight: float = 1.0) -> Profile:
    return build_profile(
        {
            "plugins": {"score": {"enabled": [{"name": "Consolidation", "weight": weight}]}},
            "pluginConfig": [{"name": "Consolidation", "args": {"busyShare": busy_share}}],
        }
    )


def test_busy_nodes_score_10_and_emptier_nodes_fewer_points_from_requests(predictor) -> None:
    state = state_of({"a": {}, "b": {}, "c": {}, "d": {"cpu": 16.0}})
    # Requests: a 6 of 8 cores (busy), b 2 of 8, c nothing, d 4 of 16.
    state.set_signal(
        REQUESTED_CPU_SIGNAL, NodeRequests(MappingProxyType({"a": 6.0, "b": 2.0, "d": 4.0}))
    )
    result = run(predictor, state, consolidating())
    np.testing.assert_allclose(result.scores["Consolidation"].raw, [0.75, 0.25, 0.0, 0.25])
    np.testing.assert_allclose(result.points("Consolidation"), [10.0, 5.0, 0.0, 5.0])
    explained = result.explain()
    assert [r["requested_share"] for r in explained] == [0.75, 0.25, 0.0, 0.25]
    assert {r["requested_share_from"] for r in explained} == {"requests"}
    # a, b, c: same power curves and telemetry, so the consolidation points decide the order.
    scores = dict(result.host_scores())
    assert scores["a"] > scores["b"] > scores["c"]
    # busyShare 1 is "most allocated": points in proportion to the share.
    linear = run(predictor, state, consolidating(busy_share=1.0))
    np.testing.assert_allclose(linear.points("Consolidation"), [7.5, 2.5, 0.0, 2.5])


def test_without_the_pod_watch_the_share_is_measured_use(predictor) -> None:
    state = state_of({"a": {"util": 0.6}, "b": {"util": 0.1}})
    state.pod_bound("b", "uid-1", 2.0, NOW_S - 1)  # assumed: 2 of 8 cores
    result = run(predictor, state, consolidating())
    np.testing.assert_allclose(result.scores["Consolidation"].raw, [0.6, 0.35], atol=1e-6)
    np.testing.assert_allclose(result.points("Consolidation"), [10.0, 7.0], atol=1e-5)
    assert {r["requested_share_from"] for r in result.explain()} == {"measured"}


def test_a_node_the_extender_cannot_tell_scores_no_consolidation_points(predictor) -> None:
    state = state_of({"a": {}})
    state.set_signal(REQUESTED_CPU_SIGNAL, NodeRequests(MappingProxyType({"a": 8.0})))
    view = state.view(NOW_S)
    result = assess(
        view, None, ["a", "ghost"], 1.0, consolidating(), now_s=NOW_S, telemetry_ttl_s=90.0
    )
    np.testing.assert_allclose(result.points("Consolidation"), [10.0, 0.0])
    assert result.explain()[1]["requested_share"] is None
    assert result.explain()[1]["requested_share_from"] == "unknown"


def test_busy_share_must_be_a_share() -> None:
    for bad in (0, 1.5, -0.2):
        with pytest.raises(ProfileError, match="busyShare must be in"):
            consolidating(busy_share=bad)
    assert math.isclose(consolidating().plugin("Consolidation").args.busy_share, 0.5)


def test_the_service_filters_power_states_and_consolidates_from_a_profile_file(
    tmp_path: Path,
) -> None:
    config = tmp_path / "profile.yaml"
    config.write_text(textwrap.dedent(CONSOLIDATING))

    def snapshot_node(name: str, util: float, annotations: dict | None = None) -> dict:
        telemetry = {"cpu_util": util, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}
        node = {"name": name, "allocatable_cpu": 8, "telemetry": telemetry}
        return node | ({"annotations": annotations} if annotations else {})

    snapshot = write_snapshot(
        tmp_path / "cluster.json",
        [
            snapshot_node("node-01", 0.0, {POWER_STATE_ANNOTATION: "off"}),
            snapshot_node("node-02", 0.7),
            snapshot_node("node-03", 0.1),
        ],
    )
    pod = {"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}}
    body = {"Pod": pod, "NodeNames": ["node-01", "node-02", "node-03"]}
    with extender_service(MODELS, cluster_file=snapshot, config_file=config) as (url, _):
        answer = httpx.post(f"{url}/filter", json=body, timeout=10).json()
        explained = httpx.post(f"{url}/explain", json=body, timeout=10).json()["nodes"]
    assert answer["NodeNames"] == ["node-02", "node-03"]
    assert "powered off" in answer["FailedAndUnresolvableNodes"]["node-01"]
    # No Pod watch in snapshot mode: the share is the measured utilisation.
    points = {r["node"]: r["plugins"]["Consolidation"]["points"] for r in explained}
    assert points["node-02"] == 10.0 and points["node-03"] == pytest.approx(2.0, abs=1e-6)
