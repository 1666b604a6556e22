"""The fleet fallback scaled by a node's CPU count: the shipped exponents and the curve tables.

The exponents are refitted here from the SPECpower data (the table training ships, and the
sample beside the repository when it is there) and must match the copy the service reads.
The curves come from real ONNX models through the real builder: a fallback node with twice the
anchor's cores must cost more by exactly the shipped exponents, one with half less, and a node
whose CPU count or anchor is unknown keeps today's curve.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from predictor.core_scaling import (
    CLIPPED,
    MAX_CORE_RATIO,
    MIN_CORE_RATIO,
    NO_ANCHOR,
    OFF,
    SCALED,
    UNKNOWN_CORES,
    CoreExponents,
    shipped_core_exponents,
)
from predictor.curves import UTIL_GRID, CurveBuilder
from predictor.model import Predictor
from tests.support.bundles import PowerCurveSpec, make_bundle
from training.shape_prior import (
    core_exponents_from_table,
    core_scaling_document,
    fit_core_exponents,
    load_shapes_table,
)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "predictor" / "data" / "core_scaling.json"
SPECPOWER_SAMPLE = REPO / ".." / "shared" / "data" / "specpower" / "ssj2008-sample.csv"

FLEET = PowerCurveSpec(80.0, 250.0, exponent=2)  # P_fleet(u) = 80 + 170 u^2
OWN = PowerCurveSpec(100.0, 300.0)
FLOAT32_W = 0.05  # float32 inference error of these exact fits, watts
# Own-model nodes' allocatable CPU: median 32 cores, the anchor.
OWN_CORES = {"own-a": 16.0, "own-b": 32.0, "own-c": 64.0}


def telemetry(util: float) -> dict[str, float]:
    return {"cpu_util": util, "ambient_temp_c": 24.0, "cpu1_temp_c": 50.0}


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    directory = tmp_path_factory.mktemp("cores") / "bundle"
    make_bundle(
        directory,
        {
            **dict.fromkeys(OWN_CORES, OWN),
            # A scaled fallback ships as a node's own file; it did not shape the fleet curve.
            "scaled-fb": PowerCurveSpec(60.0, 120.0, info={"scaled_fallback": {"reason": "few"}}),
        },
        fallback=FLEET,
    )
    return Predictor.load(directory)


TELEMETRY = {
    **{name: telemetry(0.3) for name in OWN_CORES},
    "scaled-fb": telemetry(0.3),
    "twice": telemetry(0.3),
    "half": telemetry(0.3),
    "same": telemetry(0.3),
    "huge": telemetry(0.3),
    "unknown": telemetry(0.3),
}
CORES = {**OWN_CORES, "scaled-fb": 2.0, "twice": 64.0, "half": 16.0, "same": 32.0, "huge": 512.0}


def fleet_curve_w() -> np.ndarray:
    return FLEET.power_w(UTIL_GRID, 50.0)


def expected_curve_w(ratio: float, exponents: CoreExponents) -> np.ndarray:
    fleet = fleet_curve_w()
    return fleet[0] * ratio**exponents.idle + (fleet - fleet[0]) * ratio**exponents.dynamic


# ---- the shipped exponents ---------------------------------------------------------------------


def test_the_shipped_exponents_are_a_refit_on_the_shipped_specpower_table() -> None:
    fit = core_exponents_from_table(load_shapes_table())
    shipped = json.loads(SHIPPED.read_text())
    assert shipped == core_scaling_document(fit)  # regenerate: see its "derived_by"
    exponents = shipped_core_exponents()
    assert exponents.dynamic == pytest.approx(fit.dynamic_exponent, abs=1e-6)
    assert exponents.idle == pytest.approx(fit.idle_exponent, abs=1e-6)
    # What issue 14 measured: range grows with cores, idle barely.
    assert 0.65 < exponents.dynamic < 0.75 and fit.dynamic_log_correlation > 0.85
    assert 0.10 < exponents.idle < 0.22 and fit.idle_log_correlation < 0.25
    assert fit.servers == 116


@pytest.mark.skipif(
    not SPECPOWER_SAMPLE.is_file(), reason=f"{SPECPOWER_SAMPLE} (beside the repo) is missing"
)
def test_the_shipped_exponents_match_a_refit_on_the_raw_specpower_sample() -> None:
    sample = pd.read_csv(SPECPOWER_SAMPLE)
    fit = fit_core_exponents(
        sample["cores"].to_numpy(), sample["watts_idle"].to_numpy(), sample["watts_100"].to_numpy()
    )
    exponents = shipped_core_exponents()
    assert fit.servers == 116
    assert exponents.dynamic == pytest.approx(fit.dynamic_exponent, abs=1e-6)
    assert exponents.idle == pytest.approx(fit.idle_exponent, abs=1e-6)


def test_a_fit_recovers_known_exponents() -> None:
    cores = np.array([2.0, 4.0, 8.0, 16.0, 64.0])
    idle_w = 30.0 * cores**0.2
    fit = fit_core_exponents(cores, idle_w, idle_w + 5.0 * cores**0.8)
    assert fit.idle_exponent == pytest.approx(0.2)
    assert fit.dynamic_exponent == pytest.approx(0.8)
    with pytest.raises(ValueError, match="full load > idle"):
        fit_core_exponents(cores, idle_w, idle_w)


def test_exponents_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="dynamic must be within"):
        CoreExponents(idle=0.2, dynamic=-0.1)


# ---- the curves ----------------------------------------------------------------------------


def test_fallback_curves_scale_by_cores_against_the_own_model_median(
    predictor: Predictor,
) -> None:
    exponents = shipped_core_exponents()
    builder = CurveBuilder(fallback_core_exponents=exponents)
    table = builder.build(predictor, TELEMETRY, None, CORES)
    scaling = table.fallback_scaling
    # The scaled fallback's 2 cores would pull the median to 24: it is not in the anchor.
    assert scaling.anchor_cores == 32.0 and scaling.anchor_nodes == 3
    grid = {name: table.power_w_grid[table.row_of(name)] for name in TELEMETRY}

    np.testing.assert_allclose(grid["twice"], expected_curve_w(2.0, exponents), atol=FLOAT32_W)
    np.testing.assert_allclose(grid["half"], expected_curve_w(0.5, exponents), atol=FLOAT32_W)
    np.testing.assert_allclose(grid["same"], fleet_curve_w(), atol=FLOAT32_W)
    # Twice the cores: higher everywhere, the range by 2^0.71 (~1.64), idle by 2^0.17 (~1.12).
    assert (grid["twice"] > grid["same"] + 1.0).all()
    assert (grid["half"] < grid["same"] - 1.0).all()
    dynamic_twice = grid["twice"][-1] - grid["twice"][0]
    assert dynamic_twice / 170.0 == pytest.approx(2.0**exponents.dynamic, rel=1e-3)
    assert grid["twice"][0] / 80.0 == pytest.approx(2.0**exponents.idle, rel=1e-3)
    # The increase a pod adds follows: a 10 % step costs 2^0.71 times the fleet's.
    row = table.index_of(["twice", "same"])
    increase = table.power_increase_w(row, np.array([0.3, 0.3]), np.array([0.1, 0.1]))
    assert increase[0] / increase[1] == pytest.approx(2.0**exponents.dynamic, rel=1e-3)

    # 512 / 32 = 16: clipped to the band.
    np.testing.assert_allclose(
        grid["huge"], expected_curve_w(MAX_CORE_RATIO, exponents), atol=FLOAT32_W
    )
    assert MIN_CORE_RATIO == 0.25
    # Unknown allocatable CPU: the fleet curve as today.
    np.testing.assert_allclose(grid["unknown"], fleet_curve_w(), atol=FLOAT32_W)
    # Own models are never touched.
    np.testing.assert_allclose(grid["own-a"], OWN.power_w(UTIL_GRID, 50.0), atol=FLOAT32_W)

    described = {name: scaling.describe(table.row_of(name)) for name in TELEMETRY}
    assert described["own-a"] is None and described["scaled-fb"] is None
    assert described["twice"]["reason"] == SCALED and described["twice"]["ratio"] == 2.0
    assert described["twice"]["dynamic_factor"] == pytest.approx(2.0**exponents.dynamic)
    assert described["huge"]["reason"] == CLIPPED and described["huge"]["ratio"] == 4.0
    assert described["unknown"] == {
        "applied": False,
        "reason": UNKNOWN_CORES,
        "text": "not scaled: the node's allocatable CPU is unknown",
        "allocatable_cores": None,
        "anchor_cores": 32.0,
        "ratio": None,
        "idle_factor": 1.0,
        "dynamic_factor": 1.0,
    }
    assert scaling.summary()["nodes_by_reason"] == {SCALED: 3, CLIPPED: 1, UNKNOWN_CORES: 1}


def test_without_own_model_nodes_or_exponents_nothing_is_scaled(predictor: Predictor) -> None:
    fallback_only = {name: CORES[name] for name in ("twice", "half", "huge")}
    unscaled = CurveBuilder().build(predictor, TELEMETRY, None)
    for builder, cores, reason in (
        (CurveBuilder(fallback_core_exponents=shipped_core_exponents()), fallback_only, NO_ANCHOR),
        (CurveBuilder(fallback_core_exponents=shipped_core_exponents()), None, NO_ANCHOR),
        (CurveBuilder(), CORES, OFF),
    ):
        table = builder.build(predictor, TELEMETRY, None, cores)
        np.testing.assert_array_equal(table.power_w_grid, unscaled.power_w_grid)
        for name in ("twice", "half", "huge", "unknown"):
            assert table.fallback_scaling.reason[table.row_of(name)] == reason
    assert unscaled.fallback_scaling.summary()["enabled"] is False


def test_rows_are_rebuilt_when_the_anchor_moves_and_reused_when_not(
    predictor: Predictor,
) -> None:
    exponents = shipped_core_exponents()
    builder = CurveBuilder(fallback_core_exponents=exponents)
    first = builder.build(predictor, TELEMETRY, None, CORES)
    again = builder.build(predictor, TELEMETRY, first, CORES)
    assert again.computed_rows == 0
    np.testing.assert_array_equal(again.power_w_grid, first.power_w_grid)
    # The median is robust: one own-model node growing to 128 cores leaves it at 32.
    same = builder.build(predictor, TELEMETRY, again, {**CORES, "own-c": 128.0})
    assert same.fallback_scaling.anchor_cores == 32.0 and same.computed_rows == 0
    # own-a resized to 64 cores: the anchor becomes 64 and the scaled rows are tabulated again,
    # except the 512-core node, clipped to 4 before and after.
    moved = builder.build(predictor, TELEMETRY, again, {**CORES, "own-a": 64.0})
    assert moved.fallback_scaling.anchor_cores == 64.0
    assert moved.computed_rows == 3  # twice, half, same
    np.testing.assert_allclose(
        moved.power_w_grid[moved.row_of("twice")], fleet_curve_w(), atol=FLOAT32_W
    )
    np.testing.assert_array_equal(
        moved.power_w_grid[moved.row_of("huge")], first.power_w_grid[first.row_of("huge")]
    )
