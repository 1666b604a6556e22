"""Cluster snapshot files (contract 3): read and checked at start-up, written from your data.

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
                              "cpu1_temp_c": 51.0, "cpu2_temp_c": 49.5, "power_w": 210.0}}]}

``name`` and ``allocatable_cpu`` (cores, a number or a Kubernetes quantity string such as
``"7500m"``) are required; ``labels`` and ``annotations`` are string maps as on the Node
(``energy-status``: grid, well-powered, vulnerable, low-powered, powerless; the annotation
``power-aware-scheduler/max-power-w``: a power cap in watts). ``telemetry`` holds the bundle's
features with the names of a contract-1 metrics table: ``cpu_util`` (a fraction 0..1),
``ambient_temp_c`` and ``cpu1_temp_c`` are required, ``cpu2_temp_c`` may be left out on a
one-socket node (the bundle fills it from ``cpu1_temp_c``), and ``power_w`` (measured watts,
optional) is reported next to the prediction on ``/metrics``. Any other key is refused (a typo
would otherwise leave the node without telemetry). ``null`` is a reading known to be missing (the
bundle's feature fill or "no telemetry" applies); no ``telemetry`` at all, or ``{}``, means the
node has none. Every error names the file, the node and the field.

Writing one (``python -m extender.sources.snapshot --help``): from a contract-1 metrics table,
each node's newest complete reading (``--from-metrics FILE``), or from a live cluster, its Nodes
from the Kubernetes API and each node's telemetry read from Prometheus now with the collect
settings training used (``--prometheus URL --kubeconfig FILE``). Reading a table needs pandas,
imported only by that command: the service itself never loads it.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import yaml

from extender.state import ClusterState, NodeInfo
from livedata.kube_client import add_kube_arguments
from livedata.metrics_table import (
    AMBIENT_TEMP_C,
    CONTRACT_COLUMNS,
    CPU1_TEMP_C,
    CPU2_TEMP_C,
    CPU_UTIL,
    NODE,
    POWER_W,
    TIMESTAMP,
    VALUE_COLUMNS,
)
from livedata.pod_resources import parse_cpu_quantity

if TYPE_CHECKING:
    import pandas as pd

    from livedata.collect_config import CollectConfig

DEMO_CLUSTER_FILE = Path(__file__).resolve().parent / "demo_cluster.json"
UTIL_FIELD = CPU_UTIL  # the telemetry value checked to be a fraction 0..1
NODE_FIELDS = frozenset({"name", "allocatable_cpu", "labels", "annotations", "telemetry"})
TELEMETRY_KEYS: tuple[str, ...] = VALUE_COLUMNS  # the features and the measured power
# Every bundle training writes needs these (cpu2_temp_c it fills from cpu1_temp_c); power_w
# is only reported. A reading known to be missing is given as null, never left out.
REQUIRED_TELEMETRY: tuple[str, ...] = (CPU_UTIL, AMBIENT_TEMP_C, CPU1_TEMP_C)
OPTIONAL_TELEMETRY: tuple[str, ...] = (CPU2_TEMP_C, POWER_W)


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
    for key in raw:
        if key not in TELEMETRY_KEYS:
            raise SnapshotError(f"{where}: {_unknown_telemetry_key(str(key))}")
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
    missing = [key for key in REQUIRED_TELEMETRY if key not in raw]
    if raw and missing:
        raise SnapshotError(
            f'{where}: "telemetry.{missing[0]}" is missing: a node\'s telemetry needs '
            f"{', '.join(REQUIRED_TELEMETRY)} (null for a reading that is missing); "
            f"{' and '.join(OPTIONAL_TELEMETRY)} may be left out"
        )
    return values


def _unknown_telemetry_key(key: str) -> str:
    close = difflib.get_close_matches(key, TELEMETRY_KEYS, n=1)
    hint = f' (did you mean "{close[0]}"?)' if close else ""
    return (
        f'"telemetry.{key}" is not a telemetry key{hint}; the keys are {", ".join(TELEMETRY_KEYS)}'
    )


def _kind(path: Path) -> str:
    return "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"


# ---------------------------------------------------------------------------------------------
# Writing snapshots (the command line; never run by the service)

DEFAULT_ALLOCATABLE_CPU = 32.0
KEPT_ANNOTATION_PREFIX = "power-aware-scheduler/"


def snapshot_document(nodes: Sequence[SnapshotNode]) -> dict[str, list[dict[str, object]]]:
    """The contract-3 document for `nodes`, sorted by name (what `parse_snapshot` reads back)."""
    document = []
    for node in sorted(nodes, key=lambda n: n.info.name):
        entry: dict[str, object] = {
            "name": node.info.name,
            "allocatable_cpu": node.info.allocatable_cpu,
            "labels": dict(node.info.labels),
        }
        if node.info.annotations:
            entry["annotations"] = dict(node.info.annotations)
        if node.telemetry:
            # A required reading the source lacked is written as null: missing, and said so.
            missing = {key: None for key in REQUIRED_TELEMETRY if key not in node.telemetry}
            entry["telemetry"] = {**node.telemetry, **missing}
        document.append(entry)
    return {"nodes": document}


def write_snapshot_file(path: Path, nodes: Sequence[SnapshotNode]) -> None:
    """Write `nodes` as a snapshot file: JSON (one node per line), or YAML by the suffix."""
    document = snapshot_document(nodes)
    parse_snapshot(document, str(path))  # never write what --cluster would refuse
    if path.suffix.lower() in (".yaml", ".yml"):
        text = yaml.safe_dump(document, sort_keys=False)
    else:
        lines = [orjson.dumps(node).decode() for node in document["nodes"]]
        text = '{"nodes": [\n  ' + ",\n  ".join(lines) + "\n]}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def nodes_from_metrics(
    path: Path, *, allocatable_cpu: float, cpu_util_percent: bool = False
) -> list[SnapshotNode]:
    """Each node's newest usable reading in a contract-1 table (a CSV/Parquet file or a
    directory of them): the newest row with a cpu_util in 0..1 and the ambient and CPU 1
    temperatures (sensor dropouts leave rows without them). Every node gets
    `allocatable_cpu` cores and no labels (grid power): edit the file to say otherwise."""
    try:
        import pandas as pd  # the command's only pandas use: the service never imports it
    except ImportError:  # the runtime image and a runtime-only install have no pandas
        raise SnapshotError(
            "--from-metrics reads the table with pandas, which only the train extra installs "
            "(pip install 'power-aware-scheduler[train]', or run it in the trainer image)"
        ) from None

    files = _metrics_files(Path(path))
    frames = []
    for file in files:
        try:
            if file.suffix.lower() == ".csv":
                frames.append(pd.read_csv(file, dtype={NODE: str}))
            else:
                frames.append(pd.read_parquet(file))
        except Exception as exc:  # pandas and pyarrow raise many types for a bad file
            raise SnapshotError(f"{file}: not readable as {file.suffix[1:]}: {exc}") from None
        missing = [c for c in (NODE, TIMESTAMP, UTIL_FIELD) if c not in frames[-1].columns]
        if missing:
            raise SnapshotError(
                f"{file}: missing column(s) {', '.join(missing)}; a contract-1 metrics table "
                f"has {', '.join(CONTRACT_COLUMNS)}"
            )
    table = pd.concat(frames, ignore_index=True)
    table["_time"] = _parse_times(table[TIMESTAMP])
    for column in TELEMETRY_KEYS:
        if column in table.columns:
            table[column] = pd.to_numeric(table[column], errors="coerce")
    if cpu_util_percent:
        table[UTIL_FIELD] = table[UTIL_FIELD] / 100.0
    elif (table[UTIL_FIELD] > 1.5).mean() > 0.5:
        raise SnapshotError(
            f"{path}: cpu_util looks like a percentage (most values above 1.5): pass "
            "--cpu-util-percent, or give fractions 0..1"
        )
    # A reading the bundle can use: utilisation and the temperatures a one-socket node has
    # (cpu2_temp_c is filled from cpu1_temp_c by the bundle when missing).
    complete = table[UTIL_FIELD].between(0.0, 1.0) & table["_time"].notna()
    for column in REQUIRED_TELEMETRY:
        if column in table.columns:
            complete &= table[column].notna()
    usable = table[complete]
    usable = usable[usable[NODE].notna() & (usable[NODE].astype(str).str.strip() != "")]
    if usable.empty:
        raise SnapshotError(
            f"{path}: no row has a node, a time, a cpu_util in 0..1 and the temperatures "
            f"{', '.join(REQUIRED_TELEMETRY[1:])}"
        )
    newest = usable.sort_values("_time", kind="stable").groupby(NODE, sort=True).tail(1)
    nodes = []
    for row in newest.to_dict("records"):
        telemetry = {
            column: float(row[column])
            for column in TELEMETRY_KEYS
            if column in row and pd.notna(row[column])
        }
        info = NodeInfo(str(row[NODE]).strip(), float(allocatable_cpu), {}, {})
        nodes.append(SnapshotNode(info=info, telemetry=telemetry))
    return nodes


def nodes_from_cluster(collect: CollectConfig, api: object) -> list[SnapshotNode]:
    """The cluster now: its Nodes (allocatable CPU, labels, our annotations) from the
    Kubernetes API (`api`: a `kubernetes` CoreV1Api) and each node's telemetry from one instant
    read of Prometheus, with the collect settings training used."""
    from livedata.instant import read_instant

    readings = {reading.node: reading for reading in read_instant(collect)}
    nodes = []
    for item in api.list_node().items:  # type: ignore[attr-defined]
        metadata, status = item.metadata, item.status
        allocatable = (status.allocatable or {}) if status is not None else {}
        if "cpu" not in allocatable:
            continue  # a node that has not reported yet
        annotations = {
            key: value
            for key, value in (metadata.annotations or {}).items()
            if key.startswith(KEPT_ANNOTATION_PREFIX)
        }
        reading = readings.get(metadata.name)
        telemetry = {}
        if reading is not None:
            telemetry = {
                column: value
                for column, value in reading.values.items()
                if column in TELEMETRY_KEYS and math.isfinite(value)
            }
        info = NodeInfo(
            metadata.name,
            parse_cpu_quantity(allocatable["cpu"]),
            dict(metadata.labels or {}),
            annotations,
        )
        nodes.append(SnapshotNode(info=info, telemetry=telemetry))
    return nodes


def _metrics_files(path: Path) -> list[Path]:
    suffixes = (".csv", ".parquet")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in suffixes)
        if not files:
            raise SnapshotError(f"{path}: directory has no .csv or .parquet files")
        return files
    if not path.is_file():
        raise SnapshotError(f"{path}: no such file or directory")
    if path.suffix.lower() not in suffixes:
        raise SnapshotError(f"{path}: give a .csv or .parquet metrics table")
    return [path]


def _parse_times(column: pd.Series) -> pd.Series:
    """Unix seconds or RFC 3339 -> UTC datetimes (NaT where unreadable)."""
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(column):  # Parquet keeps real timestamps
        return pd.to_datetime(column, utc=True)
    seconds = pd.to_numeric(column, errors="coerce")  # each row may be either form
    times = pd.to_datetime(seconds, unit="s", utc=True, errors="coerce")
    text = seconds.isna() & column.notna()
    if text.any():
        times[text] = pd.to_datetime(
            column[text].astype(str), utc=True, format="ISO8601", errors="coerce"
        )
    return times


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m extender.sources.snapshot",
        description=(
            "Write a cluster snapshot file for `python -m extender --cluster FILE`: nodes with "
            "fixed telemetry, to try a bundle on your own fleet without Kubernetes or "
            "Prometheus. The format is in `python -m extender --help` and the README."
        ),
        epilog=(
            "examples: python -m extender.sources.snapshot --from-metrics fleet.parquet "
            "--out cluster.json; python -m extender.sources.snapshot --prometheus "
            "http://prometheus:9090 --kubeconfig ~/.kube/config --out cluster.json"
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from-metrics",
        metavar="FILE",
        type=Path,
        help="a contract-1 metrics table (CSV/Parquet file or directory, what training.collect "
        "and training.synth write): each node's newest reading with a cpu_util in 0..1 and its "
        "temperatures",
    )
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="a live cluster: Nodes from the Kubernetes API (--kubeconfig or --in-cluster), "
        "telemetry read from this Prometheus now",
    )
    parser.add_argument("--out", metavar="FILE", type=Path, required=True, help=".json or .yaml")
    parser.add_argument(
        "--allocatable-cpu",
        metavar="CORES",
        type=float,
        default=DEFAULT_ALLOCATABLE_CPU,
        help="with --from-metrics: every node's allocatable CPU, which a metrics table does not "
        "hold (default %(default)g; edit the file for nodes of other sizes)",
    )
    parser.add_argument(
        "--cpu-util-percent",
        action="store_true",
        help="with --from-metrics: the table's cpu_util is in percent (0..100)",
    )
    parser.add_argument(
        "--collect-config",
        metavar="FILE",
        type=Path,
        help="with --prometheus: the collect settings training used (queries, sensor names, "
        "instance-to-node mapping)",
    )
    add_kube_arguments(parser, when="with --prometheus: ")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.prometheus is None and (args.kubeconfig or args.in_cluster or args.collect_config):
        parser.error("--kubeconfig, --in-cluster and --collect-config need --prometheus")
    if not args.allocatable_cpu > 0:
        parser.error(f"--allocatable-cpu must be > 0 cores, got {args.allocatable_cpu:g}")
    try:
        if args.from_metrics is not None:
            nodes = nodes_from_metrics(
                args.from_metrics,
                allocatable_cpu=args.allocatable_cpu,
                cpu_util_percent=args.cpu_util_percent,
            )
            source = str(args.from_metrics)
        else:
            nodes = _read_cluster(args)
            source = f"{args.prometheus} and the Kubernetes API"
        write_snapshot_file(args.out, nodes)
    except (SnapshotError, ValueError, OSError, RuntimeError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    with_telemetry = sum(1 for node in nodes if node.telemetry)
    print(
        f"wrote {args.out}: {len(nodes)} nodes ({with_telemetry} with telemetry) from {source}; "
        f"serve it with: python -m extender --bundle DIR --cluster {args.out}"
    )
    return 0


def _read_cluster(args: argparse.Namespace) -> list[SnapshotNode]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as ConnectionFailure

    from livedata.collect_config import load_collect_config
    from livedata.kube_client import (
        describe_api_error,
        describe_unreachable,
        kube_api_client,
        quiet_client_retries,
    )

    quiet_client_retries()
    collect = load_collect_config(args.collect_config, url=args.prometheus)
    api = client.CoreV1Api(kube_api_client(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster))
    try:
        return nodes_from_cluster(collect, api)
    except ApiException as exc:
        raise RuntimeError(describe_api_error(exc, "listing nodes")) from None
    except ConnectionFailure as exc:
        raise RuntimeError(describe_unreachable(exc, "listing nodes")) from None


if __name__ == "__main__":
    sys.exit(main())
