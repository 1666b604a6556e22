"""Curve tables: interpolation against the real model, extrapolation, thermal slope, reuse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor.curves import GRID_POINTS, UTIL_GRID, CurveBuilder, CurveTable
from predictor.model import Predictor
from tests.support.bundles import PowerCurveSpec, make_bundle

LINEAR = PowerCurveSpec(100.0, 300.0, exponent=1)
CUBIC = PowerCurveSpec(60.0, 220.0, exponent=3, temp_w_per_c=0.5)
THERMAL = PowerCurveSpec(
    90.0, 260.0, exponent=2, temp_w_per_c=1.0, thermal={"cpu1_temp_c_per_util": 30.0}
)
FLEET = PowerCurveSpec(80.0, 250.0, exponent=2)
GRID_STEP = 1.0 / (GRID_POINTS - 1)
FLOAT32_W = 0.05  # float32 inference error of these exact fits, watts


class CountingPredictor(Predictor):
    """The real predictor, recording every model call as (model file, rows)."""

    calls: list[tuple[str, int]]

    def run_model_w(self, model_key: str, rows: np.ndarray) -> np.ndarray:
        self.__dict__.setdefault("calls", []).append((model_key, len(rows)))
        return super().run_model_w(model_key, rows)


def telemetry(util: float, cpu1_c: float = 50.0) -> dict[str, float]:
    return {"cpu_util": util, "ambient_temp_c": 24.0, "cpu1_temp_c": cpu1_c}


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("curves") / "bundle"
    make_bundle(directory, {"lin": LINEAR, "cubic": CUBIC, "thermal": THERMAL}, fallback=FLEET)
    return directory


@pytest.fixture
def predictor(bundle_dir: Path) -> CountingPredictor:
    loaded = CountingPredictor.load(bundle_dir)
    loaded.calls = []
    return loaded


TELEMETRY = {
    "lin": telemetry(0.2),
    "cubic": telemetry(0.5, 62.0),
    "thermal": telemetry(0.4, 55.0),
    "fleet-1": telemetry(0.1),
    "fleet-2": telemetry(0.7),
    "no-temp": {"cpu_util": 0.3},
}


def test_table_contents_and_skips(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    assert table.version == predictor.version
    assert set(table.names) == {"lin", "cubic", "thermal", "fleet-1", "fleet-2"}
    assert table.skipped == {"no-temp": "no_telemetry"}
    row = table.row_of("cubic")
    assert table.util_now[row] == pytest.approx(0.5)
    assert table.model_kind[row] == "own"
    assert table.model_kind[table.row_of("fleet-2")] == "fallback"
    assert table.power_w_grid.dtype == np.float64
    assert not table.power_w_grid.flags.writeable
    # the fallback's two nodes were tabulated in one batched call
    fallback_calls = [n for key, n in predictor.calls if key == predictor.bundle.fallback.file]
    assert fallback_calls == [2 * GRID_POINTS]


def test_interpolation_matches_the_model_off_grid(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    util = np.linspace(0.0013, 0.9987, 97)  # none of them on the grid
    for node, spec in (("lin", LINEAR), ("cubic", CUBIC), ("fleet-2", FLEET)):
        cpu1 = TELEMETRY[node]["cpu1_temp_c"]
        exact = predictor.predict_w(
            node, np.column_stack([util, np.full((97, 3), [24.0, cpu1, cpu1])])
        )
        got = table.power_w(np.full(97, table.row_of(node)), util)
        # linear interpolation error <= max|P''| h^2 / 8
        curvature_w = (spec.max_w - spec.idle_w) * spec.exponent * max(spec.exponent - 1, 0)
        np.testing.assert_allclose(got, exact, atol=curvature_w * GRID_STEP**2 / 8 + FLOAT32_W)
        assert np.abs(got - spec.power_w(util, cpu1)).max() < 0.1


def test_vectorised_over_mixed_nodes(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    idx = table.index_of(["lin", "unknown", "fleet-1", "no-temp"])
    assert idx.tolist()[1] == -1 and idx.tolist()[3] == -1
    power = table.power_w(idx, np.array([0.5, 0.5, 0.5, 0.5]))
    assert np.isnan(power[[1, 3]]).all()
    assert power[0] == pytest.approx(LINEAR.power_w(0.5, 50.0), abs=FLOAT32_W)
    assert power[2] == pytest.approx(FLEET.power_w(0.5, 50.0), abs=FLOAT32_W)


def test_power_increase_monotone_in_demand_and_beyond_one(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    demand = np.linspace(0.0, 1.5, 301)
    for node in ("lin", "cubic", "fleet-1", "thermal"):
        idx = np.full(demand.shape, table.row_of(node))
        increase = table.power_increase_w(idx, 0.6, demand)
        assert increase[0] == 0.0
        assert (np.diff(increase) > 0).all(), node  # strictly rising, also past u = 1


def test_beyond_one_continues_with_last_slope(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    lin = np.array([table.row_of("lin")] * 3)
    power = table.power_w(lin, np.array([1.0, 1.25, 2.0]))
    span_w = LINEAR.max_w - LINEAR.idle_w
    np.testing.assert_allclose(power[1:] - power[0], [0.25 * span_w, 1.0 * span_w], rtol=1e-3)
    cubic_row = table.row_of("cubic")
    grid = table.power_w_grid[cubic_row]
    last_slope = (grid[-1] - grid[-2]) / GRID_STEP  # ~ 3 * span for u^3
    beyond = table.power_w(np.array([cubic_row]), np.array([1.1]))[0]
    assert beyond == pytest.approx(grid[-1] + 0.1 * last_slope)
    assert last_slope > 2.9 * (CUBIC.max_w - CUBIC.idle_w)


def test_below_zero_clamps(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    idx = np.array([table.row_of("cubic")] * 2)
    below, zero = table.power_w(idx, np.array([-0.3, 0.0]))
    assert below == zero


def test_small_pods_do_not_tie(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    idx = table.index_of(["lin", "fleet-1", "fleet-2"])
    increase = table.power_increase_w(idx, table.util_now[idx], 0.001)  # 1 % of a core on 10
    assert (increase > 0).all()
    assert len(set(increase.tolist())) == 3  # float precision, no rounding to whole watts
    assert increase[0] == pytest.approx(0.001 * 200.0, rel=1e-2)


def test_thermal_slope_moves_cpu_temperature_along_the_grid(
    predictor: CountingPredictor,
) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    row = table.row_of("thermal")
    u_now, t_now = 0.4, 55.0
    expected = THERMAL.power_w(UTIL_GRID, t_now + 30.0 * (UTIL_GRID - u_now))
    np.testing.assert_allclose(table.power_w_grid[row], expected, atol=FLOAT32_W)
    # A pod of 0.2 costs the curve's increase plus 30 C/util * 0.2 * 1 W/C = 6 W of heat.
    increase = table.power_increase_w(np.array([row]), u_now, 0.2)[0]
    without_heat = THERMAL.power_w(0.6, t_now) - THERMAL.power_w(0.4, t_now)
    assert increase == pytest.approx(without_heat + 6.0, abs=0.1)


def test_rebuild_recomputes_only_changed_nodes(predictor: CountingPredictor) -> None:
    builder = CurveBuilder()
    first = builder.build(predictor, TELEMETRY, None)
    assert first.computed_rows == 5 and first.reused_rows == 0
    predictor.calls.clear()

    same = builder.build(predictor, dict(TELEMETRY), first)
    assert predictor.calls == []  # nothing changed: not one model call
    assert same.reused_rows == 5 and same.computed_rows == 0
    np.testing.assert_array_equal(same.power_w_grid, first.power_w_grid)

    changed = {**TELEMETRY, "fleet-2": telemetry(0.75), "cubic": telemetry(0.5, 63.0)}
    second = builder.build(predictor, changed, first)
    fallback = predictor.bundle.fallback.file
    cubic = predictor.model_key("cubic")
    assert sorted(predictor.calls) == sorted([(fallback, GRID_POINTS), (cubic, GRID_POINTS)])
    assert second.reused_rows == 3 and second.computed_rows == 2
    lin_row_old, lin_row_new = first.row_of("lin"), second.row_of("lin")
    np.testing.assert_array_equal(second.power_w_grid[lin_row_new], first.power_w_grid[lin_row_old])
    cubic_new = second.power_w_grid[second.row_of("cubic")]
    np.testing.assert_allclose(cubic_new, CUBIC.power_w(UTIL_GRID, 63.0), atol=FLOAT32_W)


def test_new_bundle_version_recomputes_everything(
    predictor: CountingPredictor, tmp_path: Path
) -> None:
    first = CurveBuilder().build(predictor, TELEMETRY, None)
    make_bundle(tmp_path / "v2", {"lin": PowerCurveSpec(50.0, 150.0)}, fallback=FLEET)
    newer = CountingPredictor.load(tmp_path / "v2")
    newer.calls = []
    second = CurveBuilder().build(newer, TELEMETRY, first)
    assert second.version == newer.version != first.version
    assert second.reused_rows == 0 and second.computed_rows == 5
    lin = second.power_w(second.index_of(["lin"]), np.array([1.0]))[0]
    assert lin == pytest.approx(150.0, abs=FLOAT32_W)


def test_nan_predicting_model_leaves_the_node_without_curve(tmp_path: Path) -> None:
    make_bundle(tmp_path / "b", {"bad": PowerCurveSpec(1.0, 2.0, nan_output=True)}, fallback=FLEET)
    table = CurveBuilder().build(
        Predictor.load(tmp_path / "b"), {"bad": telemetry(0.3), "ok": telemetry(0.3)}, None
    )
    assert table.skipped == {"bad": "non_finite_prediction"}
    assert table.row_of("bad") == -1
    assert table.names == ("ok",)


def test_empty_table() -> None:
    table = CurveTable.empty("v0", 4)
    assert np.isnan(table.power_w(table.index_of(["x"]), np.array([0.5]))).all()


def test_nan_utilisation_gives_nan_not_an_index_error(predictor: CountingPredictor) -> None:
    table = CurveBuilder().build(predictor, TELEMETRY, None)
    idx = table.index_of(["lin", "lin"])
    power = table.power_w(idx, np.array([np.nan, 0.5]))
    assert np.isnan(power[0]) and np.isfinite(power[1])
    assert np.isnan(table.power_increase_w(idx, np.array([0.5, 0.5]), np.array([np.nan, 0.1]))[0])


def test_flat_ended_curve_still_rises_beyond_one() -> None:
    # A tree model often saturates before u = 1; an overcommitted node must not look free.
    flat_end = np.minimum(100.0 + 200.0 * UTIL_GRID, 250.0)  # flat from u = 0.75
    table = CurveTable(
        version="v",
        names=("saturating",),
        power_w_grid=flat_end[None, :].copy(),
        util_now=np.array([0.5]),
        model_kind=("own",),
        feature_rows=np.zeros((1, 4), dtype=np.float32),
    )
    increase = table.power_increase_w(np.array([0, 0]), np.array([0.9, 1.0]), 0.2)
    assert increase[0] > 0
    chord_w = 250.0 - 100.0
    assert increase[1] == pytest.approx(0.2 * chord_w)
