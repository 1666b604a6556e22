"""Scores and filter verdicts over real curve tables (real ONNX models through onnxruntime)."""

from __future__ import annotations

import gc
import math
import weakref
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.plugins.energy_level import (
    ENERGY_LEVEL,
    ENERGY_SCORES,
    EnergyLevel,
    energy_level_of,
)
from extender.plugins.power_cap import max_power_of
from extender.profile import DEFAULT_PROFILE, ProfileError
from extender.protocol import encode, prioritize_result
from extender.scoring import assess
from extender.state import ClusterState, NodeInfo
from predictor.bundle import BundleError
from predictor.curves import UTIL_GRID, CurveBuilder, CurveTable
from predictor.model import Predictor
from tests.support.bundles import PowerCurveSpec, make_bundle

NOW_S = 1_700_000_000.0
TTL_S = 90.0
FLOAT32_W = 0.05  # float32 inference error of the exact fits, watts

# Linear curves: the increase of one core on an 8-core node is (max - idle) / 8.
CURVES = {
    "steep": PowerCurveSpec(100.0, 400.0),  # 300 W per unit u -> 37.5 W per core
    "mid": PowerCurveSpec(100.0, 300.0),  # 25 W per core
    "mid-plus": PowerCurveSpec(100.0, 320.0),  # 27.5 W per core
    "flat": PowerCurveSpec(80.0, 180.0),  # 12.5 W per core
    "twin": PowerCurveSpec(80.0, 180.0),
    # Cubic: the increase grows with load, so assumed load shifts where the next pod goes.
    "convex-a": PowerCurveSpec(60.0, 210.0, exponent=3),  # flattest
    "convex-b": PowerCurveSpec(70.0, 270.0, exponent=3),
    "convex-c": PowerCurveSpec(80.0, 330.0, exponent=3),
}


def telemetry(util: float) -> dict[str, float]:
    return {"cpu_util": util, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    directory: Path = tmp_path_factory.mktemp("scoring") / "bundle"
    make_bundle(directory, CURVES)
    return Predictor.load(directory)


def make_state(nodes: dict[str, dict], util: float = 0.3) -> ClusterState:
    """Nodes (name -> labels/annotations/allocatable), all with fresh telemetry at `util`."""
    state = ClusterState()
    state.replace_nodes(
        NodeInfo(
            name,
            spec.get("cpu", 8.0),
            spec.get("labels", {}),
            spec.get("annotations", {}),
        )
        for name, spec in nodes.items()
    )
    for name, spec in nodes.items():
        if spec.get("telemetry", True):
            state.set_telemetry(name, telemetry(spec.get("util", util)), NOW_S - 5)
    return state


def curves_for(predictor: Predictor, state: ClusterState) -> CurveTable:
    _, snapshot = state.telemetry_snapshot()
    return CurveBuilder().build(predictor, {n: v for n, (v, _) in snapshot.items()}, None)


def run(predictor, state, candidates, demand_cores=1.0, weights=None, ttl_s=TTL_S, now_s=NOW_S):
    return assess(
        state.view(now_s),
        curves_for(predictor, state),
        candidates,
        demand_cores,
        DEFAULT_PROFILE.with_weights(**weights) if weights else DEFAULT_PROFILE,
        now_s=now_s,
        telemetry_ttl_s=ttl_s,
    )


def test_smallest_increase_scores_10_and_order_follows_increase(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "mid": {}, "flat": {}})
    result = run(predictor, state, ["steep", "mid", "flat"])
    np.testing.assert_allclose(result.increase_w, [37.5, 25.0, 12.5], atol=FLOAT32_W)
    np.testing.assert_allclose(result.d, [1 / 8] * 3)
    # 10 - 5 * log2(increase / 12.5): three times the cheapest loses log2(3) doublings.
    np.testing.assert_allclose(
        result.points("PowerIncrease"), [10 - 5 * math.log2(3), 5.0, 10.0], atol=0.01
    )
    # Grid power everywhere: energy score 10, final = 0.6 * power + 4 (5.25 -> 5, 7.0 -> 7).
    assert result.host_scores() == [("steep", 5), ("mid", 7), ("flat", 10)]
    assert result.failed == {}
    np.testing.assert_allclose(result.power_before_w, [190.0, 160.0, 110.0], atol=FLOAT32_W)
    np.testing.assert_allclose(
        result.power_after_w - result.power_before_w, result.increase_w, atol=1e-9
    )


def test_scores_are_python_ints_and_encode_as_json_integers(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "mid": {}, "flat": {}})
    result = run(predictor, state, ["steep", "mid", "flat"])
    assert all(type(score) is int for _, score in result.host_scores())
    decoded = orjson.loads(encode(prioritize_result(result.host_scores())))
    assert all(type(entry["Score"]) is int and 0 <= entry["Score"] <= 10 for entry in decoded)
    assert b"." not in encode(prioritize_result(result.host_scores()))


def test_node_without_telemetry_gets_the_lowest_power_score(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "flat": {}, "mid": {"telemetry": False}})
    result = run(predictor, state, ["steep", "flat", "mid"])
    mid = 2
    assert not result.has_telemetry[mid]
    assert result.points("PowerIncrease")[mid] == 0.0
    assert result.points("PowerIncrease")[mid] <= result.points("PowerIncrease").min()
    assert result.score[mid] < result.score.max()
    assert "mid" not in result.failed  # passes the filter
    assert result.no_telemetry_nodes == 1
    assert math.isnan(result.increase_w[mid])
    assert result.explain()[mid]["note"] == "no telemetry: lowest power score"


def test_stale_telemetry_counts_as_none(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "flat": {}})
    state.set_telemetry("flat", telemetry(0.3), NOW_S - 600)  # 10 minutes old
    stale = run(predictor, state, ["steep", "flat"], ttl_s=TTL_S)
    assert stale.has_telemetry.tolist() == [True, False]
    assert stale.points("PowerIncrease").tolist() == [10.0, 0.0]
    assert stale.no_telemetry_nodes == 1
    assert stale.explain()[1]["note"].startswith("telemetry stale (600 s old)")
    # A snapshot never goes stale.
    fixed = run(predictor, state, ["steep", "flat"], ttl_s=None)
    assert fixed.has_telemetry.tolist() == [True, True]
    assert fixed.host_scores()[1] == ("flat", 10)


@pytest.mark.parametrize("ttl_s", [TTL_S, None], ids=["live", "snapshot"])
def test_fresh_telemetry_without_cpu_util_is_not_called_stale(
    predictor: Predictor, ttl_s: float | None
) -> None:
    state = make_state({"steep": {}, "flat": {}})
    state.set_telemetry("flat", {"ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}, NOW_S - 5)
    result = run(predictor, state, ["steep", "flat"], ttl_s=ttl_s)
    assert result.has_telemetry.tolist() == [True, False]
    assert result.points("PowerIncrease")[1] == 0.0
    assert result.explain()[1]["note"] == "telemetry has no cpu_util: lowest power score"


def test_node_without_a_curve_is_counted_and_scored_lowest(predictor: Predictor) -> None:
    # "orphan" has telemetry but no model (the bundle has no fallback).
    state = make_state({"flat": {}, "steep": {}, "orphan": {}})
    result = run(predictor, state, ["flat", "steep", "orphan"])
    assert result.has_telemetry.tolist() == [True, True, True]
    assert result.has_curve.tolist() == [True, True, False]
    assert result.no_curve_nodes == 1
    assert result.points("PowerIncrease")[2] == 0.0
    assert result.host_scores()[0] == ("flat", 10)


def test_unknown_names_score_0_and_pass(predictor: Predictor) -> None:
    state = make_state({"flat": {}, "steep": {}})
    result = run(predictor, state, ["ghost", "flat", "steep"])
    assert result.host_scores()[0] == ("ghost", 0)
    assert result.unknown_nodes == 1
    assert result.passes() == [True, True, True]
    assert result.host_scores()[1] == ("flat", 10)


def test_powerless_nodes_fail_the_filter(predictor: Predictor) -> None:
    state = make_state({"flat": {"labels": {"energy-status": "powerless"}}, "steep": {}})
    result = run(predictor, state, ["flat", "steep"])
    assert result.failed == {"flat": "energy-status is powerless (0-15 % stored energy)"}
    assert result.passes() == [False, True]
    # Preempting pods cannot charge a battery: the scheduler should not try.
    assert result.unresolvable == {"flat"}


def test_a_node_turning_powerless_is_filtered_from_the_next_request_on(
    predictor: Predictor,
) -> None:
    # No powerless node anywhere: the filter passes all without looking; until one changes.
    state = make_state({"steep": {}, "flat": {}})
    assert run(predictor, state, ["steep", "flat"]).failed == {}
    state.upsert_node(NodeInfo("flat", 8.0, {"energy-status": "powerless"}, {}))
    assert set(run(predictor, state, ["steep", "flat"]).failed) == {"flat"}


def test_max_power_annotation_fails_with_both_numbers(predictor: Predictor) -> None:
    # steep: 190 W at u=0.3, 227.5 W after one core.
    state = make_state(
        {
            "steep": {"annotations": {"power-aware-scheduler/max-power-w": "200"}},
            "mid": {"annotations": {"power-aware-scheduler/max-power-w": "500"}},
        }
    )
    result = run(predictor, state, ["steep", "mid"])
    assert list(result.failed) == ["steep"]
    assert result.unresolvable == frozenset()  # evicting pods would lower its power
    assert result.failed["steep"] == (
        "predicted power after placement 227.5 W exceeds power-aware-scheduler/max-power-w 200 W"
    )


def test_nodes_without_telemetry_pass_even_with_a_max_power(predictor: Predictor) -> None:
    state = make_state(
        {"steep": {"telemetry": False, "annotations": {"power-aware-scheduler/max-power-w": "1"}}}
    )
    assert run(predictor, state, ["steep"]).failed == {}


def test_all_equal_increases_all_score_best(predictor: Predictor) -> None:
    state = make_state({"flat": {}, "twin": {}})
    result = run(predictor, state, ["flat", "twin"])
    assert result.points("PowerIncrease").tolist() == [10.0, 10.0]
    assert result.host_scores() == [("flat", 10), ("twin", 10)]


def test_energy_level_changes_the_order_as_documented(predictor: Predictor) -> None:
    # mid: 25 W per core but low-powered; mid-plus: 27.5 W and well-powered; steep: 37.5 W.
    nodes = {
        "mid": {"labels": {"energy-status": "low-powered"}},
        "mid-plus": {"labels": {"energy-status": "well-powered"}},
        "steep": {},
    }
    result = run(predictor, make_state(nodes), ["mid", "mid-plus", "steep"])
    assert result.increase_w[0] < result.increase_w[1] < result.increase_w[2]
    power = [10.0, 10 - 5 * math.log2(1.1), 10 - 5 * math.log2(1.5)]
    np.testing.assert_allclose(result.points("PowerIncrease"), power, atol=0.01)
    np.testing.assert_allclose(result.points("EnergyLevel"), [3.0, 10.0, 10.0])
    # 0.6 * 10 + 0.4 * 3 = 7.2 -> 7 ; 0.6 * 9.31 + 4 = 9.59 -> 10 ; 0.6 * 7.08 + 4 = 8.25 -> 8
    assert result.host_scores() == [("mid", 7), ("mid-plus", 10), ("steep", 8)]
    # the explain view spells levels as the label does
    levels = [record["energy_level"] for record in result.explain()]
    assert levels == ["low-powered", "well-powered", "grid"]
    # With power alone, the smaller increase wins again.
    power_only = run(
        predictor,
        make_state(nodes),
        ["mid", "mid-plus"],
        weights={"PowerIncrease": 1.0, "EnergyLevel": 0.0},
    )
    assert power_only.host_scores() == [("mid", 10), ("mid-plus", 9)]


def test_energy_levels_from_labels() -> None:
    assert energy_level_of({}) == EnergyLevel.GRID
    assert energy_level_of(None) == EnergyLevel.GRID
    assert energy_level_of({"energy-status": "well-powered"}) == EnergyLevel.WELL_POWERED
    assert energy_level_of({"energy-status": "vulnerable"}) == EnergyLevel.VULNERABLE
    assert energy_level_of({"energy-status": "low-powered"}) == EnergyLevel.LOW_POWERED
    assert energy_level_of({"energy-status": "powerless"}) == EnergyLevel.POWERLESS
    assert energy_level_of({"energy-status": "Solar"}) == EnergyLevel.UNKNOWN
    scores = ENERGY_SCORES
    assert scores[EnergyLevel.GRID] == scores[EnergyLevel.WELL_POWERED] == 10
    assert scores[EnergyLevel.UNKNOWN] == scores[EnergyLevel.VULNERABLE]
    assert (
        scores[EnergyLevel.WELL_POWERED]
        > scores[EnergyLevel.VULNERABLE]
        > scores[EnergyLevel.LOW_POWERED]
        > scores[EnergyLevel.POWERLESS]
    )


def test_max_power_annotation_parsing() -> None:
    key = "power-aware-scheduler/max-power-w"
    assert max_power_of({key: "450"}) == 450.0
    assert max_power_of({key: "312.5"}) == 312.5
    for bad in ("", "lots", "-5", "0", "nan", "inf"):
        assert math.isnan(max_power_of({key: bad})), bad
    assert math.isnan(max_power_of({}))


def test_unknown_energy_label_is_counted_and_scored_like_vulnerable(predictor: Predictor) -> None:
    state = make_state({"flat": {"labels": {"energy-status": "solar-ish"}}})
    result = run(predictor, state, ["flat"])
    assert [r["energy_level"] for r in result.explain()].count("unknown") == 1
    assert result.points("EnergyLevel")[0] == 6.0
    assert result.failed == {}
    assert result.explain()[0]["energy_level"] == "unknown"


def test_every_level_explain_reports_is_a_label_that_means_it(
    predictor: Predictor, caplog: pytest.LogCaptureFixture
) -> None:
    # /explain says "grid" for an unlabelled node: writing that word back as the label must be
    # accepted (no "unknown" warning) and mean the same level, score and filter verdict.
    from livedata.labels import ENERGY_LABEL_VALUES

    labels = {"plain": {}, **{value: {"energy-status": value} for value in ENERGY_LABEL_VALUES}}
    with caplog.at_level("WARNING"):
        state = make_state({name: {"labels": labels[name]} for name in labels})
        for name, node_labels in labels.items():  # the check the service runs on every write
            assert ENERGY_LEVEL.check(NodeInfo(name, 8.0, node_labels, {})) is None
    assert "unknown energy-status" not in caplog.text
    result = run(predictor, state, list(labels))
    said = {row["node"]: row["energy_level"] for row in result.explain()}
    assert said["plain"] == said["grid"] == "grid"
    for value in ENERGY_LABEL_VALUES:
        assert said[value] == value  # the word shown is the label that produces it
    points = dict(zip(result.names, result.points("EnergyLevel").tolist(), strict=True))
    assert points["grid"] == points["plain"] == 10.0
    assert set(result.failed) == {"powerless"}


def test_an_unknown_label_warning_lists_the_valid_values() -> None:
    problem = ENERGY_LEVEL.check(NodeInfo("flat", 8.0, {"energy-status": "solar-ish"}, {}))
    assert problem == (
        "unknown energy-status label 'solar-ish', scored like 'vulnerable'; valid values: "
        "grid, well-powered, vulnerable, low-powered, powerless (no label: grid)"
    )


def grid_table(slopes_w: dict[str, float]) -> CurveTable:
    """A real CurveTable over exact linear curves (no inference error), for tiny differences."""
    names = tuple(slopes_w)
    grid = np.array([100.0 + slope * UTIL_GRID for slope in slopes_w.values()])
    return CurveTable(
        version="test",
        names=names,
        power_w_grid=grid,
        util_now=np.full(len(names), 0.3),
        model_kind=("own",) * len(names),
        feature_rows=np.zeros((len(names), 4), dtype=np.float32),
    )


def test_tiny_pods_rank_nodes_as_large_pods_do() -> None:
    # Linear curves: a 10m pod and a 4-core pod on 64-core nodes cost 0.1 W and 40 W on "a";
    # the score depends on increases relative to the cheapest, so both rank alike (WAO's
    # whole-watt rounding made small pods tie everywhere).
    state = make_state({"a": {"cpu": 64.0}, "b": {"cpu": 64.0}, "c": {"cpu": 64.0}})
    table = grid_table({"a": 640.0, "b": 640.64, "c": 1280.0})
    view = state.view(NOW_S)
    tiny = assess(view, table, ["a", "b", "c"], 0.01, now_s=NOW_S, telemetry_ttl_s=TTL_S)
    large = assess(view, table, ["a", "b", "c"], 4.0, now_s=NOW_S, telemetry_ttl_s=TTL_S)
    np.testing.assert_allclose(tiny.increase_w, [0.1, 0.1001, 0.2], rtol=1e-9)
    np.testing.assert_allclose(
        tiny.points("PowerIncrease"), large.points("PowerIncrease"), atol=1e-9
    )
    # Twice the cheapest's increase: 5 points; 0.1 % more: below 10, in float precision.
    assert tiny.points("PowerIncrease")[2] == pytest.approx(5.0)
    assert tiny.points("PowerIncrease")[0] == 10.0 > tiny.points("PowerIncrease")[1] > 9.99
    assert tiny.host_scores() == large.host_scores() == [("a", 10), ("b", 10), ("c", 7)]


def test_power_score_falls_five_points_per_doubling_and_stops_at_0() -> None:
    state = make_state({name: {} for name in "abcde"})
    # d = 1/8 of the slope: increases 10, 11.5, 20, 40 and 80 W.
    table = grid_table({"a": 80.0, "b": 92.0, "c": 160.0, "d": 320.0, "e": 640.0})
    result = assess(
        state.view(NOW_S), table, list("abcde"), 1.0, now_s=NOW_S, telemetry_ttl_s=TTL_S
    )
    np.testing.assert_allclose(result.increase_w, [10.0, 11.5, 20.0, 40.0, 80.0], rtol=1e-9)
    expected = [10.0, 10 - 5 * math.log2(1.15), 5.0, 0.0, 0.0]
    np.testing.assert_allclose(result.points("PowerIncrease"), expected, atol=1e-9)
    # 15 % more power costs about one power point (0.6 of a final point at default weights).
    assert result.points("PowerIncrease")[0] - result.points("PowerIncrease")[1] == pytest.approx(
        1.0, abs=0.01
    )


def test_a_zero_watt_increase_does_not_divide_by_zero() -> None:
    state = make_state({"flat": {}, "rising": {}})
    table = grid_table({"flat": 0.0, "rising": 200.0})
    result = assess(
        state.view(NOW_S), table, ["flat", "rising"], 1.0, now_s=NOW_S, telemetry_ttl_s=TTL_S
    )
    assert result.increase_w[0] == pytest.approx(0.0, abs=1e-9)
    assert result.points("PowerIncrease").tolist() == [10.0, 0.0]


def test_recently_bound_pods_raise_the_increase_and_spread_a_burst(predictor: Predictor) -> None:
    state = make_state({"convex-a": {}, "convex-b": {}, "convex-c": {}}, util=0.2)
    table = curves_for(predictor, state)
    chosen = []
    for i in range(20):
        now_s = NOW_S + i
        result = assess(
            state.view(now_s),
            table,
            ["convex-a", "convex-b", "convex-c"],
            1.0,
            now_s=now_s,
            telemetry_ttl_s=TTL_S,
        )
        best = max(result.host_scores(), key=lambda pair: pair[1])[0]
        chosen.append(best)
        state.pod_bound(best, f"burst-{i}", 1.0, now_s)
    assert len(set(chosen)) == 3, chosen
    view = state.view(NOW_S + 20)
    assert view.assumed_cpu.sum() == 20.0
    # The flattest curve takes the first pods, then the burst spreads as its load rises.
    assert chosen[0] == "convex-a"
    counts = {node: chosen.count(node) for node in ("convex-a", "convex-b", "convex-c")}
    assert counts["convex-a"] > max(counts["convex-b"], counts["convex-c"]) > 0, chosen


def test_assumed_load_moves_the_operating_point(predictor: Predictor) -> None:
    state = make_state({"convex-a": {}}, util=0.2)
    before = run(predictor, state, ["convex-a"])
    state.pod_bound("convex-a", "uid-1", 2.0, NOW_S - 1)
    after = run(predictor, state, ["convex-a"])
    assert after.a[0] == pytest.approx(0.25)
    assert after.increase_w[0] > before.increase_w[0]
    spec = CURVES["convex-a"]
    expected = spec.power_w(0.2 + 0.25 + 0.125, 50.0) - spec.power_w(0.2 + 0.25, 50.0)
    assert after.increase_w[0] == pytest.approx(float(expected), abs=FLOAT32_W)


def test_node_objects_use_the_request_labels_and_view_telemetry(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "flat": {}})
    nodes = [
        NodeInfo("steep", 8.0, {}, {}),
        NodeInfo("flat", 8.0, {"energy-status": "powerless"}, {}),
        NodeInfo("mid", 8.0, {}, {}),  # in the request only: no telemetry
    ]
    result = run(predictor, state, nodes)
    assert result.names == ("steep", "flat", "mid")
    assert result.known.tolist() == [True, True, True]
    assert result.failed == {"flat": "energy-status is powerless (0-15 % stored energy)"}
    assert result.has_telemetry.tolist() == [True, True, False]
    assert result.no_telemetry_nodes == 1


def test_no_curves_at_all_and_empty_candidates(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "flat": {}})
    result = assess(
        state.view(NOW_S), None, ["steep", "flat"], 1.0, now_s=NOW_S, telemetry_ttl_s=None
    )
    assert result.points("PowerIncrease").tolist() == [0.0, 0.0]
    assert result.host_scores() == [("steep", 4), ("flat", 4)]
    assert result.no_curve_nodes == 2
    empty = assess(state.view(NOW_S), None, [], 1.0, now_s=NOW_S, telemetry_ttl_s=None)
    assert empty.host_scores() == []
    assert empty.failed == {}


def test_explain_records_carry_the_inputs(predictor: Predictor) -> None:
    state = make_state({"steep": {}, "flat": {}})
    record = run(predictor, state, ["steep", "flat"]).explain()[1]
    assert record["node"] == "flat"
    assert record["u"] == pytest.approx(0.3)
    assert record["a"] == 0.0
    assert record["d"] == 0.125
    assert record["increase_w"] == pytest.approx(12.5, abs=FLOAT32_W)
    assert record["score"] == 10
    assert record["energy_level"] == "grid"
    assert orjson.loads(orjson.dumps(record)) == record


def test_explain_names_predictions_above_the_highest_measured_load(tmp_path: Path) -> None:
    # The bundle says how far each node's data went; /explain flags a placement that takes the
    # node above it (the model's shape there is the population prior's, not the node's).
    curves = {
        "half-seen": PowerCurveSpec(100.0, 300.0, info={"max_util_measured": 0.5}),
        "all-seen": PowerCurveSpec(100.0, 300.0, info={"max_util_measured": 0.98}),
        "unrecorded": PowerCurveSpec(100.0, 300.0),
    }
    make_bundle(tmp_path / "bundle", curves, fallback=PowerCurveSpec(90.0, 250.0))
    predictor = Predictor.load(tmp_path / "bundle")
    state = make_state({name: {} for name in (*curves, "new-node")}, util=0.3)
    table = curves_for(predictor, state)
    assert table.max_util_measured[table.row_of("half-seen")] == 0.5
    assert np.isnan(table.max_util_measured[table.row_of("new-node")])  # the fleet fallback
    names = [*curves, "new-node", "not-in-cluster"]

    def flags(demand_cores: float) -> dict[str, object]:
        records = run(predictor, state, names, demand_cores=demand_cores).explain()
        return {r["node"]: (r["max_util_measured"], r["extrapolated"]) for r in records}

    # 1 core of 8 at u = 0.3: 0.425, inside what every node has shown
    assert flags(1.0) == {
        "half-seen": (0.5, False),
        "all-seen": (0.98, False),
        "unrecorded": (None, None),
        "new-node": (None, None),
        "not-in-cluster": (None, None),
    }
    # 2 cores: 0.55, above the half-seen node's data only
    assert flags(2.0)["half-seen"] == (0.5, True)
    assert flags(2.0)["all-seen"] == (0.98, False)


def test_explain_gives_the_band_of_a_prediction_above_the_highest_measured_load(
    tmp_path: Path,
) -> None:
    band = {"util": [0.6, 0.8, 1.0], "low": [0.95, 0.9, 0.85], "high": [1.05, 1.2, 1.3]}
    curves = {
        "half-seen": PowerCurveSpec(
            100.0, 300.0, info={"max_util_measured": 0.5, "extrapolation_interval": band}
        ),
        "no-band": PowerCurveSpec(100.0, 300.0, info={"max_util_measured": 0.5}),
    }
    make_bundle(tmp_path / "bundle", curves, fallback=PowerCurveSpec(90.0, 250.0))
    predictor = Predictor.load(tmp_path / "bundle")
    state = make_state({name: {} for name in curves}, util=0.3)

    def intervals(demand_cores: float) -> dict[str, object]:
        records = run(predictor, state, list(curves), demand_cores=demand_cores).explain()
        return {r["node"]: (r["power_after_w"], r["extrapolation_interval_w"]) for r in records}

    # 1 core of 8 at u = 0.3: 0.425, inside what the node has shown: no band
    assert intervals(1.0)["half-seen"][1] is None
    # 4 cores: 0.8, where the band is 0.9-1.2 times the prediction
    after_w, (low_w, high_w) = intervals(4.0)["half-seen"]
    assert (low_w, high_w) == pytest.approx((0.9 * after_w, 1.2 * after_w), abs=1e-3)
    assert intervals(4.0)["no-band"][1] is None


def test_a_bundle_with_an_impossible_highest_load_is_refused(tmp_path: Path) -> None:
    # write_bundle reads what it wrote back through read_bundle, as the extender would
    with pytest.raises(BundleError, match="'max_util_measured' must be a utilisation"):
        make_bundle(
            tmp_path / "bundle",
            {"n": PowerCurveSpec(100.0, 300.0, info={"max_util_measured": 1.7})},
        )


def test_bad_weights_and_demand_are_refused() -> None:
    with pytest.raises(ProfileError, match="PowerIncrease must be finite and >= 0"):
        DEFAULT_PROFILE.with_weights(PowerIncrease=-1.0)
    with pytest.raises(ProfileError, match="must not all be 0"):
        DEFAULT_PROFILE.with_weights(PowerIncrease=0.0, EnergyLevel=0.0)
    state = make_state({"flat": {}})
    with pytest.raises(ValueError, match="demand_cores"):
        assess(state.view(NOW_S), None, ["flat"], math.nan, now_s=NOW_S, telemetry_ttl_s=None)


@settings(max_examples=60, deadline=None)
@given(
    slopes=st.lists(
        st.floats(min_value=1.0, max_value=2000.0, allow_nan=False), min_size=1, max_size=12
    ),
    demand_cores=st.floats(min_value=0.001, max_value=64.0),
    missing=st.integers(min_value=0, max_value=11),
)
def test_score_invariants(slopes: list[float], demand_cores: float, missing: int) -> None:
    names = [f"n{i}" for i in range(len(slopes))]
    nodes = {name: {"cpu": 16.0} for name in names}
    if missing < len(names):
        nodes[names[missing]]["telemetry"] = False
    state = make_state(nodes)
    result = assess(
        state.view(NOW_S),
        grid_table(dict(zip(names, slopes, strict=True))),
        names,
        demand_cores,
        now_s=NOW_S,
        telemetry_ttl_s=TTL_S,
    )
    scores = [score for _, score in result.host_scores()]
    assert all(type(score) is int and 0 <= score <= 10 for score in scores)
    scorable = np.flatnonzero(result.scorable)
    if scorable.size:
        best = scorable[np.argmin(result.increase_w[scorable])]
        assert result.points("PowerIncrease")[best] == 10.0
        assert scores[best] == max(scores)
        # Lower increase never scores lower (same energy level everywhere).
        order = scorable[np.argsort(result.increase_w[scorable], kind="stable")]
        ranked = [scores[i] for i in order]
        assert ranked == sorted(ranked, reverse=True)
    if missing < len(names):
        assert result.points("PowerIncrease")[missing] == 0.0
        assert scores[missing] == min(scores)


def test_repeated_candidates_reuse_pod_independent_work_only_while_it_holds(
    predictor: Predictor,
) -> None:
    """The same list scored again on one view: same answers as from scratch, TTL still applies."""
    state = make_state({"steep": {}, "flat": {}})  # telemetry observed at NOW_S - 5
    view, curves = state.view(NOW_S), curves_for(predictor, state)
    names = ["steep", "flat"]

    def scored(demand_cores: float, now_s: float):
        return assess(view, curves, list(names), demand_cores, now_s=now_s, telemetry_ttl_s=TTL_S)

    first = scored(1.0, NOW_S)
    second = scored(2.0, NOW_S + 1)  # another pod: only d and what follows from it change
    assert second.power_before_w.tolist() == first.power_before_w.tolist()
    np.testing.assert_allclose(second.increase_w, 2 * first.increase_w, rtol=1e-6)
    assert second.telemetry_age_s.tolist() == [6.0, 6.0]
    # Past the TTL the same view must not serve the earlier, fresh state.
    late = scored(1.0, NOW_S + TTL_S)
    assert late.has_telemetry.tolist() == [False, False]
    assert late.no_telemetry_nodes == 2 and late.score.max() < first.score.max()
    # A clock behind the one the state was computed at gets fresh work, not the stale state.
    early = scored(1.0, NOW_S)
    assert early.has_telemetry.tolist() == [True, True]
    assert early.score.tolist() == first.score.tolist()


def test_the_view_wide_state_gives_what_each_list_would_compute_alone(
    predictor: Predictor,
) -> None:
    """Bindings rebuild the view, lists rotate, a name is unknown, telemetry turns stale: the
    state gathered from the view's equals what the candidates compute on their own (the path
    of request Node objects, which computes per list from the view's raw arrays)."""
    nodes = {name: {"util": 0.1 + 0.1 * i} for i, name in enumerate(CURVES)}
    nodes["mid"]["telemetry"] = False
    state = make_state(nodes)
    curves = curves_for(predictor, state)
    rng = np.random.default_rng(3)
    names = list(CURVES)
    for step in range(12):
        now_s = NOW_S + step * 10.0  # past NOW_S + 85 the telemetry is stale
        if step % 3:
            node = names[int(rng.integers(len(names)))]
            state.pod_bound(node, f"uid-{step}", float(rng.uniform(0.5, 2.0)), now_s)
        start = int(rng.integers(len(names)))
        chosen = [*names[start:], *names[:start]][:5]
        view = state.view(now_s)
        gathered = assess(
            view, curves, [*chosen, "not-a-node"], 1.5, now_s=now_s, telemetry_ttl_s=TTL_S
        )
        objects = [NodeInfo(name, 8.0, {}, {}) for name in chosen]
        alone = assess(view, curves, objects, 1.5, now_s=now_s, telemetry_ttl_s=TTL_S)
        for field in ("a", "power_before_w", "increase_w", "has_telemetry"):
            np.testing.assert_array_equal(
                getattr(gathered, field)[:5], getattr(alone, field), err_msg=f"step {step}: {field}"
            )
        assert not gathered.has_telemetry[5] and gathered.score[5] == 0  # the unknown name
    assert state.view(NOW_S + 110).assumed_cpu.sum() > 0  # bindings were live throughout


def test_a_new_curve_table_replaces_the_cached_state_rather_than_piling_up(
    predictor: Predictor,
) -> None:
    """Every bundle swap brings a curve table of the whole fleet (megabytes at 5,000 nodes):
    the request path's caches must let the old ones go, on one view as on the views after it."""
    state = make_state({"steep": {}, "flat": {}})
    tables: list[weakref.ref[CurveTable]] = []
    for step in range(12):
        curves = curves_for(predictor, state)
        tables.append(weakref.ref(curves))
        result = assess(
            state.view(NOW_S), curves, ["steep", "flat"], 1.0, now_s=NOW_S, telemetry_ttl_s=TTL_S
        )
        steep_u = 0.3 + (1.0 / 8.0 if step > 6 else 0.0)  # a core bound on 8 after step 6
        assert result.power_before_w.tolist() == pytest.approx(
            [100.0 + 300.0 * steep_u, 80.0 + 100.0 * 0.3], abs=1
        )
        del curves, result
        if step == 6:
            state.pod_bound("steep", "uid-1", 1.0, NOW_S - 1)  # and a view rebuilt midway
    gc.collect()
    alive = sum(ref() is not None for ref in tables)
    assert alive <= 1, f"{alive} of 12 curve tables still held"
