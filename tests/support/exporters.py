"""Tiny exporters for tests: `bench.support.exporters` (what node_exporter and ipmi_exporter
serve for one host: `FakeHost`, put on 127.0.0.1 by `serve`), and `two_nodes` starts the pair the
live-telemetry and fault tests share: node-a (found through `node_uname_info`, two sockets) and
node-b (found by instance, one socket).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.support.exporters import Exporter, FakeHost, serve

__all__ = ["Exporter", "FakeHost", "serve", "two_nodes", "wait_until"]

WAIT_S = 60.0


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll `condition` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(0.1)
    return value


@contextlib.contextmanager
def two_nodes(node_a_name: str = "node-a") -> Iterator[tuple[Exporter, Exporter]]:
    """node-a: uname-mapped, two sockets; node-b: no uname (map it by instance), one socket.

    `node_a_name` is the nodename node-a's `node_uname_info` reports: a test sharing a cluster
    with others names its nodes uniquely."""
    node_a = serve(
        FakeHost(
            cpu_util=0.25,
            temperatures_c={"Inlet Temp": 22.0, "CPU1 Temp": 55.0, "CPU2 Temp": 53.0},
            power_w=310.0,
            nodename=node_a_name,
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
