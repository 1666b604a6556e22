"""`python -m training.fit`: collected node metrics -> per-node power models -> a model bundle.

The step between telemetry and the extender. For every node:

1. split its cleaned rows chronologically: the newest `--test-fraction` is held out (a random
   shuffle would leak neighbouring samples of the same time series into the test set);
2. fit every candidate family (`training.families`) on the older rows, on float32 features so
   tree thresholds mean the same in scikit-learn and in ONNX;
3. rank the families by held-out MAE and keep the best one whose predicted power never falls as
   utilisation rises at the node's median temperatures (the extender prices a pod by
   P(u + d) - P(u): a dip would make a busier node look cheaper); the defaults are smooth
   families only (`training.families.DEFAULT_FAMILIES` says why); when a flexible family is
   asked for with `--families`, it must beat the best smooth one by `FLEXIBLE_MARGIN` (10 % of
   MAE) to be chosen, because its ONNX is ~50x larger (ConfigMaps hold 1 MiB), it is flat
   outside the data it saw, and inside a step a small pod adds exactly 0 W; with
   `--max-model-bytes`, a family whose ONNX is larger is passed over for the next one (fleet
   bundles: smooth models are ~1-3 KiB, `rfmono` ~15-60 KiB per node);
4. convert the winner to ONNX and check it against scikit-learn on the held-out rows.

Nodes with fewer than `--min-rows` clean rows, or with no family passing the check, are served
by a fleet fallback model fitted the same way on a subsample of every eligible node's rows
(with a utilisation-only family added to its candidates: across different servers, temperature
mostly says which server it is).

Nodes are fitted in worker processes over all cores, streamed: at most a few nodes' rows are in
flight, and a finished node leaves behind only its ONNX bytes, its figures and (on disk) its
held-out predictions for the plot.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import multiprocessing
import os
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from livedata.collect_config import load_collect_config, parse_time
from livedata.metrics_table import FEATURES
from livedata.prometheus import CollectError
from predictor.bundle import THERMAL_SUFFIX, BundleError
from predictor.validation import probe_model
from training.collect import collect_to_directory
from training.collect.cli import attach_relative_times
from training.dataset import (
    CleanedMetrics,
    CleaningTally,
    MetricsInputError,
    MetricsStream,
    stream_metrics,
)
from training.export import (
    PARITY_TOLERANCE_W,
    ExportError,
    ParityResult,
    check_parity,
    export_bundle,
    model_to_onnx,
)
from training.families import (
    DEFAULT_FAMILIES,
    FAMILIES,
    LAST_RESORT_FAMILIES,
    UTIL_ONLY_FAMILY,
    Family,
    fit_family,
    max_power_drop_w,
    resolve_families,
    thermal_slope_c_per_util,
)
from training.report import (
    PLOT_PNG,
    HeldoutSeriesStore,
    IdleToMaxLine,
    best_median_worst,
    error_metrics,
    plot_predicted_vs_measured,
    summarise,
    write_report,
)

log = logging.getLogger("training.fit")

FEATURE_FILL: dict[str, str] = {"cpu2_temp_c": "cpu1_temp_c"}
CPU_TEMP_FEATURES = ("cpu1_temp_c", "cpu2_temp_c")
DEFAULT_TEST_FRACTION = 0.2
# ~8 h at 60 s: below this a node has rarely seen enough of its utilisation range for a curve
# of its own; the fleet fallback is the safer guess.
DEFAULT_MIN_ROWS = 500
# Predicted power may fall this much along utilisation before a model counts as decreasing:
# float32 rounding, never a real dip.
DEFAULT_MONOTONIC_TOLERANCE_W = 0.05
FLEXIBLE_MARGIN = 0.10  # a flexible family must cut held-out MAE by 10 % to beat a smooth one
# Trees cost time linear in rows and have only a few hundred leaves to place: beyond several
# thousand rows they gain little. Capping them keeps a 1000-node fleet with 10k rows per node
# within minutes on two cores. Smooth families always see every training row.
FLEXIBLE_MAX_ROWS = 8_000
# Trees predict a constant across a stretch of utilisation with no rows (a node that is either
# idle or busy), where a smooth curve interpolates; wider gaps than this rule trees out.
FLEXIBLE_MAX_UTIL_GAP = 0.05
FALLBACK_MAX_ROWS = 40_000  # pooled rows the fleet fallback trains on (subsampled per node)
UTIL_CHECK_GRID = np.linspace(0.0, 1.0, 101)
FALLBACK_NAME = "(fleet fallback)"


class FitError(RuntimeError):
    """The run cannot produce a trustworthy bundle; the message says why."""


@dataclass(frozen=True)
class FitSettings:
    """Every choice a training run makes; the CLI sets the first five, the rest are tuned here."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    last_resort_families: tuple[str, ...] = LAST_RESORT_FAMILIES
    test_fraction: float = DEFAULT_TEST_FRACTION
    min_rows: int = DEFAULT_MIN_ROWS
    seed: int = 0
    max_model_bytes: int | None = None  # None: no limit on a node's ONNX size
    monotonic_tolerance_w: float = DEFAULT_MONOTONIC_TOLERANCE_W
    fallback_max_rows: int = FALLBACK_MAX_ROWS
    flexible_max_rows: int = FLEXIBLE_MAX_ROWS
    flexible_max_util_gap: float = FLEXIBLE_MAX_UTIL_GAP


@dataclass
class NodeRows:
    """One node's rows, oldest first: float32 features in manifest order, watts, Unix seconds."""

    node: str
    time_s: np.ndarray
    features: np.ndarray
    power_w: np.ndarray

    def __len__(self) -> int:
        return len(self.power_w)

    def take(self, index: np.ndarray | slice) -> NodeRows:
        return NodeRows(self.node, self.time_s[index], self.features[index], self.power_w[index])


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


# --- pure pieces ---------------------------------------------------------------------------


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


def rfc3339(time_s: float) -> str:
    return datetime.fromtimestamp(float(time_s), tz=UTC).isoformat().replace("+00:00", "Z")


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
    util = rows.features[:, FEATURES.index("cpu_util")].astype(np.float64)
    ambient = rows.features[:, FEATURES.index("ambient_temp_c")].astype(np.float64)
    thermal = {}
    for name in CPU_TEMP_FEATURES:
        temp = rows.features[:, FEATURES.index(name)].astype(np.float64)
        slope = thermal_slope_c_per_util(util, ambient, temp)
        if slope is not None:
            thermal[f"{name}{THERMAL_SUFFIX}"] = round(slope, 3)
    return thermal


def largest_util_gap(util: np.ndarray) -> float:
    """Widest utilisation interval (within the seen range) that holds no row."""
    seen = np.unique(np.asarray(util, dtype=np.float64))
    return float(np.max(np.diff(seen))) if len(seen) > 1 else 0.0


def rank_candidates(candidates: Sequence[dict], families: Sequence[Family]) -> list[dict]:
    """Order by held-out MAE; a flexible family must beat the best smooth one by the margin."""
    kind = {family.name: family.kind for family in families}
    smooth_best = min(
        (c["metrics"]["mae_w"] for c in candidates if kind[c["family"]] == "smooth"),
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

    `model` is None when no family passes the monotonicity check.
    """
    names = list(settings.families) + [n for n in extra_families if n not in settings.families]
    families = resolve_families(names)
    typical = np.median(train.features, axis=0)
    fitted = {}
    candidates: list[dict] = []
    skipped: list[dict] = []
    util_gap = largest_util_gap(train.features[:, FEATURES.index("cpu_util")])
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
        model = fit_family(family, fit_rows.features, fit_rows.power_w, settings.seed)
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
        raise FitError(f"{train.node}: no model family applies: {skipped[0]['skipped']}")
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


def no_model_reason(candidates: Sequence[dict], settings: FitSettings) -> str:
    """Why `choose_model` found no model: every family dips, or the ones that don't are large."""
    if any(c.get("over_max_model_bytes") for c in candidates):
        return (
            "no family passed the monotonicity check with an ONNX within --max-model-bytes "
            f"{settings.max_model_bytes}"
        )
    return "no family passed the monotonicity check"


def choose_model_or_last_resort(
    train: NodeRows,
    test: NodeRows,
    settings: FitSettings,
    extra_families: Sequence[str] = (),
    thermal: Mapping[str, float] | None = None,
) -> tuple[object | None, dict | None, list[dict], dict]:
    """`choose_model` over the smooth families, then over the last-resort ones if none passed.

    The candidates list holds both rounds; the check is the passing model's, else the first's.
    """
    model, choice, candidates, check = choose_model(train, test, settings, extra_families, thermal)
    last_resort = [f for f in settings.last_resort_families if f not in settings.families]
    if model is not None or not last_resort:
        return model, choice, candidates, check
    try:
        model, choice, more_candidates, last_check = choose_model(
            train, test, replace(settings, families=tuple(last_resort)), thermal=thermal
        )
    except FitError as exc:  # e.g. trees ruled out by a gap in utilisation
        more_candidates = [{"family": ",".join(last_resort), "skipped": str(exc)}]
    else:
        if model is not None:
            check = last_check
    return model, choice, candidates + more_candidates, check


def fit_node(rows: NodeRows, settings: FitSettings) -> FitOutcome:
    """Everything one node needs: split, fit, choose, check, convert, parity. Runs in a worker."""
    n_rows = len(rows)
    power_range_w = [round(float(rows.power_w.min()), 2), round(float(rows.power_w.max()), 2)]
    if n_rows < max(settings.min_rows, 2):
        return FitOutcome(
            node=rows.node,
            rows_train=0,
            rows_test=n_rows,
            fallback_reason=f"{n_rows} clean rows < --min-rows {settings.min_rows}",
            thermal=node_thermal(rows),
            power_range_w=power_range_w,
            eval_rows=rows,
        )
    start = heldout_start_index(n_rows, settings.test_fraction)
    train, test = rows.take(slice(0, start)), rows.take(slice(start, None))
    outcome = FitOutcome(
        node=rows.node,
        rows_train=len(train),
        rows_test=len(test),
        thermal=node_thermal(train),
        power_range_w=power_range_w,
        train_window=[rfc3339(train.time_s[0]), rfc3339(train.time_s[-1])],
        test_window=[rfc3339(test.time_s[0]), rfc3339(test.time_s[-1])],
    )
    line = IdleToMaxLine.from_train(train.features[:, 0], train.power_w)
    outcome.baseline = {
        **error_metrics(test.power_w, line.predict_w(test.features[:, 0])),
        "idle_w": round(line.idle_w, 2),
        "max_w": round(line.max_w, 2),
    }
    model, choice, outcome.candidates, outcome.monotonic = choose_model_or_last_resort(
        train, test, settings, thermal=outcome.thermal
    )
    if model is None:
        outcome.fallback_reason = no_model_reason(outcome.candidates, settings)
        outcome.eval_rows = test
        return outcome
    outcome.family = choice["family"]
    outcome.metrics = choice["metrics"]
    outcome.onnx = choice.pop("onnx", None) or model_to_onnx(model, rows.features.shape[1])
    outcome.parity = check_parity(rows.node, model, outcome.onnx, test.features)
    outcome.heldout = (test.time_s, test.power_w, np.asarray(model.predict(test.features)))
    return outcome


# --- streaming over nodes ------------------------------------------------------------------


def iter_node_rows(frame: pd.DataFrame, fill: Mapping[str, str]) -> Iterator[NodeRows]:
    """One `NodeRows` per node, sorted by name, rows oldest first, feature fill applied.

    The columns are turned into arrays once and each node gets slices of them: no per-node
    DataFrame copies, no whole-table copy to fill one column (cleaning already sorted the table
    by node and time; an unsorted table is sorted once).
    """
    if not frame["node"].is_monotonic_increasing:
        frame = frame.sort_values(["node", "timestamp"], kind="stable")
    names = frame["node"].to_numpy()
    time_s = (frame["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
    features = frame[list(FEATURES)].to_numpy(np.float32)
    power_w = frame["power_w"].to_numpy(np.float64)
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]]) if len(names) else []
    for start, end in zip(starts, [*starts[1:], len(names)], strict=True):
        order = np.argsort(time_s[start:end], kind="stable") + start
        yield NodeRows(
            node=str(names[start]),
            time_s=time_s[order],
            features=fill_features(features[order], fill),
            power_w=power_w[order],
        )


def _limit_worker_threads() -> None:
    # One BLAS/OpenMP thread per worker: the pool already uses every core.
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _stream_outcomes(
    nodes: Iterator[NodeRows], settings: FitSettings, jobs: int
) -> Iterator[tuple[NodeRows, FitOutcome]]:
    """Yield (rows, outcome) as nodes finish, keeping at most ~2 x jobs nodes in flight."""
    if jobs <= 1:
        for rows in nodes:
            yield rows, fit_node(rows, settings)
        return
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_limit_worker_threads) as pool:
        in_flight: dict[Future, NodeRows] = {}
        for rows in nodes:
            in_flight[pool.submit(fit_node, rows, settings)] = rows
            while len(in_flight) >= 2 * jobs:
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    yield in_flight.pop(future), future.result()
        for future in list(in_flight):
            yield in_flight.pop(future), future.result()


@dataclass
class FallbackPool:
    """Subsampled train/test rows of every node with a model of its own, for the fleet model."""

    rows_per_node: int
    seed: int
    train: list[NodeRows] = field(default_factory=list)
    test: list[NodeRows] = field(default_factory=list)

    def add(self, rows: NodeRows, test_fraction: float) -> None:
        start = heldout_start_index(len(rows), test_fraction)
        rng = np.random.default_rng([self.seed, zlib.crc32(rows.node.encode())])
        for part, target, cap in (
            (rows.take(slice(0, start)), self.train, self.rows_per_node),
            (rows.take(slice(start, None)), self.test, max(1, self.rows_per_node // 4)),
        ):
            if len(part) > cap:
                part = part.take(np.sort(rng.choice(len(part), cap, replace=False)))
            target.append(part)

    def merged(self, parts: list[NodeRows]) -> NodeRows:
        return NodeRows(
            FALLBACK_NAME,
            np.concatenate([p.time_s for p in parts]),
            np.concatenate([p.features for p in parts]),
            np.concatenate([p.power_w for p in parts]),
        )


# --- the whole run -------------------------------------------------------------------------


class _InputAccount:
    """Turns cleaned batches into node rows while summing what the report says about input.

    Rows whose features are still empty after the fill are dropped here (counted as
    `feature_missing_after_fill`); a node found in two batches is refused, because its rows
    would be fitted twice as two halves.
    """

    def __init__(self) -> None:
        self.tally = CleaningTally()
        self.unfilled_rows = 0
        self.rows_used = 0
        self.start: pd.Timestamp | None = None
        self.end: pd.Timestamp | None = None
        self.nodes_seen: set[str] = set()

    def node_rows(self, batches: Iterable[CleanedMetrics]) -> Iterator[NodeRows]:
        for batch in batches:
            self.tally.add(batch)
            frame = batch.frame
            unfilled = unfillable_rows(frame, FEATURE_FILL)
            if unfilled.any():
                self.unfilled_rows += int(unfilled.sum())
                frame = frame[~unfilled]
            if frame.empty:
                continue
            self.rows_used += len(frame)
            first, last = frame["timestamp"].min(), frame["timestamp"].max()
            self.start = first if self.start is None else min(self.start, first)
            self.end = last if self.end is None else max(self.end, last)
            for rows in iter_node_rows(frame, FEATURE_FILL):
                if rows.node in self.nodes_seen:
                    raise FitError(
                        f"node {rows.node} has rows in two separately cleaned groups "
                        f"(the second in {', '.join(batch.sources)}); put all of a node's rows "
                        "in one group of files"
                    )
                self.nodes_seen.add(rows.node)
                yield rows

    def dropped(self) -> dict[str, int]:
        dropped = dict(self.tally.dropped)
        if self.unfilled_rows:
            dropped["feature_missing_after_fill"] = self.unfilled_rows
        return dropped

    def window(self) -> dict[str, str]:
        return {"start": rfc3339(self.start.timestamp()), "end": rfc3339(self.end.timestamp())}


@dataclass
class FitRun:
    report: dict
    report_dir: Path
    bundle_dir: Path | None  # None when the run failed before writing


def default_report_dir(out_dir: Path) -> Path:
    """`<parent>/<bundle-name>-report`: beside the bundle, never in it (ConfigMaps are small)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f"{out_dir.name}-report"


def fit_fleet(
    cleaned: CleanedMetrics | MetricsStream,
    out_dir: Path,
    *,
    report_dir: Path | None = None,
    settings: FitSettings = FitSettings(),
    jobs: int | None = None,
    progress: bool = True,
) -> FitRun:
    """Fit every node of `cleaned`, write the report, then (if every model is sound) the bundle.

    `cleaned` is one cleaned table, or a `MetricsStream` (`training.dataset.stream_metrics`)
    read and cleaned one group of files at a time while earlier groups' nodes are being fitted:
    then memory follows the largest group, not the fleet.

    Raises FitError / ExportError after writing the report when the bundle cannot be trusted.
    """
    resolve_families(settings.families)  # fail on a bad name before any work
    if not 0 < settings.test_fraction < 1:
        raise FitError(f"--test-fraction must be between 0 and 1, got {settings.test_fraction}")
    report_dir = Path(report_dir) if report_dir is not None else default_report_dir(out_dir)
    jobs = jobs or os.cpu_count() or 1
    if isinstance(cleaned, CleanedMetrics):
        batches: Iterable[CleanedMetrics] = [cleaned]
        n_nodes_expected = int(cleaned.frame["node"].nunique())
    else:
        batches, n_nodes_expected = cleaned, cleaned.n_nodes
    log.info(
        "fitting %d nodes with families %s on %d worker(s)",
        n_nodes_expected,
        ", ".join(settings.families),
        jobs,
    )
    account = _InputAccount()
    pool = FallbackPool(
        max(20, settings.fallback_max_rows // max(1, n_nodes_expected)), settings.seed
    )
    outcomes: dict[str, FitOutcome] = {}

    with HeldoutSeriesStore() as store:
        bar = tqdm(
            total=n_nodes_expected,
            desc="fitting nodes",
            unit="node",
            disable=not progress or not sys.stderr.isatty(),
        )
        for rows, outcome in _stream_outcomes(account.node_rows(batches), settings, jobs):
            if len(rows) >= max(settings.min_rows, 2):
                pool.add(rows, settings.test_fraction)
            if outcome.heldout is not None:
                store.put(outcome.node, *outcome.heldout)
                outcome.heldout = None
            outcomes[outcome.node] = outcome
            bar.update(1)
        bar.close()
        if not outcomes:
            raise FitError(f"no usable rows in {', '.join(account.tally.sources)} after cleaning")
        if not pool.train:
            raise FitError(
                f"no node has at least --min-rows {settings.min_rows} clean rows, so neither "
                f"per-node models nor the fleet fallback can be trained; lower --min-rows"
            )
        fallback, fallback_model = _fit_fallback(pool, settings)
        node_entries = [
            _report_entry(outcomes[node], fallback_model, settings) for node in sorted(outcomes)
        ]
        window = account.window()
        report = _build_report(account, settings, node_entries, fallback, window)
        write_report(report_dir, report)
        _plot(report_dir / PLOT_PNG, node_entries, store)

    parity = [o.parity for o in [*outcomes.values(), fallback] if o.parity is not None]
    node_models = {n: o.onnx for n, o in outcomes.items() if o.onnx is not None}
    node_info = {n: _manifest_entry(outcomes[n]) for n in node_models}
    export_bundle(
        out_dir,
        features=FEATURES,
        node_models=node_models,
        node_info=node_info,
        fallback_model=fallback.onnx,
        fallback_info=_fallback_manifest_entry(fallback, outcomes, settings),
        feature_fill=FEATURE_FILL,
        extra={
            "training_window": window,
            "training": {
                "tool": "training.fit",
                "families": list(settings.families),
                "test_fraction": settings.test_fraction,
                "seed": settings.seed,
            },
        },
        parity=parity,
    )
    return FitRun(report=report, report_dir=report_dir, bundle_dir=Path(out_dir))


def _fit_fallback(pool: FallbackPool, settings: FitSettings) -> tuple[FitOutcome, object]:
    """The fleet fallback, chosen like a node's model on the pooled rows: its outcome and its
    scikit-learn model (the report judges fallback nodes with it). FitError when none passes."""
    train, test = pool.merged(pool.train), pool.merged(pool.test)
    log.info("fitting the fleet fallback on %d pooled rows", len(train))
    thermal = node_thermal(train)
    model, choice, candidates, check = choose_model_or_last_resort(
        train, test, settings, extra_families=(UTIL_ONLY_FAMILY,), thermal=thermal
    )
    if model is None:
        raise FitError(
            f"fleet fallback: {no_model_reason(candidates, settings)} (largest dip "
            f"{check['max_drop_w']} W at the fleet's median temperatures)"
        )
    onnx = choice.pop("onnx", None) or model_to_onnx(model, train.features.shape[1])
    outcome = FitOutcome(
        node=FALLBACK_NAME,
        rows_train=len(train),
        rows_test=len(test),
        family=choice["family"],
        onnx=onnx,
        parity=check_parity(FALLBACK_NAME, model, onnx, test.features),
        metrics=choice["metrics"],
        candidates=candidates,
        monotonic=check,
        thermal=thermal,
    )
    return outcome, model


def _manifest_entry(outcome: FitOutcome) -> dict:
    """A node's manifest entry beyond its model file (contract 2's extra fields)."""
    entry = {
        "family": outcome.family,
        "rows_train": outcome.rows_train,
        "rows_test": outcome.rows_test,
        "metrics": outcome.metrics,
        "power_range_w": outcome.power_range_w,
    }
    if outcome.thermal:
        entry["thermal"] = outcome.thermal
    return entry


def _fallback_manifest_entry(
    fallback: FitOutcome, outcomes: Mapping[str, FitOutcome], settings: FitSettings
) -> dict:
    """The manifest's `fallback` entry beyond its model file, naming the nodes it serves."""
    return {
        "family": fallback.family,
        "min_rows": settings.min_rows,
        "rows_train": fallback.rows_train,
        "rows_test": fallback.rows_test,
        "metrics": fallback.metrics,
        "thermal": fallback.thermal,
        "nodes": sorted(n for n, o in outcomes.items() if o.onnx is None),
    }


def _report_entry(outcome: FitOutcome, fallback_model, settings: FitSettings) -> dict:
    entry = {
        "node": outcome.node,
        "model": "own" if outcome.onnx is not None else "fallback",
        "family": outcome.family,
        "fallback_reason": outcome.fallback_reason,
        "rows_train": outcome.rows_train,
        "rows_test": outcome.rows_test,
        "train_window": outcome.train_window,
        "test_window": outcome.test_window,
        "metrics": outcome.metrics,
        "baseline": outcome.baseline,
        "monotonic": outcome.monotonic,
        "candidates": outcome.candidates,
        "parity_max_diff_w": None if outcome.parity is None else outcome.parity.max_abs_diff_w,
        "onnx_bytes": None if outcome.onnx is None else len(outcome.onnx),
        "thermal": outcome.thermal,
        "power_range_w": outcome.power_range_w,
        "note": "",
    }
    if outcome.onnx is None:
        rows = outcome.eval_rows
        predicted_w = fallback_model.predict(rows.features)
        entry["metrics"] = error_metrics(rows.power_w, predicted_w)
        entry["family"] = "fleet"
        check = monotonic_verdict(
            fallback_model,
            np.median(rows.features, axis=0),
            settings.monotonic_tolerance_w,
            outcome.thermal,
        )
        if outcome.monotonic:  # keep the node's own failed check visible next to the fallback's
            check["own_families"] = outcome.monotonic
        entry["monotonic"] = check
        entry["note"] = f"fallback: {outcome.fallback_reason}"
    elif outcome.parity is not None and not outcome.parity.passed:
        entry["note"] = f"ONNX parity FAILED ({outcome.parity.max_abs_diff_w:.4g} W)"
    return entry


def _build_report(
    account: _InputAccount,
    settings: FitSettings,
    node_entries: list[dict],
    fallback: FitOutcome,
    window: dict,
) -> dict:
    return {
        "created_at": datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "input": {
            "sources": list(account.tally.sources),
            "rows_read": account.tally.rows_read,
            "rows_used": account.rows_used,
            "dropped": account.dropped(),
            "training_window": window,
        },
        "settings": {**asdict(settings), "families": list(settings.families)},
        "parity_tolerance_w": PARITY_TOLERANCE_W,
        "summary": summarise(node_entries),
        "fallback": {
            "family": fallback.family,
            "min_rows": settings.min_rows,
            "rows_train": fallback.rows_train,
            "rows_test": fallback.rows_test,
            "metrics": fallback.metrics,
            "candidates": fallback.candidates,
            "monotonic": fallback.monotonic,
            "parity_max_diff_w": fallback.parity.max_abs_diff_w,
            "thermal": fallback.thermal,
            "nodes": [e["node"] for e in node_entries if e["model"] != "own"],
        },
        "nodes": node_entries,
    }


def _plot(path: Path, node_entries: list[dict], store: HeldoutSeriesStore) -> None:
    mape = {
        e["node"]: e["metrics"]["mape_pct"]
        for e in node_entries
        if e["model"] == "own" and e["metrics"].get("mape_pct") is not None
    }
    series = [(label, node, store.get(node), mape[node]) for label, node in best_median_worst(mape)]
    plot_predicted_vs_measured(path, series)
    log.info("plot of predicted vs measured power: %s", path)


# --- command line --------------------------------------------------------------------------


@contextlib.contextmanager
def _metrics_input(args: argparse.Namespace) -> Iterator[MetricsStream]:
    """The input as a stream of node groups: files as they are, or a Prometheus collection
    spilled to node-group Parquet files (a temporary directory unless --keep-collected), so
    that neither collecting nor fitting holds the whole fleet in memory."""
    if args.input is not None:
        yield stream_metrics(args.input, cpu_util_percent=args.cpu_util_percent)
        return
    overrides: dict[str, object] = {"url": args.prometheus}
    if args.step is not None:
        overrides["step_s"] = args.step
    now = datetime.now(UTC)
    start, end = parse_time(args.start, now=now), parse_time(args.end, now=now)
    if end < start:
        raise FitError(f"--end ({end.isoformat()}) is before --start ({start.isoformat()})")
    config = load_collect_config(args.collect_config, **overrides)
    where = f"{config.url} [{start.isoformat()} .. {end.isoformat()}]"
    with contextlib.ExitStack() as cleanup:
        if args.keep_collected is not None:
            spill_dir = Path(args.keep_collected)
        else:
            spill_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="fit-")))
        try:
            files = collect_to_directory(
                config,
                start,
                end,
                spill_dir,
                progress=not args.quiet,
            )
        except CollectError as exc:  # a RuntimeError: say it as a user-facing failure
            raise FitError(str(exc)) from None
        if not files:
            raise FitError(
                f"Prometheus at {where} has no data for any node "
                "(check the range, the queries and the node mapping)"
            )
        # Kept files are the input a refit would read: name them; temporary ones are not.
        yield stream_metrics(
            spill_dir,
            cpu_util_percent=args.cpu_util_percent,
            source=None if args.keep_collected is not None else where,
        )


def setup_logging(quiet: bool) -> None:
    """Log to stderr: INFO normally, warnings and errors only with --quiet."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.fit",
        description=(
            "Fit one power model per node from collected metrics (contract 1), check them, and "
            "write an ONNX model bundle (contract 2) plus a training report beside it."
        ),
        epilog="model families: "
        + "; ".join(f"{f.name} ({f.kind}): {f.description}" for f in FAMILIES.values()),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        type=Path,
        help="contract-1 metrics: a CSV or Parquet file, or a directory of them. A directory "
        "is read and cleaned one group of files at a time (files sharing a node form one "
        "group), so per-node or per-rack files keep memory flat however large the fleet",
    )
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="collect from this Prometheus first (needs --start and --end), then fit. The "
        "collection is spilled to node-group Parquet files in a temporary directory ($TMPDIR, "
        "about 40 bytes per row; or --keep-collected) and fitted group by group, so memory "
        "stays flat however large the fleet",
    )
    parser.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    parser.add_argument(
        "--start", help="collection start: RFC 3339, Unix seconds, or relative like -7d"
    )
    parser.add_argument(
        "--end", help="collection end: RFC 3339, Unix seconds, now, or relative like -1h"
    )
    parser.add_argument(
        "--step",
        type=float,
        help="collection resolution in seconds (default: the collect config's, 60 s)",
    )
    parser.add_argument(
        "--keep-collected",
        type=Path,
        metavar="DIR",
        help="with --prometheus: keep the collected metrics in DIR (node-group Parquet files, "
        "what `training.collect --nodes-per-file` writes) to refit later with --input DIR",
    )
    parser.add_argument(
        "--collect-config",
        type=Path,
        help="collect settings file (queries, sensor names, instance->node mapping)",
    )
    parser.add_argument(
        "--report-dir",
        type=Path,
        help="where report.json, report.txt and the plot go "
        "(default: <out's parent>/<out's name>-report, outside the bundle)",
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULT_TEST_FRACTION,
        help="newest share of each node's rows held out for choosing and scoring models, "
        "split by time, never shuffled (default %(default)s)",
    )
    parser.add_argument(
        "--min-rows",
        type=int,
        default=DEFAULT_MIN_ROWS,
        help="nodes with fewer clean rows use the fleet fallback model "
        "(default %(default)s, about 8 h at 60 s)",
    )
    parser.add_argument(
        "--families",
        default=",".join(DEFAULT_FAMILIES),
        help="comma-separated model families to try per node (default %(default)s); a node "
        f"where none passes the monotonicity checks tries {', '.join(LAST_RESORT_FAMILIES)} "
        "before the fleet fallback",
    )
    parser.add_argument(
        "--max-model-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="largest ONNX file a node's model may have; a family over it is passed over for "
        "the next-ranked one, and a node with none within it uses the fleet fallback. Size a "
        "fleet bundle for ConfigMaps (1 MiB): smooth families are ~1-3 KiB, rfmono ~15-60 KiB "
        "(default: no limit)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="worker processes fitting nodes in parallel (default 0 = all cores)",
    )
    parser.add_argument(
        "--cpu-util-percent",
        action="store_true",
        help="the input's cpu_util is in percent (0..100), not a fraction: divide by 100",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed for row subsampling and the tree families (default 0)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="no progress bar, warnings and errors only"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # `--start -7d`: argparse would read `-7d` as a flag; collect's CLI has the same fix.
    args = parser.parse_args(attach_relative_times(sys.argv[1:] if argv is None else argv))
    setup_logging(args.quiet)
    if args.prometheus is not None and (args.start is None or args.end is None):
        parser.error("--prometheus needs --start and --end")
    if args.prometheus is None and (
        args.start or args.end or args.collect_config or args.step or args.keep_collected
    ):
        parser.error(
            "--start, --end, --step, --collect-config and --keep-collected only apply with "
            "--prometheus"
        )
    settings = FitSettings(
        families=tuple(name.strip() for name in args.families.split(",") if name.strip()),
        test_fraction=args.test_fraction,
        min_rows=args.min_rows,
        seed=args.seed,
        max_model_bytes=args.max_model_bytes,
    )
    try:
        resolve_families(settings.families)
        with _metrics_input(args) as metrics:
            run = fit_fleet(
                metrics,
                args.out,
                report_dir=args.report_dir,
                settings=settings,
                jobs=args.jobs or None,
                progress=not args.quiet,
            )
    except (MetricsInputError, FitError, ExportError, ValueError, OSError) as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = run.report["summary"]
    log.info(
        "bundle written to %s; report in %s; median held-out MAPE %s %% over %d own models",
        run.bundle_dir,
        run.report_dir,
        summary["median_mape_pct"],
        summary["nodes_own_model"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
