"""Fitting the fleet: every node in worker processes, the fleet fallback, the report, the bundle.

`fit_fleet` streams cleaned node rows (one table, or a `MetricsStream` read one group of files
at a time) into worker processes running `training.fit.node.fit_node`, at most a few nodes in
flight; a finished node leaves behind only its `FitOutcome` (ONNX bytes and figures) and, on
disk, its held-out predictions for the plot. Meanwhile a subsample of every eligible node's
rows is pooled for the fleet fallback (`FallbackSample`, merged in node order so the fallback
does not depend on which worker finished first), fitted last the same way (with a
utilisation-only family added to its candidates) into the same `FitOutcome`. Then
`finish_run` writes the report, and only if every model is sound, the bundle; Dask runs
(`training.fit.distributed`) fit their nodes elsewhere and finish the same way.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from livedata.metrics_table import FEATURES, NODE, TIMESTAMP
from training.dataset import CleanedMetrics, CleaningTally, MetricsStream
from training.export import PARITY_TOLERANCE_W, check_parity, export_bundle, model_to_onnx
from training.families import UTIL_ONLY_FAMILY, resolve_families
from training.fit.node import (
    FALLBACK_NAME,
    FitOutcome,
    NodeRows,
    choose_model_or_last_resort,
    fit_node,
    heldout_start_index,
    iter_node_rows,
    monotonic_verdict,
    no_model_reason,
    node_thermal,
    rfc3339,
    unfillable_rows,
)
from training.fit.settings import DEFAULT_SETTINGS, FEATURE_FILL, FitError, FitSettings
from training.report import (
    PLOT_PNG,
    HeldoutSeriesStore,
    best_median_worst,
    error_metrics,
    plot_predicted_vs_measured,
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


def fallback_rows_per_node(settings: FitSettings, n_nodes: int) -> int:
    """Training rows each eligible node gives the fleet fallback: an equal share of
    `fallback_max_rows` over the fleet, at least 20 (held-out rows: a quarter of it)."""
    return max(20, settings.fallback_max_rows // max(1, n_nodes))


@dataclass
class FallbackSample:
    """A node's rows for the fleet fallback, in a random order seeded by the run and the node.

    The first k rows of that order are a uniform sample of k, whatever k is: a sample taken
    with more rows than the run needs (on a Dask worker, before the fleet's size is known) is
    `cut` later to exactly the rows a smaller one would hold. `train_rows` / `test_rows` count
    the node's rows before sampling, so `covers` knows when the sample holds all of them.
    """

    node: str
    train: NodeRows  # at most rows_per_node rows, in sample order
    test: NodeRows  # at most max(1, rows_per_node // 4) rows, in sample order
    train_rows: int
    test_rows: int

    @classmethod
    def take(
        cls, rows: NodeRows, test_fraction: float, seed: int, rows_per_node: int
    ) -> FallbackSample:
        start = heldout_start_index(len(rows), test_fraction)
        train, test = rows.take(slice(0, start)), rows.take(slice(start, None))
        rng = np.random.default_rng([seed, zlib.crc32(rows.node.encode())])
        train_order, test_order = rng.permutation(len(train)), rng.permutation(len(test))
        return cls(
            node=rows.node,
            train=train.take(train_order[:rows_per_node]),
            test=test.take(test_order[: _test_cap(rows_per_node)]),
            train_rows=len(train),
            test_rows=len(test),
        )

    def covers(self, rows_per_node: int) -> bool:
        """Does it hold every row a sample of `rows_per_node` would?"""
        return len(self.train) >= min(self.train_rows, rows_per_node) and len(self.test) >= min(
            self.test_rows, _test_cap(rows_per_node)
        )

    def cut(self, rows_per_node: int) -> tuple[NodeRows, NodeRows]:
        """(train, test) of a sample of `rows_per_node`, back in time order."""
        if not self.covers(rows_per_node):
            raise ValueError(f"{self.node}: fallback sample too small for {rows_per_node} rows")
        return (
            _time_ordered(self.train.take(slice(0, rows_per_node))),
            _time_ordered(self.test.take(slice(0, _test_cap(rows_per_node)))),
        )


def _test_cap(rows_per_node: int) -> int:
    return max(1, rows_per_node // 4)


def _time_ordered(rows: NodeRows) -> NodeRows:
    return rows.take(np.argsort(rows.time_s, kind="stable"))


@dataclass
class FallbackPool:
    """Subsampled train/test rows of every node with a model of its own, for the fleet model.

    Merged in node order, not in the order nodes finished: worker processes finish in any
    order, and the fallback must not change from run to run."""

    rows_per_node: int
    parts: dict[str, tuple[NodeRows, NodeRows]] = field(default_factory=dict)

    def add(self, sample: FallbackSample) -> None:
        self.parts[sample.node] = sample.cut(self.rows_per_node)

    def merged(self) -> tuple[NodeRows, NodeRows]:
        """(train, test) of every node's sample, in node order."""
        nodes = sorted(self.parts)
        return (
            _concatenated([self.parts[node][0] for node in nodes]),
            _concatenated([self.parts[node][1] for node in nodes]),
        )


def _concatenated(parts: list[NodeRows]) -> NodeRows:
    return NodeRows(
        FALLBACK_NAME,
        np.concatenate([p.time_s for p in parts]),
        np.concatenate([p.features for p in parts]),
        np.concatenate([p.power_w for p in parts]),
    )


def gives_fallback_rows(rows: NodeRows, settings: FitSettings) -> bool:
    """A node with enough rows for a model of its own also feeds the fleet fallback."""
    return len(rows) >= max(settings.min_rows, 2)


# --- the whole run -------------------------------------------------------------------------


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
    eval_rows: dict[str, NodeRows] = {}

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
            if outcome.eval_rows is not None:
                eval_rows[outcome.node] = outcome.eval_rows
                outcome.eval_rows = None
            outcomes[outcome.node] = outcome
            bar.update(1)
        bar.close()

        def judge_here(model: object, nodes: list[FitOutcome]) -> dict[str, dict]:
            return {o.node: judge_fallback(model, eval_rows[o.node], o, settings) for o in nodes}

        return finish_run(
            FleetFits(outcomes, pool, account),
            out_dir,
            report_dir=report_dir,
            settings=settings,
            judge=judge_here,
            heldout_series=store.get,
        )


def check_settings(settings: FitSettings) -> None:
    """Fail on a bad family name or test fraction before any work."""
    resolve_families(settings.families)
    if not 0 < settings.test_fraction < 1:
        raise FitError(f"--test-fraction must be between 0 and 1, got {settings.test_fraction}")


@dataclass
class FleetFits:
    """What fitting every node left behind, wherever the nodes were fitted: the outcomes
    (without held-out series or evaluation rows), the fallback's pooled sample, the input."""

    outcomes: dict[str, FitOutcome]
    pool: FallbackPool
    account: InputAccount


# judge(fallback model, outcomes of the nodes it serves) -> node -> `judge_fallback`'s answer
FallbackJudge = Callable[[object, list[FitOutcome]], Mapping[str, dict]]


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
    """Fit the fleet fallback, write the report and the plot, then (if sound) the bundle.

    `judge` scores the fallback on the nodes it serves where their rows are (this process, or
    the Dask workers that read them); `heldout_series` fetches the plot's few nodes' series.
    """
    outcomes, pool, account = fits.outcomes, fits.pool, fits.account
    if not outcomes:
        raise FitError(f"no usable rows in {', '.join(account.tally.sources)} after cleaning")
    if not pool.parts:
        raise FitError(
            f"no node has at least --min-rows {settings.min_rows} clean rows, so neither "
            f"per-node models nor the fleet fallback can be trained; lower --min-rows"
        )
    fallback, fallback_model = _fit_fallback(pool, settings)
    judged = judge(
        fallback_model, [outcomes[n] for n in sorted(outcomes) if outcomes[n].onnx is None]
    )
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


def _fit_fallback(pool: FallbackPool, settings: FitSettings) -> tuple[FitOutcome, object]:
    """The fleet fallback, chosen like a node's model on the pooled rows: its outcome and its
    scikit-learn model (the report judges fallback nodes with it). FitError when none passes."""
    train, test = pool.merged()
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


def judge_fallback(model, rows: NodeRows, outcome: FitOutcome, settings: FitSettings) -> dict:
    """The fleet fallback on a node it serves: its error on the node's rows and whether it
    rises with utilisation at the node's median temperatures (the report's figures)."""
    check = monotonic_verdict(
        model, np.median(rows.features, axis=0), settings.monotonic_tolerance_w, outcome.thermal
    )
    if outcome.monotonic:  # keep the node's own failed check visible next to the fallback's
        check["own_families"] = outcome.monotonic
    return {"metrics": error_metrics(rows.power_w, model.predict(rows.features)), "check": check}


def _report_entry(outcome: FitOutcome, fallback_judgement: dict | None) -> dict:
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
        if fallback_judgement is None:
            raise FitError(f"{outcome.node}: the fleet fallback was not judged on its rows")
        entry["metrics"] = fallback_judgement["metrics"]
        entry["family"] = "fleet"
        entry["monotonic"] = fallback_judgement["check"]
        entry["note"] = f"fallback: {outcome.fallback_reason}"
    elif outcome.parity is not None and not outcome.parity.passed:
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


def _plot(
    path: Path,
    node_entries: list[dict],
    heldout_series: Callable[[str], dict[str, np.ndarray] | None],
) -> None:
    mape = {
        e["node"]: e["metrics"]["mape_pct"]
        for e in node_entries
        if e["model"] == "own" and e["metrics"].get("mape_pct") is not None
    }
    series = [
        (label, node, heldout_series(node), mape[node]) for label, node in best_median_worst(mape)
    ]
    plot_predicted_vs_measured(path, series)
    log.info("plot of predicted vs measured power: %s", path)
