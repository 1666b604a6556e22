"""Tiny exporters for benches and tests: what node_exporter and ipmi_exporter serve for a host.

A `FakeHost` exposes CPU counters that advance at a settable utilisation, `node_uname_info`,
BMC temperatures and DCMI power, and optionally a battery (`node_power_supply_capacity`);
`serve` puts it on 127.0.0.1 for a real Prometheus to scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CPUS = 2


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
