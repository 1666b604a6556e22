"""Which node and which contract column each Prometheus series feeds (pure, no I/O).

The collect settings (`livedata.collect_config`) say how: an exporter's `instance` becomes a
node through `instance_nodes`, a label on the series (`node_from: label`) or node_exporter's
`node_uname_info` joined on the host part of `instance` (`node_from: uname`); a BMC sensor
feeds the temperature column its name matches. `node_samples` applies both to a set of query
answers and gives one `NodeSamples` per node: sample times and each column's values, as numpy
arrays. Training builds its tables from them, the live readers their per-node readings, so both
see a node's features the same way.

A series that maps to no node is counted in `CollectStats` (and logged by the caller), never
dropped quietly; several series for one node and column (say two scrape jobs) are averaged
and noted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from livedata.collect_config import (
    TEMPERATURE_ANSWER,
    CollectConfig,
    SensorRules,
    compile_sensor_rules,
)
from livedata.metrics_table import CPU1_TEMP_C, CPU2_TEMP_C, CPU_UTIL, POWER_W
from livedata.prometheus import Series

# --------------------------------------------------------------------------------------------
# Instance -> node


def instance_host(instance: str) -> str:
    """The host part of an exporter `instance` (`10.0.0.1:9100` -> `10.0.0.1`, `[::1]:9100`)."""
    instance = instance.strip()
    if instance.startswith("["):
        return instance[1 : instance.find("]")] if "]" in instance else instance[1:]
    if instance.count(":") == 1:
        return instance.split(":", 1)[0]
    return instance  # no port, or a bare IPv6 address


def host_nodes_from_uname(series: Iterable[Series], config: CollectConfig) -> dict[str, str]:
    """host -> node name from `node_uname_info` series; a renamed host keeps its newest name."""
    newest: dict[str, tuple[float, str]] = {}
    for one in series:
        instance = one.labels.get(config.instance_label)
        nodename = one.labels.get(config.nodename_label)
        if not instance or not nodename:
            continue
        seen_at_s = float(one.timestamps_s.max()) if len(one.timestamps_s) else -math.inf
        host = instance_host(instance)
        if host not in newest or seen_at_s >= newest[host][0]:
            newest[host] = (seen_at_s, nodename)
    return {host: nodename for host, (_, nodename) in newest.items()}


def node_of(
    labels: Mapping[str, str], config: CollectConfig, host_nodes: Mapping[str, str]
) -> str | None:
    """The Kubernetes node a series belongs to, or None when nothing maps it."""
    instance = labels.get(config.instance_label, "")
    host = instance_host(instance) if instance else ""
    for key in (instance, host):
        if key and key in config.instance_nodes:
            return config.instance_nodes[key]
    if config.node_from == "label":
        return labels.get(config.node_label) or None
    return host_nodes.get(host)


# --------------------------------------------------------------------------------------------
# Sensor -> column


def _sensor_order(labels: Mapping[str, str], id_label: str) -> tuple[int, float, str]:
    sensor_id = labels.get(id_label, "")
    try:
        return (0, float(sensor_id), sensor_id)
    except ValueError:
        return (1, 0.0, sensor_id)


def assign_sensor_columns(
    sensors: Sequence[Mapping[str, str]], rules: SensorRules
) -> dict[int, str]:
    """Which temperature column each of one node's sensors feeds: `{sensor index: column}`.

    A sensor goes to the first column whose patterns match its name; when several sensors match
    a column, the earliest pattern wins, then the lowest sensor id. Sensors named only "Temp"
    (see `DEFAULT_SHARED_CPU_SENSOR_PATTERNS`) fill CPU1 then CPU2 in sensor-id order, when no
    sensor names those columns. Unmatched sensors (exhaust, DIMMs...) feed nothing.
    """
    candidates: dict[str, list[tuple[int, tuple, int]]] = defaultdict(list)
    shared: list[tuple[tuple, int]] = []
    for index, labels in enumerate(sensors):
        name = labels.get(rules.name_label, "").strip()
        order = _sensor_order(labels, rules.id_label)
        matched = False
        for column, patterns in rules.columns.items():
            rank = next((r for r, p in enumerate(patterns) if p.fullmatch(name)), None)
            if rank is not None:
                candidates[column].append((rank, order, index))
                matched = True
                break
        if not matched and any(p.fullmatch(name) for p in rules.shared_cpu):
            shared.append((order, index))
    assignment = {min(found)[2]: column for column, found in candidates.items()}
    free_cpu_columns = [c for c in (CPU1_TEMP_C, CPU2_TEMP_C) if c not in candidates]
    if free_cpu_columns == [CPU1_TEMP_C, CPU2_TEMP_C]:
        for (_, index), column in zip(sorted(shared), free_cpu_columns, strict=False):
            assignment[index] = column
    return assignment


# --------------------------------------------------------------------------------------------
# Answers -> per-node samples


@dataclass
class CollectStats:
    """What a collection saw: chunks, unmapped series (by metric), sensors chosen per node."""

    chunks: int = 0
    largest_chunk_samples: int = 0  # the most samples one chunk's answers held at once
    unmapped_series: dict[str, set[tuple[tuple[str, str], ...]]] = field(
        default_factory=lambda: defaultdict(set)
    )
    sensors: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> column -> name
    duplicates: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    unmapped_instance_names: set[str] = field(default_factory=set)

    def note_unmapped(self, metric: str, labels: Mapping[str, str], instance_label: str) -> None:
        self.unmapped_series[metric].add(tuple(sorted(labels.items())))
        self.unmapped_instance_names.add(labels.get(instance_label, "(no instance label)"))

    def unmapped_counts(self) -> dict[str, int]:
        return {metric: len(found) for metric, found in self.unmapped_series.items()}

    def unmapped_instances(self) -> list[str]:
        return sorted(self.unmapped_instance_names)


@dataclass(frozen=True)
class NodeSamples:
    """One node's samples: sorted Unix seconds and each column's values on them (NaN: none).

    `values` holds only the columns some series fed; a column without one is absent.
    """

    node: str
    timestamps_s: np.ndarray
    values: Mapping[str, np.ndarray]


def node_samples(
    answers: Mapping[str, Sequence[Series]],
    config: CollectConfig,
    host_nodes: Mapping[str, str],
    stats: CollectStats,
    rules: SensorRules | None = None,
) -> list[NodeSamples]:
    """Per-node samples, sorted by node, from query answers keyed like `collect_queries`.

    Several series for one node and column (say two scrape jobs) are averaged and noted in
    `stats.duplicates`; series that map to no node are noted in `stats.unmapped_series`. A node
    whose series feed no column (only sensors no rule matches) is left out.
    """
    rules = rules or compile_sensor_rules(config)
    per_node: dict[str, dict[str, list[Series]]] = defaultdict(lambda: defaultdict(list))
    for metric, series_list in answers.items():
        for series in series_list:
            node = node_of(series.labels, config, host_nodes)
            if node is None:
                stats.note_unmapped(metric, series.labels, config.instance_label)
                continue
            per_node[node][metric].append(series)

    samples: list[NodeSamples] = []
    for node in sorted(per_node):
        by_metric = per_node[node]
        columns: dict[str, list[Series]] = {
            metric: list(by_metric[metric]) for metric in (CPU_UTIL, POWER_W) if by_metric[metric]
        }
        sensors = by_metric.get(TEMPERATURE_ANSWER, [])
        assignment = assign_sensor_columns([s.labels for s in sensors], rules)
        chosen = stats.sensors.setdefault(node, {})
        for index, column in sorted(assignment.items()):
            columns.setdefault(column, []).append(sensors[index])
            chosen.setdefault(column, sensors[index].labels.get(rules.name_label, ""))
        if not columns:
            continue
        for column, series_list in columns.items():
            if len(series_list) > 1:
                stats.duplicates[node].add(column)
        timestamps_s, values = _node_columns(columns)
        samples.append(NodeSamples(node, timestamps_s, values))
    return samples


def _node_columns(
    columns: Mapping[str, Sequence[Series]],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One node's sample times (sorted union) and each column's values on them.

    Several series for one column are averaged point by point (NaN points skipped).
    """
    times_s = np.unique(np.concatenate([s.timestamps_s for ss in columns.values() for s in ss]))
    values: dict[str, np.ndarray] = {}
    for column, series_list in columns.items():
        sums = np.zeros(len(times_s))
        counts = np.zeros(len(times_s))
        for series in series_list:
            known = ~np.isnan(series.values)
            index = np.searchsorted(times_s, series.timestamps_s[known])
            sums += np.bincount(index, weights=series.values[known], minlength=len(times_s))
            counts += np.bincount(index, minlength=len(times_s))
        with np.errstate(invalid="ignore", divide="ignore"):
            values[column] = np.where(counts > 0, sums / counts, np.nan)
    return times_s, values
