"""The energy adapter's own Prometheus metrics (served by `health` at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AdapterMetrics:
    """Counters and gauges of one adapter process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.passes = Counter(
            "energy_adapter_passes_total",
            "Passes over all nodes, by result (ok, error)",
            ["result"],
            registry=self.registry,
        )
        self.changes = Counter(
            "energy_adapter_label_changes_total",
            "energy-status label changes patched, by the new level",
            ["level"],
            registry=self.registry,
        )
        self.nodes = Gauge(
            "energy_adapter_nodes",
            "Nodes per energy-status level after the last pass (none = no reading)",
            ["level"],
            registry=self.registry,
        )
        self.last_success = Gauge(
            "energy_adapter_last_success_timestamp_seconds",
            "Unix time the last successful pass ended",
            registry=self.registry,
        )
