"""The controller's probes, metrics and status over HTTP: /healthz, /readyz, /metrics, /status.

The controllers' probe server (`controllers.probes`) in a daemon thread: the kubelet's probes,
Prometheus's scrape and an operator's curl are its only callers. Both replicas answer; /readyz
says ready once the caches are synced and a bundle is loaded (a standby is ready to take over),
and /status says which replica leads.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer

from controllers.node_power.controller import NodePowerController
from controllers.probes import serve_probes


def serve_health(controller: NodePowerController, host: str, port: int) -> ThreadingHTTPServer:
    """Serve the probes, metrics and status in a daemon thread; returns the bound server."""
    return serve_probes(
        health=controller.health,
        registry=controller.metrics.registry,
        host=host,
        port=port,
        name="node-power-health",
        pages={"/status": controller.status},
    )
