"""The `monoshape` family: a power curve that cannot fall with utilisation, shaped by real servers.

    P(u, ambient, cpu1, cpu2) = a + sum_j d_j * ramp_j(u)                       ten deciles of u
                                + c_0 (T - 50) + sum_k c_k relu(T - k)          T = mean CPU temp
                                + c_amb (ambient - 23)                          k = 55, 65, 75 C
    ramp_j(u) = min(max(u - j/10, 0), 0.1) / 0.1,   every coefficient >= 0

* **Monotone by construction.** Each ramp rises with u and every weight is non-negative, and no
  temperature term depends on u: P(u) cannot fall at any fixed temperatures, nor when CPU
  temperatures rise with load. The ONNX graph (Relu, Min, MatMul with non-negative weights, Add)
  keeps that in float32. So a node never loses its model because a fit dipped.
* **Physically sensible temperatures.** Power rises with CPU temperature (fans, leakage; the
  hinges follow a convex fan curve) and with ambient, never falls. On real servers CPU
  temperature follows load almost exactly, so a fit could credit load's watts to temperature;
  a ridge prior (about 0.5 W per degree) keeps the temperature terms to what temperature
  explains *beyond* load (ambient swings, thermal lag), so the curve in u carries the load.
* **A population shape prior** (`training.shape_prior`): the ten decile increments, as shares of
  the node's dynamic range, are pulled towards what real servers show, with the scale left free.
  Where the node has data its own data dominate (thousands of rows against one prior); between
  load levels it never held and above the highest load it reached, the prior gives the shape.

Fitting one node (`fit_monotone_curve`, a few milliseconds at 10k rows) runs three passes:

1. all rows, jointly, by non-negative least squares: the temperature terms and the noise level;
2. power corrected to reference temperatures, averaged in narrow bins at u = 0, 0.1, ..., 1,
   and the curve fitted to those bin means with the shape prior. Bin means, not raw rows: the
   jitter around a load level held for hours shows a local slope that a fit on raw rows would
   carry straight across the empty decile next to it (linear interpolation, in effect);
3. the prior's mean replaced by a shape through the node's own pass-2 curve at the loads it
   showed (`ShapePrior.conditional_shape`): each gap between two of them shared out, and the
   rise above the highest, as a ridge regression on the node's shown shape predicts (learned
   on the prior's servers), mixed with what the servers that looked like this node did
   (`ShapePrior.local_mean_increments`' kernel), or, when the node's facts tell its cores and
   sockets, as a forest on its shown shape and that hardware predicts; when the prior holds
   servers of the node's own processor model, half the rise above the highest is theirs;
   pass 2 repeated around it. So the node's shape where it has data informs the deciles it never
   showed, beyond what any one server of the prior did; above the highest load, that is its
   extrapolation.

`MonoShapeRegressor` wraps it as a scikit-learn estimator over the manifest's four features
and registers its own skl2onnx converter, so `training.export` converts and checks it like
any other family.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls
from skl2onnx import update_registered_converter
from skl2onnx.algebra.onnx_ops import OnnxAdd, OnnxConcat, OnnxMatMul, OnnxMin, OnnxRelu, OnnxSub
from skl2onnx.common.data_types import FloatTensorType
from sklearn.base import BaseEstimator, RegressorMixin

from livedata.metrics_table import AMBIENT_TEMP_C, CPU1_TEMP_C, CPU2_TEMP_C, CPU_UTIL, FEATURES
from training.node_facts import NodeFacts
from training.prior_rise import INTERVAL_QUANTILES
from training.shape_prior import (
    GRID_UTIL,
    N_DECILES,
    ShapePrior,
    default_shape_prior,
)

UTIL_COLUMN = FEATURES.index(CPU_UTIL)
AMBIENT_COLUMN = FEATURES.index(AMBIENT_TEMP_C)
CPU_TEMP_COLUMNS = (FEATURES.index(CPU1_TEMP_C), FEATURES.index(CPU2_TEMP_C))

DECILE_KNOTS = GRID_UTIL[:-1]  # 0, 0.1, ..., 0.9: where each ramp starts
DECILE_WIDTH = 0.1
REFERENCE_CPU_TEMP_C = 50.0  # the intercept is power at this mean CPU temperature...
REFERENCE_AMBIENT_C = 23.0  # ...and this ambient
CPU_TEMP_HINGES_C = (55.0, 65.0, 75.0)  # fans step up and leakage grows above these
# Prior standard deviation of each temperature coefficient (W per degree C): fans and leakage
# add fractions of a watt per degree on real servers, not the tens a collinear fit could claim.
TEMP_COEFFICIENT_PRIOR_W_PER_C = 0.5
# Bins are +-0.025 wide (wider bins around the grid points bring back the local-slope problem
# of pass 2), and a bin needs a few rows to count as "the node showed this load".
MIN_BIN_ROWS = 3
SCALE_ITERATIONS = 6  # the shape penalty divides by the dynamic range, re-estimated this often


def ramps(util: np.ndarray) -> np.ndarray:
    """[n] utilisation -> [n, 10] how far u has climbed through each decile (0..1 each)."""
    util = np.asarray(util, dtype=np.float64).reshape(-1, 1)
    return np.minimum(np.maximum(util - DECILE_KNOTS[None, :], 0.0), DECILE_WIDTH) / DECILE_WIDTH


def cpu_temp_basis(cpu_temp_c: np.ndarray) -> np.ndarray:
    """[n] mean CPU temperature -> [n, 4]: T - 50, then the hinges relu(T - k)."""
    temp = np.asarray(cpu_temp_c, dtype=np.float64).reshape(-1)
    hinges = [np.maximum(temp - hinge, 0.0) for hinge in CPU_TEMP_HINGES_C]
    return np.column_stack([temp - REFERENCE_CPU_TEMP_C, *hinges])


N_TEMP_TERMS = 1 + len(CPU_TEMP_HINGES_C)


@dataclass(frozen=True)
class MonotoneCurve:
    """Fitted coefficients, all >= 0 (see the module docstring for the formula)."""

    intercept_w: float
    decile_w: np.ndarray  # [10] watts each decile of utilisation adds
    cpu_temp_w: np.ndarray  # [4] watts per degree: linear term, then one per hinge
    ambient_w_per_c: float

    def predict_w(self, features: np.ndarray) -> np.ndarray:
        features = np.asarray(features, dtype=np.float64)
        cpu_temp_c = features[:, list(CPU_TEMP_COLUMNS)].mean(axis=1)
        return (
            self.intercept_w
            + ramps(features[:, UTIL_COLUMN]) @ self.decile_w
            + cpu_temp_basis(cpu_temp_c) @ self.cpu_temp_w
            + self.ambient_w_per_c * (features[:, AMBIENT_COLUMN] - REFERENCE_AMBIENT_C)
        )


@dataclass(frozen=True)
class FitDetails:
    """What the fit saw, for reports: its noise level, thermal path and which loads it had."""

    noise_w: float
    thermal_slope_c_per_util: float  # mean CPU temperature's rise over 0..1 load at fixed ambient
    observed_grid: tuple[bool, ...]  # per grid point u = 0, 0.1, ..., 1: did the node show it?
    top_grid_point: int  # highest load (in tenths) the node's data reach: above, the prior
    # Above `top_grid_point`: how sure the prior is (`extrapolation_interval`); None when the
    # node showed every load.
    extrapolation: ExtrapolationInterval | None = None
    generation: str | None = None  # the generation whose servers the prior drew on (None: all)


@dataclass(frozen=True)
class ExtrapolationInterval:
    """Above the highest load a node showed: at each grid point, the band the prior expects its
    power in, as ratios to the fitted curve there (steady-state temperatures). Ratios, not
    watts, so the predictor can apply them to the curve it tabulates at any temperature."""

    util: tuple[float, ...]  # grid loads above the highest shown
    low: tuple[float, ...]  # lower bound / predicted power
    high: tuple[float, ...]  # upper bound / predicted power
    quantiles: tuple[float, float]  # which quantiles of the prior's own errors the band spans
    # servers of the node's own processor model whose rise the prediction took half from
    # (`ShapePrior.same_processor`); 0: none, the prior's own rise alone
    same_processor_servers: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "util": list(self.util),
            "low": list(self.low),
            "high": list(self.high),
            "quantiles": list(self.quantiles),
            "same_processor_servers": self.same_processor_servers,
        }


def extrapolation_interval(
    prior: ShapePrior,
    steady_w: np.ndarray,
    top: int,
    observed: np.ndarray,
    facts: NodeFacts | None = None,
) -> ExtrapolationInterval | None:
    """The band above grid point `top` for a node whose fitted steady curve at the 11 grid
    points is `steady_w`: the prior's rise quantiles (`ShapePrior.rise_interval`) from the
    curve's own idle and `top` watts, widened to hold the prediction. Facts move it: full load
    draws at least the highest power the BMC has reported, and no load more than the
    power-supply rating (either may put the band off the prediction: the band then says the
    prediction is surely too low, or too high)."""
    if top >= N_DECILES:
        return None
    _, low_rise, high_rise = prior.rise_interval(steady_w[: top + 1], top, observed, facts)
    top_w, rise_w = steady_w[top], max(steady_w[top] - steady_w[0], 1e-6)
    predicted_w = np.maximum(steady_w[top + 1 :], 1e-6)
    # the prior's band, around the prediction (the fit may sit a little off the prior's rise)
    low_w = np.minimum(top_w + low_rise * rise_w, predicted_w)
    high_w = np.maximum(top_w + high_rise * rise_w, predicted_w)
    # what the hardware says is firmer than the prior: a BMC that read more than the band
    # allows at full load moves the band up (even above the prediction), a power supply
    # rated below it moves the band down
    if facts is not None and facts.bmc_max_power_w is not None:
        low_w[-1] = max(low_w[-1], facts.bmc_max_power_w)
        high_w[-1] = max(high_w[-1], low_w[-1])
    if facts is not None and facts.psu_rating_w is not None:
        high_w = np.minimum(high_w, facts.psu_rating_w)
        low_w = np.minimum(low_w, high_w)
    low, high = low_w / predicted_w, high_w / predicted_w
    same = prior.same_processor(facts)
    return ExtrapolationInterval(
        util=tuple(round(float(u), 2) for u in GRID_UTIL[top + 1 :]),
        low=tuple(round(float(r), 4) for r in low),
        high=tuple(round(float(r), 4) for r in high),
        quantiles=INTERVAL_QUANTILES,
        same_processor_servers=0 if same is None else int(same.sum()),
    )


def _nnls_quadratic(hessian: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """argmin over x >= 0 of x'Hx - 2 b'x for a small positive definite H, by NNLS on its
    Cholesky factor R (H = R'R: ||R x - R^-T b||^2 is the same objective up to a constant)."""
    hessian = 0.5 * (hessian + hessian.T)
    jitter = 1e-12 * max(1.0, float(np.trace(hessian)) / len(hessian))
    for _ in range(8):
        try:
            factor = np.linalg.cholesky(hessian + jitter * np.eye(len(hessian))).T
            break
        except np.linalg.LinAlgError:
            jitter *= 100.0
    else:
        raise np.linalg.LinAlgError("normal equations are not positive definite")
    target = np.linalg.solve(factor.T, linear)
    solution, _ = nnls(factor, target, maxiter=50 * len(linear))
    return solution


def _thermal_path(
    util: np.ndarray, cpu_temp_c: np.ndarray, ambient_c: np.ndarray
) -> tuple[float, float]:
    """Mean CPU temperature at idle and its rise per unit load, at the reference ambient."""
    columns = [np.ones_like(util), util]
    if np.std(ambient_c) > 1e-6:
        columns.append(ambient_c - REFERENCE_AMBIENT_C)
    coefficients, *_ = np.linalg.lstsq(np.column_stack(columns), cpu_temp_c, rcond=None)
    return float(coefficients[0]), max(0.0, float(coefficients[1]))


class CurveNotIdentifiable(ValueError):
    """The rows cannot tell how power grows with load (utilisation barely moved)."""


@dataclass(frozen=True)
class LoadBins:
    """Rows grouped by load in half-decile bins (+-0.025 around u = 0, 0.05, 0.1, ...)."""

    index: np.ndarray  # [rows] bin of each row (0..20)
    counts: np.ndarray  # [21] rows per bin
    kept: np.ndarray  # [21] bins the curve is fitted to
    mean_util: np.ndarray  # [kept bins] their mean utilisation

    @property
    def n_bins(self) -> int:
        return len(self.counts)

    @property
    def observed_grid(self) -> np.ndarray:
        """[11] kept bins at u = 0, 0.1, ..., 1: the loads the node showed."""
        return self.kept[::2]


def _load_bins(util: np.ndarray) -> LoadBins:
    """Bin the rows by load and decide which bins the curve is fitted to.

    Bins at the grid points (u = 0, 0.1, ...) count when they hold `MIN_BIN_ROWS`. A bin between
    two grid points (u = 0.05, 0.15, ...) counts only when neither grid point beside it does:
    the curve is straight within a decile, so a point inside one whose ends are known would
    only bend the ends by the curve's real curvature (the steep first decile most of all), and
    the tails of load held at 30 % are no measurement of 35 % (their local slope carried across
    the decile would be linear interpolation in disguise). A node that never left 35 % is still
    measured there.
    """
    index = np.clip(np.round(util * 20).astype(int), 0, 20)
    counts = np.bincount(index, minlength=21).astype(float)
    kept = counts >= MIN_BIN_ROWS
    kept[1::2] &= ~kept[0:-2:2] & ~kept[2::2]
    sums = np.bincount(index, weights=util, minlength=21)
    return LoadBins(index, counts, kept, sums[kept] / counts[kept])


def fit_monotone_curve(
    features: np.ndarray,
    power_w: np.ndarray,
    prior: ShapePrior,
    facts: NodeFacts | None = None,
) -> tuple[MonotoneCurve, FitDetails]:
    """Fit one node's curve from its rows (features in manifest order) against `prior`, or
    against its generation's servers when `facts` tell the generation
    (`ShapePrior.for_generation`)."""
    generation = facts.generation if facts is not None else None
    population = prior
    prior = prior.for_generation(generation)
    features = np.asarray(features, dtype=np.float64)
    power_w = np.asarray(power_w, dtype=np.float64)
    util = features[:, UTIL_COLUMN]
    ambient_c = features[:, AMBIENT_COLUMN]
    cpu_temp_c = features[:, list(CPU_TEMP_COLUMNS)].mean(axis=1)
    idle_temp_c, slope_c = _thermal_path(util, cpu_temp_c, ambient_c)
    temp_terms = cpu_temp_basis(cpu_temp_c)
    # What the temperature terms add in each decile when the CPU warms along its usual path
    # (at the reference ambient): the prior judges these steady-state increments, d + delta c,
    # so how a fit splits load's watts between u and a collinear temperature does not change
    # what the prior sees.
    temp_steps = np.diff(cpu_temp_basis(idle_temp_c + slope_c * GRID_UTIL), axis=0)  # [10, 4]

    # --- pass 1: every row, jointly ---------------------------------------------------------
    design = np.column_stack(
        [np.ones(len(util)), ramps(util), temp_terms, ambient_c - REFERENCE_AMBIENT_C]
    )
    n_params = design.shape[1]
    temp_slice = slice(1 + N_DECILES, 1 + N_DECILES + N_TEMP_TERMS)
    steady_steps = np.zeros((N_DECILES, n_params))  # params -> steady-state decile increments
    steady_steps[:, 1 : 1 + N_DECILES] = np.eye(N_DECILES)
    steady_steps[:, temp_slice] = temp_steps
    ridge = np.zeros((n_params, n_params))
    ridge[1 + N_DECILES :, 1 + N_DECILES :] = np.eye(N_TEMP_TERMS + 1) / (
        TEMP_COEFFICIENT_PRIOR_W_PER_C**2
    )
    gram, moment = design.T @ design, design.T @ power_w

    low_u, high_u = np.percentile(util, [2, 98])
    mean_curve = np.concatenate([[0.0], np.cumsum(prior.mean_increments)])
    covered = max(
        np.interp(high_u, GRID_UTIL, mean_curve) - np.interp(low_u, GRID_UTIL, mean_curve), 0.05
    )
    rise_w = np.median(power_w[util >= high_u - 0.03]) - np.median(power_w[util <= low_u + 0.03])
    dynamic_w = max(1.0, rise_w / covered)

    def solve_rows(mean: np.ndarray, dynamic_w: float, noise_w: float) -> tuple[np.ndarray, float]:
        penalty = steady_steps.T @ prior.shape_precision(mean) @ steady_steps
        for _ in range(SCALE_ITERATIONS):
            params = _nnls_quadratic(
                gram / noise_w**2 + penalty / dynamic_w**2 + ridge, moment / noise_w**2
            )
            new_dynamic_w = max(float((steady_steps @ params).sum()), 1e-3)
            converged = abs(new_dynamic_w - dynamic_w) < 1e-4 * dynamic_w
            dynamic_w = new_dynamic_w
            if converged:
                break
        return params, dynamic_w

    noise_w = max(1.0, 0.005 * float(np.median(power_w)))
    params, dynamic_w = solve_rows(prior.mean_increments, dynamic_w, noise_w)
    residual_w = power_w - design @ params
    noise_w = max(0.5, 1.4826 * float(np.median(np.abs(residual_w - np.median(residual_w)))))
    params, dynamic_w = solve_rows(prior.mean_increments, dynamic_w, noise_w)
    cpu_temp_w = params[temp_slice].copy()
    ambient_w_per_c = float(params[-1])

    # --- pass 2: temperature-corrected bin means at the grid points ---------------------------
    corrected_w = (
        power_w - temp_terms @ cpu_temp_w - ambient_w_per_c * (ambient_c - REFERENCE_AMBIENT_C)
    )
    bins = _load_bins(util)
    bin_power_w = np.bincount(bins.index, weights=corrected_w, minlength=bins.n_bins)[bins.kept]
    bin_power_w = bin_power_w / bins.counts[bins.kept]
    bin_util = bins.mean_util
    if len(bin_util) < 2:
        raise CurveNotIdentifiable(
            f"its utilisation stayed near {np.median(util):.2f} (between {low_u:.2f} and "
            f"{high_u:.2f} in 96 % of rows): how its power grows with load cannot be seen"
        )
    observed = bins.observed_grid
    bin_design = np.column_stack([np.ones(len(bin_util)), ramps(bin_util)])
    bin_weight = bins.counts[bins.kept] / noise_w**2
    bin_gram = bin_design.T @ (bin_weight[:, None] * bin_design)
    bin_moment = bin_design.T @ (bin_weight * bin_power_w)
    temp_part = temp_steps @ cpu_temp_w  # the temperature share of each steady-state increment

    def solve_bins(mean: np.ndarray, dynamic_w: float) -> tuple[np.ndarray, float]:
        shape_q = prior.shape_precision(mean)
        for _ in range(SCALE_ITERATIONS):
            penalty = np.zeros((N_DECILES + 1, N_DECILES + 1))
            penalty[1:, 1:] = shape_q / dynamic_w**2
            shift = np.zeros(N_DECILES + 1)
            shift[1:] = shape_q @ temp_part / dynamic_w**2
            curve = _nnls_quadratic(bin_gram + penalty, bin_moment - shift)
            new_dynamic_w = max(float(curve[1:].sum() + temp_part.sum()), 1e-3)
            converged = abs(new_dynamic_w - dynamic_w) < 1e-4 * dynamic_w
            dynamic_w = new_dynamic_w
            if converged:
                break
        return curve, dynamic_w

    curve, dynamic_w = solve_bins(prior.mean_increments, dynamic_w)

    # --- pass 3: the prior's mean through the node's own curve, gaps and rise as regressed -----
    top = int(np.clip(np.round(high_u * 10), 2, N_DECILES))
    steady_w = curve[0] + np.concatenate([[0.0], np.cumsum(curve[1:] + temp_part)])
    steady_w = steady_w + cpu_temp_basis([idle_temp_c])[0] @ cpu_temp_w
    local_mean = prior.conditional_shape(steady_w[: top + 1], top, observed, facts)
    curve, dynamic_w = solve_bins(local_mean, dynamic_w)

    fitted = MonotoneCurve(
        intercept_w=float(curve[0]),
        decile_w=curve[1:].copy(),
        cpu_temp_w=cpu_temp_w,
        ambient_w_per_c=ambient_w_per_c,
    )
    fitted_steady_w = curve[0] + np.concatenate([[0.0], np.cumsum(curve[1:] + temp_part)])
    details = FitDetails(
        noise_w=round(noise_w, 3),
        thermal_slope_c_per_util=round(slope_c, 3),
        observed_grid=tuple(bool(b) for b in observed),
        top_grid_point=top,
        extrapolation=extrapolation_interval(prior, fitted_steady_w, top, observed, facts),
        generation=generation if prior is not population else None,
    )
    return fitted, details


def shape_curve(idle_w: float, dynamic_w: float, shape: np.ndarray) -> MonotoneCurve:
    """A temperature-blind curve `idle + dynamic * shape(u)` (`shape` at the 11 grid points,
    0 -> 1, non-decreasing): the fleet fallback and the fallback scaled to one node's power."""
    increments = np.maximum(np.diff(np.asarray(shape, dtype=np.float64)), 0.0)
    return MonotoneCurve(
        intercept_w=float(idle_w),
        decile_w=dynamic_w * increments / increments.sum(),
        cpu_temp_w=np.zeros(N_TEMP_TERMS),
        ambient_w_per_c=0.0,
    )


class MonoShapeRegressor(RegressorMixin, BaseEstimator):
    """Features (manifest order) -> watts: a `MonotoneCurve` fitted against a shape prior.

    `prior=None` uses the prior shipped with the package (`default_shape_prior`). `curve`
    skips fitting: `fit` keeps the given curve (for the fallbacks, built from a shape).
    """

    def __init__(
        self,
        prior: ShapePrior | None = None,
        curve: MonotoneCurve | None = None,
        facts: NodeFacts | None = None,
    ):
        self.prior = prior
        self.curve = curve
        self.facts = facts

    def fit(self, X, y=None) -> MonoShapeRegressor:
        if self.curve is not None:
            self.curve_, self.details_ = self.curve, None
            return self
        prior = self.prior if self.prior is not None else default_shape_prior()
        self.curve_, self.details_ = fit_monotone_curve(
            np.asarray(X), np.asarray(y), prior, self.facts
        )
        return self

    def predict(self, X) -> np.ndarray:
        return self.curve_.predict_w(np.asarray(X))


def _monoshape_shape(operator) -> None:
    rows = operator.inputs[0].get_first_dimension()
    operator.outputs[0].type = FloatTensorType([rows, 1])


def _column_selector(weights: dict[int, float]) -> np.ndarray:
    """A [features, 1] matrix picking (and averaging) feature columns by MatMul."""
    selector = np.zeros((len(FEATURES), 1), dtype=np.float32)
    for column, weight in weights.items():
        selector[column, 0] = weight
    return selector


def _monoshape_converter(scope, operator, container) -> None:
    curve: MonotoneCurve = operator.raw_operator.curve_
    opset, f32 = container.target_opset, np.float32
    features = operator.inputs[0]
    util = OnnxMatMul(features, _column_selector({UTIL_COLUMN: 1.0}), op_version=opset)
    ambient = OnnxMatMul(features, _column_selector({AMBIENT_COLUMN: 1.0}), op_version=opset)
    cpu_temp = OnnxMatMul(
        features, _column_selector(dict.fromkeys(CPU_TEMP_COLUMNS, 0.5)), op_version=opset
    )
    climbed = OnnxMin(
        OnnxRelu(
            OnnxSub(util, DECILE_KNOTS.astype(f32)[None, :], op_version=opset), op_version=opset
        ),
        np.array([DECILE_WIDTH], dtype=f32),
        op_version=opset,
    )
    util_w = OnnxMatMul(
        climbed, (curve.decile_w / DECILE_WIDTH).astype(f32)[:, None], op_version=opset
    )
    temp_terms = OnnxConcat(
        OnnxSub(cpu_temp, np.array([REFERENCE_CPU_TEMP_C], dtype=f32), op_version=opset),
        OnnxRelu(
            OnnxSub(cpu_temp, np.array(CPU_TEMP_HINGES_C, dtype=f32)[None, :], op_version=opset),
            op_version=opset,
        ),
        axis=1,
        op_version=opset,
    )
    temp_w = OnnxMatMul(temp_terms, curve.cpu_temp_w.astype(f32)[:, None], op_version=opset)
    ambient_w = OnnxMatMul(
        OnnxSub(ambient, np.array([REFERENCE_AMBIENT_C], dtype=f32), op_version=opset),
        np.array([[curve.ambient_w_per_c]], dtype=f32),
        op_version=opset,
    )
    total = OnnxAdd(
        OnnxAdd(OnnxAdd(util_w, temp_w, op_version=opset), ambient_w, op_version=opset),
        np.array([[curve.intercept_w]], dtype=f32),
        op_version=opset,
        output_names=operator.outputs[:1],
    )
    total.add_to(scope, container)


update_registered_converter(
    MonoShapeRegressor, "PowerAwareMonoShape", _monoshape_shape, _monoshape_converter
)
