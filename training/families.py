"""Candidate model families: the shapes a node's power curve may take.

`training.fit` fits every family on a node's older rows and keeps the one with the lowest error on
the newest rows. Three kinds compete:

* `monoshape` (`training.monoshape`): ten non-negative ramps in utilisation plus non-negative
  temperature terms, fitted against a shape prior learned from real servers (SPECpower). It
  cannot fall with utilisation at any temperatures, by construction, and where a node's data
  leave gaps (load held at a few levels, never above half) the prior fills in the shape;
* smooth, low-parameter curves: sqrt(u) plus a polynomial in utilisation u, plus straight-line
  (or quadratic) temperature terms, fitted by ridge regression. Real servers' power curves
  (SPECpower, Kepler's model database) are well described this way; the sqrt(u) term follows
  the steep rise from active idle to light load that polynomials miss (on the SPECpower sample
  it cuts the error at 10 % load from ~7 % to ~2 %). The models are a few KiB as ONNX and
  interpolate gently across utilisations the node has not shown;
* flexible families, for nodes whose power depends on temperatures or utilisation in ways a
  polynomial cannot follow (fans stepping up, turbo limits): a random forest whose trees are
  constrained to be non-decreasing in utilisation and CPU temperatures (`rfmono`, the default:
  its P(u) can never dip, whatever the temperatures), and plain gradient-boosted depth-3 trees
  (`gbr`, on request; as accurate, but they often dip by a fraction of a watt along u and take
  4x longer to fit).

Every estimator here converts with skl2onnx 1.20 (no HistGradientBoosting, no SplineTransformer;
`UtilTerms` brings its own converter) and takes the manifest's feature columns in order,
utilisation first.

This module also fits the per-node thermal slope the predictor uses to move CPU temperatures
along a tabulated P(u) curve (docs/architecture.md, "Thermal slope").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from skl2onnx import update_registered_converter
from skl2onnx.algebra.onnx_ops import OnnxConcat, OnnxMul, OnnxRelu, OnnxSqrt
from skl2onnx.common.data_types import FloatTensorType
from sklearn.base import BaseEstimator, RegressorMixin, TransformerMixin
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingRegressor, RandomForestRegressor
from sklearn.linear_model import Ridge
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

from training.monoshape import MonoShapeRegressor
from training.node_facts import NodeFacts
from training.shape_prior import ShapePrior

UTIL_COLUMN = 0  # utilisation is the first feature in every manifest this project writes

# Ridge penalty on standardised features: large enough to keep the collinear temperature columns
# (cpu2 filled from cpu1 on one-socket nodes) well conditioned, far too small to bend a curve
# fitted on thousands of rows.
RIDGE_ALPHA = 1.0


@dataclass(frozen=True)
class Family:
    """One candidate family: a name for reports and manifests and a factory for a fresh model."""

    name: str
    kind: str  # "monotone" (by construction), "smooth" or "flexible"
    make: Callable[[int], RegressorMixin]  # seed -> unfitted estimator
    description: str


class UtilTerms(TransformerMixin, BaseEstimator):
    """Utilisation u (one column) -> [sqrt(u)], u, u^2, ..., u^degree (u below 0 read as 0).

    The square-root term gives a curve the steep rise real servers show between active idle and
    light load (SPECpower: idle 69 W, 10 % 103 W, 20 % 117 W), which no low-degree polynomial
    follows. scikit-learn has no converter-friendly transformer for it (FunctionTransformer does
    not convert), so this one ships its own skl2onnx converter below: Relu, Sqrt, Mul, Concat.
    """

    def __init__(self, degree: int = 3, sqrt: bool = True) -> None:
        self.degree = degree
        self.sqrt = sqrt

    def fit(self, X, y=None):
        self.n_terms_ = self.degree + int(self.sqrt)
        return self

    def transform(self, X):
        u = np.maximum(np.asarray(X)[:, :1], 0)
        terms = [np.sqrt(u)] if self.sqrt else []
        power = u
        terms.append(u)
        for _ in range(2, self.degree + 1):
            power = power * u  # the same multiplications as the ONNX graph, for parity
            terms.append(power)
        return np.hstack(terms)


def _util_terms_shape(operator) -> None:
    rows = operator.inputs[0].get_first_dimension()
    operator.outputs[0].type = FloatTensorType([rows, operator.raw_operator.n_terms_])


def _util_terms_converter(scope, operator, container) -> None:
    raw, opset = operator.raw_operator, container.target_opset
    util = OnnxRelu(operator.inputs[0], op_version=opset)
    terms = [OnnxSqrt(util, op_version=opset)] if raw.sqrt else []
    power = util
    terms.append(util)
    for _ in range(2, raw.degree + 1):
        power = OnnxMul(power, util, op_version=opset)
        terms.append(power)
    output = OnnxConcat(*terms, axis=1, op_version=opset, output_names=operator.outputs[:1])
    output.add_to(scope, container)


update_registered_converter(
    UtilTerms, "PowerAwareUtilTerms", _util_terms_shape, _util_terms_converter
)


def _polynomial_in_util(
    degree: int, temp_degree: int = 1, sqrt: bool = False
) -> Callable[[int], RegressorMixin]:
    def make(_seed: int) -> RegressorMixin:
        temps = (
            "passthrough"
            if temp_degree == 1
            else PolynomialFeatures(temp_degree, include_bias=False)
        )
        columns = ColumnTransformer(
            [
                ("util_terms", UtilTerms(degree, sqrt=sqrt), [UTIL_COLUMN]),
                ("temps", temps, [1, 2, 3]),
            ]
        )
        return Pipeline(
            [("terms", columns), ("scale", StandardScaler()), ("ridge", Ridge(RIDGE_ALPHA))]
        )

    return make


def _polynomial_in_util_only(degree: int) -> Callable[[int], RegressorMixin]:
    def make(_seed: int) -> RegressorMixin:
        columns = ColumnTransformer(
            [("util_terms", UtilTerms(degree, sqrt=False), [UTIL_COLUMN])],
            remainder="drop",
        )
        return Pipeline(
            [("terms", columns), ("scale", StandardScaler()), ("ridge", Ridge(RIDGE_ALPHA))]
        )

    return make


def _gradient_boosting(seed: int) -> RegressorMixin:
    # subsample=0.5 (stochastic boosting) halves the fit time and regularises; leaves of at least
    # 20 rows keep the staircase in utilisation from following BMC noise downwards.
    return GradientBoostingRegressor(
        n_estimators=100,
        max_depth=3,
        learning_rate=0.1,
        subsample=0.5,
        min_samples_leaf=20,
        random_state=seed,
    )


def _monotone_forest(seed: int) -> RegressorMixin:
    # Every tree non-decreasing in utilisation => so is their average, at any temperatures.
    # 20 trees of depth <= 6 on half-size bootstrap samples: ~60-80 KiB as ONNX, ~0.1 s to fit
    # on 8k rows, within ~0.1 percentage point of the boosted trees' MAPE on the synthetic fleet.
    # Also non-decreasing in both CPU temperatures (fans and leakage only add power), so P(u)
    # cannot dip either when the predictor raises CPU temperatures along u.
    monotonic = [1, 0, 1, 1]
    return RandomForestRegressor(
        n_estimators=20,
        max_depth=6,
        min_samples_leaf=20,
        max_samples=0.5,
        monotonic_cst=monotonic,
        random_state=seed,
        n_jobs=1,
    )


MONOSHAPE_FAMILY = "monoshape"

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            MONOSHAPE_FAMILY,
            "monotone",
            lambda _seed: MonoShapeRegressor(),
            "ten non-negative ramps in utilisation (never falls, by construction) + non-negative "
            "CPU-temperature and ambient terms, with a shape prior learned from 116 real servers "
            "(SPECpower) filling loads the node has not shown",
        ),
        Family(
            "poly3",
            "smooth",
            _polynomial_in_util(3),
            "cubic in utilisation + linear in each temperature (ridge)",
        ),
        Family(
            "poly5",
            "smooth",
            _polynomial_in_util(5),
            "quintic in utilisation + linear in each temperature (ridge)",
        ),
        Family(
            "poly5t2",
            "smooth",
            _polynomial_in_util(5, temp_degree=2),
            "quintic in utilisation + quadratic in the temperatures, for fans and leakage (ridge)",
        ),
        Family(
            "sqrt2",
            "smooth",
            _polynomial_in_util(2, sqrt=True),
            "sqrt(u) + quadratic in utilisation + linear in each temperature (ridge)",
        ),
        Family(
            "sqrt3",
            "smooth",
            _polynomial_in_util(3, sqrt=True),
            "sqrt(u) + cubic in utilisation + linear in each temperature (ridge)",
        ),
        Family(
            "sqrt3t2",
            "smooth",
            _polynomial_in_util(3, temp_degree=2, sqrt=True),
            "sqrt(u) + cubic in utilisation + quadratic in the temperatures (ridge)",
        ),
        Family(
            "rfmono",
            "flexible",
            _monotone_forest,
            "random forest, 20 x depth 6, non-decreasing in utilisation and CPU temperatures",
        ),
        Family(
            "gbr",
            "flexible",
            _gradient_boosting,
            "gradient-boosted trees, 100 x depth 3, on all features",
        ),
    )
}
# `util3` ignores temperatures (for nodes whose temperature sensors mislead; `--families`).
UTIL_ONLY_FAMILY = "util3"
FAMILIES[UTIL_ONLY_FAMILY] = Family(
    UTIL_ONLY_FAMILY,
    "smooth",
    _polynomial_in_util_only(3),
    "cubic in utilisation only, temperatures ignored (ridge)",
)
# `monoshape` only, by default. Measured (README, Results: bench.accuracy_specpower on 39
# held-out SPECpower servers, bench.fit_export on the synthetic fleet), it is more accurate
# than the sqrt families where a node's data cover every load (held-out MAPE 1.14 % against
# 1.41 % on the synthetic fleet) and far more where they do not: between load levels held for
# hours (median 0.8 % against 1.9 % at the loads never seen; the sqrt families' p90 is lower,
# 2.6 % against 3.2 %), on mostly idle nodes (0.5 % against 1.5 %), and above the highest load
# a node has shown (3.5 % against 11 % from 60 to 100 %). Adding the sqrt families and choosing
# by held-out error made it worse: the newest rows a node has cannot show how a curve behaves
# between or above the loads they hold, so held-out error picks a polynomial that fits them a
# little better and extrapolates badly. They stay available through `--families`, as do trees
# (`rfmono`, `gbr`: step functions of u, so small pods would add exactly 0 W inside a step and
# tie, the mistake DESIGN.md warns about).
DEFAULT_FAMILIES: tuple[str, ...] = (MONOSHAPE_FAMILY,)
# Tried only for a node where none of the chosen families passes the checks (a family given with
# `--families` that dips along utilisation): `monoshape` cannot fall with utilisation, so a node
# with enough rows never ends on the fleet fallback because a family dipped.
LAST_RESORT_FAMILIES: tuple[str, ...] = (MONOSHAPE_FAMILY,)


def resolve_families(names: Sequence[str]) -> list[Family]:
    """Families by name, in the given order; unknown names raise ValueError listing the known."""
    unknown = [name for name in names if name not in FAMILIES]
    if unknown:
        raise ValueError(
            f"unknown model famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
            f"known: {', '.join(FAMILIES)}"
        )
    if not names:
        raise ValueError("no model family given")
    return [FAMILIES[name] for name in names]


def fit_family(
    family: Family,
    features: np.ndarray,
    power_w: np.ndarray,
    seed: int,
    shape_prior: ShapePrior | None = None,
    facts: NodeFacts | None = None,
):
    """Fit a fresh model of `family` on float32 features (what ONNX will see) and watts.

    `shape_prior` goes to families that use one (`monoshape`); None means the prior shipped
    with the package. `facts` (the node's hardware, `training.node_facts`) likewise.
    """
    model = family.make(seed)
    params = model.get_params(deep=False) if hasattr(model, "get_params") else {}
    if shape_prior is not None and "prior" in params:
        model.set_params(prior=shape_prior)
    if facts is not None and "facts" in params:
        model.set_params(facts=facts)
    model.fit(np.asarray(features, dtype=np.float32), np.asarray(power_w, dtype=np.float64))
    return model


def max_power_drop_w(
    model,
    util_grid: np.ndarray,
    fixed_features: np.ndarray,
    temp_slopes: Mapping[int, float] | None = None,
) -> float:
    """Largest fall of predicted power as utilisation rises along `util_grid` (0 = never falls).

    `fixed_features` holds the other features (temperatures) at one value, e.g. the node's
    medians. With `temp_slopes` (column -> degrees C per unit utilisation) those columns move
    with utilisation the way the predictor moves them when it tabulates P(u):
    `t(u) = t + slope * (u - u_typical)`. The drop is measured against the running maximum, so a
    dip anywhere counts, not only between neighbouring grid points.
    """
    fixed = np.asarray(fixed_features, dtype=np.float64)
    rows = np.tile(fixed, (len(util_grid), 1))
    rows[:, UTIL_COLUMN] = util_grid
    for column, slope in (temp_slopes or {}).items():
        rows[:, column] = fixed[column] + slope * (util_grid - fixed[UTIL_COLUMN])
    rows = rows.astype(np.float32)
    predicted_w = np.asarray(model.predict(rows), dtype=np.float64).ravel()
    return float(np.max(np.maximum.accumulate(predicted_w) - predicted_w))


def thermal_slope_c_per_util(
    util: np.ndarray, ambient_temp_c: np.ndarray, cpu_temp_c: np.ndarray
) -> float | None:
    """Degrees C a CPU warms per unit of utilisation at fixed ambient (least squares).

    Fits `cpu_temp = a + slope * util + b * ambient`. Returns None when utilisation barely varies
    (the slope is then not identifiable); a negative fit (noise on a node that never got busy) is
    reported as 0, since a CPU does not cool down under load.
    """
    keep = np.isfinite(util) & np.isfinite(ambient_temp_c) & np.isfinite(cpu_temp_c)
    util, ambient_temp_c, cpu_temp_c = util[keep], ambient_temp_c[keep], cpu_temp_c[keep]
    if len(util) < 3 or np.std(util) < 0.02:
        return None
    design = np.column_stack([np.ones_like(util), util, ambient_temp_c])
    if np.std(ambient_temp_c) < 1e-6:
        design = design[:, :2]  # constant ambient: its column would duplicate the intercept
    coefficients, *_ = np.linalg.lstsq(design, cpu_temp_c, rcond=None)
    return max(0.0, float(coefficients[1]))
