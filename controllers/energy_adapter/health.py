"""The energy adapter's probes and metrics over HTTP: /healthz, /readyz, /metrics.

The controllers' probe server (`controllers.probes`) in a daemon thread: the kubelet's probes
and Prometheus's scrape are its only callers.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from controllers.energy_adapter.adapter import EnergyAdapter
from controllers.probes import serve_probes


def serve_health(adapter: EnergyAdapter, host: str, port: int) -> ThreadingHTTPServer:
    """Serve /healthz, /readyz and /metrics in a daemon thread; returns the bound server."""
    return serve_probes(
        health=adapter.health,
        registry=adapter.metrics.registry,
        host=host,
        port=port,
        name="energy-adapter-health",
    )
