"""`python -m controllers.energy_adapter`: the command line of the energy adapter process.

Flags -> `AdapterSettings` (a bad value exits 2 with one line naming the flag), a Kubernetes
client, then one pass (`--once`) or passes forever, with /healthz, /readyz and /metrics on
`--listen-port`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence

from kubernetes import client

from controllers.energy_adapter.adapter import (
    PASS_ERRORS,
    AdapterSettings,
    EnergyAdapter,
    one_line_error,
)
from controllers.energy_adapter.health import serve_health
from controllers.energy_adapter.policy import (
    DEFAULT_HYSTERESIS_PCT,
    MAX_HYSTERESIS_PCT,
    POWERLESS_TAINT_EFFECT,
    POWERLESS_TAINT_KEY,
)
from controllers.energy_adapter.readings import DEFAULT_QUERY
from controllers.probes import stop_on_signals
from livedata.collect_config import CollectConfigError, parse_duration_s
from livedata.kube_client import (
    KubeConfigError,
    add_kube_arguments,
    kube_api_client,
    quiet_client_retries,
)
from livedata.labels import ENERGY_BANDS, ENERGY_LABEL
from livedata.logs import LOG_FORMATS, configure_logging

log = logging.getLogger(__package__)

DEFAULT_INTERVAL = "30s"


def build_parser() -> argparse.ArgumentParser:
    """Every flag of the adapter, with its default in the help."""
    parser = argparse.ArgumentParser(
        prog="python -m controllers.energy_adapter",
        description=(
            f"Keep each node's {ENERGY_LABEL} label ("
            + ", ".join(f"{b.name} {b.low_pct:g}-{b.high_pct:g} %" for b in reversed(ENERGY_BANDS))
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
    add_kube_arguments(parser)
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
    """Run the adapter; exit status 0, 1 (`--once` pass failed) or 2 (bad flags or kubeconfig)."""
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    quiet_client_retries()  # a failed pass says in one line what failed
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
        except PASS_ERRORS as error:
            print(f"error: {one_line_error(error)}", file=sys.stderr)
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
    with stop_on_signals(stop) as signals:
        adapter.run_forever(stop)
    log.info("energy adapter stopped on %s", signals.received or "request")
    return 0
