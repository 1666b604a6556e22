"""Collect: node metrics from Prometheus -> the contract-1 table (the input of training.fit).

- `tables`: range collection in time chunks -> pandas tables, in memory or spilled to
  node-group Parquet files; the same read at one instant as a table.
- `facts`: the node facts (CPU model, cores, sockets, highest BMC power, PSU rating), read
  once per collection and joined to every row of their node.
- `cli`: `python -m training.collect` (flags, logging, exit statuses).

The settings, the Prometheus reader and the instance-to-node and sensor mapping are shared with
the extender and live in `livedata` (`collect_config`, `prometheus`, `node_mapping`).
"""

from training.collect.tables import (
    FIRST_CHUNK_STEPS,
    build_table,
    chunk_steps,
    collect_instant,
    collect_metrics,
    collect_to_directory,
    empty_table,
    iter_collected,
)

__all__ = [
    "FIRST_CHUNK_STEPS",
    "build_table",
    "chunk_steps",
    "collect_instant",
    "collect_metrics",
    "collect_to_directory",
    "empty_table",
    "iter_collected",
]
