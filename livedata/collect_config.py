"""The collect settings: what to ask Prometheus and how its answers map to nodes and columns.

Training's collector, the extender's live telemetry and the energy adapter read Prometheus with
these same settings, so a node's features mean the same thing at training and at serving time.
Three things vary between clusters, so all three are configuration (`CollectConfig`, loadable
from YAML/JSON with `load_collect_config`):

- the PromQL queries (`$window` and `$by` in a query are replaced by the CPU rate window and the
  grouping labels, `$match` by a node group's label matcher when `training.fit --dask` has each
  worker read only its group, and by nothing otherwise; `render_query`, `group_matcher`);
- the BMC sensor names, which every vendor spells differently ("Inlet Temp", "Ambient",
  "CPU1 Temp", "CPU 1 Temp", Dell's two sensors both called "Temp"...): regexes per column
  (`compile_sensor_rules`; `livedata.node_mapping` applies them);
- how an exporter's `instance` becomes a Kubernetes node name: a label already on the series
  (`node_from: label`), or node_exporter's `node_uname_info{nodename}` joined on the host part
  of `instance` (`node_from: uname`; node_exporter and ipmi_exporter listen on different ports
  of the same host; `uname_query`).

Also here: the duration and time forms the settings and the command lines accept
(`parse_duration_s`, `parse_time`). A bad setting raises `CollectConfigError` naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from livedata.metrics_table import (
    AMBIENT_TEMP_C,
    CPU1_TEMP_C,
    CPU2_TEMP_C,
    CPU_UTIL,
    POWER_W,
    TEMPERATURE_COLUMNS,
)

PROMETHEUS_MAX_POINTS = 11_000  # Prometheus rejects range queries with more points per series
# rate() of the idle counter can exceed 1 by float rounding or scrape jitter, which would make
# an idle node's utilisation slightly negative and its row dropped as out of range: clamp.
DEFAULT_CPU_QUERY = (
    'clamp(1 - avg by ($by) (rate(node_cpu_seconds_total{mode="idle",$match}[$window])), 0, 1)'
)
DEFAULT_TEMPERATURE_QUERY = "ipmi_temperature_celsius{$match}"
DEFAULT_POWER_QUERY = "ipmi_dcmi_power_consumption_watts{$match}"

# Full-match, case-insensitive; earlier patterns win when several sensors match one column.
# "CPU1 Temp" must beat "CPU1 VRM Temp", and Supermicro's "P1-DIMMA1 Temp" is no CPU.
_NOT_CPU_DIE = r"(?!.*\b(vrm|vr|dimm|mem|memory|vcore)\b)"
DEFAULT_SENSOR_PATTERNS: dict[str, tuple[str, ...]] = {
    AMBIENT_TEMP_C: (
        r"(\d+-)?(system board |mb |front panel )?(inlet|ambient)( (temp|temperature|air))?",
        r".*\b(inlet|ambient)\b.*",
    ),
    CPU1_TEMP_C: (
        r"(\d+-)?(cpu|proc|processor)[ _]?1( (temp|temperature))?",
        rf"(\d+-)?(cpu|proc|processor)[ _]?1\b{_NOT_CPU_DIE}.*",
    ),
    CPU2_TEMP_C: (
        r"(\d+-)?(cpu|proc|processor)[ _]?2( (temp|temperature))?",
        rf"(\d+-)?(cpu|proc|processor)[ _]?2\b{_NOT_CPU_DIE}.*",
    ),
}
# Dell iDRAC names both CPU sensors just "Temp": taken in sensor-id order as CPU1, CPU2 when a
# node has no sensor matching the CPU columns by name.
DEFAULT_SHARED_CPU_SENSOR_PATTERNS: tuple[str, ...] = (r"temp(erature)?",)


class CollectConfigError(ValueError):
    """A bad collect setting; the message names the setting (and the file it came from)."""


@dataclass
class CollectConfig:
    """Everything a Prometheus reader needs to know about a cluster: where, what, and how the
    answers map to nodes and columns (training's range collection, the live instant reads)."""

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
    # Node facts (contract 1's optional columns), read once per collection by training.collect:
    # node_exporter's CPU info (model name, package and core per logical CPU), kube-state-
    # metrics' node labels (Node Feature Discovery's cpu-model labels, when allow-listed), and
    # a PromQL giving each node's power-supply or nameplate rating in watts ("" : not asked).
    cpu_info_metric: str = "node_cpu_info"
    node_labels_metric: str = "kube_node_labels"
    psu_rating_query: str = ""
    # How far back from the end of a collection the facts are looked for: the highest power
    # the BMC reported in this window says more than the training range alone.
    facts_lookback: str = "30d"
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
        parse_duration_s(self.facts_lookback)
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
# Times and durations (settings and command lines)

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


# --------------------------------------------------------------------------------------------
# Queries

# The answers a collection reads, keyed by what they fill: the CPU and power answers are
# contract columns themselves, the temperature answer is split over the temperature columns
# by sensor name.
TEMPERATURE_ANSWER = "temperature"
ANSWER_KEYS: tuple[str, ...] = (CPU_UTIL, TEMPERATURE_ANSWER, POWER_W)


MATCH_PLACEHOLDER = "$match"


def render_query(template: str, config: CollectConfig, match: str = "") -> str:
    """Fill `$window` (CPU rate window), `$by` (labels identifying a node) and `$match` in a query.

    `$match` goes inside a selector's braces and becomes `match`, a label matcher that narrows
    the query to one node group (`group_matcher`); without one it disappears with its comma or
    its empty braces, so the query reads as it always has.
    """
    by = config.instance_label
    if config.node_from == "label":
        by = f"{config.instance_label}, {config.node_label}"
    query = template.replace("$window", config.cpu_rate_window).replace("$by", by)
    if match:
        return query.replace(MATCH_PLACEHOLDER, match)
    for form in ("{" + MATCH_PLACEHOLDER + "}", "," + MATCH_PLACEHOLDER, MATCH_PLACEHOLDER):
        query = query.replace(form, "")
    return query


def uname_query(config: CollectConfig, window_s: float, match: str = "") -> str:
    """The query whose answer maps exporter hosts to node names (`node_from: uname`)."""
    selector = f"{{{match}}}" if match else ""
    return f"last_over_time({config.uname_metric}{selector}[{max(1, math.ceil(window_s))}s])"


def collect_queries(config: CollectConfig, match: str = "") -> dict[str, str]:
    """The PromQL per answer key (`ANSWER_KEYS`), rendered for this cluster (and node group)."""
    return {
        CPU_UTIL: render_query(config.cpu_query, config, match),
        TEMPERATURE_ANSWER: render_query(config.temperature_query, config, match),
        POWER_W: render_query(config.power_query, config, match),
    }


def queries_without_match(config: CollectConfig) -> list[str]:
    """The settings among `cpu_query`, `temperature_query`, `power_query` lacking `$match`: a
    collection split into node groups cannot narrow them, so it refuses them."""
    return [
        name
        for name in ("cpu_query", "temperature_query", "power_query")
        if MATCH_PLACEHOLDER not in getattr(config, name)
    ]


def group_matcher(label: str, values: Sequence[str]) -> str:
    """A PromQL matcher selecting series whose `label` is exactly one of `values`.

    `label=~"v1|v2|..."`: each value regex-escaped, then escaped for the double-quoted PromQL
    string; an empty value also selects the series that lack the label.
    """
    alternatives = "|".join(re.escape(value) for value in values)
    quoted = alternatives.replace("\\", "\\\\").replace('"', '\\"')
    return f'{label}=~"{quoted}"'


# --------------------------------------------------------------------------------------------
# Sensor-name rules


@dataclass(frozen=True)
class SensorRules:
    """Compiled sensor-name regexes: per temperature column, and the shared CPU names."""

    columns: Mapping[str, tuple[re.Pattern[str], ...]]
    shared_cpu: tuple[re.Pattern[str], ...]
    name_label: str
    id_label: str


def compile_sensor_rules(config: CollectConfig) -> SensorRules:
    """The config's sensor-name regexes, compiled; `CollectConfigError` names a bad one."""

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
