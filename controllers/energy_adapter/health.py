"""The energy adapter's probes and metrics over HTTP: /healthz, /readyz, /metrics.

A small standard-library server in a daemon thread (the adapter has no web framework): the
kubelet's probes and Prometheus's scrape are its only callers.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controllers.energy_adapter.adapter import EnergyAdapter


class _HealthHandler(BaseHTTPRequestHandler):
    adapter: EnergyAdapter

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass

    def do_GET(self) -> None:
        alive, ready, details = self.adapter.health()
        if self.path == "/metrics":
            self._send(200, generate_latest(self.adapter.metrics.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._send(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
        elif self.path == "/readyz":
            body = f"{'ready' if ready else 'not ready'}: {details}\n".encode()
            self._send(200 if ready else 503, body)
        else:
            self._send(404, b"not found: /healthz /readyz /metrics\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_health(adapter: EnergyAdapter, host: str, port: int) -> ThreadingHTTPServer:
    """Serve /healthz, /readyz and /metrics in a daemon thread; returns the bound server."""
    handler = type("HealthHandler", (_HealthHandler,), {"adapter": adapter})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="energy-adapter-health", daemon=True).start()
    return server
