"""Tiny exporters for tests: what node_exporter and ipmi_exporter serve for one host.

A `FakeHost` exposes CPU counters that advance at a settable utilisation, `node_uname_info`,
BMC temperatures and DCMI power, and optionally a battery (`node_power_supply_capacity`);
`serve` puts it on 127.0.0.1 for a real Prometheus to scrape. `two_nodes` starts the pair the
live-telemetry and fault tests share: node-a (found through `node_uname_info`, two sockets) and
node-b (found by instance, one socket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

WAIT_S = 60.0
CPUS = 2


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll `condition` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(0.1)
    return value


@dataclass(eq=False)  # identity hash: the registry keys collectors by object
class FakeHost(Collector):
    """Exposes what node_exporter and ipmi_exporter would for one host; values settable."""

    cpu_util: float
    temperatures_c: dict[str, float]
    power_w: float
    nodename: str | None = None
    battery_pct: float | None = None  # stored energy, as node_exporter's powersupplyclass
    _idle_s: float = 0.0
    _busy_s: float = 0.0
    _last_s: float = field(default_factory=time.time)

    def collect(self) -> Iterator[Metric]:
        # The CPU counters advance with wall time at the current utilisation, so
        # 1 - rate(idle) is exactly `cpu_util` once the rate window holds two scrapes.
        now_s = time.time()
        elapsed_s, self._last_s = now_s - self._last_s, now_s
        self._idle_s += elapsed_s * (1 - self.cpu_util)
        self._busy_s += elapsed_s * self.cpu_util
        cpu = CounterMetricFamily(
            "node_cpu_seconds_total", "Seconds the CPUs spent in each mode.", labels=["cpu", "mode"]
        )
        for index in range(CPUS):
            cpu.add_metric([str(index), "idle"], self._idle_s)
            cpu.add_metric([str(index), "user"], self._busy_s)
        yield cpu
        if self.nodename is not None:
            uname = GaugeMetricFamily(
                "node_uname_info", "Labeled system information.", labels=["nodename", "sysname"]
            )
            uname.add_metric([self.nodename, "Linux"], 1.0)
            yield uname
        temperature = GaugeMetricFamily(
            "ipmi_temperature_celsius",
            "Temperature reading in degree Celsius.",
            labels=["id", "name"],
        )
        for index, (name, value) in enumerate(self.temperatures_c.items()):
            temperature.add_metric([str(index + 1), name], value)
        yield temperature
        yield GaugeMetricFamily(
            "ipmi_dcmi_power_consumption_watts",
            "Current power consumption in Watts.",
            value=self.power_w,
        )
        if self.battery_pct is not None:
            battery = GaugeMetricFamily(
                "node_power_supply_capacity",
                "capacity value of /sys/class/power_supply/<power_supply>.",
                labels=["power_supply"],
            )
            battery.add_metric(["BAT0"], self.battery_pct)
            yield battery


@dataclass
class Exporter:
    host: FakeHost
    target: str
    stop: Callable[[], None]


def serve(host: FakeHost) -> Exporter:
    registry = CollectorRegistry()
    registry.register(host)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return Exporter(host, f"127.0.0.1:{server.server_port}", stop)


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[Exporter, Exporter]]:
    """node-a: uname-mapped, two sockets; node-b: no uname (map it by instance), one socket."""
    node_a = serve(
        FakeHost(
            cpu_util=0.25,
            temperatures_c={"Inlet Temp": 22.0, "CPU1 Temp": 55.0, "CPU2 Temp": 53.0},
            power_w=310.0,
            nodename="node-a",
        )
    )
    node_b = serve(
        FakeHost(cpu_util=0.6, temperatures_c={"Ambient": 24.0, "CPU1 Temp": 61.0}, power_w=150.0)
    )
    try:
        yield node_a, node_b
    finally:
        node_a.stop()
        node_b.stop()
