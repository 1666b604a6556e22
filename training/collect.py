"""Collect node metrics from Prometheus into the contract-1 table (the input of training).

This is the first step of the pipeline: node_exporter gives each node's CPU busy share,
ipmi_exporter its BMC temperatures and DCMI input power. We read them over a time range with
`prometheus-api-client` and write one row per node per step:
`node, timestamp, cpu_util, ambient_temp_c, cpu1_temp_c, cpu2_temp_c, power_w`.

Three things vary between clusters, so all three are configuration (`CollectConfig`, loadable
from YAML/JSON with `--config`):

- the PromQL queries (`$window` and `$by` in a query are replaced by the CPU rate window and the
  grouping labels);
- the BMC sensor names, which every vendor spells differently ("Inlet Temp", "Ambient",
  "CPU1 Temp", "CPU 1 Temp", Dell's two sensors both called "Temp"...): regexes per column;
- how an exporter's `instance` becomes a Kubernetes node name: a label already on the series
  (`node_from: label`), or node_exporter's `node_uname_info{nodename}` joined on the host part
  of `instance` (`node_from: uname`; node_exporter and ipmi_exporter listen on different ports
  of the same host). A series that maps to no node is counted and logged, never dropped quietly.

Long ranges are read in time chunks: Prometheus refuses range queries of more than 11,000
points per series, and memory holds one chunk, so a chunk spans as many steps as keep its
samples within a budget (`max_samples_per_chunk`): fewer steps for a larger fleet, so memory
does not grow with the number of nodes. Every request has a timeout, and anything unexpected
(unreachable server, HTTP errors, non-JSON, JSON of the wrong shape) raises `CollectError`
naming the URL, the query and the problem.

The same query and mapping functions serve `collect_instant`, which the extender's live
telemetry poller uses, so that training and serving see a node's features the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import requests
import yaml
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from tqdm import tqdm
from urllib3.util.retry import Retry

from livedata.metrics_table import CONTRACT_COLUMNS
from training.dataset import write_metrics

log = logging.getLogger("training.collect")  # also when run as __main__

TEMPERATURE_COLUMNS: tuple[str, ...] = ("ambient_temp_c", "cpu1_temp_c", "cpu2_temp_c")
PROMETHEUS_MAX_POINTS = 11_000  # Prometheus rejects range queries with more points per series
# Before the first answer the fleet's size is unknown: the first chunk is short, and later ones
# are sized from the series it returned (see chunk_steps).
FIRST_CHUNK_STEPS = 120

# rate() of the idle counter can exceed 1 by float rounding or scrape jitter, which would make
# an idle node's utilisation slightly negative and its row dropped as out of range: clamp.
DEFAULT_CPU_QUERY = (
    'clamp(1 - avg by ($by) (rate(node_cpu_seconds_total{mode="idle"}[$window])), 0, 1)'
)
DEFAULT_TEMPERATURE_QUERY = "ipmi_temperature_celsius"
DEFAULT_POWER_QUERY = "ipmi_dcmi_power_consumption_watts"

# Full-match, case-insensitive; earlier patterns win when several sensors match one column.
# "CPU1 Temp" must beat "CPU1 VRM Temp", and Supermicro's "P1-DIMMA1 Temp" is no CPU.
_NOT_CPU_DIE = r"(?!.*\b(vrm|vr|dimm|mem|memory|vcore)\b)"
DEFAULT_SENSOR_PATTERNS: dict[str, tuple[str, ...]] = {
    "ambient_temp_c": (
        r"(\d+-)?(system board |mb |front panel )?(inlet|ambient)( (temp|temperature|air))?",
        r".*\b(inlet|ambient)\b.*",
    ),
    "cpu1_temp_c": (
        r"(\d+-)?(cpu|proc|processor)[ _]?1( (temp|temperature))?",
        rf"(\d+-)?(cpu|proc|processor)[ _]?1\b{_NOT_CPU_DIE}.*",
    ),
    "cpu2_temp_c": (
        r"(\d+-)?(cpu|proc|processor)[ _]?2( (temp|temperature))?",
        rf"(\d+-)?(cpu|proc|processor)[ _]?2\b{_NOT_CPU_DIE}.*",
    ),
}
# Dell iDRAC names both CPU sensors just "Temp": taken in sensor-id order as CPU1, CPU2 when a
# node has no sensor matching the CPU columns by name.
DEFAULT_SHARED_CPU_SENSOR_PATTERNS: tuple[str, ...] = (r"temp(erature)?",)


class CollectError(RuntimeError):
    """Prometheus could not be read; the message names the URL, the query and the problem."""


class CollectConfigError(ValueError):
    """A bad collect setting; the message names the setting (and the file it came from)."""


@dataclass
class CollectConfig:
    """Everything `collect_metrics` and `collect_instant` need to know about a cluster."""

    url: str = "http://127.0.0.1:9090"
    step_s: float = 60.0  # range query resolution; whole seconds
    timeout_s: float = 30.0  # per HTTP request, also sent to Prometheus as its query timeout
    retries: int = 1  # connection failures and 502/503/504 only; a slow answer is not retried
    cpu_rate_window: str = "2m"  # `$window` in cpu_query; at least 2 scrape intervals
    cpu_query: str = DEFAULT_CPU_QUERY
    temperature_query: str = DEFAULT_TEMPERATURE_QUERY
    power_query: str = DEFAULT_POWER_QUERY
    sensor_name_label: str = "name"
    sensor_id_label: str = "id"
    sensor_patterns: Mapping[str, Sequence[str]] = field(
        default_factory=lambda: dict(DEFAULT_SENSOR_PATTERNS)
    )
    shared_cpu_sensor_patterns: Sequence[str] = DEFAULT_SHARED_CPU_SENSOR_PATTERNS
    node_from: str = "uname"  # "uname": node_uname_info join; "label": `node_label` on series
    node_label: str = "node"
    instance_label: str = "instance"
    uname_metric: str = "node_uname_info"
    nodename_label: str = "nodename"
    uname_lookback_s: float = 3600.0  # how far back a node_uname_info sample still counts
    instance_nodes: Mapping[str, str] = field(default_factory=dict)  # host or instance -> node
    max_points_per_series: int = PROMETHEUS_MAX_POINTS
    # Memory holds one time chunk's answers (about 110 bytes per sample): a larger fleet gets
    # chunks of fewer steps, so 1,000 nodes collect in about the memory of 100 (measured 1.14x).
    max_samples_per_chunk: int = 1_000_000

    def __post_init__(self) -> None:
        if not (self.step_s >= 1 and float(self.step_s).is_integer()):
            raise CollectConfigError(
                f"step_s must be a whole number of seconds >= 1, got {self.step_s!r}"
            )
        if not self.timeout_s > 0:
            raise CollectConfigError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        if self.retries < 0:
            raise CollectConfigError(f"retries must be >= 0, got {self.retries!r}")
        if self.node_from not in ("uname", "label"):
            raise CollectConfigError(
                f"node_from must be 'uname' or 'label', got {self.node_from!r}"
            )
        if not 2 <= self.max_points_per_series <= PROMETHEUS_MAX_POINTS:
            raise CollectConfigError(
                f"max_points_per_series must be 2..{PROMETHEUS_MAX_POINTS}, "
                f"got {self.max_points_per_series!r}"
            )
        if not self.max_samples_per_chunk >= 1:
            raise CollectConfigError(
                f"max_samples_per_chunk must be at least 1, got {self.max_samples_per_chunk!r}"
            )
        unknown = set(self.sensor_patterns) - set(TEMPERATURE_COLUMNS)
        if unknown:
            raise CollectConfigError(
                f"sensor_patterns has unknown column(s) {sorted(unknown)}; "
                f"known: {list(TEMPERATURE_COLUMNS)}"
            )
        parse_duration_s(self.cpu_rate_window)  # fails early with a clear message
        compile_sensor_rules(self)


def load_collect_config(path: str | Path | None = None, **overrides: Any) -> CollectConfig:
    """A `CollectConfig` from a YAML/JSON file (keys = field names), then `overrides`.

    `sensor_patterns` in the file replaces the defaults only for the columns it names.
    """
    settings: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise CollectConfigError(f"cannot read collect config {path}: {error}") from error
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise CollectConfigError(
                f"{path}: expected a mapping of settings, got {type(loaded).__name__}"
            )
        known = {f.name for f in fields(CollectConfig)}
        unknown = sorted(set(loaded) - known)
        if unknown:
            raise CollectConfigError(
                f"{path}: unknown setting(s) {unknown}; known: {sorted(known)}"
            )
        settings.update(loaded)
        if "sensor_patterns" in loaded:
            patterns = loaded["sensor_patterns"]
            if not isinstance(patterns, dict):
                raise CollectConfigError(
                    f"{path}: sensor_patterns must map column -> list of regexes"
                )
            settings["sensor_patterns"] = {
                **DEFAULT_SENSOR_PATTERNS,
                **{k: [v] if isinstance(v, str) else list(v) for k, v in patterns.items()},
            }
    settings.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return CollectConfig(**settings)
    except CollectConfigError as error:
        raise CollectConfigError(f"{path}: {error}" if path else str(error)) from error
    except TypeError as error:
        raise CollectConfigError(f"{path}: {error}" if path else str(error)) from error


# --------------------------------------------------------------------------------------------
# Times and durations (CLI and config)

_DURATION_UNITS_S = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 604800,
    "y": 31536000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")


def parse_duration_s(text: str) -> float:
    """Seconds in `90`, `60s`, `2m`, `1h30m`, `7d` (Prometheus units ms s m h d w y)."""
    text = str(text).strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise CollectConfigError(
            f"bad duration {text!r}: use seconds (90) or units like 60s, 2m, 1h30m, 7d"
        )
    return sum(float(number) * _DURATION_UNITS_S[unit] for number, unit in parts)


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """A UTC time from RFC 3339, Unix seconds, `now`, or relative `-7d` / `now-2h`."""
    now = now or datetime.now(UTC)
    text = text.strip()
    if text == "now":
        return now
    relative = re.fullmatch(r"(?:now)?-(.+)", text)
    if relative:
        return now - timedelta(seconds=parse_duration_s(relative.group(1)))
    try:
        return datetime.fromtimestamp(float(text), UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as error:
        raise CollectConfigError(
            f"bad time {text!r}: use RFC 3339 (2026-01-05T00:00:00Z), Unix seconds, "
            "'now' or relative like -7d"
        ) from error
    if parsed.tzinfo is None:
        raise CollectConfigError(f"time {text!r} has no UTC offset: add Z or +HH:MM")
    return parsed.astimezone(UTC)


def chunk_steps(config: CollectConfig, series_per_step: int) -> int:
    """Steps in the next time chunk: as many as keep `series_per_step` x steps within
    `max_samples_per_chunk`, at least one, at most `max_points_per_series` (Prometheus's
    limit). `series_per_step` is the most series a chunk has returned so far, 0 before any."""
    if series_per_step <= 0:
        return min(FIRST_CHUNK_STEPS, config.max_points_per_series)
    return max(
        1, min(config.max_points_per_series, config.max_samples_per_chunk // series_per_step)
    )


# --------------------------------------------------------------------------------------------
# Queries and answers (pure)


@dataclass(frozen=True)
class Series:
    """One series of a query answer: its labels and its points (Unix seconds, values)."""

    labels: Mapping[str, str]
    timestamps_s: np.ndarray
    values: np.ndarray


def render_query(template: str, config: CollectConfig) -> str:
    """Fill `$window` (CPU rate window) and `$by` (labels identifying a node) in a query."""
    by = config.instance_label
    if config.node_from == "label":
        by = f"{config.instance_label}, {config.node_label}"
    return template.replace("$window", config.cpu_rate_window).replace("$by", by)


def uname_query(config: CollectConfig, window_s: float) -> str:
    """The query whose answer maps exporter hosts to node names (`node_from: uname`)."""
    return f"last_over_time({config.uname_metric}[{max(1, math.ceil(window_s))}s])"


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def parse_result(result: object, *, instant: bool, where: str) -> list[Series]:
    """Validate `data.result` of a range (matrix) or instant (vector) answer into `Series`."""
    if not isinstance(result, list):
        raise CollectError(f"{where}: data.result is {type(result).__name__}, expected a list")
    key = "value" if instant else "values"
    parsed = []
    for index, item in enumerate(result):
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise CollectError(
                f"{where}: result[{index}] has no 'metric' object: {_describe(item)}"
            )
        points = [item.get(key)] if instant else item.get(key)
        pairs = _points_array(points)
        if pairs is None:  # say exactly what is wrong, point by point (the slow path)
            _explain_bad_points(points, item, f"{where}: result[{index}]", key)
        labels = {str(k): str(v) for k, v in item["metric"].items()}
        parsed.append(Series(labels, pairs[:, 0].copy(), pairs[:, 1].copy()))
    return parsed


def _points_array(points: object) -> np.ndarray | None:
    """`[[time, "value"], ...]` as an (n, 2) float array, or None if it is not one. numpy parses
    the value strings ("NaN", "+Inf" too) in C: a 1,000-node chunk has millions of points."""
    if not isinstance(points, list):
        return None
    if not points:
        return np.empty((0, 2))
    try:
        pairs = np.array(points, dtype=float)
    except (TypeError, ValueError):
        return None
    return pairs if pairs.ndim == 2 and pairs.shape[1] == 2 else None


def _explain_bad_points(points: object, item: dict, where: str, key: str) -> NoReturn:
    """Raise the `CollectError` that says what is wrong with points `_points_array` refused."""
    if not isinstance(points, list) or not all(
        isinstance(p, list | tuple) and len(p) == 2 for p in points
    ):
        raise CollectError(
            f"{where}.{key} is not a list of [time, value] pairs: {_describe(item.get(key))}"
        )
    for point in points:
        try:
            float(point[0]), float(point[1])
        except (TypeError, ValueError) as error:
            raise CollectError(
                f"{where} ({item['metric']}) has a non-numeric point: {error}"
            ) from error
    raise CollectError(f"{where}.{key} is not a list of [time, value] pairs")


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


@dataclass(frozen=True)
class SensorRules:
    """Compiled sensor-name regexes: per temperature column, and the shared CPU names."""

    columns: Mapping[str, tuple[re.Pattern[str], ...]]
    shared_cpu: tuple[re.Pattern[str], ...]
    name_label: str
    id_label: str


def compile_sensor_rules(config: CollectConfig) -> SensorRules:
    def compile_all(where: str, patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
        if isinstance(patterns, str):
            patterns = [patterns]
        compiled = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern, re.IGNORECASE))
            except re.error as error:
                raise CollectConfigError(f"{where}: bad regex {pattern!r}: {error}") from error
        return tuple(compiled)

    return SensorRules(
        columns={
            column: compile_all(f"sensor_patterns.{column}", patterns)
            for column, patterns in config.sensor_patterns.items()
        },
        shared_cpu=compile_all("shared_cpu_sensor_patterns", config.shared_cpu_sensor_patterns),
        name_label=config.sensor_name_label,
        id_label=config.sensor_id_label,
    )


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
    free_cpu_columns = [c for c in ("cpu1_temp_c", "cpu2_temp_c") if c not in candidates]
    if free_cpu_columns == ["cpu1_temp_c", "cpu2_temp_c"]:
        for (_, index), column in zip(sorted(shared), free_cpu_columns, strict=False):
            assignment[index] = column
    return assignment


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


def _node_columns(columns: Mapping[str, Sequence[Series]]) -> tuple[np.ndarray, dict]:
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


def build_table(
    answers: Mapping[str, Sequence[Series]],
    config: CollectConfig,
    host_nodes: Mapping[str, str],
    stats: CollectStats,
    rules: SensorRules | None = None,
) -> pd.DataFrame:
    """Contract-1 rows from query answers keyed `cpu_util`, `temperature`, `power_w`.

    Several series for one node and column (say two scrape jobs) are averaged and noted in
    `stats.duplicates`; series that map to no node are noted in `stats.unmapped_series`.
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

    node_parts: list[tuple[str, np.ndarray, dict[str, np.ndarray]]] = []
    for node in sorted(per_node):
        by_metric = per_node[node]
        columns: dict[str, list[Series]] = {
            metric: list(by_metric[metric])
            for metric in ("cpu_util", "power_w")
            if by_metric[metric]
        }
        sensors = by_metric.get("temperature", [])
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
        times_s, values = _node_columns(columns)
        node_parts.append((node, times_s, values))
    if not node_parts:
        return empty_table()
    # one frame per chunk, not per node: a DataFrame per node costs more than its rows
    return _contract_frame(
        np.repeat([node for node, _, _ in node_parts], [len(t) for _, t, _ in node_parts]),
        np.concatenate([times_s for _, times_s, _ in node_parts]),
        {
            column: np.concatenate(
                [values.get(column, np.full(len(t), np.nan)) for _, t, values in node_parts]
            )
            for column in CONTRACT_COLUMNS[2:]
        },
    )


def _contract_frame(
    nodes: np.ndarray, timestamps_s: np.ndarray, values: Mapping[str, np.ndarray]
) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "node": pd.array(nodes, dtype="str"),
            "timestamp": pd.to_datetime(np.asarray(timestamps_s, dtype=float), unit="s", utc=True),
        }
    )
    for column in CONTRACT_COLUMNS[2:]:
        frame[column] = values[column] if column in values else np.full(len(frame), np.nan)
    return frame


def empty_table() -> pd.DataFrame:
    """A contract-1 table with no rows (the right columns and dtypes)."""
    return _contract_frame(np.array([], dtype=object), np.array([], dtype=float), {})


# --------------------------------------------------------------------------------------------
# Talking to Prometheus (the I/O edge)


class PrometheusReader:
    """Queries one Prometheus with bounded time and turns every failure into `CollectError`."""

    def __init__(self, config: CollectConfig):
        self.config = config
        self._last_response: requests.Response | None = None
        session = requests.Session()
        session.hooks["response"].append(self._remember)
        retry = Retry(
            total=config.retries,
            connect=config.retries,
            read=False,  # a server too slow once is too slow twice: keep the total time bounded
            status=config.retries,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET"}),
            raise_on_status=False,
        )
        self._client = PrometheusConnect(
            url=config.url.rstrip("/"), retry=retry, session=session, timeout=config.timeout_s
        )

    def _remember(self, response: requests.Response, *args: object, **kwargs: object) -> None:
        self._last_response = response

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> PrometheusReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def range(self, query: str, start_s: float, end_s: float) -> list[Series]:
        step = f"{int(self.config.step_s)}"
        result = self._call(
            query,
            lambda: self._client.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(start_s, UTC),
                end_time=datetime.fromtimestamp(end_s, UTC),
                step=step,
                params={"timeout": self._query_timeout},
            ),
        )
        return parse_result(result, instant=False, where=self._where(query))

    def instant(self, query: str, at_s: float) -> list[Series]:
        result = self._call(
            query,
            lambda: self._client.custom_query(
                query, params={"time": f"{at_s:.3f}", "timeout": self._query_timeout}
            ),
        )
        return parse_result(result, instant=True, where=self._where(query))

    @property
    def _query_timeout(self) -> str:
        # Prometheus durations take whole numbers per unit ("1.25s" is bad_data): send ms.
        return f"{max(1, round(self.config.timeout_s * 1000))}ms"

    def _where(self, query: str) -> str:
        return f"Prometheus at {self.config.url} answering {query!r}"

    def _call(self, query: str, request: Callable[[], object]) -> object:
        self._last_response = None
        where = self._where(query)
        try:
            return request()
        except PrometheusApiClientException as error:
            raise CollectError(f"{where}: {self._http_problem() or error}") from error
        except requests.exceptions.JSONDecodeError as error:
            raise CollectError(
                f"{where}: the answer is not JSON ({self._body_excerpt()})"
            ) from error
        except requests.exceptions.Timeout as error:
            raise CollectError(
                f"{where}: no answer within the {self.config.timeout_s:g} s timeout ({error})"
            ) from error
        except requests.exceptions.ConnectionError as error:
            raise CollectError(f"{where}: cannot connect ({_root_cause(error)})") from error
        except requests.exceptions.RequestException as error:
            raise CollectError(f"{where}: request failed ({error})") from error
        except (KeyError, TypeError, ValueError) as error:
            raise CollectError(f"{where}: {self._envelope_problem()}") from error

    def _body_excerpt(self) -> str:
        response = self._last_response
        if response is None:
            return "no response body"
        body = response.text[:120]
        content_type = response.headers.get("Content-Type", "no Content-Type")
        return f"HTTP {response.status_code}, {content_type}, body starts {body!r}"

    def _http_problem(self) -> str | None:
        response = self._last_response
        if response is None:
            return None
        try:
            payload = response.json()
            detail = f"{payload.get('errorType', 'error')}: {payload['error']}"
        except (ValueError, KeyError, TypeError, AttributeError):
            detail = f"body starts {response.text[:200]!r}"
        return f"HTTP {response.status_code} {response.reason}: {detail}"

    def _envelope_problem(self) -> str:
        response = self._last_response
        if response is None:
            return "no usable answer"
        try:
            payload = response.json()
        except ValueError:
            return f"the answer is not JSON ({self._body_excerpt()})"
        if isinstance(payload, dict) and payload.get("status") == "error":
            return f"status 'error': {payload.get('errorType', '?')}: {payload.get('error', '?')}"
        if not isinstance(payload, dict):
            return f"JSON of the wrong shape: a {type(payload).__name__}, expected an object"
        return (
            "JSON of the wrong shape: expected {'status': 'success', 'data': {'result': [...]}}, "
            f"got {_describe(payload)}"
        )


def _root_cause(error: BaseException) -> str:
    while error.__context__ is not None and error.__context__ is not error:
        error = error.__context__
    return f"{type(error).__name__}: {error}"


def _queries(config: CollectConfig) -> dict[str, str]:
    """The PromQL per answer key of `build_table`."""
    return {
        "cpu_util": render_query(config.cpu_query, config),
        "temperature": render_query(config.temperature_query, config),
        "power_w": render_query(config.power_query, config),
    }


def _query_all(
    config: CollectConfig, run: Callable[[str], list[Series]]
) -> dict[str, list[Series]]:
    return {key: run(query) for key, query in _queries(config).items()}


def _log_summary(frame: pd.DataFrame, stats: CollectStats) -> None:
    log.info(
        "collected %d rows for %d nodes in %d chunk(s)",
        len(frame),
        frame["node"].nunique(),
        stats.chunks,
    )
    unmapped = stats.unmapped_counts()
    if any(unmapped.values()):
        instances = stats.unmapped_instances()
        log.warning(
            "%d series map to no node (by metric: %s); instances: %s",
            sum(unmapped.values()),
            unmapped,
            ", ".join(instances[:10]) + (" ..." if len(instances) > 10 else ""),
        )
    for node, columns in sorted(stats.duplicates.items()):
        log.warning("node %s: several series for %s were averaged", node, sorted(columns))
    for node, chosen in sorted(stats.sensors.items()):
        missing = [c for c in ("ambient_temp_c", "cpu1_temp_c") if c not in chosen]
        if missing:
            log.warning("node %s: no BMC sensor matched %s (check sensor_patterns)", node, missing)
        log.debug("node %s sensors: %s", node, chosen)


def iter_collected(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    *,
    progress: bool = True,
    stats: CollectStats | None = None,
) -> Iterator[pd.DataFrame]:
    """Contract-1 rows for `[start, end]`, one time chunk at a time (every node, as many steps
    as `chunk_steps` allows): what is held at once is one chunk, not the range."""
    stats = stats if stats is not None else CollectStats()
    step_s = int(config.step_s)
    start_s = math.floor(start.timestamp())
    end_s = math.floor(end.timestamp())
    if end_s < start_s:
        raise CollectConfigError(f"end ({end_s}) is before start ({start_s})")
    rules = compile_sensor_rules(config)
    show = progress and sys.stderr.isatty()
    queries = _queries(config)
    series_per_step = 0
    chunk_start_s = start_s
    with (
        contextlib.ExitStack() as open_readers,
        # A chunk's range queries run at once, each on its own connection: the server
        # evaluates one while this process decodes another (a fifth less wall time at 1,000
        # nodes on 2 cores; asking for the next chunk early gained nothing more).
        ThreadPoolExecutor(len(queries), thread_name_prefix="collect") as pool,
        tqdm(
            total=(end_s - start_s) // step_s + 1,
            desc="collect",
            unit="step",
            file=sys.stderr,
            disable=not show,
        ) as bar,
    ):
        # a reader per query and one for node names: a reader (session, last response for
        # error messages) is used by one thread only
        readers = {key: open_readers.enter_context(PrometheusReader(config)) for key in queries}
        uname_reader = open_readers.enter_context(PrometheusReader(config))
        while chunk_start_s <= end_s:
            steps = chunk_steps(config, series_per_step)
            chunk_end_s = min(chunk_start_s + (steps - 1) * step_s, end_s)
            pending = {
                key: pool.submit(readers[key].range, query, chunk_start_s, chunk_end_s)
                for key, query in queries.items()
            }
            host_nodes: dict[str, str] = {}
            if config.node_from == "uname":
                window_s = chunk_end_s - chunk_start_s + config.uname_lookback_s
                host_nodes = host_nodes_from_uname(
                    uname_reader.instant(uname_query(config, window_s), chunk_end_s), config
                )
            answers = {key: answer.result() for key, answer in pending.items()}
            series_per_step = max(series_per_step, sum(map(len, answers.values())))
            stats.chunks += 1
            stats.largest_chunk_samples = max(
                stats.largest_chunk_samples,
                sum(len(one.values) for found in answers.values() for one in found),
            )
            yield build_table(answers, config, host_nodes, stats, rules)
            bar.update((chunk_end_s - chunk_start_s) // step_s + 1)
            chunk_start_s = chunk_end_s + step_s


def collect_metrics(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    *,
    progress: bool = True,
    stats: CollectStats | None = None,
) -> pd.DataFrame:
    """Contract-1 rows for every node and step in `[start, end]`, read from Prometheus.

    Pass a `CollectStats` to learn what was unmapped or ambiguous (also logged). The whole
    range is held in memory (~0.8 KiB per row while collecting); for fleets, see
    `collect_to_directory`.
    """
    stats = stats if stats is not None else CollectStats()
    frames = list(iter_collected(config, start, end, progress=progress, stats=stats))
    frame = pd.concat(frames, ignore_index=True) if frames else empty_table()
    frame = frame.sort_values(["node", "timestamp"], kind="stable").reset_index(drop=True)
    _log_summary(frame, stats)
    return frame


def collect_to_directory(
    config: CollectConfig,
    start: datetime,
    end: datetime,
    out_dir: str | Path,
    *,
    nodes_per_file: int = 10,
    progress: bool = True,
    stats: CollectStats | None = None,
) -> list[Path]:
    """Collect into a directory of Parquet files of `nodes_per_file` nodes each.

    Each time chunk is split by node group and appended to the group's file as a row group,
    so memory holds one chunk (lower `max_samples_per_chunk` for smaller chunks), and the
    directory streams into `training.fit --input DIR` one file at a time. Nodes are numbered
    in the order they are first seen. Returns the files written, in group order.
    """
    if nodes_per_file < 1:
        raise CollectConfigError(f"nodes_per_file must be at least 1, got {nodes_per_file}")
    stats = stats if stats is not None else CollectStats()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    group_of: dict[str, int] = {}
    writers: dict[int, pq.ParquetWriter] = {}
    files: dict[int, Path] = {}
    rows = 0
    try:
        for chunk in iter_collected(config, start, end, progress=progress, stats=stats):
            for node in chunk["node"].unique():
                group_of.setdefault(str(node), len(group_of) // nodes_per_file)
            groups = chunk["node"].map(group_of).to_numpy()
            for group in np.unique(groups):
                part = chunk[groups == group].sort_values(["node", "timestamp"], kind="stable")
                table = pa.Table.from_pandas(part, preserve_index=False)
                if group not in writers:
                    files[group] = out_dir / f"nodes-{group:05d}.parquet"
                    writers[group] = pq.ParquetWriter(files[group], table.schema)
                writers[group].write_table(table.cast(writers[group].schema))
                rows += len(part)
    finally:
        for writer in writers.values():
            writer.close()
    log.info(
        "collected %d rows for %d nodes into %d file(s) in %s (%d unmapped series)",
        rows,
        len(group_of),
        len(files),
        out_dir,
        sum(stats.unmapped_counts().values()),
    )
    return [files[group] for group in sorted(files)]


def collect_instant(
    config: CollectConfig,
    *,
    at: datetime | None = None,
    stats: CollectStats | None = None,
) -> pd.DataFrame:
    """One contract-1 row per node, as Prometheus sees it at `at` (default: now).

    One instant query per metric for all nodes; `timestamp` is the evaluation time (a series
    stops answering once it is older than Prometheus's lookback, 5 minutes by default). A node
    without a power reading has `power_w` NaN; without a sensor, that temperature is NaN.
    """
    stats = stats if stats is not None else CollectStats()
    at_s = at.timestamp() if at is not None else time.time()
    with PrometheusReader(config) as reader:
        host_nodes: dict[str, str] = {}
        if config.node_from == "uname":
            host_nodes = host_nodes_from_uname(
                reader.instant(uname_query(config, config.uname_lookback_s), at_s), config
            )
        answers = _query_all(config, lambda q: reader.instant(q, at_s))
    stats.chunks += 1
    frame = build_table(answers, config, host_nodes, stats)
    # Instant answers all carry the evaluation time; keep one row per node regardless.
    return frame.drop_duplicates("node", keep="last").reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.collect",
        description=(
            "Read node CPU utilisation, BMC temperatures and power from Prometheus over a time "
            "range and write the contract-1 metrics table (the input of training.fit)."
        ),
    )
    parser.add_argument(
        "--prometheus",
        required=True,
        metavar="URL",
        help="Prometheus base URL, e.g. http://prometheus:9090 (required)",
    )
    parser.add_argument(
        "--start",
        required=True,
        metavar="TIME",
        help="range start: RFC 3339 (2026-01-05T00:00:00Z), Unix seconds, "
        "or relative to now (-7d, now-12h)",
    )
    parser.add_argument(
        "--end",
        default="now",
        metavar="TIME",
        help="range end, same forms as --start (default: now)",
    )
    parser.add_argument(
        "--step",
        default=None,
        metavar="DURATION",
        help="sample interval of the table in whole seconds: 60, 60s, 5m "
        "(default: 60s, or the config's step_s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="per-request timeout in seconds (default: 30 or the config's timeout_s)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML/JSON file of CollectConfig settings: queries, sensor_patterns, "
        "node_from (uname|label), instance_nodes... "
        "(default: built-in node_exporter + ipmi_exporter queries)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="output table, .parquet or .csv; with --nodes-per-file a directory (required)",
    )
    parser.add_argument(
        "--nodes-per-file",
        type=int,
        default=None,
        metavar="N",
        help="write --out as a directory of Parquet files of N nodes each, one time chunk at a "
        "time, so memory holds one chunk instead of the whole range; `python -m training.fit "
        "--input DIR` then reads it one file at a time (default: one table in memory)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar; log warnings only")
    parser.add_argument(
        "--verbose", action="store_true", help="also log the sensors chosen per node"
    )
    return parser


_TIME_FLAGS = ("--start", "--end")


def attach_relative_times(argv: Sequence[str]) -> list[str]:
    """`--start -7d` -> `--start=-7d`: argparse would take `-7d` for an unknown flag."""
    joined: list[str] = []
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        following = items[index + 1] if index + 1 < len(items) else ""
        if item in _TIME_FLAGS and following.startswith("-") and following[1:2].isdigit():
            joined.append(f"{item}={following}")
            index += 2
            continue
        joined.append(item)
        index += 1
    return joined


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(attach_relative_times(argv))
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # urllib3 warns on every retry; the final CollectError says what went wrong, once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    if args.nodes_per_file is None and args.out.suffix.lower() not in (".parquet", ".csv"):
        print(f"error: --out must end in .parquet or .csv, got {args.out.name!r}", file=sys.stderr)
        return 2
    try:
        step_s = parse_duration_s(args.step) if args.step is not None else None
        config = load_collect_config(
            args.config, url=args.prometheus, step_s=step_s, timeout_s=args.timeout
        )
        now = datetime.now(UTC)
        start = parse_time(args.start, now=now)
        end = parse_time(args.end, now=now)
        if end < start:
            raise CollectConfigError(
                f"--end ({end.isoformat()}) is before --start ({start.isoformat()})"
            )
    except CollectConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stats = CollectStats()
    try:
        if args.nodes_per_file is not None:
            files = collect_to_directory(
                config,
                start,
                end,
                args.out,
                nodes_per_file=args.nodes_per_file,
                progress=not args.quiet,
                stats=stats,
            )
            frame = empty_table() if not files else None
        else:
            frame = collect_metrics(config, start, end, progress=not args.quiet, stats=stats)
    except (CollectError, CollectConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if frame is None:  # written by collect_to_directory, which logged the summary
        return 0
    if frame.empty:
        print(
            f"error: Prometheus at {config.url} has no data for any node between "
            f"{start.isoformat()} and {end.isoformat()} "
            "(check the range, the queries and the node mapping)",
            file=sys.stderr,
        )
        return 1
    write_metrics(frame, args.out)
    log.info(
        "wrote %d rows for %d nodes to %s (%d unmapped series)",
        len(frame),
        frame["node"].nunique(),
        args.out,
        sum(stats.unmapped_counts().values()),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
