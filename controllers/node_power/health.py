"""The controller's probes, metrics and status over HTTP: /healthz, /readyz, /metrics, /status.

A small standard-library server in a daemon thread: the kubelet's probes, Prometheus's scrape
and an operator's curl are its only callers. Both replicas answer; /readyz says ready once the
caches are synced and a bundle is loaded (a standby is ready to take over), and /status says
which replica leads.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from controllers.node_power.controller import NodePowerController


class _Handler(BaseHTTPRequestHandler):
    controller: NodePowerController

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass

    def do_GET(self) -> None:
        alive, ready, details = self.controller.health()
        if self.path == "/metrics":
            body = generate_latest(self.controller.metrics.registry)
            self._send(200, body, CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._send(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
        elif self.path == "/readyz":
            body = f"{'ready' if ready else 'not ready'}: {details}\n".encode()
            self._send(200 if ready else 503, body)
        elif self.path == "/status":
            body = json.dumps(self.controller.status(), indent=2, default=str).encode()
            self._send(200, body + b"\n", "application/json")
        else:
            self._send(404, b"not found: /healthz /readyz /metrics /status\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_health(controller: NodePowerController, host: str, port: int) -> ThreadingHTTPServer:
    """Serve the probes, metrics and status in a daemon thread; returns the bound server."""
    handler = type("HealthHandler", (_Handler,), {"controller": controller})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="node-power-health", daemon=True).start()
    return server
