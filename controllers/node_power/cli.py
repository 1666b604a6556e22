"""`python -m controllers.node_power`: the command line of the node power controller.

Flags -> `ControllerSettings` (a bad value exits 2 with one line naming the flag), a
Kubernetes client, the model bundle, the BMC Secret and the leader election, then rounds
every `--scan-interval` (or one round with `--once`), with /healthz, /readyz, /metrics and
/status on `--listen-port`. The policy's flags carry cluster-autoscaler's names where it has
the same knob (`--scale-down-unneeded-time`, `--scale-down-utilization-threshold`,
`--max-graceful-termination-sec`, `--max-drain-parallelism`), the leader election's
kube-scheduler's (`--leader-elect-*`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from controllers.node_power.actuator import ActuatorSettings
from controllers.node_power.carbon import CarbonSettings, NodeIntensity, read_sources_file
from controllers.node_power.controller import ControllerSettings, NodePowerController
from controllers.node_power.drivers import BmcSecret, DriverError
from controllers.node_power.health import serve_health
from controllers.node_power.idle_power import IdlePower, NominalConditions
from controllers.node_power.kube import describe_api_error, rfc3339
from controllers.node_power.lease import LeaderElector, LeaseSettings
from controllers.node_power.metrics import ControllerMetrics
from controllers.node_power.policy import RANK_BY, RANK_BY_GRAMS, RANK_BY_WATTS, PolicySettings
from controllers.probes import stop_on_signals
from livedata.carbon import SIGNALS
from livedata.collect_config import CollectConfig, CollectConfigError, parse_duration_s
from livedata.kube_client import KubeConfigError, add_kube_arguments, kube_api_client
from livedata.labels import (
    CARBON_INTENSITY_ANNOTATION,
    CARBON_ZONE_LABEL,
    POWER_DRIVER_DRY_RUN,
    POWER_DRIVER_LABEL,
    POWER_DRIVERS,
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_STATE_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
    REGION_LABEL,
)
from livedata.logs import LOG_FORMATS, configure_logging
from predictor.core_scaling import shipped_core_exponents

log = logging.getLogger(__package__)

DEFAULT_NAMESPACE = "power-aware-scheduler"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

DESCRIPTION = f"""\
Power off the nodes that consolidation empties, and wake them when pods need them.

Every scan interval the leader (one replica holds a Lease) reads nodes, pods and disruption
budgets, asks the policy which nodes to power off, drain or wake, and acts: cordon, evict
through the Eviction API (PodDisruptionBudgets respected), power off through the node's
driver, record the state on the node ({POWER_STATE_ANNOTATION}: on, draining, off,
waking); wake = power on, uncordon once Ready. Any failure uncordons the node, records why
and backs off.

Only nodes labelled {POWER_MANAGEMENT_LABEL}={POWER_MANAGEMENT_ENABLED} are touched. The
annotation {POWER_MANAGEMENT_DISABLED_ANNOTATION}: "true" on a node or on the
controller's namespace stops every power action there. The driver is the node label
{POWER_DRIVER_LABEL} ({", ".join(POWER_DRIVERS)}; --default-driver otherwise); BMC
addresses and credentials come from a mounted Secret (--bmc-secret-dir), never from flags.

Dry run is the default: without --apply nothing is written and every decision is logged
as "would ...". With --apply and the dry-run driver the whole cycle runs except the power
switch itself.

A node goes off once it has been unneeded for --scale-down-unneeded-time. The first round
a process leads (every --once run, a new leader) starts that clock from the evidence the
cluster holds, not from the process start: the node's {POWER_STATE_SINCE_ANNOTATION}
(or its creation), the pods the API still lists on it, and its kubelet's Events about pods,
which the API server keeps for its --event-ttl (give the same value here): a node empty for
longer than the unneeded time shows as a power-off in the first round, one whose last pod
ended a minute ago does not. Without leave to list Events the clocks start at that round.

Stopping: SIGTERM or Ctrl-C stops acting at once, stops the leader election and releases the
Lease (the other replica takes over at once), and exits 0. When the API server is unreachable
the controller says so in one line per retry and stops acting at the renew deadline.
"""


def _duration(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            return parse_duration_s(text)
        except CollectConfigError as error:
            raise argparse.ArgumentTypeError(f"{flag}: {error}") from None

    return parse


def _durations(flag: str) -> Callable[[str], tuple[float, ...]]:
    """'5m,30m' -> (300.0, 1800.0); each a positive duration."""
    one = _duration(flag)

    def parse(text: str) -> tuple[float, ...]:
        values = tuple(one(part.strip()) for part in text.split(",") if part.strip())
        if not values or not all(v > 0 for v in values):
            raise argparse.ArgumentTypeError(f"{flag}: positive durations, got {text!r}")
        return values

    return parse


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def default_namespace() -> str:
    """$POD_NAMESPACE, else the service account's namespace, else power-aware-scheduler."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def build_parser() -> argparse.ArgumentParser:
    """Every flag, with its default in the help."""
    parser = argparse.ArgumentParser(
        prog="python -m controllers.node_power",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="act: cordon, evict, switch power, annotate. Without it (the default) the "
        "controller only logs what it would do",
    )
    where = parser.add_argument_group("cluster")
    add_kube_arguments(where)
    where.add_argument(
        "--namespace",
        default=None,
        help="the controller's namespace: its Lease and the namespace kill switch (default: "
        f"$POD_NAMESPACE, the service account's, else {DEFAULT_NAMESPACE})",
    )
    where.add_argument(
        "--scheduler-name",
        default="power-aware-scheduler",
        help="pods for this scheduler that wait as Unschedulable wake nodes (default: %(default)s)",
    )
    where.add_argument(
        "--api-timeout",
        type=_duration("--api-timeout"),
        default="10s",
        metavar="DURATION",
        help="timeout of each API call (default: %(default)s)",
    )
    where.add_argument(
        "--event-ttl",
        type=_duration("--event-ttl"),
        default="1h",
        metavar="DURATION",
        help="how long the API server keeps Events (its own --event-ttl): how far back the "
        "first round looks for a node's last pod (default: %(default)s)",
    )

    model = parser.add_argument_group("idle power (which nodes go first, watts saved)")
    model.add_argument(
        "--bundle",
        type=Path,
        help="model bundle directory, the extender's (mounted power-models-* ConfigMaps); "
        "without it idle watts are unknown and nodes go off in name order",
    )
    model.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus for current temperatures (optional; nominal ones otherwise)",
    )
    model.add_argument(
        "--nominal-ambient-c", type=float, default=24.0, help="(default: %(default)s)"
    )
    model.add_argument(
        "--nominal-cpu-above-ambient-c",
        type=float,
        default=32.0,
        help="CPU temperature above ambient at half load (default: %(default)s)",
    )
    model.add_argument(
        "--fallback-core-scaling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="scale the idle watts of nodes on the bundle's fleet fallback by their allocatable "
        "CPU against the median of the nodes with a model of their own, as the extender scales "
        "their curves (default: on; keep it as the extender's --fallback-core-scaling)",
    )

    policy = parser.add_argument_group("policy")
    policy.add_argument(
        "--scan-interval",
        type=_duration("--scan-interval"),
        default="10s",
        metavar="DURATION",
        help="time between rounds (default: %(default)s)",
    )
    policy.add_argument(
        "--scale-down-unneeded-time",
        type=_duration("--scale-down-unneeded-time"),
        default="10m",
        metavar="DURATION",
        help="how long a node must be unneeded before it goes off, counted in the first "
        "round from the evidence the cluster holds (see above) (default: %(default)s)",
    )
    policy.add_argument(
        "--scale-down-utilization-threshold",
        type=_fraction,
        default=0.5,
        metavar="FRACTION",
        help="a node whose pods request less than this share of its CPU, and fit elsewhere, "
        "is drained (default: %(default)s)",
    )
    policy.add_argument(
        "--empty-nodes-only",
        action="store_true",
        help="power off only nodes that run nothing but DaemonSet and mirror pods; never drain",
    )
    policy.add_argument(
        "--node-cooldown",
        type=_duration("--node-cooldown"),
        default="30m",
        metavar="DURATION",
        help="a node powered on or off less than this ago is left alone: at most one power "
        "cycle per cool-down (default: %(default)s)",
    )
    policy.add_argument(
        "--min-on-nodes",
        type=int,
        default=1,
        metavar="N",
        help="never fewer nodes on than this (default: %(default)s)",
    )
    policy.add_argument(
        "--max-off-fraction",
        type=_fraction,
        default=0.5,
        metavar="FRACTION",
        help="never more than this share of the managed nodes off (default: %(default)s)",
    )
    policy.add_argument(
        "--min-headroom-cores",
        type=float,
        default=0.0,
        metavar="CORES",
        help="free CPU always kept on (default: %(default)s)",
    )
    policy.add_argument(
        "--target-wait-p99-s",
        type=_non_negative,
        default=0.0,
        metavar="SECONDS",
        help="target for the p99 wait of pods (creation to scheduled): the controller learns "
        "a headroom from the demand growth within a boot time by hour of day, at a quantile "
        "it raises while the target is missed and lowers slowly while met; the larger of it "
        "and --min-headroom-cores applies (default: %(default)s, none)",
    )
    policy.add_argument(
        "--boot-time",
        type=_duration("--boot-time"),
        default="5m",
        metavar="DURATION",
        help="how long a node takes to boot: the headroom keeps room for what arrives "
        "meanwhile (default: %(default)s)",
    )
    policy.add_argument(
        "--headroom-factor",
        type=float,
        default=1.0,
        help="scale of that headroom (default: %(default)s)",
    )
    policy.add_argument(
        "--boot-energy-kj",
        type=float,
        default=0.0,
        metavar="KJ",
        help="energy one boot costs, spread over --wake-horizon when choosing whom to wake "
        "(default: %(default)s)",
    )
    policy.add_argument(
        "--wake-horizon",
        type=_duration("--wake-horizon"),
        default="1h",
        metavar="DURATION",
        help="(default: %(default)s)",
    )
    policy.add_argument(
        "--arrival-windows",
        type=_durations("--arrival-windows"),
        default=(),
        metavar="DURATION,...",
        help="the arrival rate of requested CPU is the highest mean rate over these windows "
        "(default: one --boot-time and six, as the energy simulation measures it)",
    )
    policy.add_argument(
        "--off-margin-sd",
        type=_non_negative,
        default=2.0,
        metavar="SD",
        help="a node goes off only while the others keep the headroom plus this many standard "
        "deviations of the CPU that arrives in a boot time: the margin between waking and "
        "powering off, so the next few pods do not wake it again (default: %(default)s)",
    )
    policy.add_argument(
        "--rank-by",
        choices=RANK_BY,
        default=None,
        help="what the choice of nodes to power off and to wake minimises: 'watts' (predicted "
        "power) or 'grams' (predicted power times each node's carbon intensity over the next "
        "--carbon-horizon, read as the extender's Carbon plugin reads it; see "
        "--carbon-sources) (default: grams with --carbon-sources, watts without)",
    )

    carbon = parser.add_argument_group("carbon intensity (for --rank-by grams)")
    carbon.add_argument(
        "--carbon-sources",
        type=Path,
        metavar="FILE",
        help="YAML file with the Carbon plugin's 'sources' list (Prometheus, carbon-aware-sdk, "
        "Electricity Maps, WattTime, file; or its whole args block); without it only nodes' "
        f"own {CARBON_INTENSITY_ANNOTATION} annotations count",
    )
    carbon.add_argument(
        "--carbon-signal",
        choices=SIGNALS,
        default="average",
        help="which intensity signal ranks nodes (default: %(default)s)",
    )
    carbon.add_argument(
        "--carbon-zone-label",
        default=REGION_LABEL,
        metavar="LABEL",
        help=f"node label naming the grid zone ({CARBON_ZONE_LABEL} wins when set) "
        "(default: %(default)s)",
    )
    carbon.add_argument(
        "--carbon-max-age",
        type=_duration("--carbon-max-age"),
        default="2h",
        metavar="DURATION",
        help="a value or forecast older than this is stale and the node counts as unknown "
        "(default: %(default)s)",
    )
    carbon.add_argument(
        "--carbon-poll-interval",
        type=_duration("--carbon-poll-interval"),
        default="5m",
        metavar="DURATION",
        help="how often the sources are polled, in the background (default: %(default)s)",
    )
    carbon.add_argument(
        "--carbon-horizon",
        type=_duration("--carbon-horizon"),
        default="4h",
        metavar="DURATION",
        help="rank each node by its zone's mean intensity over the next DURATION (the "
        "sources' forecast, weighted by time; the current value where the forecast ends or "
        "without one), not the present hour's: a node powered off stays off for hours, so one "
        "about to enter a dirty hour is the better one to empty, one about to enter a clean "
        "hour the better one to wake. 0: the present value only (default: %(default)s)",
    )

    act = parser.add_argument_group("acting")
    act.add_argument(
        "--max-drain-parallelism",
        type=int,
        default=1,
        metavar="N",
        help="nodes drained at once; as many may start in one round (default: %(default)s)",
    )
    act.add_argument(
        "--max-empty-bulk-power-off",
        type=int,
        default=10,
        metavar="N",
        help="empty nodes powered off in one round (default: %(default)s)",
    )
    act.add_argument(
        "--drain-timeout",
        type=_duration("--drain-timeout"),
        default="10m",
        metavar="DURATION",
        help="a drain not done by then is given up, the node uncordoned (default: %(default)s)",
    )
    act.add_argument(
        "--max-graceful-termination-sec",
        type=int,
        default=600,
        metavar="SECONDS",
        help="longest grace period given to an evicted pod (default: %(default)s)",
    )
    act.add_argument(
        "--shutdown-timeout",
        type=_duration("--shutdown-timeout"),
        default="5m",
        metavar="DURATION",
        help="a node still on this long after a graceful shutdown is forced off (default: "
        "%(default)s)",
    )
    act.add_argument(
        "--wake-timeout",
        type=_duration("--wake-timeout"),
        default="15m",
        metavar="DURATION",
        help="a woken node not Ready by then is recorded off again (default: %(default)s)",
    )
    act.add_argument(
        "--retry-backoff",
        type=_duration("--retry-backoff"),
        default="1m",
        metavar="DURATION",
        help="wait after a node's first failure, doubled after each next (default: %(default)s)",
    )
    act.add_argument(
        "--max-retry-backoff",
        type=_duration("--max-retry-backoff"),
        default="30m",
        metavar="DURATION",
        help="(default: %(default)s)",
    )

    drivers = parser.add_argument_group("power drivers")
    drivers.add_argument(
        "--default-driver",
        choices=POWER_DRIVERS,
        default=POWER_DRIVER_DRY_RUN,
        help=f"driver of nodes without the {POWER_DRIVER_LABEL} label (default: %(default)s)",
    )
    drivers.add_argument(
        "--bmc-secret-dir",
        type=Path,
        help="the mounted BMC Secret: one key per node (address, username, password...); see "
        "docs/operations.md",
    )
    drivers.add_argument(
        "--bmc-timeout",
        type=_duration("--bmc-timeout"),
        default="10s",
        metavar="DURATION",
        help="bound on every BMC call (default: %(default)s)",
    )

    election = parser.add_argument_group("leader election (a Lease in --namespace)")
    election.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a Lease before acting, so replicas never act together (default: on)",
    )
    election.add_argument("--leader-elect-resource-name", default="power-node-controller")
    election.add_argument(
        "--leader-elect-lease-duration",
        type=_duration("--leader-elect-lease-duration"),
        default="15s",
        metavar="DURATION",
    )
    election.add_argument(
        "--leader-elect-renew-deadline",
        type=_duration("--leader-elect-renew-deadline"),
        default="10s",
        metavar="DURATION",
    )
    election.add_argument(
        "--leader-elect-retry-period",
        type=_duration("--leader-elect-retry-period"),
        default="2s",
        metavar="DURATION",
    )
    election.add_argument(
        "--identity", default=None, help="this replica's name in the Lease (default: hostname)"
    )

    run = parser.add_argument_group("running")
    run.add_argument(
        "--listen-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /healthz, /readyz, /metrics and /status on this port (default: off)",
    )
    run.add_argument("--listen-host", default="0.0.0.0", help="(default: %(default)s)")
    run.add_argument(
        "--once",
        action="store_true",
        help="one round, its decisions printed as JSON (unknown numbers are null); exit 1 if "
        "it failed. Its unneeded clocks start from the evidence the cluster holds, as a new "
        "leader's do. With --apply it takes the Lease first and refuses while a running "
        "controller holds it",
    )
    run.add_argument(
        "--check-bmc",
        action="append",
        metavar="NODE",
        help="ask NODE's BMC for its power state through the node's driver and BMC Secret "
        "entry, print it and exit 1 if it failed; changes nothing (repeatable)",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    return parser


def settings_from_args(args: argparse.Namespace) -> ControllerSettings:
    """Validated settings; ValueError naming the flag on a bad combination."""
    for flag in ("min_on_nodes", "max_drain_parallelism", "max_empty_bulk_power_off"):
        if getattr(args, flag) < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0")
    if args.max_graceful_termination_sec < 0:
        raise ValueError("--max-graceful-termination-sec must be >= 0")
    if args.carbon_sources is not None and args.rank_by == RANK_BY_WATTS:
        raise ValueError("--carbon-sources is read only with --rank-by grams")
    try:
        policy = PolicySettings(
            unneeded_time_s=args.scale_down_unneeded_time,
            utilization_threshold=args.scale_down_utilization_threshold,
            consolidate=not args.empty_nodes_only,
            cooldown_s=args.node_cooldown,
            min_on_nodes=args.min_on_nodes,
            max_off_fraction=args.max_off_fraction,
            min_headroom_cores=args.min_headroom_cores,
            target_wait_p99_s=args.target_wait_p99_s,
            boot_s=args.boot_time,
            headroom_factor=args.headroom_factor,
            boot_energy_j=args.boot_energy_kj * 1000.0,
            wake_horizon_s=args.wake_horizon,
            off_margin_sd=args.off_margin_sd,
            rank_by=rank_by(args),
            carbon_horizon_s=args.carbon_horizon,
            # Drains started together in one round are cordoned together before any eviction,
            # so what one drain evicts cannot land on another (see `controller`).
            max_drains_per_round=args.max_drain_parallelism,
        )
    except ValueError as error:
        raise ValueError(f"policy flags: {error}") from None
    actuator = ActuatorSettings(
        default_driver=args.default_driver,
        bmc_timeout_s=args.bmc_timeout,
        drain_timeout_s=args.drain_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        wake_timeout_s=args.wake_timeout,
        max_graceful_termination_s=args.max_graceful_termination_sec,
        retry_backoff_s=args.retry_backoff,
        max_retry_backoff_s=args.max_retry_backoff,
    )
    return ControllerSettings(
        policy=policy,
        actuator=actuator,
        apply=args.apply,
        scheduler_name=args.scheduler_name,
        namespace=args.namespace or default_namespace(),
        scan_interval_s=args.scan_interval,
        arrival_windows_s=args.arrival_windows,
        max_drain_parallelism=args.max_drain_parallelism,
        max_bulk_power_off=args.max_empty_bulk_power_off,
        api_timeout_s=args.api_timeout,
        event_ttl_s=args.event_ttl,
    )


def rank_by(args: argparse.Namespace) -> str:
    """--rank-by as given, else grams when there are carbon sources to rank by, else watts."""
    if args.rank_by is not None:
        return str(args.rank_by)
    return RANK_BY_GRAMS if args.carbon_sources is not None else RANK_BY_WATTS


def carbon_settings_from_args(args: argparse.Namespace) -> CarbonSettings:
    """The carbon flags; ValueError naming the file or flag at fault."""
    sources = read_sources_file(args.carbon_sources) if args.carbon_sources else ()
    try:
        return CarbonSettings(
            sources=sources,
            signal=args.carbon_signal,
            zone_label=args.carbon_zone_label,
            max_age_s=args.carbon_max_age,
            forecast_max_age_s=args.carbon_max_age,
            poll_interval_s=args.carbon_poll_interval,
            timeout_s=args.api_timeout,
            horizon_s=args.carbon_horizon,
        )
    except ValueError as error:
        raise ValueError(f"carbon flags: {error}") from None


def lease_settings_from_args(args: argparse.Namespace, namespace: str) -> LeaseSettings:
    return LeaseSettings(
        namespace=namespace,
        name=args.leader_elect_resource_name,
        identity=args.identity or socket.gethostname(),
        lease_duration_s=args.leader_elect_lease_duration,
        renew_deadline_s=args.leader_elect_renew_deadline,
        retry_period_s=args.leader_elect_retry_period,
        request_timeout_s=min(args.api_timeout, args.leader_elect_renew_deadline),
    )


def round_summary(controller: NodePowerController, result: object) -> dict[str, object]:
    """`--once`: the round's decisions and the nodes it saw, as JSON-ready data."""
    decisions = getattr(result, "decisions", None)
    view = getattr(result, "view", None)

    def actions(items: object) -> list[dict[str, object]]:
        return [
            {"node": a.node, "reason": a.reason, "watts": a.watts}
            for a in (items or ())  # type: ignore[attr-defined]
        ]

    return {
        "apply": controller.settings.apply,
        "error": getattr(result, "error", None),
        "acted": getattr(result, "acted", []),
        "wake": actions(getattr(decisions, "wake", ())),
        "cancel_drain": actions(getattr(decisions, "cancel_drain", ())),
        "power_off": actions(getattr(decisions, "power_off", ())),
        "drain": actions(getattr(decisions, "drain", ())),
        "free_cores": getattr(decisions, "free_cores", None),
        # Since when each node has been unneeded (RFC 3339), as this round's clocks have it.
        "unneeded_since": {
            name: rfc3339(since_s)
            for name, since_s in sorted(getattr(decisions, "unneeded_since", {}).items())
        },
        "headroom_cores": getattr(decisions, "headroom_cores", None),
        # Ranking by grams: each node's g_per_kwh is its mean intensity over this horizon.
        "rank_by": controller.settings.policy.rank_by,
        "carbon_horizon_s": controller.carbon.settings.horizon_s if controller.carbon else None,
        "pending_pods": [p.name for p in getattr(view, "pending", ())],
        "nodes": [
            {
                "name": n.name,
                "state": n.state,
                "managed": n.managed,
                "why_not": n.unmanaged_reason,
                "idle_w": n.idle_w,
                "g_per_kwh": n.g_per_kwh,
                "requested_cpu": n.requested_cpu,
                "allocatable_cpu": n.allocatable_cpu,
            }
            for n in getattr(view, "nodes", ())
        ],
    }


def json_safe(value: object) -> object:
    """`value` as strict JSON data: NaN and infinities (unknown watts, intensities) become
    null, which every JSON parser reads; anything else not JSON becomes its string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the controller; exit status 0, 1 (`--once` round failed) or 2 (bad flags)."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    metrics = ControllerMetrics()
    carbon = None
    try:
        settings = settings_from_args(args)
        lease = lease_settings_from_args(args, settings.namespace)
        if settings.policy.rank_by == RANK_BY_GRAMS:
            carbon = NodeIntensity(
                carbon_settings_from_args(args),
                lambda: controller.nodes.items(),  # the controller's Node cache, made below
                prometheus_url=args.prometheus,
                registry=metrics.registry,
            )
        api_client = without_urllib3_retries(
            kube_api_client(kubeconfig=args.kubeconfig, in_cluster=args.in_cluster)
        )
    except (ValueError, KubeConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    prometheus = CollectConfig(url=args.prometheus) if args.prometheus else None
    idle_power = IdlePower(
        args.bundle,
        prometheus=prometheus,
        nominal=NominalConditions(args.nominal_ambient_c, args.nominal_cpu_above_ambient_c),
        core_exponents=shipped_core_exponents() if args.fallback_core_scaling else None,
    )
    elector = None
    if args.leader_elect and (args.apply or not args.once):
        elector = LeaderElector(client.CoordinationV1Api(api_client), lease)
    controller = NodePowerController(
        settings,
        api_client,
        idle_power=idle_power,
        carbon=carbon,
        secret=BmcSecret(args.bmc_secret_dir),
        elector=elector,
        metrics=metrics,
    )
    if args.check_bmc:
        return check_bmcs(api_client, args.check_bmc, controller)
    if args.once:
        stop = threading.Event()
        with stop_on_signals(stop) as signals:
            code = _run_once(controller, elector, stop)
        if signals.received:
            print(f"error: stopped on {signals.received} before the round", file=sys.stderr)
        return code
    if args.listen_port is not None:
        server = serve_health(controller, args.listen_host, args.listen_port)
        log.info("health, metrics and status on http://%s:%d", *server.server_address[:2])
    log.info(
        "node power controller %s: %s, rounds every %g s, namespace %s, %s",
        lease.identity,
        "APPLYING" if settings.apply else "dry run (no --apply): nothing will be changed",
        settings.scan_interval_s,
        settings.namespace,
        f"leader election on Lease {lease.name}" if elector else "no leader election",
    )
    stop = threading.Event()
    with stop_on_signals(stop) as signals:
        released = controller.run_forever(stop)
    log.info(
        "node power controller %s stopped%s%s",
        lease.identity,
        f" on {signals.received}" if signals.received else "",
        f"; released Lease {elector.lease_name}: another replica takes over at once"
        if released and elector is not None
        else "",
    )
    return 0


def without_urllib3_retries(api_client: client.ApiClient) -> client.ApiClient:
    """The same client, but urllib3 tries each request once.

    The controller retries on its own schedules (the leader election every retry period, the
    watches with backoff, the next round), each logging one line per try. urllib3's default
    three silent retries would log three "Retrying" warnings per try and stretch a renewal
    that times out to four timeouts, past the renew deadline.
    """
    configuration = api_client.configuration
    configuration.retries = 0
    return client.ApiClient(configuration)


def check_bmcs(
    api_client: client.ApiClient, nodes: Sequence[str], controller: NodePowerController
) -> int:
    """`--check-bmc`: each node's driver and BMC answer, one line per node; 1 if any failed."""
    core = client.CoreV1Api(api_client)
    failed = 0
    for name in nodes:
        try:
            response = core.list_node(
                field_selector=f"metadata.name={name}", _preload_content=False
            )
            items = json.loads(response.data).get("items") or []
            if not items:
                raise DriverError("config", f"node {name}: no such node")
            driver = controller.actuator.driver_for(items[0], "on")
            print(f"{name}: {driver.describe()}: power {driver.power_state()}")
        except DriverError as error:
            failed += 1
            print(f"{name}: FAILED ({error.kind}): {error}")
        except ApiException as error:
            failed += 1
            print(f"{name}: FAILED: cannot read the node: {describe_api_error(error)}")
    return 1 if failed else 0


def _run_once(
    controller: NodePowerController, elector: LeaderElector | None, stop: threading.Event
) -> int:
    """One round. Acting (`--apply`) takes the Lease first, so that it never acts beside a
    running controller; a dry run reads only and needs none. `stop` (SIGTERM, Ctrl-C) set
    before the round starts: no round, exit 1, the Lease released."""
    if elector is not None and not elector.try_acquire_or_renew():
        if elector.last_error is not None:
            print(f"error: cannot take the Lease: {elector.last_error}", file=sys.stderr)
            return 1
        holder = elector.holder or "another replica"
        print(
            f"error: the Lease {elector.lease_name} is held by {holder}: a controller is "
            "running; stop it (or run without --apply)",
            file=sys.stderr,
        )
        return 1
    controller.start()
    try:
        if not _wait_synced(controller, stop):
            if not stop.is_set():
                why = next(
                    (
                        f": {informer.name}: {informer.status.last_error}"
                        for informer in (controller.nodes, controller.pods, controller.budgets)
                        if informer.status.last_error
                    ),
                    "",
                )
                print(f"error: the node, pod and budget caches did not sync{why}", file=sys.stderr)
            return 1
        if controller.carbon is not None:
            controller.carbon.poll_once()  # this round's intensities, not the next poll's
        result = controller.run_round()
    finally:
        controller.stop()
        if elector is not None:
            elector.release()
    print(json.dumps(json_safe(round_summary(controller, result)), indent=2, allow_nan=False))
    return 1 if result.error else 0


def _wait_synced(
    controller: NodePowerController, stop: threading.Event, timeout_s: float = 60.0
) -> bool:
    """Whether the caches synced within `timeout_s` (False at once when `stop` is set)."""
    deadline_s = time.monotonic() + timeout_s
    while not controller.synced and time.monotonic() < deadline_s:
        if stop.wait(0.1):
            return False
    return controller.synced
