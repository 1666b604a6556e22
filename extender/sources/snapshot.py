"""Cluster snapshot files (contract 3) and the built-in demo cluster.

A snapshot replaces live Kubernetes + Prometheus with a file: nodes (allocatable CPU, labels,
optional annotations) and fixed telemetry. Its telemetry never goes stale, so a service
started with ``--cluster`` is ready as soon as its bundle is loaded. ``python -m extender``
with no arguments uses ``demo_cluster.json`` next to this module: twelve nodes ``node-01``..
``node-12`` (the nodes of the shipped bundle) with varied size, load and energy level.

The file is JSON, or YAML (``.yaml``/``.yml``) with the same structure::

    {"nodes": [{"name": "node-a", "allocatable_cpu": 32,
                "labels": {"energy-status": "well-powered"},
                "annotations": {"power-aware-scheduler/max-power-w": "450"},
                "telemetry": {"cpu_util": 0.35, "ambient_temp_c": 23.0,
                              "cpu1_temp_c": 51.0, "cpu2_temp_c": 49.5}}]}

``allocatable_cpu`` is cores (a number) or a Kubernetes quantity string (``"7500m"``).
Telemetry values are numbers; ``null`` or a missing key is a missing reading (the bundle's
feature fill or "no telemetry" applies). Every error names the file, the node and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
import yaml

from extender.state import ClusterState, NodeInfo
from livedata.metrics_table import CPU_UTIL
from livedata.pod_resources import parse_cpu_quantity

DEMO_CLUSTER_FILE = Path(__file__).resolve().parent / "demo_cluster.json"
UTIL_FIELD = CPU_UTIL  # the telemetry value checked to be a fraction 0..1
NODE_FIELDS = frozenset({"name", "allocatable_cpu", "labels", "annotations", "telemetry"})


class SnapshotError(ValueError):
    """The snapshot file cannot be used; the message names the file, node and field."""


@dataclass(frozen=True)
class SnapshotNode:
    info: NodeInfo
    telemetry: Mapping[str, float]  # empty: the node has no telemetry at all


def read_snapshot(path: Path) -> list[SnapshotNode]:
    """Read and check a snapshot file; raises SnapshotError naming file, node and field."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read cluster snapshot: {exc.strerror}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            document = yaml.safe_load(text)
        else:
            document = orjson.loads(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise SnapshotError(f"{path}: not valid {_kind(path)}: {exc}") from None
    return parse_snapshot(document, str(path))


def parse_snapshot(document: object, source: str) -> list[SnapshotNode]:
    """Check a decoded snapshot document; ``source`` names it in error messages."""
    if not isinstance(document, Mapping) or not isinstance(document.get("nodes"), list):
        raise SnapshotError(f'{source}: expected an object with a "nodes" list')
    nodes: list[SnapshotNode] = []
    seen: set[str] = set()
    for i, raw in enumerate(document["nodes"]):
        node = _parse_node(raw, f"{source}: nodes[{i}]")
        if node.info.name in seen:
            raise SnapshotError(f"{source}: nodes[{i}]: node {node.info.name!r} appears twice")
        seen.add(node.info.name)
        nodes.append(node)
    return nodes


def demo_snapshot() -> list[SnapshotNode]:
    """The built-in demo cluster shipped with the package."""
    return read_snapshot(DEMO_CLUSTER_FILE)


def load_into(state: ClusterState, nodes: Sequence[SnapshotNode], observed_at_s: float) -> None:
    """Make ``nodes`` the whole node set of ``state`` and record their telemetry."""
    state.replace_nodes(node.info for node in nodes)
    for node in nodes:
        if node.telemetry:
            state.set_telemetry(node.info.name, node.telemetry, observed_at_s)


def _parse_node(raw: object, where: str) -> SnapshotNode:
    if not isinstance(raw, Mapping):
        raise SnapshotError(f"{where}: a node must be an object")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SnapshotError(f'{where}: "name" must be a non-empty string, got {name!r}')
    where = f"{where} (node {name})"
    unknown = sorted(set(raw) - NODE_FIELDS)
    if unknown:
        raise SnapshotError(f"{where}: unknown field(s) {unknown}; known: {sorted(NODE_FIELDS)}")
    if "allocatable_cpu" not in raw:
        raise SnapshotError(f'{where}: "allocatable_cpu" (cores) is missing')
    raw_cpu = raw["allocatable_cpu"]
    try:
        if isinstance(raw_cpu, bool):
            raise ValueError("a boolean is not a CPU quantity")
        allocatable_cpu = parse_cpu_quantity(raw_cpu)
    except ValueError as exc:
        raise SnapshotError(f'{where}: "allocatable_cpu" {raw_cpu!r}: {exc}') from None
    if not allocatable_cpu > 0:
        raise SnapshotError(f'{where}: "allocatable_cpu" must be > 0 cores, got {raw_cpu!r}')
    return SnapshotNode(
        info=NodeInfo(
            name=name,
            allocatable_cpu=allocatable_cpu,
            labels=_string_map(raw.get("labels"), f'{where}: "labels"'),
            annotations=_string_map(raw.get("annotations"), f'{where}: "annotations"'),
        ),
        telemetry=_telemetry(raw.get("telemetry"), where),
    )


def _string_map(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SnapshotError(f"{where} must be an object of strings")
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise SnapshotError(f"{where}: {key!r}: {value!r} must map a string to a string")
    return dict(raw)


def _telemetry(raw: object, where: str) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SnapshotError(f'{where}: "telemetry" must be an object of numbers')
    values: dict[str, float] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SnapshotError(f'{where}: "telemetry.{key}" must be a number, got {value!r}')
        if not math.isfinite(value):
            raise SnapshotError(f'{where}: "telemetry.{key}" must be finite, got {value!r}')
        values[str(key)] = float(value)
    util = values.get(UTIL_FIELD)
    if util is not None and not 0.0 <= util <= 1.0:
        raise SnapshotError(
            f'{where}: "telemetry.{UTIL_FIELD}" must be a fraction 0..1, got {util}'
        )
    return values


def _kind(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
