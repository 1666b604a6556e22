"""Fitting one node: its rows, the candidate families, the checks, the chosen model.

For a node's cleaned rows (`NodeRows`, oldest first): split them chronologically (the newest
`test_fraction` held out), fit every candidate family on the older rows, rank by held-out MAE,
keep the best one that passes the checks (never falling along utilisation; plausible on the
extender's probe grid, `predictor.validation.probe_model`), convert it to ONNX and check it
against scikit-learn. `fit_node` does all of it in a worker process and returns a `FitOutcome`,
which also records the highest load the node was measured at (above it, the model
extrapolates) and its curve at steady state (the fleet fallback is built from those).

A node with too few rows, or whose load never moved enough to show how its power grows, gets
no model here; its outcome says why in words, and `training.fit.fleet` serves it with the
fleet's shape scaled to the power it was measured at (`training.fit.fallback`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from livedata.metrics_table import (
    AMBIENT_TEMP_C,
    CPU_TEMPERATURE_COLUMNS,
    CPU_UTIL,
    FACT_COLUMNS,
    FEATURES,
    NODE,
    POWER_W,
    TIMESTAMP,
)
from predictor.bundle import THERMAL_SUFFIX, BundleError
from predictor.validation import probe_model
from training.export import ParityResult, check_parity, model_to_onnx
from training.families import (
    Family,
    fit_family,
    max_power_drop_w,
    resolve_families,
    thermal_slope_c_per_util,
)
from training.fit.settings import FLEXIBLE_MARGIN, FitSettings
from training.monoshape import CurveNotIdentifiable, MonoShapeRegressor
from training.node_facts import NodeFacts
from training.report import IdleToMaxLine, error_metrics
from training.shape_prior import GRID_UTIL

UTIL_CHECK_GRID = np.linspace(0.0, 1.0, 101)
FALLBACK_NAME = "(fleet fallback)"  # the `node` of the fleet fallback's rows and outcome
# The highest load a node was measured at: this percentile of its training utilisation, so a
# few stray samples (a minute at 100 % in a week at 30 %) do not count as having seen it.
MEASURED_LOAD_PERCENTILE = 99.5


@dataclass
class NodeRows:
    """One node's rows, oldest first: float32 features in manifest order, watts, Unix seconds."""

    node: str
    time_s: np.ndarray
    features: np.ndarray
    power_w: np.ndarray
    facts: NodeFacts | None = None  # the node's hardware, when the table's fact columns tell

    def __len__(self) -> int:
        return len(self.power_w)

    def take(self, index: np.ndarray | slice) -> NodeRows:
        return NodeRows(
            self.node, self.time_s[index], self.features[index], self.power_w[index], self.facts
        )


@dataclass
class FitOutcome:
    """What fitting one node, or the fleet fallback, leaves behind (no scikit-learn objects:
    they stay in the worker). The fallback's has `node` `FALLBACK_NAME` and no baseline,
    windows, held-out series or evaluation rows."""

    node: str
    rows_train: int
    rows_test: int
    family: str | None = None  # None: the node is served by the fleet fallback
    fallback_reason: str | None = None
    onnx: bytes | None = None
    parity: ParityResult | None = None
    metrics: dict = field(default_factory=dict)
    baseline: dict | None = None
    candidates: list[dict] = field(default_factory=list)
    monotonic: dict = field(default_factory=dict)
    thermal: dict[str, float] = field(default_factory=dict)
    power_range_w: list[float] = field(default_factory=list)
    train_window: list[str] = field(default_factory=list)
    test_window: list[str] = field(default_factory=list)
    heldout: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # time_s, measured, predicted
    eval_rows: NodeRows | None = None  # rows the fallback is judged on, for fallback nodes
    rows: NodeRows | None = None  # a fallback node's older rows: its fallback is scaled to them
    # Highest load measured (`MEASURED_LOAD_PERCENTILE` of the training utilisation; None
    # without rows): above it the model extrapolates, and the extender says so in /explain.
    max_util_measured: float | None = None
    # The model's power at u = 0, 0.1, ..., 1 with the CPU temperatures following load from the
    # node's typical temperatures (what the predictor tabulates): the fleet fallback's material.
    steady_curve_w: list[float] = field(default_factory=list)
    loads_shown_pct: list[int] | None = None  # monoshape: grid loads the data showed
    # monoshape: above `max_util_measured`, the band the prior expects power in, as ratios to
    # the model's prediction (`training.monoshape.ExtrapolationInterval.as_dict`)
    extrapolation_interval: dict | None = None
    facts: dict = field(default_factory=dict)  # the node's hardware facts, for the report
    scaled: dict | None = None  # a scaled fallback's idle and range (training.fit.fallback)


# --- a node's rows --------------------------------------------------------------------------------


def heldout_start_index(n_rows: int, test_fraction: float) -> int:
    """Index of the first held-out row: the newest ceil(n * fraction) rows (at least one)."""
    n_test = min(n_rows - 1, max(1, math.ceil(n_rows * test_fraction)))
    return n_rows - n_test


def fill_features(features: np.ndarray, fill: Mapping[str, str]) -> np.ndarray:
    """Fill each empty target column from its source (e.g. cpu2 from cpu1 on one-socket nodes)."""
    for target, source in fill.items():
        t, src = FEATURES.index(target), FEATURES.index(source)
        empty = np.isnan(features[:, t])
        features[empty, t] = features[empty, src]
    return features


def unfillable_rows(frame: pd.DataFrame, fill: Mapping[str, str]) -> np.ndarray:
    """Rows where a feature is still missing after the fill (no telemetry: not usable)."""
    missing = np.zeros(len(frame), dtype=bool)
    for feature in FEATURES:
        gap = frame[feature].isna().to_numpy()
        if feature in fill:
            gap = gap & frame[fill[feature]].isna().to_numpy()
        missing |= gap
    return missing


def iter_node_rows(frame: pd.DataFrame, fill: Mapping[str, str]) -> Iterator[NodeRows]:
    """One `NodeRows` per node, sorted by name, rows oldest first, feature fill applied.

    The columns are turned into arrays once and each node gets slices of them: no per-node
    DataFrame copies, no whole-table copy to fill one column (cleaning already sorted the table
    by node and time; an unsorted table is sorted once).
    """
    if not frame[NODE].is_monotonic_increasing:
        frame = frame.sort_values([NODE, TIMESTAMP], kind="stable")
    names = frame[NODE].to_numpy()
    time_s = (frame[TIMESTAMP] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
    features = frame[list(FEATURES)].to_numpy(np.float32)
    power_w = frame[POWER_W].to_numpy(np.float64)
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]]) if len(names) else []
    fact_columns = [c for c in FACT_COLUMNS if c in frame.columns]
    for start, end in zip(starts, [*starts[1:], len(names)], strict=True):
        order = np.argsort(time_s[start:end], kind="stable") + start
        facts = NodeFacts.from_rows(frame.iloc[start:end][fact_columns]) if fact_columns else None
        yield NodeRows(
            node=str(names[start]),
            time_s=time_s[order],
            features=fill_features(features[order], fill),
            power_w=power_w[order],
            facts=facts if facts is not None and facts.known else None,
        )


def rfc3339(time_s: float) -> str:
    return datetime.fromtimestamp(float(time_s), tz=UTC).isoformat().replace("+00:00", "Z")


# --- checks ---------------------------------------------------------------------------------------


def monotonic_verdict(
    model,
    typical_features: np.ndarray,
    tolerance_w: float,
    thermal: Mapping[str, float] | None = None,
) -> dict:
    """Does predicted power never fall as utilisation rises 0 -> 1?

    Checked at the typical temperatures held fixed and, when the node has thermal slopes, also
    with the CPU temperatures following utilisation as the predictor tabulates P(u); both must
    pass.
    """
    drop_w = max_power_drop_w(model, UTIL_CHECK_GRID, typical_features)
    slopes = {
        FEATURES.index(key.removesuffix(THERMAL_SUFFIX)): slope
        for key, slope in (thermal or {}).items()
    }
    along_w = max_power_drop_w(model, UTIL_CHECK_GRID, typical_features, slopes) if slopes else 0.0
    temps = {
        name: round(float(v), 2) for name, v in zip(FEATURES[1:], typical_features[1:], strict=True)
    }
    return {
        "verdict": "pass" if max(drop_w, along_w) <= tolerance_w else "fail",
        "max_drop_w": round(drop_w, 4),
        "max_drop_along_thermal_w": round(along_w, 4),
        "tolerance_w": tolerance_w,
        "at_temps_c": temps,
    }


def extender_probe_verdict(model, thermal: Mapping[str, float] | None, node: str) -> str:
    """ "pass", or why the extender would refuse this model when it loads the bundle.

    The extender validates every model on a fixed grid of temperatures before serving a bundle
    (`predictor.validation.probe_model`), and refuses the whole bundle for one bad model; running
    the same check here means training never writes a bundle the extender refuses.
    """
    slopes = {key.removesuffix(THERMAL_SUFFIX): slope for key, slope in (thermal or {}).items()}
    try:
        probe_model(model.predict, FEATURES, slopes, where=f"node {node!r} model")
    except BundleError as exc:
        return str(exc)
    return "pass"


def node_thermal(rows: NodeRows) -> dict[str, float]:
    """Per-CPU thermal slope (degrees C per unit utilisation) for the manifest's `thermal`."""
    util = rows.features[:, FEATURES.index(CPU_UTIL)].astype(np.float64)
    ambient = rows.features[:, FEATURES.index(AMBIENT_TEMP_C)].astype(np.float64)
    thermal = {}
    for name in CPU_TEMPERATURE_COLUMNS:
        temp = rows.features[:, FEATURES.index(name)].astype(np.float64)
        slope = thermal_slope_c_per_util(util, ambient, temp)
        if slope is not None:
            thermal[f"{name}{THERMAL_SUFFIX}"] = round(slope, 3)
    return thermal


def max_util_measured(util: np.ndarray) -> float | None:
    """The highest load a node was measured at (see `MEASURED_LOAD_PERCENTILE`)."""
    util = np.asarray(util, dtype=np.float64)
    if len(util) == 0:
        return None
    return round(float(np.percentile(util, MEASURED_LOAD_PERCENTILE)), 4)


def steady_curve_w(
    model, typical_features: np.ndarray, thermal: Mapping[str, float] | None
) -> list[float]:
    """The model's watts at u = 0, 0.1, ..., 1, CPU temperatures moving along the thermal slopes
    from the node's typical temperatures (as `predictor.curves` tabulates P(u))."""
    rows = np.tile(np.asarray(typical_features, dtype=np.float64), (len(GRID_UTIL), 1))
    u_typical = rows[0, FEATURES.index(CPU_UTIL)]
    rows[:, FEATURES.index(CPU_UTIL)] = GRID_UTIL
    for key, slope in (thermal or {}).items():
        column = FEATURES.index(key.removesuffix(THERMAL_SUFFIX))
        rows[:, column] = rows[:, column] + slope * (GRID_UTIL - u_typical)
    predicted_w = np.asarray(model.predict(rows.astype(np.float32)), dtype=np.float64).ravel()
    return [round(float(w), 3) for w in predicted_w]


def util_span(util: np.ndarray) -> tuple[float, float]:
    """The range that holds 96 % of a node's utilisation (2nd to 98th percentile)."""
    low, high = np.percentile(np.asarray(util, dtype=np.float64), [2, 98])
    return float(low), float(high)


def largest_util_gap(util: np.ndarray) -> float:
    """Widest utilisation interval (within the seen range) that holds no row."""
    seen = np.unique(np.asarray(util, dtype=np.float64))
    return float(np.max(np.diff(seen))) if len(seen) > 1 else 0.0


# --- choosing a family ----------------------------------------------------------------------------


def rank_candidates(candidates: Sequence[dict], families: Sequence[Family]) -> list[dict]:
    """Order by held-out MAE; a flexible family must beat the best other one by the margin."""
    kind = {family.name: family.kind for family in families}
    smooth_best = min(
        (c["metrics"]["mae_w"] for c in candidates if kind[c["family"]] != "flexible"),
        default=math.inf,
    )

    def key(candidate: dict) -> tuple[float, int]:
        mae_w = candidate["metrics"]["mae_w"]
        if kind[candidate["family"]] == "flexible" and mae_w > smooth_best * (1 - FLEXIBLE_MARGIN):
            mae_w = max(mae_w, smooth_best) + 1e-9  # not better enough: rank after the smooth one
        return (mae_w, [f.name for f in families].index(candidate["family"]))

    return sorted(candidates, key=key)


def choose_model(
    train: NodeRows,
    test: NodeRows,
    settings: FitSettings,
    extra_families: Sequence[str] = (),
    thermal: Mapping[str, float] | None = None,
) -> tuple[object | None, dict | None, list[dict], dict]:
    """Fit every family, pick the best monotonic one. Returns (model, choice, candidates, check).

    `model` is None when no family passes the checks; `candidates` then says why for each (a
    family that could not be fitted at all is listed with `skipped` and the reason).
    """
    names = list(settings.families) + [n for n in extra_families if n not in settings.families]
    families = resolve_families(names)
    typical = np.median(train.features, axis=0)
    fitted = {}
    candidates: list[dict] = []
    skipped: list[dict] = []
    util_gap = largest_util_gap(train.features[:, FEATURES.index(CPU_UTIL)])
    for family in families:
        if family.kind == "flexible" and util_gap > settings.flexible_max_util_gap:
            skipped.append(
                {
                    "family": family.name,
                    "skipped": f"training utilisation has a gap of {util_gap:.3f} with no rows "
                    f"(> {settings.flexible_max_util_gap}); trees would be flat across it",
                }
            )
            continue
        fit_rows = train
        if family.kind == "flexible" and len(train) > settings.flexible_max_rows:
            rng = np.random.default_rng(settings.seed)
            pick = rng.choice(len(train), settings.flexible_max_rows, replace=False)
            fit_rows = train.take(np.sort(pick))
        try:
            model = fit_family(
                family,
                fit_rows.features,
                fit_rows.power_w,
                settings.seed,
                settings.shape_prior,
                train.facts,
            )
        except (CurveNotIdentifiable, np.linalg.LinAlgError) as exc:
            skipped.append({"family": family.name, "skipped": str(exc)})
            continue
        predicted_w = model.predict(test.features)
        check = monotonic_verdict(model, typical, settings.monotonic_tolerance_w, thermal)
        check["extender_probe"] = extender_probe_verdict(model, thermal, train.node)
        if check["extender_probe"] != "pass":
            check["verdict"] = "fail"
        fitted[family.name] = (model, predicted_w)
        candidates.append(
            {
                "family": family.name,
                "metrics": error_metrics(test.power_w, predicted_w),
                "monotonic": check["verdict"],
                "max_drop_w": check["max_drop_w"],
                "check": check,
            }
        )
    if not candidates:
        return None, None, skipped, {}
    ranked = rank_candidates(candidates, families)
    for candidate in ranked:
        if candidate["monotonic"] != "pass":
            continue
        model, predicted_w = fitted[candidate["family"]]
        if settings.max_model_bytes is not None:
            # Size is only known once converted; the winner's ONNX is kept for fit_node.
            onnx = model_to_onnx(model, train.features.shape[1])
            candidate["onnx_bytes"] = len(onnx)
            if len(onnx) > settings.max_model_bytes:
                candidate["over_max_model_bytes"] = True
                continue
            candidate["onnx"] = onnx
        return model, candidate, _public(candidates) + skipped, candidate["check"]
    # every family dips somewhere (or is too large): report the best-ranked one's check
    return None, None, _public(candidates) + skipped, ranked[0]["check"]


def _public(candidates: list[dict]) -> list[dict]:
    return [{k: v for k, v in c.items() if k not in ("check", "onnx")} for c in candidates]


def no_model_reason(
    candidates: Sequence[dict], settings: FitSettings, check: Mapping | None = None
) -> str:
    """Why `choose_model` found no model, in words: what each family ran into.

    `check` is the best-ranked family's monotonicity check, for the size and place of the dip.
    """
    if any(c.get("over_max_model_bytes") for c in candidates):
        return (
            "no family passed the monotonicity check with an ONNX within --max-model-bytes "
            f"{settings.max_model_bytes}"
        )
    fitted = [c for c in candidates if "skipped" not in c]
    if not fitted:
        reasons = dict.fromkeys(c["skipped"] for c in candidates)  # unique, in order
        return "no family could be fitted: " + "; ".join(reasons)
    refused = [c for c in fitted if c.get("extender_probe", "pass") != "pass"]
    if refused:
        return f"the extender would refuse every family's model: {refused[0]['extender_probe']}"
    if not check:
        return "no family passed the monotonicity check"
    fixed_w, along_w = check.get("max_drop_w", 0.0), check.get("max_drop_along_thermal_w", 0.0)
    if fixed_w <= check.get("tolerance_w", 0.0) < along_w:
        # Families monotone in u fall only when the CPU temperatures are moved along the
        # node's thermal slope: a slope fitted negative (temperature falling as load rises).
        return (
            f"no family passed the monotonicity check: predicted power falls by {along_w:g} W "
            "as utilisation rises with the CPU temperatures following it along the node's "
            "thermal slope (is a temperature sensor mapped to the wrong CPU, or stuck?)"
        )
    return (
        f"no family passed the monotonicity check: predicted power falls by {fixed_w:g} W as "
        f"utilisation rises at the node's typical temperatures {check.get('at_temps_c')}"
    )


def choose_model_or_last_resort(
    train: NodeRows,
    test: NodeRows,
    settings: FitSettings,
    extra_families: Sequence[str] = (),
    thermal: Mapping[str, float] | None = None,
) -> tuple[object | None, dict | None, list[dict], dict]:
    """`choose_model` over the families, then over the last-resort ones if none passed.

    The candidates list holds both rounds; the check is the passing model's, else the first's.
    """
    model, choice, candidates, check = choose_model(train, test, settings, extra_families, thermal)
    last_resort = [f for f in settings.last_resort_families if f not in settings.families]
    if model is not None or not last_resort:
        return model, choice, candidates, check
    model, choice, more_candidates, last_check = choose_model(
        train, test, replace(settings, families=tuple(last_resort)), thermal=thermal
    )
    if model is not None or not check:
        check = last_check
    return model, choice, candidates + more_candidates, check


# --- one node, start to end -----------------------------------------------------------------------


def fit_node(rows: NodeRows, settings: FitSettings) -> FitOutcome:
    """Everything one node needs: split, fit, choose, check, convert, parity. Runs in a worker.

    A node that gets no model of its own comes back with `fallback_reason` (in words) and its
    rows, for the fleet stage to scale the fallback to.
    """
    n_rows = len(rows)
    power_range_w = [round(float(rows.power_w.min()), 2), round(float(rows.power_w.max()), 2)]
    util = rows.features[:, FEATURES.index(CPU_UTIL)]
    if n_rows < max(settings.min_rows, 2):
        # Too few rows for a model of its own; the fallback is scaled to the older rows and
        # judged on the newest, like every model (a single row is both).
        start = heldout_start_index(n_rows, settings.test_fraction) if n_rows > 1 else 1
        older = rows.take(slice(0, start))
        newest = rows.take(slice(start, None)) if n_rows > 1 else rows
        return FitOutcome(
            node=rows.node,
            rows_train=len(older) if n_rows > 1 else 0,
            rows_test=len(newest),
            fallback_reason=f"{n_rows} clean rows < --min-rows {settings.min_rows}",
            thermal=node_thermal(rows),
            power_range_w=power_range_w,
            eval_rows=newest,
            rows=older,
            max_util_measured=max_util_measured(util),
        )
    start = heldout_start_index(n_rows, settings.test_fraction)
    train, test = rows.take(slice(0, start)), rows.take(slice(start, None))
    outcome = FitOutcome(
        node=rows.node,
        facts=rows.facts.as_dict() if rows.facts is not None else {},
        rows_train=len(train),
        rows_test=len(test),
        thermal=node_thermal(train),
        power_range_w=power_range_w,
        train_window=[rfc3339(train.time_s[0]), rfc3339(train.time_s[-1])],
        test_window=[rfc3339(test.time_s[0]), rfc3339(test.time_s[-1])],
        max_util_measured=max_util_measured(train.features[:, FEATURES.index(CPU_UTIL)]),
    )
    line = IdleToMaxLine.from_train(train.features[:, 0], train.power_w)
    outcome.baseline = {
        **error_metrics(test.power_w, line.predict_w(test.features[:, 0])),
        "idle_w": round(line.idle_w, 2),
        "max_w": round(line.max_w, 2),
    }
    low_u, high_u = util_span(train.features[:, FEATURES.index(CPU_UTIL)])
    if high_u - low_u < settings.min_util_span:
        outcome.fallback_reason = (
            f"its utilisation stayed between {low_u:.2f} and {high_u:.2f} in 96 % of its "
            f"training rows (a span under {settings.min_util_span}): how its power grows with "
            "load cannot be seen from that"
        )
        outcome.eval_rows, outcome.rows = test, train
        return outcome
    model, choice, outcome.candidates, outcome.monotonic = choose_model_or_last_resort(
        train, test, settings, thermal=outcome.thermal
    )
    if model is None:
        outcome.fallback_reason = no_model_reason(outcome.candidates, settings, outcome.monotonic)
        outcome.eval_rows, outcome.rows = test, train
        return outcome
    outcome.family = choice["family"]
    outcome.metrics = choice["metrics"]
    outcome.onnx = choice.pop("onnx", None) or model_to_onnx(model, rows.features.shape[1])
    outcome.parity = check_parity(rows.node, model, outcome.onnx, test.features)
    outcome.heldout = (test.time_s, test.power_w, np.asarray(model.predict(test.features)))
    outcome.steady_curve_w = steady_curve_w(
        model, np.median(train.features, axis=0), outcome.thermal
    )
    if isinstance(model, MonoShapeRegressor) and model.details_ is not None:
        shown = model.details_.observed_grid
        outcome.loads_shown_pct = [10 * i for i, seen in enumerate(shown) if seen]
        if model.details_.extrapolation is not None:
            outcome.extrapolation_interval = model.details_.extrapolation.as_dict()
    return outcome
