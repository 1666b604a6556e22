"""The energy adapter's input: each node's stored energy in percent, read from Prometheus.

One instant query (node_exporter's `node_power_supply_capacity` by default) per pass. Its
series are mapped to Kubernetes nodes the way the training collector maps them (the same
`CollectConfig`: join with `node_uname_info`'s nodename, or a label naming the node).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from livedata.collect_config import CollectConfig, uname_query
from livedata.node_mapping import host_nodes_from_uname, node_of
from livedata.prometheus import PrometheusReader, Series

DEFAULT_QUERY = "node_power_supply_capacity"


@dataclass(frozen=True)
class BatteryReadings:
    """Stored-energy percentage per node, and what could not be used (for the log)."""

    pct_by_node: dict[str, float]
    unmapped_series: list[dict[str, str]] = field(default_factory=list)
    invalid: dict[str, float] = field(default_factory=dict)  # node -> the bad reading


def battery_by_node(
    series: Iterable[Series], config: CollectConfig, host_nodes: Mapping[str, str]
) -> BatteryReadings:
    """One percentage per node from an instant query's series (pure).

    Several series for one node (a node with two batteries, BAT0 and BAT1) are averaged:
    equal batteries hold the same energy per percent. A reading outside 0..100 or NaN makes
    the node's whole reading invalid rather than skewing the average.
    """
    values: dict[str, list[float]] = {}
    unmapped: list[dict[str, str]] = []
    invalid: dict[str, float] = {}
    for one in series:
        node = node_of(one.labels, config, host_nodes)
        if node is None:
            unmapped.append(dict(one.labels))
            continue
        value = float(one.values[-1]) if len(one.values) else math.nan
        if not (math.isfinite(value) and 0.0 <= value <= 100.0):
            invalid[node] = value
            continue
        values.setdefault(node, []).append(value)
    pct_by_node = {
        node: sum(points) / len(points) for node, points in values.items() if node not in invalid
    }
    return BatteryReadings(pct_by_node, unmapped, invalid)


def read_batteries(config: CollectConfig, query: str, at_s: float) -> BatteryReadings:
    """Evaluate `query` at `at_s` and map its series to nodes. Raises CollectError on failure."""
    with PrometheusReader(config) as reader:
        host_nodes: dict[str, str] = {}
        if config.node_from == "uname":
            uname = reader.instant(uname_query(config, config.uname_lookback_s), at_s)
            host_nodes = host_nodes_from_uname(uname, config)
        return battery_by_node(reader.instant(query, at_s), config, host_nodes)
