"""Fitting the fleet: every node in worker processes, the fallbacks, the report, the bundle.

`fit_fleet` streams cleaned node rows (one table, or a `MetricsStream` read one group of files
at a time) into worker processes running `training.fit.node.fit_node`, at most a few nodes in
flight; a finished node leaves behind only its `FitOutcome` (ONNX bytes and figures) and, on
disk, its held-out predictions for the plot. Meanwhile a subsample of every eligible node's
held-out rows is kept to judge the fleet fallback on (`FallbackSample`, pooled in node order so
the fallback does not depend on which worker finished first).

Then `finish_run`, shared with Dask runs (`training.fit.distributed`, which fit their nodes
elsewhere): the fleet's shape from the nodes' own steady-state curves (`training.fit.fallback`)
gives the fleet fallback, judged on the pooled rows; each node left without a model gets the
fallback scaled to its power, or is judged on the fleet fallback, where its rows are (`judge`:
here, or on the worker that read them). Then the report is written, and only if every model is
sound, the bundle.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from livedata.metrics_table import FEATURES, NODE, TIMESTAMP
from training.dataset import CleanedMetrics, CleaningTally, MetricsStream
from training.export import PARITY_TOLERANCE_W, export_bundle
from training.families import resolve_families
from training.fit.fallback import FleetShape, fleet_fallback, fleet_shape, scale_fallback
from training.fit.node import (
    FALLBACK_NAME,
    FitOutcome,
    NodeRows,
    fit_node,
    heldout_start_index,
    iter_node_rows,
    monotonic_verdict,
    rfc3339,
    unfillable_rows,
)
from training.fit.settings import DEFAULT_SETTINGS, FEATURE_FILL, FitError, FitSettings
from training.report import (
    PLOT_PNG,
    HeldoutSeriesStore,
    error_metrics,
    plot_heldout_nodes,
    summarise,
    write_report,
)

log = logging.getLogger("training.fit")  # the package's name: log lines read as they always have


# --- streaming over nodes ------------------------------------------------------------------


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


# --- the fleet fallback's pooled held-out rows -----------------------------------------------


def fallback_rows_per_node(settings: FitSettings, n_nodes: int) -> int:
    """Held-out rows each eligible node gives the fleet fallback's test: an equal share of
    `fallback_max_rows` over the fleet, at least 5."""
    return max(5, settings.fallback_max_rows // max(1, n_nodes))


def gives_fallback_rows(rows: NodeRows, settings: FitSettings) -> bool:
    """A node with enough rows for a model of its own also lends held-out rows to the pool."""
    return len(rows) >= max(settings.min_rows, 2)


@dataclass
class FallbackSample:
    """A node's held-out rows for judging the fleet fallback: all of them, or `rows_per_node`
    chosen at random (seeded by the run and the node), in time order.

    How many rows a node gives depends on the fleet's size, which a Dask worker may only have an
    estimate of when it samples (Prometheus's index can count nodes that have no data). So a
    sample records the size it was taken for and the node's held-out rows before sampling, and
    `fits` says whether it is exactly the sample of another size; when not, the node's group is
    read again (`training.fit.distributed`).
    """

    node: str
    test: NodeRows  # at most rows_per_node held-out rows, in time order
    rows_per_node: int  # the size it was taken for
    test_rows: int  # the node's held-out rows before sampling

    @classmethod
    def take(
        cls, rows: NodeRows, test_fraction: float, seed: int, rows_per_node: int
    ) -> FallbackSample:
        test = rows.take(slice(heldout_start_index(len(rows), test_fraction), None))
        sample = test
        if len(test) > rows_per_node:
            rng = np.random.default_rng([seed, zlib.crc32(rows.node.encode())])
            sample = test.take(np.sort(rng.choice(len(test), rows_per_node, replace=False)))
        return cls(rows.node, sample, rows_per_node, len(test))

    def fits(self, rows_per_node: int) -> bool:
        """Is it the sample a run of `rows_per_node` would take? (Either the size it was taken
        for, or every held-out row at both sizes.)"""
        return rows_per_node == self.rows_per_node or self.test_rows <= min(
            rows_per_node, self.rows_per_node
        )


@dataclass
class FallbackPool:
    """The held-out samples of every node with enough rows: the fleet fallback's test.

    Merged in node order, not in the order nodes finished: worker processes finish in any
    order, and the fallback's figures must not change from run to run."""

    rows_per_node: int
    parts: dict[str, NodeRows] = field(default_factory=dict)

    def add(self, sample: FallbackSample) -> None:
        if not sample.fits(self.rows_per_node):
            raise ValueError(
                f"{sample.node}: fallback sample taken for {sample.rows_per_node} rows, the pool "
                f"takes {self.rows_per_node}"
            )
        self.parts[sample.node] = sample.test

    def merged(self) -> NodeRows:
        parts = [self.parts[node] for node in sorted(self.parts)]
        return NodeRows(
            FALLBACK_NAME,
            np.concatenate([p.time_s for p in parts]),
            np.concatenate([p.features for p in parts]),
            np.concatenate([p.power_w for p in parts]),
        )


# --- the input ---------------------------------------------------------------------------------


class InputAccount:
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
            first, last = frame[TIMESTAMP].min(), frame[TIMESTAMP].max()
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

    def merge(self, other: InputAccount, where: str) -> None:
        """Add another account's input (a node group read elsewhere, `where` names it)."""
        for node in sorted(self.nodes_seen & other.nodes_seen):
            raise FitError(
                f"node {node} has rows in two separately read node groups (the second: "
                f"{where}); all of a node's series must be in one group"
            )
        self.nodes_seen |= other.nodes_seen
        self.tally.rows_read += other.tally.rows_read
        self.tally.rows_kept += other.tally.rows_kept
        for reason, count in other.tally.dropped.items():
            self.tally.dropped[reason] = self.tally.dropped.get(reason, 0) + count
        self.tally.sources += [s for s in other.tally.sources if s not in self.tally.sources]
        for reason, example in other.tally.examples.items():
            self.tally.examples.setdefault(reason, example)
        self.unfilled_rows += other.unfilled_rows
        self.rows_used += other.rows_used
        for mine, theirs, pick in (("start", other.start, min), ("end", other.end, max)):
            if theirs is not None:
                current = getattr(self, mine)
                setattr(self, mine, theirs if current is None else pick(current, theirs))

    def dropped(self) -> dict[str, int]:
        dropped = dict(self.tally.dropped)
        if self.unfilled_rows:
            dropped["feature_missing_after_fill"] = self.unfilled_rows
        return dropped

    def window(self) -> dict[str, str]:
        return {"start": rfc3339(self.start.timestamp()), "end": rfc3339(self.end.timestamp())}


# --- the whole run, in this process -------------------------------------------------------------


@dataclass
class FitRun:
    """What a run wrote: the report (also in `report_dir`) and the bundle directory."""

    report: dict
    report_dir: Path
    bundle_dir: Path | None  # None when the run failed before writing


def default_report_dir(out_dir: Path) -> Path:
    """`<parent>/<bundle-name>-report`: beside the bundle, never in it (ConfigMaps are small)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f"{out_dir.name}-report"


def check_settings(settings: FitSettings) -> None:
    """Fail on a bad family name or test fraction before any work."""
    resolve_families(settings.families)
    if not 0 < settings.test_fraction < 1:
        raise FitError(f"--test-fraction must be between 0 and 1, got {settings.test_fraction}")


@dataclass
class NodeRowsKept:
    """The rows a node without a model of its own keeps where it was fitted, for its fallback:
    its older rows (the scaled fallback is fitted to them) and its newest (it is judged on
    them). They never leave a Dask worker; `FitOutcome`s travel without them."""

    rows: NodeRows | None
    eval_rows: NodeRows


def keep_fallback_rows(outcome: FitOutcome) -> NodeRowsKept | None:
    """Take a fallback node's rows out of its outcome (None for a node with its own model)."""
    if outcome.eval_rows is None:
        outcome.rows = None
        return None
    kept = NodeRowsKept(outcome.rows, outcome.eval_rows)
    outcome.rows = outcome.eval_rows = None
    return kept


def fit_fleet(
    cleaned: CleanedMetrics | MetricsStream,
    out_dir: Path,
    *,
    report_dir: Path | None = None,
    settings: FitSettings = DEFAULT_SETTINGS,
    jobs: int | None = None,
    progress: bool = True,
) -> FitRun:
    """Fit every node of `cleaned`, write the report, then (if every model is sound) the bundle.

    `cleaned` is one cleaned table, or a `MetricsStream` (`training.dataset.stream_metrics`)
    read and cleaned one group of files at a time while earlier groups' nodes are being fitted:
    then memory follows the largest group, not the fleet.

    Raises FitError / ExportError after writing the report when the bundle cannot be trusted.
    """
    check_settings(settings)
    report_dir = Path(report_dir) if report_dir is not None else default_report_dir(out_dir)
    jobs = jobs or os.cpu_count() or 1
    if isinstance(cleaned, CleanedMetrics):
        batches: Iterable[CleanedMetrics] = [cleaned]
        n_nodes_expected = int(cleaned.frame[NODE].nunique())
    else:
        batches, n_nodes_expected = cleaned, cleaned.n_nodes
    log.info(
        "fitting %d nodes with families %s on %d worker(s)",
        n_nodes_expected,
        ", ".join(settings.families),
        jobs,
    )
    account = InputAccount()
    pool = FallbackPool(fallback_rows_per_node(settings, n_nodes_expected))
    outcomes: dict[str, FitOutcome] = {}
    kept: dict[str, NodeRowsKept] = {}

    with HeldoutSeriesStore() as store:
        bar = tqdm(
            total=n_nodes_expected,
            desc="fitting nodes",
            unit="node",
            disable=not progress or not sys.stderr.isatty(),
        )
        for rows, outcome in _stream_outcomes(account.node_rows(batches), settings, jobs):
            if gives_fallback_rows(rows, settings):
                pool.add(
                    FallbackSample.take(
                        rows, settings.test_fraction, settings.seed, pool.rows_per_node
                    )
                )
            if outcome.heldout is not None:
                store.put(outcome.node, *outcome.heldout)
                outcome.heldout = None
            node_kept = keep_fallback_rows(outcome)
            if node_kept is not None:
                kept[outcome.node] = node_kept
            outcomes[outcome.node] = outcome
            bar.update(1)
        bar.close()

        def judge_here(
            shape: FleetShape, fleet_model: object, nodes: list[FitOutcome]
        ) -> dict[str, dict]:
            return {
                o.node: fallback_for_node(o, kept[o.node], shape, fleet_model, settings)
                for o in nodes
            }

        return finish_run(
            FleetFits(outcomes, pool, account),
            out_dir,
            report_dir=report_dir,
            settings=settings,
            judge=judge_here,
            heldout_series=store.get,
        )


# --- the fallbacks, the report and the bundle, wherever the nodes were fitted --------------------


@dataclass
class FleetFits:
    """What fitting every node left behind, wherever the nodes were fitted: the outcomes
    (without held-out series or rows), the fallback's pooled held-out samples, the input."""

    outcomes: dict[str, FitOutcome]
    pool: FallbackPool
    account: InputAccount


# judge(fleet shape, fleet fallback model, outcomes of the nodes without a model of their own)
# -> node -> `fallback_for_node`'s answer, found where the nodes' rows are
FallbackJudge = Callable[[FleetShape, object, list[FitOutcome]], Mapping[str, dict]]

# The outcome fields `scale_fallback` sets: what a scaled fallback sends back to the client.
SCALED_FIELDS = ("family", "onnx", "parity", "metrics", "monotonic", "scaled", "steady_curve_w")


def fallback_for_node(
    outcome: FitOutcome,
    kept: NodeRowsKept,
    shape: FleetShape,
    fleet_model: object,
    settings: FitSettings,
) -> dict:
    """What serves a node without a model of its own, worked out where its rows are.

    `{"scaled": {field: value}}`: the fleet's shape scaled to its readings (`SCALED_FIELDS` of
    its outcome: the ONNX bytes and the figures); else `{"fleet": judgement}`: the fleet
    fallback's error on its newest rows and its monotonic check there. Small either way.
    """
    node = replace(outcome, rows=kept.rows, eval_rows=kept.eval_rows)
    if scale_fallback(node, shape):
        return {"scaled": {name: getattr(node, name) for name in SCALED_FIELDS}}
    return {"fleet": judge_fallback(fleet_model, kept.eval_rows, outcome, settings)}


def judge_fallback(model, rows: NodeRows, outcome: FitOutcome, settings: FitSettings) -> dict:
    """The fleet fallback on a node it serves: its error on the node's rows and whether it
    rises with utilisation at the node's median temperatures (the report's figures)."""
    check = monotonic_verdict(
        model, np.median(rows.features, axis=0), settings.monotonic_tolerance_w, outcome.thermal
    )
    if outcome.monotonic:  # keep the node's own failed check visible next to the fallback's
        check["own_families"] = outcome.monotonic
    return {"metrics": error_metrics(rows.power_w, model.predict(rows.features)), "check": check}


def finish_run(
    fits: FleetFits,
    out_dir: Path,
    *,
    report_dir: Path,
    settings: FitSettings,
    judge: FallbackJudge,
    heldout_series: Callable[[str], dict[str, np.ndarray] | None],
    report_extra: Mapping[str, object] | None = None,
) -> FitRun:
    """Build the fallbacks, write the report and the plot, then (if sound) the bundle.

    `judge` scales the fleet's shape to, or judges the fleet fallback on, the nodes without a
    model of their own where their rows are (this process, or the Dask workers that read them);
    `heldout_series` fetches the plot's few nodes' series.
    """
    outcomes, pool, account = fits.outcomes, fits.pool, fits.account
    if not outcomes:
        raise FitError(f"no usable rows in {', '.join(account.tally.sources)} after cleaning")
    if not pool.parts:
        raise FitError(
            f"no node has at least --min-rows {settings.min_rows} clean rows, so neither "
            f"per-node models nor the fleet fallback can be trained; lower --min-rows"
        )
    fallback, judged = _fallbacks(outcomes, pool, settings, judge)
    node_entries = [_report_entry(outcomes[node], judged.get(node)) for node in sorted(outcomes)]
    window = account.window()
    report = _build_report(account, settings, node_entries, fallback, window)
    report_dir.mkdir(parents=True, exist_ok=True)
    _plot(report_dir / PLOT_PNG, node_entries, heldout_series)  # first: it may fetch series
    report.update(report_extra or {})
    write_report(report_dir, report)

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


def _fallbacks(
    outcomes: Mapping[str, FitOutcome],
    pool: FallbackPool,
    settings: FitSettings,
    judge: FallbackJudge,
) -> tuple[FitOutcome, dict[str, dict]]:
    """The fleet fallback's outcome, and what `judge` found for each node without a model of its
    own (a scaled fallback is applied to its outcome here)."""
    # in node order: the fleet's shape must not depend on which worker finished first
    own = [
        outcomes[n].steady_curve_w
        for n in sorted(outcomes)
        if outcomes[n].fallback_reason is None and outcomes[n].onnx
    ]
    if not own:
        reasons = sorted({o.fallback_reason for o in outcomes.values() if o.fallback_reason})
        raise FitError(
            "no node got a model of its own, so there is no fleet to build a fallback from: "
            + "; ".join(reasons[:3])
        )
    shape = fleet_shape(own, settings.shape_prior)
    fallback, model = fleet_fallback(shape, pool.merged(), settings)
    without = [outcomes[n] for n in sorted(outcomes) if outcomes[n].fallback_reason is not None]
    judged = dict(judge(shape, model, without)) if without else {}
    for outcome in without:
        answer = judged.get(outcome.node)
        if answer is None:
            raise FitError(f"{outcome.node}: its fallback was not worked out on its rows")
        for name, value in answer.get("scaled", {}).items():
            setattr(outcome, name, value)
    log.info(
        "fleet fallback: idle %.0f W + %.0f W over the fleet's shape (%s); %d node(s) without "
        "a model of their own scaled to their measured power",
        shape.idle_w,
        shape.dynamic_w,
        shape.source,
        sum("scaled" in answer for answer in judged.values()),
    )
    return fallback, judged


def _manifest_entry(outcome: FitOutcome) -> dict:
    """A node's manifest entry beyond its model file (contract 2's extra fields)."""
    entry = {
        "family": outcome.family,
        "rows_train": outcome.rows_train,
        "rows_test": outcome.rows_test,
        "metrics": outcome.metrics,
        "power_range_w": outcome.power_range_w,
        # above this load the model extrapolates (the extender's /explain says so)
        "max_util_measured": outcome.max_util_measured,
    }
    if outcome.extrapolation_interval is not None:
        # how sure the model is above it: ratios to its prediction (predictor.curves)
        entry["extrapolation_interval"] = outcome.extrapolation_interval
    if outcome.thermal:
        entry["thermal"] = outcome.thermal
    if outcome.scaled is not None:
        entry["scaled_fallback"] = {"reason": outcome.fallback_reason, **outcome.scaled}
    return entry


def _fallback_manifest_entry(
    fallback: FitOutcome, outcomes: Mapping[str, FitOutcome], settings: FitSettings
) -> dict:
    """The manifest's `fallback` entry beyond its model file, naming the nodes it serves."""
    return {
        "family": fallback.family,
        "min_rows": settings.min_rows,
        "rows_test": fallback.rows_test,
        "metrics": fallback.metrics,
        "thermal": fallback.thermal,
        "nodes": sorted(n for n, o in outcomes.items() if o.onnx is None),
    }


def _report_entry(outcome: FitOutcome, fallback_answer: dict | None) -> dict:
    entry = {
        "node": outcome.node,
        "model": "own" if outcome.fallback_reason is None else "fallback",
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
        "max_util_measured": outcome.max_util_measured,
        "loads_shown_pct": outcome.loads_shown_pct,
        "extrapolation_interval": outcome.extrapolation_interval,
        "facts": outcome.facts,
        "steady_curve_w": outcome.steady_curve_w,
        "note": "",
    }
    if outcome.scaled is not None:
        entry["scaled_fallback"] = outcome.scaled
        entry["note"] = (
            f"fallback scaled to its power (idle {outcome.scaled['idle_w']:.0f} W): "
            f"{outcome.fallback_reason}"
        )
    elif outcome.fallback_reason is not None:
        judgement = (fallback_answer or {}).get("fleet")
        if judgement is None:
            raise FitError(f"{outcome.node}: the fleet fallback was not judged on its rows")
        entry["metrics"] = judgement["metrics"]
        entry["family"] = "fleet"
        entry["monotonic"] = judgement["check"]
        entry["note"] = f"fleet fallback: {outcome.fallback_reason}"
    if outcome.parity is not None and not outcome.parity.passed:
        entry["note"] = f"ONNX parity FAILED ({outcome.parity.max_abs_diff_w:.4g} W)"
    return entry


def _build_report(
    account: InputAccount,
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
        "settings": _settings_entry(settings),
        "parity_tolerance_w": PARITY_TOLERANCE_W,
        "summary": summarise(node_entries),
        "fallback": {
            "family": fallback.family,
            "min_rows": settings.min_rows,
            "rows_test": fallback.rows_test,
            "steady_curve_w": fallback.steady_curve_w,
            "metrics": fallback.metrics,
            "candidates": fallback.candidates,
            "monotonic": fallback.monotonic,
            "parity_max_diff_w": fallback.parity.max_abs_diff_w,
            "thermal": fallback.thermal,
            "nodes": [e["node"] for e in node_entries if e["onnx_bytes"] is None],
            "scaled_nodes": [e["node"] for e in node_entries if e.get("scaled_fallback")],
        },
        "nodes": node_entries,
    }


def _settings_entry(settings: FitSettings) -> dict:
    """The settings as JSON: the shape prior by what it was learned from, not its matrices."""
    entry = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "shape_prior"}
    prior = settings.shape_prior
    entry["families"] = list(settings.families)
    entry["last_resort_families"] = list(settings.last_resort_families)
    entry["shape_prior"] = (
        "shipped: training/data/specpower_shapes.csv, specpower_modern_shapes.csv"
        if prior is None
        else f"given: {prior.n_servers} server curves"
    )
    return entry


def _plot(
    path: Path,
    node_entries: list[dict],
    heldout_series: Callable[[str], dict[str, np.ndarray] | None],
) -> None:
    # which nodes, which panels: training.report; the series are fetched for those nodes only
    plot_heldout_nodes(path, node_entries, heldout_series)
    log.info("plot of predicted vs measured power: %s", path)
