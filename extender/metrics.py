"""Prometheus metrics of the extender service (``GET /metrics``).

Each app gets its own ``CollectorRegistry`` (tests and benches run several apps in one
process). Counters and the latency histogram are updated on the request path (a lock and an
add: microseconds); everything that describes the cluster or the bundle (telemetry age, nodes
without telemetry, bundle version) is computed at scrape time by ``_StateCollector`` from a
callable, so nothing has to keep gauges in step with the state.

Names follow client_python conventions: ``power_aware_extender_`` prefix, base units
(seconds, watts), ``_total`` on counters, ``_info`` on the bundle version.

Per node (the ``node`` label; one series per node and metric, so the cardinality follows the
fleet, never the traffic): predicted and measured power and the serving model's held-out error
(``NodeSample``, built at scrape time from the curve table and the telemetry), each plugin's
``node_metrics`` (the energy level...), and the decisions taken about the node
(``DecisionCounters``: how often it was scored and with what score, how often it had the top
score, how often a filter failed it). ``docs/operations.md`` lists them with the Grafana
dashboard built on them (``manifests/base/dashboards/``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from extender.state import Candidates

PREFIX = "power_aware_extender"

# Scoring 5000 nodes takes a few milliseconds and 100 nodes well under one, so the buckets are
# fine below 1 ms and coarse above the scheduler's usual httpTimeout range.
LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


@dataclass(frozen=True)
class StateSample:
    """What the scrape-time collector reports; built by the runtime from its current state."""

    nodes: int = 0
    nodes_without_telemetry: int = 0
    telemetry_max_age_s: float | None = None
    telemetry_median_age_s: float | None = None
    bundle_version: str | None = None
    bundle_created_at: str | None = None
    curve_table_age_s: float | None = None
    ready: bool = False
    bundle_reload_refusals: int = 0
    extra_info: dict[str, str] = field(default_factory=dict)
    # Nodes with a power curve, by the model serving it: "own" or "fallback" (fleet model).
    nodes_by_model: Mapping[str, int] = field(default_factory=dict)
    fallback_mape_pct: float | None = None  # the fleet fallback's held-out MAPE (manifest)


@dataclass(frozen=True)
class NodeSample:
    """Per-node series at scrape time; arrays aligned to `names` (NaN: no value)."""

    names: Sequence[str] = ()
    model: Sequence[str] = ()  # "own" or "fallback": which model predicts the node
    predicted_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    measured_w: np.ndarray = field(default_factory=lambda: np.empty(0))
    model_mape_pct: np.ndarray = field(default_factory=lambda: np.empty(0))
    extra: Sequence[Metric] = ()  # the plugins' `node_metrics`


class _StateCollector(Collector):
    def __init__(self, sample: Callable[[], StateSample]) -> None:
        self._sample = sample

    def collect(self) -> Iterator[Metric]:
        s = self._sample()
        yield GaugeMetricFamily(f"{PREFIX}_nodes", "Nodes known to the extender", value=s.nodes)
        yield GaugeMetricFamily(
            f"{PREFIX}_nodes_without_telemetry",
            "Known nodes with no fresh telemetry (scored lowest on power, never best)",
            value=s.nodes_without_telemetry,
        )
        if s.telemetry_max_age_s is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_telemetry_max_age_seconds",
                "Age of the oldest telemetry value in use",
                value=s.telemetry_max_age_s,
            )
        if s.telemetry_median_age_s is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_telemetry_median_age_seconds",
                "Median age of the telemetry values in use",
                value=s.telemetry_median_age_s,
            )
        if s.curve_table_age_s is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_curve_table_age_seconds",
                "Time since the power curves in use were tabulated",
                value=s.curve_table_age_s,
            )
        yield CounterMetricFamily(
            f"{PREFIX}_bundle_reload_refusals",
            "Bundles refused by validation; the previous bundle kept serving",
            value=s.bundle_reload_refusals,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_ready", "1 when /readyz answers 200", value=1.0 if s.ready else 0.0
        )
        by_model = GaugeMetricFamily(
            f"{PREFIX}_nodes_by_model",
            "Nodes with a power curve, by the model predicting them: own, or the bundle's "
            "fleet fallback (nodes without a model of their own)",
            labels=["model"],
        )
        for model in ("own", "fallback"):
            by_model.add_metric([model], s.nodes_by_model.get(model, 0))
        yield by_model
        if s.fallback_mape_pct is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_fallback_model_heldout_mape_percent",
                "Held-out MAPE (%) of the bundle's fleet fallback model, from its manifest",
                value=s.fallback_mape_pct,
            )
        if s.bundle_version is not None:
            info = InfoMetricFamily(f"{PREFIX}_bundle", "Model bundle in use")
            info.add_metric(
                [],
                {
                    "version": s.bundle_version,
                    "created_at": s.bundle_created_at or "",
                    **s.extra_info,
                },
            )
            yield info


class _NodeCollector(Collector):
    """Per-node gauges, built from a `NodeSample` each scrape."""

    def __init__(self, sample: Callable[[], NodeSample]) -> None:
        self._sample = sample

    def collect(self) -> Iterator[Metric]:
        s = self._sample()
        predicted = GaugeMetricFamily(
            f"{PREFIX}_node_predicted_power_watts",
            "Power the node's model predicts at its current telemetry (what the scores are "
            "computed from), by the model predicting it: own, or the fleet fallback",
            labels=["node", "model"],
        )
        measured = GaugeMetricFamily(
            f"{PREFIX}_node_measured_power_watts",
            "The node's measured input power as the extender last read it with its telemetry "
            "(ipmi_exporter's DCMI reading, mapped to the node)",
            labels=["node"],
        )
        mape = GaugeMetricFamily(
            f"{PREFIX}_node_model_heldout_mape_percent",
            "Held-out MAPE (%) of the model predicting the node, from the bundle's manifest",
            labels=["node", "model"],
        )
        rows = zip(
            s.names,
            s.model,
            s.predicted_w.tolist(),
            s.measured_w.tolist(),
            s.model_mape_pct.tolist(),
            strict=True,
        )
        for name, model, predicted_w, measured_w, mape_pct in rows:
            if math.isfinite(predicted_w):
                predicted.add_metric([name, model], predicted_w)
            if math.isfinite(measured_w):
                measured.add_metric([name], measured_w)
            if math.isfinite(mape_pct):
                mape.add_metric([name, model], mape_pct)
        yield from (predicted, measured, mape)
        yield from s.extra


MAX_SCORE = 10
# Layouts (node sets) whose counts wait for the next scrape to be folded in by name; more
# node-set changes between two scrapes than this fold the oldest on the request path.
MAX_RETIRED_LAYOUTS = 8


# One prioritize answer adds SCORED_ONE + its score to a node's packed count: the answers it was
# in count in the high 32 bits, the sum of its scores (at most 10 each) in the low 32 bits. One
# scatter-add instead of two on the request path; the counts are unpacked at every scrape, long
# before 400 million answers could carry the sum into the count.
SCORED_ONE = 1 << 32


class _LayoutCounts:
    """Decision counts of one node layout: arrays aligned to the view's `names`."""

    def __init__(self, names: tuple[str, ...], filter_plugins: Sequence[str]) -> None:
        self.names = names
        size = len(names)
        self.scored_packed = np.zeros(size, dtype=np.int64)  # answers * SCORED_ONE + score sum
        self.best = np.zeros(size, dtype=np.int64)
        self.filtered = {plugin: np.zeros(size, dtype=np.int64) for plugin in filter_plugins}

    def columns(self) -> list[np.ndarray]:
        """[answers, score sum, best, failures per filter plugin...], aligned to `names`."""
        packed = self.scored_packed
        return [packed >> 32, packed & (SCORED_ONE - 1), self.best, *self.filtered.values()]


class DecisionCounters:
    """What the extender decided about each node, counted on the request path as array adds.

    `record_prioritize` adds one to each candidate's scored count, its score to its score sum,
    and one to the best count of the candidates with the top score; `record_filter` adds one
    per failed candidate under the plugin that failed it. Candidates are counted at their
    positions in the cluster view, so a request costs a few vectorised adds (tens of
    microseconds at 5,000 candidates), never a Python loop or a label lookup per node. The
    counts are folded by node name when `/metrics` is scraped (`totals`), and a node set change
    only sets the old arrays aside until then. Names the extender does not know are not counted:
    a client cannot grow the series.
    """

    def __init__(self, filter_plugins: Sequence[str]) -> None:
        self._filter_plugins = tuple(filter_plugins)
        self._lock = threading.Lock()
        self._current = _LayoutCounts((), self._filter_plugins)
        self._retired: list[_LayoutCounts] = []
        # node -> [scored, score sum, best, failures per filter plugin...]
        self._totals: dict[str, list[int]] = {}
        self.score_buckets = np.zeros(MAX_SCORE + 1, dtype=np.int64)  # answers per score 0..10
        self.filter_failures = dict.fromkeys(self._filter_plugins, 0)  # every name, known or not

    def _counts_for(self, names: tuple[str, ...]) -> _LayoutCounts:
        current = self._current
        if current.names is names:
            return current
        self._retired.append(current)
        if len(self._retired) > MAX_RETIRED_LAYOUTS:
            self._fold(self._retired.pop(0))
        self._current = _LayoutCounts(names, self._filter_plugins)
        return self._current

    @property
    def filter_plugins(self) -> tuple[str, ...]:
        return self._filter_plugins

    def record_prioritize(
        self, view_names: tuple[str, ...], candidates: Candidates, score: np.ndarray
    ) -> None:
        """One prioritize answer: `score` per candidate (int 0..10), in request order."""
        if len(score) == 0:
            return
        buckets = np.bincount(score, minlength=MAX_SCORE + 1)
        at, scores = candidates.positions, score
        if not candidates.all_in_view:  # names the view does not know are not counted
            at, scores = at[candidates.in_view], score[candidates.in_view]
        with self._lock:
            self.score_buckets += buckets[: MAX_SCORE + 1]
            if len(at) == 0:
                return
            counts = self._counts_for(view_names)
            counts.scored_packed[at] += scores + SCORED_ONE
            counts.best[at[scores == scores.max()]] += 1

    def record_filter(
        self,
        view_names: tuple[str, ...],
        candidates: Candidates,
        failed_by: Mapping[str, Sequence[int]],
    ) -> None:
        """One filter answer: `failed_by` maps a plugin to the candidates it failed (indices)."""
        if not failed_by:
            return
        with self._lock:
            counts = self._counts_for(view_names)
            for plugin, failed in failed_by.items():
                if plugin not in counts.filtered:
                    continue
                self.filter_failures[plugin] += len(failed)
                at = candidates.positions[np.asarray(failed, dtype=np.intp)]
                counts.filtered[plugin][at[at >= 0]] += 1

    def _fold(self, counts: _LayoutCounts) -> None:
        totals = self._totals
        columns = counts.columns()
        touched = np.flatnonzero(np.any(np.stack(columns), axis=0)) if counts.names else []
        width = len(columns)
        for position in np.asarray(touched).tolist():
            node = totals.get(counts.names[position])
            if node is None:
                node = totals[counts.names[position]] = [0] * width
            for column, values in enumerate(columns):
                node[column] += int(values[position])

    def totals(self, known_names: Iterable[str]) -> dict[str, list[int]]:
        """Counts by node for the nodes in `known_names` (others are forgotten); folds what
        the request path counted since the last call. Call from one thread at a time."""
        with self._lock:
            taken = [*self._retired, self._current]
            self._retired = []
            self._current = _LayoutCounts(self._current.names, self._filter_plugins)
        for counts in taken:
            self._fold(counts)
        known = set(known_names)
        for name in [n for n in self._totals if n not in known]:
            del self._totals[name]  # a removed node's series go; counters restart if it returns
        return {name: list(values) for name, values in self._totals.items()}


class _DecisionCollector(Collector):
    def __init__(self, counters: DecisionCounters, known_names: Callable[[], Iterable[str]]):
        self._counters = counters
        self._known_names = known_names
        self._lock = threading.Lock()  # totals() folds: one scrape at a time

    def collect(self) -> Iterator[Metric]:
        counters = self._counters
        with self._lock:
            totals = counters.totals(self._known_names())
        score = SummaryMetricFamily(
            f"{PREFIX}_node_score",
            "Scores 0..10 the extender gave the node in prioritize answers (_count: answers "
            "it was in, _sum: their scores; the mean is rate(_sum)/rate(_count))",
            labels=["node"],
        )
        best = CounterMetricFamily(
            f"{PREFIX}_node_best_score",
            "Prioritize answers in which the node had the top score (ties count for each)",
            labels=["node"],
        )
        filtered = CounterMetricFamily(
            f"{PREFIX}_node_filter_failures",
            "Filter answers in which the node failed, by the (first) plugin that failed it",
            labels=["node", "plugin"],
        )
        plugins = counters.filter_plugins
        for name, (scored, score_sum, top, *failures) in sorted(totals.items()):
            if scored:
                score.add_metric([name], count_value=scored, sum_value=score_sum)
                best.add_metric([name], top)
            for plugin, count in zip(plugins, failures, strict=True):
                if count:
                    filtered.add_metric([name, plugin], count)
        yield from (score, best, filtered)
        failures = CounterMetricFamily(
            f"{PREFIX}_filter_failures",
            "Candidate nodes failed by the filter, by the (first) plugin that failed them",
            labels=["plugin"],
        )
        for plugin, count in counters.filter_failures.items():
            failures.add_metric([plugin], count)
        yield failures
        buckets = counters.score_buckets.tolist()
        histogram = HistogramMetricFamily(
            f"{PREFIX}_score",
            "Final scores 0..10 in prioritize answers, one observation per candidate",
        )
        cumulative = np.cumsum(buckets).tolist()
        histogram.add_metric(
            [],
            buckets=[(str(le), count) for le, count in enumerate(cumulative)]
            + [("+Inf", cumulative[-1])],
            sum_value=sum(score * count for score, count in enumerate(buckets)),
        )
        yield histogram


class ServiceMetrics:
    """The registry and the request-path instruments of one app."""

    def __init__(
        self,
        sample: Callable[[], StateSample],
        node_sample: Callable[[], NodeSample] | None = None,
        *,
        filter_plugins: Sequence[str] = (),
        known_names: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{PREFIX}_requests",
            "HTTP requests answered, by verb (endpoint) and status code",
            ["verb", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Server-side time to answer a request, body read to answer encoded",
            ["verb"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        # Requests answered 200 per verb, as plain ints for the runtime's own checks.
        self.answered: dict[str, int] = {}
        self.errors = Counter(
            f"{PREFIX}_request_errors",
            "Requests that could not be answered normally, by verb and kind "
            "(bad_request, body_too_large, client_disconnect, internal)",
            ["verb", "kind"],
            registry=self.registry,
        )
        self.nodes_scored_without_telemetry = Counter(
            f"{PREFIX}_nodes_scored_without_telemetry",
            "Candidate nodes answered without a power prediction (no telemetry or no curve)",
            registry=self.registry,
        )
        self.unknown_nodes = Counter(
            f"{PREFIX}_unknown_nodes",
            "Candidate node names the extender did not know (scored 0)",
            registry=self.registry,
        )
        self.bundle_reloads = Counter(
            f"{PREFIX}_bundle_reloads",
            "Bundle versions swapped in after validation",
            registry=self.registry,
        )
        self.curve_rebuilds = Counter(
            f"{PREFIX}_curve_rebuilds",
            "Power-curve tables rebuilt in the background",
            registry=self.registry,
        )
        self.curve_rebuild_failures = Counter(
            f"{PREFIX}_curve_rebuild_failures",
            "Background curve rebuilds that failed; the previous table kept serving",
            registry=self.registry,
        )
        self.curve_rebuild_duration = Histogram(
            f"{PREFIX}_curve_rebuild_duration_seconds",
            "Time to tabulate power curves in the background",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(sample))
        if node_sample is not None:
            self.registry.register(_NodeCollector(node_sample))
        self.decisions = DecisionCounters(filter_plugins)
        self.registry.register(_DecisionCollector(self.decisions, known_names))

    def observe_request(self, verb: str, code: int, duration_s: float) -> None:
        # The labelled children, looked up once per (verb, code): `labels()` costs more than
        # the increment and the observation together, on every request of the scheduler.
        children = self._request_children.get((verb, code))
        if children is None:
            children = (
                self.requests.labels(verb=verb, code=str(code)),
                self.latency.labels(verb=verb),
            )
            self._request_children[(verb, code)] = children
        requests, latency = children
        requests.inc()
        latency.observe(duration_s)
        if code == 200:
            self.answered[verb] = self.answered.get(verb, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)
