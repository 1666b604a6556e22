"""The fallbacks: what serves a node that has no model of its own.

Both are built from the fleet's shape (`FleetShape`): the mean shape of the curves the fleet's
own models give at steady state (from idle to full load, as a share of the dynamic range), how
dynamic range grows with idle power across those nodes, and their median idle power and range.
Few own models (under `MIN_NODES_FOR_FLEET_SHAPE`): the shape prior's mean shape and its
SPECpower idle-to-range relation stand in.

- **Scaled fallback**, for a node with power readings but no model of its own (fewer than
  `--min-rows` rows, or a load that never moved): the fleet's shape scaled to the power it was
  measured at, `P(u) = idle + D(idle) * shape(u)`, with `idle` solved so that the curve passes
  through its readings (their median residual is 0) and `D(idle)` the fleet's relation. A 60 W
  and a 600 W server no longer share one curve. It ships as the node's own ONNX file (family
  `fleet-scaled`); the report still counts it as a fallback.
- **Fleet fallback**, the bundle's `fallback`, for nodes with no rows at all (a new node): the
  fleet's median idle and range on the fleet's shape, temperature-blind (across servers,
  temperature mostly says *which* server it is).

Both are `MonoShapeRegressor`s with a fixed curve: monotone by construction, converted and
checked like every model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from livedata.metrics_table import CPU_UTIL, FEATURES
from training.export import check_parity, model_to_onnx
from training.fit.node import (
    FALLBACK_NAME,
    FitOutcome,
    NodeRows,
    extender_probe_verdict,
    monotonic_verdict,
    node_thermal,
)
from training.fit.settings import FitError, FitSettings
from training.monoshape import MonoShapeRegressor, shape_curve
from training.report import error_metrics
from training.shape_prior import GRID_UTIL, ShapePrior, default_shape_prior

log = logging.getLogger("training.fit")

SCALED_FAMILY = "fleet-scaled"
FLEET_FAMILY = "fleet-shape"
# Below this many own models the fleet's mean shape and its idle-to-range relation are too
# noisy: the shape prior's (SPECpower) stand in.
MIN_NODES_FOR_FLEET_SHAPE = 10


@dataclass(frozen=True)
class FleetShape:
    """The fleet's typical curve, and how its dynamic range grows with idle power."""

    shape: np.ndarray  # [11] at u = 0, 0.1, ..., 1: 0 at idle, 1 at full load
    idle_w: float  # median idle power of the fleet's own models
    dynamic_w: float  # median P(1) - P(0)
    dynamic_from_idle: tuple[float, float]  # (a, b): log D = a + b log idle
    source: str  # in words, for the report

    def dynamic_w_for_idle(self, idle_w: float) -> float:
        intercept, slope = self.dynamic_from_idle
        return float(np.exp(intercept + slope * np.log(max(idle_w, 1.0))))

    def idle_w_through(self, util: np.ndarray, power_w: np.ndarray) -> float:
        """The idle power whose scaled curve passes through these readings (median residual 0).

        The residual falls as idle rises (the range grows with idle, slope clipped to >= 0), so
        bisection finds it.
        """
        along = np.interp(np.asarray(util, dtype=np.float64), GRID_UTIL, self.shape)
        power_w = np.asarray(power_w, dtype=np.float64)

        def residual_w(idle_w: float) -> float:
            return float(np.median(power_w - idle_w - self.dynamic_w_for_idle(idle_w) * along))

        low_w, high_w = 0.0, float(np.max(power_w))
        for _ in range(60):
            middle_w = 0.5 * (low_w + high_w)
            if residual_w(middle_w) > 0:
                low_w = middle_w
            else:
                high_w = middle_w
        return max(0.5 * (low_w + high_w), 1.0)


def fleet_shape(steady_curves_w: Iterable[list[float]], prior: ShapePrior | None) -> FleetShape:
    """The fleet's shape from its own models' steady-state curves (see the module docstring)."""
    prior = prior if prior is not None else default_shape_prior()
    curves_w = np.array(
        [c for c in steady_curves_w if len(c) == len(GRID_UTIL) and c[-1] > c[0] > 0],
        dtype=np.float64,
    ).reshape(-1, len(GRID_UTIL))
    if len(curves_w) == 0:
        raise FitError("no node has a model of its own to build the fleet fallback from")
    idle_w = float(np.median(curves_w[:, 0]))
    dynamic_w = float(np.median(curves_w[:, -1] - curves_w[:, 0]))
    if len(curves_w) < MIN_NODES_FOR_FLEET_SHAPE:
        intercept, slope = prior.dynamic_from_idle
        return FleetShape(
            shape=prior.mean_shape(),
            idle_w=idle_w,
            dynamic_w=dynamic_w,
            dynamic_from_idle=(intercept, max(slope, 0.0)),
            source=f"shape prior ({prior.n_servers} SPECpower servers): only "
            f"{len(curves_w)} own models",
        )
    increments = np.maximum(np.diff(curves_w, axis=1), 0.0)
    increments /= increments.sum(axis=1, keepdims=True)
    log_idle = np.log(curves_w[:, 0])
    log_dynamic = np.log(curves_w[:, -1] - curves_w[:, 0])
    if np.std(log_idle) > 0.05:
        slope, intercept = np.polyfit(log_idle, log_dynamic, 1)
        slope = float(np.clip(slope, 0.0, 2.0))
        intercept = float(np.median(log_dynamic - slope * log_idle))
    else:  # one kind of server: the range does not depend on idle power here
        slope, intercept = 0.0, float(np.log(dynamic_w))
    return FleetShape(
        shape=np.concatenate([[0.0], np.cumsum(increments.mean(axis=0))]),
        idle_w=idle_w,
        dynamic_w=dynamic_w,
        dynamic_from_idle=(intercept, slope),
        source=f"{len(curves_w)} own models",
    )


def fleet_fallback(
    shape: FleetShape, pooled_test: NodeRows, settings: FitSettings
) -> tuple[FitOutcome, MonoShapeRegressor]:
    """The bundle's fallback: the fleet's median curve, judged on pooled held-out rows."""
    model = _fixed(shape_curve(shape.idle_w, shape.dynamic_w, shape.shape))
    thermal = node_thermal(pooled_test)
    check = monotonic_verdict(
        model, np.median(pooled_test.features, axis=0), settings.monotonic_tolerance_w, thermal
    )
    check["extender_probe"] = extender_probe_verdict(model, thermal, FALLBACK_NAME)
    if check["extender_probe"] != "pass":  # e.g. a fleet of nodes reading 0 W
        raise FitError(f"fleet fallback: {check['extender_probe']}")
    onnx = model_to_onnx(model, len(FEATURES))
    predicted_w = model.predict(pooled_test.features)
    outcome = FitOutcome(
        node=FALLBACK_NAME,
        rows_train=0,
        rows_test=len(pooled_test),
        family=FLEET_FAMILY,
        onnx=onnx,
        parity=check_parity(FALLBACK_NAME, model, onnx, pooled_test.features),
        metrics=error_metrics(pooled_test.power_w, predicted_w),
        candidates=[],
        monotonic=check,
        thermal=thermal,
        steady_curve_w=[round(float(w), 3) for w in model.curve_.predict_w(_grid_rows())],
    )
    return outcome, model


def scale_fallback(outcome: FitOutcome, shape: FleetShape) -> bool:
    """Give a fallback node with power readings the fleet's shape scaled to them (in place).

    Returns False (leaving the node on the fleet fallback) when it has no readings or the
    scaled curve would not be a plausible model.
    """
    rows = outcome.rows
    if rows is None or len(rows) == 0:
        return False
    util = rows.features[:, FEATURES.index(CPU_UTIL)]
    idle_w = shape.idle_w_through(util, rows.power_w)
    dynamic_w = shape.dynamic_w_for_idle(idle_w)
    model = _fixed(shape_curve(idle_w, dynamic_w, shape.shape))
    if extender_probe_verdict(model, outcome.thermal, outcome.node) != "pass":
        return False
    evaluated = outcome.eval_rows if outcome.eval_rows is not None else rows  # the newest rows
    outcome.family = SCALED_FAMILY
    outcome.onnx = model_to_onnx(model, len(FEATURES))
    outcome.parity = check_parity(outcome.node, model, outcome.onnx, evaluated.features)
    outcome.metrics = error_metrics(evaluated.power_w, model.predict(evaluated.features))
    outcome.monotonic = {
        **monotonic_verdict(model, np.median(evaluated.features, axis=0), 0.0, outcome.thermal),
        "own_families": outcome.monotonic or None,
    }
    outcome.scaled = {
        "idle_w": round(idle_w, 2),
        "dynamic_w": round(dynamic_w, 2),
        "rows": len(rows),
        "shape_from": shape.source,
    }
    outcome.steady_curve_w = [round(float(w), 3) for w in model.curve_.predict_w(_grid_rows())]
    return True


def _fixed(curve) -> MonoShapeRegressor:
    return MonoShapeRegressor(curve=curve).fit(np.zeros((1, len(FEATURES)), dtype=np.float32))


def _grid_rows() -> np.ndarray:
    rows = np.zeros((len(GRID_UTIL), len(FEATURES)))
    rows[:, FEATURES.index(CPU_UTIL)] = GRID_UTIL
    return rows
