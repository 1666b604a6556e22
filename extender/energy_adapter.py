"""Energy adapter: each node's stored energy (Prometheus) -> its `energy-status` label.

The extender scores nodes by the label `energy-status` (DESIGN.md): `well-powered` (75-100 %
stored energy), `vulnerable` (40-75), `low-powered` (15-40), `powerless` (0-15); powerless
nodes fail the filter. This process keeps that label true. Every `--interval` it reads each
node's battery level from Prometheus (node_exporter's `node_power_supply_capacity` by default),
maps it to a level and patches the node only when the label must change.

A battery hovering at a boundary would make the label flap with every reading, and with it the
placement of new pods and the offloading of running ones. So a node leaves its level only when
the reading has moved past the level's boundary by the hysteresis margin: with 3 % a
`vulnerable` node stays so from 37 % up to (not including) 78 %.

The label is the adapter's memory: each pass reads the current labels from the API, so a
restart (or a second replica) neither forgets a level nor repeats a patch.

Offloading: a `powerless` node also gets the taint `power-aware-scheduler/powerless:NoSchedule`
(removed when it recovers). New pods of every scheduler stay off it, and the Kubernetes
descheduler's RemovePodsViolatingNodeTaints moves running pods that do not tolerate it away
through the Eviction API (manifests/descheduler.yaml, docs/operations.md). The adapter never
evicts or deletes anything itself.

Layout: pure functions (`level_for`, `next_level`, `plan_node_patch`, `battery_by_node`) then
the thin I/O (`EnergyAdapter.run_pass`, the health server, `main`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from extender.logs import LOG_FORMATS, configure_logging
from extender.scoring import ENERGY_LABEL
from livedata.collect_config import (
    CollectConfig,
    CollectConfigError,
    parse_duration_s,
    uname_query,
)
from livedata.kube_client import KubeConfigError, kube_api_client
from livedata.node_mapping import host_nodes_from_uname, node_of
from livedata.prometheus import CollectError, PrometheusReader, Series

log = logging.getLogger("extender.energy_adapter")

POWERLESS_TAINT_KEY = "power-aware-scheduler/powerless"
POWERLESS_TAINT_EFFECT = "NoSchedule"
DEFAULT_QUERY = "node_power_supply_capacity"
DEFAULT_INTERVAL = "30s"
DEFAULT_HYSTERESIS_PCT = 3.0
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class EnergyLevel:
    """A label value and the stored-energy band it stands for: low_pct <= pct < high_pct."""

    name: str
    low_pct: float
    high_pct: float


# Lowest first. A reading exactly on a boundary belongs to the upper level (75 % is
# well-powered); 100 % is well-powered too.
LEVELS: tuple[EnergyLevel, ...] = (
    EnergyLevel("powerless", 0.0, 15.0),
    EnergyLevel("low-powered", 15.0, 40.0),
    EnergyLevel("vulnerable", 40.0, 75.0),
    EnergyLevel("well-powered", 75.0, 100.0),
)
LEVEL_BY_NAME: dict[str, EnergyLevel] = {level.name: level for level in LEVELS}
POWERLESS = LEVELS[0].name
# The margin must leave every band a core that no neighbour's extension reaches.
MAX_HYSTERESIS_PCT = min(level.high_pct - level.low_pct for level in LEVELS) / 2


# --------------------------------------------------------------------------------------------
# Pure: levels, hysteresis, patches
# --------------------------------------------------------------------------------------------


def level_for(stored_pct: float) -> str:
    """The level of a stored-energy percentage (0..100), without hysteresis."""
    if not 0.0 <= stored_pct <= 100.0:
        raise ValueError(f"stored energy must be 0..100 %, got {stored_pct!r}")
    for level in reversed(LEVELS):
        if stored_pct >= level.low_pct:
            return level.name
    return LEVELS[0].name


def next_level(stored_pct: float, current: str | None, hysteresis_pct: float) -> str:
    """The level a node should have now, given the one it has (None or unknown: none).

    The node keeps `current` while the reading stays within the current band widened by
    `hysteresis_pct` on both sides; once outside, it takes the plain level of the reading
    (which may skip levels after a sudden jump).
    """
    target = level_for(stored_pct)
    band = LEVEL_BY_NAME.get(current) if current is not None else None
    if band is None or target == current:
        return target
    if band.low_pct - hysteresis_pct <= stored_pct < band.high_pct + hysteresis_pct:
        return band.name
    return target


@dataclass(frozen=True)
class NodeEnergy:
    """What the adapter needs of a Node: its label, its taints and its resourceVersion."""

    name: str
    label: str | None  # the current energy-status value, whatever it is
    taints: tuple[Mapping[str, Any], ...]
    resource_version: str

    @property
    def level(self) -> str | None:
        """The current label if it is one of our levels, else None."""
        return self.label if self.label in LEVEL_BY_NAME else None

    @property
    def tainted(self) -> bool:
        return any(t.get("key") == POWERLESS_TAINT_KEY for t in self.taints)

    @classmethod
    def from_object(cls, node: Mapping[str, Any]) -> NodeEnergy:
        """From a Node's JSON (as the API returns it)."""
        metadata = node.get("metadata") or {}
        labels = metadata.get("labels") or {}
        return cls(
            name=metadata.get("name") or "",
            label=labels.get(ENERGY_LABEL),
            taints=tuple((node.get("spec") or {}).get("taints") or ()),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )


def plan_node_patch(
    node: NodeEnergy, target_level: str, *, taint_powerless: bool
) -> dict[str, Any] | None:
    """The JSON merge patch that gives `node` the target label (and taint), or None if it has it.

    Taints are a list, which a merge patch replaces whole: the patch carries the node's other
    taints unchanged plus the node's resourceVersion, so a taint someone else added in the
    meantime makes the API answer 409 (and the next pass retries) instead of being lost.
    """
    patch: dict[str, Any] = {}
    if node.label != target_level:
        patch["metadata"] = {"labels": {ENERGY_LABEL: target_level}}
    want_taint = taint_powerless and target_level == POWERLESS
    if want_taint != node.tainted:
        taints = [dict(t) for t in node.taints if t.get("key") != POWERLESS_TAINT_KEY]
        if want_taint:
            taints.append({"key": POWERLESS_TAINT_KEY, "effect": POWERLESS_TAINT_EFFECT})
        patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
        # null removes the field (merge patch), as the API shows a node without taints.
        patch["spec"] = {"taints": taints or None}
    return patch or None


@dataclass(frozen=True)
class BatteryReadings:
    """Stored-energy percentage per node, and what could not be used (for the log)."""

    pct_by_node: dict[str, float]
    unmapped_series: list[dict[str, str]] = field(default_factory=list)
    invalid: dict[str, float] = field(default_factory=dict)  # node -> the bad reading


def battery_by_node(
    series: Iterable[Series], config: CollectConfig, host_nodes: Mapping[str, str]
) -> BatteryReadings:
    """One percentage per node from an instant query's series.

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


# --------------------------------------------------------------------------------------------
# I/O: one pass, the loop, health
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterSettings:
    """Everything one adapter process is told on its command line."""

    prometheus_url: str
    query: str = DEFAULT_QUERY
    interval_s: float = 30.0
    hysteresis_pct: float = DEFAULT_HYSTERESIS_PCT
    timeout_s: float = 10.0
    node_from: str = "uname"
    node_label: str = "node"
    taint_powerless: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"--interval must be positive, got {self.interval_s} s")
        if not 0.0 <= self.hysteresis_pct < MAX_HYSTERESIS_PCT:
            raise ValueError(
                f"--hysteresis-pct must be 0 <= pct < {MAX_HYSTERESIS_PCT:g} (half the "
                f"narrowest band), got {self.hysteresis_pct}"
            )

    def collect_config(self) -> CollectConfig:
        """The collector's Prometheus settings: same client, same instance -> node mapping."""
        return CollectConfig(
            url=self.prometheus_url,
            timeout_s=self.timeout_s,
            node_from=self.node_from,
            node_label=self.node_label,
        )


@dataclass(frozen=True)
class LabelChange:
    node: str
    old_label: str | None
    new_label: str
    stored_pct: float
    taint_changed: bool


@dataclass
class PassResult:
    changes: list[LabelChange] = field(default_factory=list)
    nodes_seen: int = 0
    nodes_with_reading: int = 0
    conflicts: int = 0


class AdapterMetrics:
    """The adapter's own Prometheus metrics (served on --listen-port at /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.passes = Counter(
            "energy_adapter_passes_total",
            "Passes over all nodes, by result (ok, error)",
            ["result"],
            registry=self.registry,
        )
        self.changes = Counter(
            "energy_adapter_label_changes_total",
            "energy-status label changes patched, by the new level",
            ["level"],
            registry=self.registry,
        )
        self.nodes = Gauge(
            "energy_adapter_nodes",
            "Nodes per energy-status level after the last pass (none = no reading)",
            ["level"],
            registry=self.registry,
        )
        self.last_success = Gauge(
            "energy_adapter_last_success_timestamp_seconds",
            "Unix time the last successful pass ended",
            registry=self.registry,
        )


class EnergyAdapter:
    """Reads Prometheus, reads nodes, patches the ones whose level changed."""

    def __init__(
        self,
        settings: AdapterSettings,
        core_api: client.CoreV1Api,
        *,
        metrics: AdapterMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.core_api = core_api
        self.metrics = metrics or AdapterMetrics()
        self._collect_config = settings.collect_config()
        self._warned: set[tuple[str, str]] = set()  # (what, node): warn once per problem
        self.last_attempt_at_s: float | None = None
        self.last_success_at_s: float | None = None
        self.last_error: str | None = None

    def read_batteries(self, at_s: float) -> BatteryReadings:
        config = self._collect_config
        with PrometheusReader(config) as reader:
            host_nodes: dict[str, str] = {}
            if config.node_from == "uname":
                uname = reader.instant(uname_query(config, config.uname_lookback_s), at_s)
                host_nodes = host_nodes_from_uname(uname, config)
            return battery_by_node(reader.instant(self.settings.query, at_s), config, host_nodes)

    def read_nodes(self) -> dict[str, NodeEnergy]:
        response = self.core_api.list_node(
            _preload_content=False, _request_timeout=self.settings.timeout_s
        )
        items = json.loads(response.data)["items"]
        return {node.name: node for node in map(NodeEnergy.from_object, items)}

    def run_pass(self, *, at_s: float | None = None) -> PassResult:
        """One pass over all nodes. Raises CollectError / ApiException when a source fails."""
        at_s = time.time() if at_s is None else at_s
        self.last_attempt_at_s = time.monotonic()
        readings = self.read_batteries(at_s)
        nodes = self.read_nodes()
        self._warn_about(readings, nodes)
        result = PassResult(nodes_seen=len(nodes))
        counts = {level.name: 0 for level in LEVELS} | {"none": 0}
        for name, node in sorted(nodes.items()):
            stored_pct = readings.pct_by_node.get(name)
            if stored_pct is None:
                counts["none"] += 1
                continue
            result.nodes_with_reading += 1
            target = next_level(stored_pct, node.level, self.settings.hysteresis_pct)
            counts[target] += 1
            patch = plan_node_patch(node, target, taint_powerless=self.settings.taint_powerless)
            if patch is None:
                continue
            change = LabelChange(name, node.label, target, stored_pct, "spec" in patch)
            if self._apply(node, patch, change):
                result.changes.append(change)
            else:
                result.conflicts += 1
        for level, count in counts.items():
            self.metrics.nodes.labels(level=level).set(count)
        self.last_success_at_s = time.monotonic()
        self.last_error = None
        self.metrics.passes.labels(result="ok").inc()
        self.metrics.last_success.set(time.time())
        return result

    def _apply(self, node: NodeEnergy, patch: dict[str, Any], change: LabelChange) -> bool:
        taint_note = ""
        if change.taint_changed:
            verb = "added" if change.new_label == POWERLESS else "removed"
            taint_note = f"; taint {POWERLESS_TAINT_KEY}:{POWERLESS_TAINT_EFFECT} {verb}"
        what = (
            f"node {node.name}: {ENERGY_LABEL} {change.old_label or '(none)'} -> "
            f"{change.new_label} at {change.stored_pct:.1f} % stored energy{taint_note}"
        )
        if self.settings.dry_run:
            log.info("dry run, not patched: %s", what)
            return True
        try:
            self.core_api.patch_node(
                node.name,
                patch,
                _content_type=MERGE_PATCH,
                _request_timeout=self.settings.timeout_s,
            )
        except ApiException as error:
            if error.status == 409:
                log.warning("node %s changed while we patched it; retrying next pass", node.name)
                return False
            if error.status == 404:
                log.info("node %s is gone; nothing to label", node.name)
                return False
            raise
        log.info("%s", what)
        self.metrics.changes.labels(level=change.new_label).inc()
        return True

    def _warn_about(self, readings: BatteryReadings, nodes: Mapping[str, NodeEnergy]) -> None:
        for node, value in readings.invalid.items():
            self._warn_once(
                "invalid",
                node,
                "node %s: stored energy reading %r is not 0..100 %%; its label is left as is",
                node,
                value,
            )
        for node in sorted(set(readings.pct_by_node) - set(nodes)):
            self._warn_once(
                "unknown",
                node,
                "Prometheus has a battery reading for %r, which is not a Kubernetes node: "
                "check --node-from / --node-label",
                node,
            )
        if readings.unmapped_series:
            self._warn_once(
                "unmapped",
                "",
                "%d battery series map to no node (first: %s): check --node-from / --node-label",
                len(readings.unmapped_series),
                readings.unmapped_series[0],
            )
        # A problem that went away may be reported again when it comes back.
        current = (
            {("invalid", n) for n in readings.invalid}
            | {("unknown", n) for n in set(readings.pct_by_node) - set(nodes)}
            | ({("unmapped", "")} if readings.unmapped_series else set())
        )
        self._warned &= current

    def _warn_once(self, what: str, node: str, message: str, *args: object) -> None:
        if (what, node) not in self._warned:
            self._warned.add((what, node))
            log.warning(message, *args)

    def run_forever(self, stop: threading.Event) -> None:
        """Pass after pass, every interval, until `stop` is set; a failed pass is retried."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                result = self.run_pass()
                log.debug(
                    "pass: %d nodes, %d with a reading, %d changed",
                    result.nodes_seen,
                    result.nodes_with_reading,
                    len(result.changes),
                )
            except (CollectError, ApiException, OSError) as error:
                self.last_error = _one_line(error)
                self.metrics.passes.labels(result="error").inc()
                log.warning("pass failed, labels left as they are: %s", self.last_error)
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

    def health(self) -> tuple[bool, bool, dict[str, Any]]:
        """(alive, ready, details): alive while passes keep being attempted on schedule."""
        now = time.monotonic()
        # A pass may take two timeouts (Prometheus, then the API) plus the patches.
        grace_s = 3 * self.settings.interval_s + 4 * self.settings.timeout_s
        attempted = self.last_attempt_at_s
        alive = attempted is None or now - attempted <= grace_s
        ready = self.last_success_at_s is not None and self.last_error is None
        details = {
            "last_success_age_s": None
            if self.last_success_at_s is None
            else round(now - self.last_success_at_s, 1),
            "last_error": self.last_error,
        }
        return alive, ready, details


def _one_line(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"Kubernetes API: HTTP {error.status} {error.reason}"
    return " ".join(str(error).split())


class _HealthHandler(BaseHTTPRequestHandler):
    adapter: EnergyAdapter

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass

    def do_GET(self) -> None:
        alive, ready, details = self.adapter.health()
        if self.path == "/metrics":
            self._send(200, generate_latest(self.adapter.metrics.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._send(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
        elif self.path == "/readyz":
            body = f"{'ready' if ready else 'not ready'}: {details}\n".encode()
            self._send(200 if ready else 503, body)
        else:
            self._send(404, b"not found: /healthz /readyz /metrics\n")

    def _send(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_health(adapter: EnergyAdapter, host: str, port: int) -> ThreadingHTTPServer:
    """Serve /healthz, /readyz and /metrics in a daemon thread; returns the bound server."""
    handler = type("HealthHandler", (_HealthHandler,), {"adapter": adapter})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="energy-adapter-health", daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m extender.energy_adapter",
        description=(
            f"Keep each node's {ENERGY_LABEL} label ("
            + ", ".join(f"{lv.name} {lv.low_pct:g}-{lv.high_pct:g} %" for lv in reversed(LEVELS))
            + ") in line with its stored energy read from Prometheus, with hysteresis; taint "
            f"powerless nodes {POWERLESS_TAINT_KEY}:{POWERLESS_TAINT_EFFECT} for the descheduler."
        ),
    )
    parser.add_argument(
        "--prometheus", required=True, metavar="URL", help="Prometheus base URL (required)"
    )
    parser.add_argument(
        "--query",
        default=DEFAULT_QUERY,
        help="PromQL instant query giving stored energy in percent (0..100) per node or "
        "exporter instance (default: %(default)s, node_exporter's battery capacity)",
    )
    parser.add_argument(
        "--node-from",
        choices=("uname", "label"),
        default="uname",
        help="how a series finds its node: 'uname' joins its instance with node_uname_info's "
        "nodename; 'label' reads the --node-label label (default: %(default)s)",
    )
    parser.add_argument(
        "--node-label",
        default="node",
        help="series label holding the node name with --node-from label (default: %(default)s)",
    )
    parser.add_argument(
        "--interval",
        default=DEFAULT_INTERVAL,
        metavar="DURATION",
        help="time between passes: seconds or 30s, 1m... (default: %(default)s)",
    )
    parser.add_argument(
        "--hysteresis-pct",
        type=float,
        default=DEFAULT_HYSTERESIS_PCT,
        metavar="PCT",
        help="percentage points a reading must cross a level's boundary by before the label "
        f"changes, 0 <= PCT < {MAX_HYSTERESIS_PCT:g} (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="timeout of each Prometheus query and API call, in seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--no-taint",
        action="store_true",
        help=f"only label; do not taint powerless nodes {POWERLESS_TAINT_KEY} (and remove "
        "that taint where present). Offloading through the descheduler needs the taint",
    )
    kube = parser.add_mutually_exclusive_group()
    kube.add_argument("--kubeconfig", type=Path, help="kubeconfig file for the API")
    kube.add_argument(
        "--in-cluster", action="store_true", help="use the pod's service account for the API"
    )
    parser.add_argument(
        "--listen-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /healthz, /readyz and /metrics on this TCP port (default: off; 0 = any)",
    )
    parser.add_argument(
        "--listen-host", default="0.0.0.0", help="address for --listen-port (default: %(default)s)"
    )
    parser.add_argument(
        "--once", action="store_true", help="run one pass and exit (non-zero if it failed)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="log the changes a pass would make; patch nothing"
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    return parser


def settings_from_args(args: argparse.Namespace) -> AdapterSettings:
    """Validated settings; ValueError (with the flag at fault) on bad values."""
    try:
        interval_s = parse_duration_s(args.interval)
    except CollectConfigError as error:
        raise ValueError(f"--interval: {error}") from None
    if not args.timeout > 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    return AdapterSettings(
        prometheus_url=args.prometheus,
        query=args.query,
        interval_s=interval_s,
        hysteresis_pct=args.hysteresis_pct,
        timeout_s=args.timeout,
        node_from=args.node_from,
        node_label=args.node_label,
        taint_powerless=not args.no_taint,
        dry_run=args.dry_run,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        settings = settings_from_args(args)
        api_client = kube_api_client(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster)
    except (ValueError, KubeConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    adapter = EnergyAdapter(settings, client.CoreV1Api(api_client))
    if args.once:
        try:
            result = adapter.run_pass()
        except (CollectError, ApiException, OSError) as error:
            print(f"error: {_one_line(error)}", file=sys.stderr)
            return 1
        log.info(
            "one pass: %d nodes, %d with a reading, %d changed",
            result.nodes_seen,
            result.nodes_with_reading,
            len(result.changes),
        )
        return 0
    if args.listen_port is not None:
        server = serve_health(adapter, args.listen_host, args.listen_port)
        log.info("health and metrics on http://%s:%d", *server.server_address[:2])
    log.info(
        "labelling nodes every %g s from %s (query %r, hysteresis %g %%)",
        settings.interval_s,
        settings.prometheus_url,
        settings.query,
        settings.hysteresis_pct,
    )
    stop = threading.Event()
    try:
        adapter.run_forever(stop)
    except KeyboardInterrupt:
        stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
