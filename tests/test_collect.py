"""Tests of training.collect against a real Prometheus server, and of the test server itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.prometheus import free_port, start_prometheus, write_openmetrics

T0_S = 1_767_571_200  # 2026-01-05T00:00:00Z


# --------------------------------------------------------------------------------------------
# The test server (tests/support/prometheus.py)


def test_write_openmetrics_groups_families_and_orders_series() -> None:
    text = write_openmetrics(
        [
            ("power_watts", {"instance": 'a"b'}, T0_S + 60, 2.0),
            ("cpu_seconds_total", {"cpu": "0"}, T0_S, 1e6 + 0.25),
            ("power_watts", {"instance": 'a"b'}, T0_S, 1.0),
        ]
    )
    assert text.splitlines() == [
        "# TYPE power_watts gauge",
        f'power_watts{{instance="a\\"b"}} 1.0 {T0_S}.000',
        f'power_watts{{instance="a\\"b"}} 2.0 {T0_S + 60}.000',
        "# TYPE cpu_seconds counter",
        f'cpu_seconds_total{{cpu="0"}} 1000000.25 {T0_S}.000',
        "# EOF",
    ]


@pytest.mark.prometheus
def test_prometheus_serves_backfilled_and_scraped_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Gauge("live_power_watts", "test gauge", registry=registry).set(321.5)
    exporter_port = free_port()
    exporter, exporter_thread = start_http_server(exporter_port, "127.0.0.1", registry)
    text = write_openmetrics(
        [("old_power_watts", {"instance": "h:1"}, T0_S + 60 * i, 100.0 + i) for i in range(10)]
    )
    try:
        with start_prometheus(
            tmp_path,
            openmetrics_text=text,
            scrape_targets=[f"127.0.0.1:{exporter_port}"],
            scrape_interval_s=0.5,
        ) as prom:
            old = prom.query("old_power_watts", at_s=T0_S + 5 * 60)
            assert [float(s["value"][1]) for s in old] == [105.0]
            live = prom.wait_for("live_power_watts")
            assert float(live[0]["value"][1]) == 321.5
        assert prom.process.poll() is not None
    finally:
        exporter.shutdown()
        exporter_thread.join(timeout=5)
