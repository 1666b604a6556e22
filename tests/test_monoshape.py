"""The monoshape family, its shape prior and the fallbacks built from the fleet's shape.

Real server curves (the SPECpower shapes shipped with the package) turned into rows the way
fleets produce them: load held at levels, CPU temperature an exact function of load, a node
that never went above 40 %, nodes with a handful of idle readings. Models go through the real
ONNX export and onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.interpolate import PchipInterpolator

from livedata.metrics_table import FEATURES
from predictor.bundle import read_bundle
from training.dataset import clean_metrics
from training.export import check_parity, model_to_onnx, onnx_predict_w
from training.fit import FitSettings, NodeRows, fit_fleet, fit_node
from training.monoshape import MonoShapeRegressor, MonotoneCurve, fit_monotone_curve
from training.node_facts import NodeFacts
from training.shape_prior import (
    GRID_UTIL,
    SHARE_COLUMNS,
    ShapePrior,
    default_shape_prior,
    load_shapes_table,
)
from training.synth import synth_fleet

SHAPES = load_shapes_table()


def server_curve_w(index: int) -> np.ndarray:
    """A real server's measured watts at 0, 10, ..., 100 % load."""
    row = SHAPES.iloc[index]
    return row[list(SHARE_COLUMNS)].to_numpy(float) * float(row["watts_max"])


def node_rows(
    name: str,
    curve_w: np.ndarray,
    util: np.ndarray,
    rng: np.random.Generator,
    *,
    cpu_temp_c: np.ndarray | None = None,
) -> NodeRows:
    """Rows at `util`, power on a smooth curve through the measured points plus 1 W noise, CPU
    temperature an exact function of load unless given, constant ambient."""
    power_w = PchipInterpolator(GRID_UTIL, curve_w)(util) + rng.normal(0, 1.0, len(util))
    cpu_c = 35.0 + 35.0 * util if cpu_temp_c is None else cpu_temp_c
    features = np.column_stack([util, np.full(len(util), 23.0), cpu_c, cpu_c + 2.0])
    return NodeRows(name, np.arange(len(util)) * 60.0, features.astype(np.float32), power_w)


def held_levels(rng: np.random.Generator, n: int, top: float = 1.0) -> np.ndarray:
    """Load held for an hour at a time at 0, 20, ... % up to `top`, +-2 % jitter."""
    levels = np.arange(0.0, top + 1e-9, 0.2)
    blocks = rng.choice(levels, n // 60 + 1)
    return np.clip(np.repeat(blocks, 60)[:n] + rng.normal(0, 0.02, n), 0, 1)


def grid_features(util: np.ndarray, cpu_c: float | np.ndarray) -> np.ndarray:
    rows = np.zeros((len(util), len(FEATURES)), dtype=np.float32)
    rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3] = util, 23.0, cpu_c, cpu_c
    return rows


def test_a_node_whose_temperature_follows_load_exactly_gets_its_own_monotone_model() -> None:
    rng = np.random.default_rng(14)
    util = held_levels(rng, 3000)
    rows = node_rows("node-collinear", server_curve_w(0), util, rng)  # T = 35 + 35 u, exactly
    outcome = fit_node(rows, FitSettings(min_rows=500))
    assert outcome.fallback_reason is None and outcome.family == "monoshape"
    check = outcome.monotonic
    assert check["verdict"] == "pass" and check["extender_probe"] == "pass"
    assert check["max_drop_w"] == 0.0 and check["max_drop_along_thermal_w"] == 0.0
    # The ONNX never falls along u, at any fixed temperatures, in float32, to the last bit.
    fine_u = np.linspace(-0.05, 1.05, 2201)
    for cpu_c in (20.0, 45.0, 60.0, 90.0):
        watts = onnx_predict_w(outcome.onnx, grid_features(fine_u, cpu_c))
        assert np.all(np.diff(watts) >= 0), cpu_c
    # ...and load, not temperature, carries the rise: at fixed load a hotter CPU adds little.
    at_half = grid_features(np.array([0.5, 0.5]), np.array([50.0, 60.0]))
    hotter_w = np.diff(onnx_predict_w(outcome.onnx, at_half))[0]
    rise_w = server_curve_w(0)[-1] - server_curve_w(0)[0]
    assert 0.0 <= hotter_w < 0.05 * rise_w


def test_a_node_measured_only_up_to_40_pct_extrapolates_within_the_priors_band() -> None:
    rng = np.random.default_rng(40)
    prior = default_shape_prior()
    for index in (3, 17, 60):
        curve_w = server_curve_w(index)
        util = np.clip(rng.uniform(0.0, 0.4, 4000), 0.0, 0.4)
        rows = node_rows(f"node-{index}", curve_w, util, rng)
        outcome = fit_node(rows, FitSettings(min_rows=500))
        assert outcome.family == "monoshape"
        assert outcome.max_util_measured == pytest.approx(0.4, abs=0.005)
        assert max(outcome.loads_shown_pct) == 40
        # The band: every real server's shape above 40 %, scaled to this node's idle and 40 %
        # points; the model must stay within the 5th..95th percentile of it.
        up_u = np.array([0.6, 0.8, 1.0])
        shapes = prior.bank_shapes
        climb = shapes[:, [6, 8, 10]] / shapes[:, [4]]
        band_w = curve_w[0] + (curve_w[4] - curve_w[0]) * climb
        low_w, high_w = np.percentile(band_w, [5, 95], axis=0)
        cpu_c = 35.0 + 35.0 * up_u
        predicted_w = onnx_predict_w(outcome.onnx, grid_features(up_u, cpu_c))
        assert np.all(predicted_w >= low_w) and np.all(predicted_w <= high_w), (
            index,
            predicted_w,
            low_w,
            high_w,
        )
        assert np.all(np.diff(predicted_w) > 0)


def test_a_fallback_node_with_known_idle_power_is_scaled_to_it(tmp_path) -> None:
    fleet = synth_fleet(12, 24, 60, seed=5)
    rng = np.random.default_rng(3)
    few = []
    for name, idle_w in (("small-idle", 60.0), ("big-idle", 400.0)):
        times = pd.Timestamp("2026-01-05T00:00:00Z") + pd.to_timedelta(np.arange(80), unit="min")
        few.append(
            pd.DataFrame(
                {
                    "node": name,
                    "timestamp": times,
                    "cpu_util": rng.uniform(0.0, 0.02, 80),
                    "ambient_temp_c": 22.0,
                    "cpu1_temp_c": 40.0,
                    "cpu2_temp_c": 41.0,
                    "power_w": np.round(idle_w + rng.normal(0, 1.5, 80)),
                }
            )
        )
    table = pd.concat([fleet, *few], ignore_index=True)
    run = fit_fleet(
        clean_metrics(table, source="test"),
        tmp_path / "bundle",
        settings=FitSettings(min_rows=200),
        jobs=1,
        progress=False,
    )
    bundle = read_bundle(tmp_path / "bundle")
    util = np.linspace(0, 1, 11)
    curves = {}
    for name, idle_w in (("small-idle", 60.0), ("big-idle", 400.0)):
        entry = bundle.nodes[name]
        assert entry.info["family"] == "fleet-scaled"
        assert "80 clean rows < --min-rows 200" in entry.info["scaled_fallback"]["reason"]
        curves[name] = onnx_predict_w(
            bundle.model_path(entry).read_bytes(), grid_features(util, 45.0)
        )
        # scaled to pass through its readings (made at about 1 % load)
        at_readings_w = onnx_predict_w(
            bundle.model_path(entry).read_bytes(), grid_features(np.array([0.01]), 45.0)
        )[0]
        assert at_readings_w == pytest.approx(idle_w, abs=1.5)
        assert np.all(np.diff(curves[name]) > 0)
    # A 60 W and a 400 W server no longer share one curve; the bigger one also swings more.
    rise = {name: curve[-1] - curve[0] for name, curve in curves.items()}
    assert rise["big-idle"] > rise["small-idle"] > 0
    report_nodes = {e["node"]: e for e in run.report["nodes"]}
    assert report_nodes["big-idle"]["model"] == "fallback"
    assert report_nodes["big-idle"]["note"].startswith("fallback scaled to its power (idle 39")
    assert run.report["fallback"]["nodes"] == []


def test_a_node_that_never_changed_load_says_why_in_words() -> None:
    rng = np.random.default_rng(8)
    util = np.clip(0.35 + rng.normal(0, 0.003, 900), 0, 1)
    outcome = fit_node(node_rows("node-steady", server_curve_w(5), util, rng), FitSettings())
    assert outcome.onnx is None
    assert outcome.fallback_reason.startswith("its utilisation stayed between 0.34 and 0.36")
    assert "how its power grows with load cannot be seen" in outcome.fallback_reason


def test_a_node_that_sits_between_grid_points_is_still_fitted_to_its_data() -> None:
    rng = np.random.default_rng(9)
    util = np.where(rng.random(2000) < 0.5, 0.0, 0.35) + rng.normal(0, 0.004, 2000)
    util = np.clip(util, 0, 1)
    curve_w = server_curve_w(7)
    rows = node_rows("node-35", curve_w, util, rng)
    curve, details = fit_monotone_curve(rows.features, rows.power_w, default_shape_prior())
    at_35 = PchipInterpolator(GRID_UTIL, curve_w)(0.35)
    predicted = curve.predict_w(grid_features(np.array([0.0, 0.35]), 35.0 + 35.0 * 0.35))
    assert predicted[1] == pytest.approx(at_35, abs=1.5)
    assert details.observed_grid[0] and not any(details.observed_grid[1:])


def test_the_shape_penalty_leaves_the_scale_free() -> None:
    prior = ShapePrior.from_shapes_table(SHAPES)
    assert prior.n_servers == len(SHAPES) == 116
    assert prior.mean_increments.sum() == pytest.approx(1.0)
    penalty = prior.shape_precision(prior.mean_increments)
    # the mean shape at any scale costs nothing; a different shape does
    assert penalty @ prior.mean_increments == pytest.approx(np.zeros(10), abs=1e-9)
    flat = np.full(10, 0.1)
    assert flat @ penalty @ flat > 0
    local = prior.local_mean_increments(server_curve_w(0)[:5], 4, np.ones(11, dtype=bool))
    assert local.sum() == pytest.approx(1.0) and np.all(local >= 0)
    with pytest.raises(ValueError, match="non-decreasing"):
        ShapePrior.from_curves(np.array([[100.0] * 10 + [90.0]] * 3))


def test_the_conditional_shape_keeps_the_node_where_it_has_data_and_regresses_the_rest() -> None:
    prior = ShapePrior.from_shapes_table(SHAPES)
    levels = np.zeros(11, dtype=bool)
    levels[::2] = True  # held at 0, 20, ..., 100 %
    bank = prior.bank_watts
    bank_shares = (bank[:, 1::2] - bank[:, 0:-1:2]) / (bank[:, 2::2] - bank[:, 0:-1:2])
    node_shares = []
    for index in (0, 40, 80):
        curve_w = server_curve_w(index)
        increments = prior.conditional_shape(curve_w, 10, levels)
        assert increments.sum() == pytest.approx(1.0) and np.all(increments > 0)
        shape = np.concatenate([[0.0], np.cumsum(increments)])
        expected = (curve_w - curve_w[0]) / (curve_w[-1] - curve_w[0])
        np.testing.assert_allclose(shape[::2], expected[::2], atol=1e-3)  # kept at the levels
        shares = (shape[1::2] - shape[0:-1:2]) / (shape[2::2] - shape[0:-1:2])
        assert np.all(shares >= bank_shares.min(axis=0) - 0.05)
        assert np.all(shares <= bank_shares.max(axis=0) + 0.05)
        node_shares.append(shares)
    # each node's gaps are filled from its own shown shape, not one fleet-wide share
    assert np.ptp(np.array(node_shares), axis=0).max() > 0.01
    # above the highest load shown: a rise, drawn from the shape below it
    shown = np.ones(11, dtype=bool)
    shown[6:] = False
    increments = prior.conditional_shape(server_curve_w(3)[:6], 5, shown)
    assert increments.sum() == pytest.approx(1.0) and np.all(increments[5:] > 0)
    # one regression per pattern of shown points, learned once, and above the highest one
    # point shown how well it and the straight line did on the prior's own servers
    assert set(prior._regressions) == {
        ((0, 2, 4, 6, 8, 10), 10),
        ((0, 1, 2, 3, 4, 5), 5),
        ("calibration", (0, 1, 2, 3, 4, 5), 5),
    }


def test_a_node_held_at_levels_interpolates_the_deciles_it_never_showed() -> None:
    rng = np.random.default_rng(12)
    util = held_levels(rng, 6000)
    errors = []
    for index in range(0, 116, 29):
        curve_w = server_curve_w(index)
        held = np.zeros(11, dtype=bool)
        held[::2] = True
        # the truth between levels is the measured curve; the rows only show the levels
        rows = node_rows(f"node-{index}", curve_w, util, rng)
        # what the cluster tells about the node: its CPU, so the prior draws on its generation
        facts = NodeFacts(cpu_model=SHAPES["processor"].iloc[index])
        curve, details = fit_monotone_curve(
            rows.features, rows.power_w, default_shape_prior(), facts
        )
        assert details.observed_grid == tuple(held) and details.generation == "old"
        odd = GRID_UTIL[1::2]
        predicted = curve.predict_w(grid_features(odd, 35.0 + 35.0 * odd))
        errors.append(np.mean(np.abs(predicted - curve_w[1::2]) / curve_w[1::2]))
    assert max(errors) < 0.02


@settings(max_examples=25, deadline=None)
@given(
    intercept_w=st.floats(20.0, 500.0),
    decile_w=st.lists(st.floats(0.0, 80.0), min_size=10, max_size=10),
    temp_w=st.lists(st.floats(0.0, 2.0), min_size=4, max_size=4),
    ambient_w=st.floats(0.0, 2.0),
    cpu_c=st.floats(0.0, 110.0),
    ambient_c=st.floats(0.0, 45.0),
)
def test_onnx_is_monotone_in_utilisation_for_any_non_negative_coefficients(
    intercept_w, decile_w, temp_w, ambient_w, cpu_c, ambient_c
) -> None:
    curve = MonotoneCurve(intercept_w, np.array(decile_w), np.array(temp_w), ambient_w)
    model = MonoShapeRegressor(curve=curve).fit(np.zeros((1, 4), dtype=np.float32))
    onnx = model_to_onnx(model, len(FEATURES))
    rows = grid_features(np.linspace(-0.1, 1.1, 601), cpu_c)
    rows[:, 1] = ambient_c
    watts = onnx_predict_w(onnx, rows)
    assert np.all(np.diff(watts) >= 0)
    assert check_parity("n", model, onnx, rows).passed
