"""A real Prometheus server for tests: `bench.support.prometheus`, with a missing binary
turned into a skip (or, under CI=true, a failure).

Typical use::

    require_prometheus()
    text = write_openmetrics([("power_watts", {"instance": "a:1"}, 1767571200, 250.0)])
    with start_prometheus(tmp_path, openmetrics_text=text) as prom:
        requests.get(f"{prom.url}/api/v1/query", params={"query": "power_watts", ...})

The server, the OpenMetrics writers and promtool backfilling live in `bench.support.prometheus`:
benches use them too, and a benchmark never imports tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.support import prometheus as _bench_prometheus
from bench.support.prometheus import (
    PROMETHEUS_MISSING,
    PrometheusServer,
    free_port,
    prometheus_available,
    write_openmetrics,
)

__all__ = [
    "PrometheusServer",
    "free_port",
    "require_prometheus",
    "start_prometheus",
    "write_openmetrics",
]


def require_prometheus() -> None:
    """Skip the calling test when Prometheus is missing; fail instead under CI=true."""
    if prometheus_available():
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but Prometheus is missing: {PROMETHEUS_MISSING}")
    pytest.skip(PROMETHEUS_MISSING)


def start_prometheus(tmp_path: Path, **options: Any) -> PrometheusServer:
    """`bench.support.prometheus.start_prometheus` (same options), after `require_prometheus`."""
    require_prometheus()
    return _bench_prometheus.start_prometheus(tmp_path, **options)
