"""Every node's telemetry now: one instant query per metric, mapped to nodes and columns.

The extender's live poller reads this every refresh interval. It uses the same settings, the
same queries and the same instance-to-node and sensor mapping as training's range collection
(`livedata.node_mapping`), so a node's features mean the same thing at training and at serving
time; training's `collect_instant` turns the same readings into a contract-1 table. Plain
Python and numpy only: the service never loads pandas.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from livedata.collect_config import CollectConfig, collect_queries, uname_query
from livedata.metrics_table import VALUE_COLUMNS
from livedata.node_mapping import CollectStats, host_nodes_from_uname, node_samples
from livedata.prometheus import PrometheusReader


@dataclass(frozen=True)
class NodeReading:
    """One node's values at one instant: every `VALUE_COLUMNS` entry, NaN where none was read."""

    node: str
    observed_at_s: float  # Unix seconds: when Prometheus evaluated the queries
    values: dict[str, float]


def read_instant(
    config: CollectConfig,
    *,
    at_s: float | None = None,
    stats: CollectStats | None = None,
) -> list[NodeReading]:
    """One reading per node, sorted by node, as Prometheus sees it at `at_s` (default: now).

    One instant query per metric for all nodes, plus `node_uname_info` when nodes are found
    through it. Every answer is stamped with the evaluation time (a series stops answering
    once it is older than Prometheus's lookback, 5 minutes by default). A node without a power
    reading has `power_w` NaN; without a sensor, that temperature is NaN. Raises `CollectError`.
    """
    stats = stats if stats is not None else CollectStats()
    at_s = time.time() if at_s is None else at_s
    with PrometheusReader(config) as reader:
        host_nodes: dict[str, str] = {}
        if config.node_from == "uname":
            host_nodes = host_nodes_from_uname(
                reader.instant(uname_query(config, config.uname_lookback_s), at_s), config
            )
        answers = {
            key: reader.instant(query, at_s) for key, query in collect_queries(config).items()
        }
    stats.chunks += 1
    readings = []
    for samples in node_samples(answers, config, host_nodes, stats):
        # Instant answers all carry the evaluation time; should a node still have several
        # sample times, its newest one is its reading.
        readings.append(
            NodeReading(
                node=samples.node,
                observed_at_s=float(samples.timestamps_s[-1]),
                values={
                    column: float(samples.values[column][-1])
                    if column in samples.values
                    else math.nan
                    for column in VALUE_COLUMNS
                },
            )
        )
    return readings
