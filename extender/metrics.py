"""Prometheus metrics of the extender service (``GET /metrics``).

Each app gets its own ``CollectorRegistry`` (tests and benches run several apps in one
process). Counters and the latency histogram are updated on the request path (a lock and an
add: microseconds); everything that describes the cluster or the bundle (telemetry age, nodes
without telemetry, bundle version) is computed at scrape time by ``_StateCollector`` from a
callable, so nothing has to keep gauges in step with the state.

Names follow client_python conventions: ``power_aware_extender_`` prefix, base units
(seconds), ``_total`` on counters, ``_info`` on the bundle version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

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


class ServiceMetrics:
    """The registry and the request-path instruments of one app."""

    def __init__(self, sample: Callable[[], StateSample]) -> None:
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

    def observe_request(self, verb: str, code: int, duration_s: float) -> None:
        self.requests.labels(verb=verb, code=str(code)).inc()
        self.latency.labels(verb=verb).observe(duration_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
