"""The controllers' life as a pod: probes and metrics over HTTP, and stopping on a signal.

Probes: a small standard-library server in a daemon thread (the controllers have no web
framework) for /healthz, /readyz, /metrics and JSON pages: the kubelet's probes,
Prometheus's scrape and an operator's curl are its only callers. Each controller hands it its
`health()` (alive, ready, details), its metrics registry and any JSON pages of its own (the node
power controller's /status).

Stopping (`stop_on_signals`): the kubelet stops a pod with SIGTERM and waits its grace period;
a developer presses Ctrl-C. Either sets the controller's stop event, so its loop ends where it
would wait next, it stops acting and releases what it holds (the node power controller's
Lease), and the process exits 0 with no traceback. A second signal while stopping ends the
process at once with status 1, as client-go's `SetupSignalHandler` does, for a stop that hangs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# (alive, ready, details): alive answers /healthz, ready and details answer /readyz.
Health = Callable[[], tuple[bool, bool, str]]


class _ProbeHandler(BaseHTTPRequestHandler):
    health: Health
    registry: CollectorRegistry
    pages: Mapping[str, Callable[[], object]]

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass

    def do_GET(self) -> None:
        if self.path == "/metrics":
            self._send(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            alive, _, _ = self.health()
            self._send(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
        elif self.path == "/readyz":
            _, ready, details = self.health()
            body = f"{'ready' if ready else 'not ready'}: {details}\n".encode()
            self._send(200 if ready else 503, body)
        elif self.path in self.pages:
            body = json.dumps(self.pages[self.path](), indent=2, default=str).encode()
            self._send(200, body + b"\n", "application/json")
        else:
            paths = " ".join(["/healthz", "/readyz", "/metrics", *self.pages])
            self._send(404, f"not found: {paths}\n".encode())

    def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_probes(
    *,
    health: Health,
    registry: CollectorRegistry,
    host: str,
    port: int,
    name: str,
    pages: Mapping[str, Callable[[], object]] | None = None,
) -> ThreadingHTTPServer:
    """Serve the probes, /metrics and `pages` (path -> JSON-able answer) in a daemon thread
    named `name`; returns the bound server (port 0 binds a free port: `server.server_port`)."""
    attributes = {
        "health": staticmethod(health),
        "registry": registry,
        "pages": dict(pages or {}),
    }
    handler = type("ProbeHandler", (_ProbeHandler,), attributes)
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


# ---- stopping on SIGTERM and Ctrl-C ----------------------------------------------------------

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    """Which stop signal arrived (None until one does)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.received: str | None = None

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            os.write(2, b"second stop signal: exiting at once\n")
            os._exit(1)
        self.received = signal.Signals(signum).name
        # Not `stop.set()` here: the handler runs on the main thread between two bytecodes, and
        # that thread may be inside `stop.wait()` holding the event's (non-reentrant) lock.
        threading.Thread(target=self.stop.set, name="stop-signal", daemon=True).start()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[StopSignals]:
    """Within the block, SIGTERM and SIGINT set `stop` instead of killing the process or
    raising KeyboardInterrupt; the previous handlers come back after it."""
    signals = StopSignals(stop)
    previous = {sig: signal.signal(sig, signals.handle) for sig in STOP_SIGNALS}
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
