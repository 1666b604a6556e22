"""Every setting of the extender service: one dataclass, its defaults, and its CLI flags.

The rest of the service reads settings only from an ``ExtenderConfig``; ``parse_config``
builds one from command-line flags, each of which can also be given as an environment
variable (``PAS_`` + the flag name in capitals, ``-`` as ``_``: ``--port`` is ``PAS_PORT``),
which is how a Deployment usually sets them. Flags win over the environment.

Three modes follow from the flags:

- ``demo`` (no flags): the shipped bundle on the built-in 12-node demo cluster;
- ``snapshot`` (``--cluster FILE``): nodes and fixed telemetry from a file;
- ``live`` (``--prometheus URL`` plus ``--kubeconfig FILE`` or ``--in-cluster``): nodes and
  pods from the Kubernetes API, telemetry from Prometheus.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from extender.limits import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JSON_DEPTH,
    DEFAULT_MAX_NODES,
    InputLimits,
)
from livedata.kube_client import add_kube_arguments
from livedata.logs import LOG_FORMATS
from predictor.core_scaling import MAX_CORE_RATIO, MIN_CORE_RATIO, shipped_core_exponents

# The shipped bundle is package data (extender/models/default), so an installed wheel has it
# too; `make models` rebuilds it. The bundle loader reads a directory, hence the Path.
DEFAULT_BUNDLE_DIR = Path(str(resources.files("extender").joinpath("models", "default")))
ENV_PREFIX = "PAS_"

MODES = ("demo", "snapshot", "live")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A combination of settings the service cannot run with; the message says which."""


@dataclass(frozen=True)
class ExtenderConfig:
    """All settings of one extender process, with the defaults ``--help`` documents."""

    host: str = "127.0.0.1"
    port: int = 8888
    bundle_dir: Path = DEFAULT_BUNDLE_DIR
    cluster_file: Path | None = None
    kubeconfig: Path | None = None
    in_cluster: bool = False
    prometheus_url: str | None = None
    # Live mode: the collect settings training used (queries, sensor names, instance->node
    # mapping), so a node's features mean the same at serving time; None = the defaults.
    collect_config: Path | None = None
    # Live telemetry: how often Prometheus is polled and how old a value may be before the
    # node counts as having no telemetry (stale data must never be used forever).
    refresh_interval_s: float = 15.0
    telemetry_ttl_s: float = 90.0
    prometheus_timeout_s: float = 5.0
    # A pod bound this recently adds its CPU demand to the node's assumed load: the metrics do
    # not show its load until a scrape and the rate window have passed.
    assumed_window_s: float = 120.0
    # The scoring profile (extender.profile): enabled filter and score plugins, their weights
    # and arguments; None = the built-in defaults.
    config_file: Path | None = None
    # Shortcuts that override the PowerIncrease and EnergyLevel weights of the profile.
    power_weight: float | None = None
    energy_weight: float | None = None
    # Input limits (extender.limits explains the defaults: a 5000-node cluster).
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_nodes: int = DEFAULT_MAX_NODES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    bundle_poll_interval_s: float = 2.0
    # How often the background refresher checks for new telemetry or a new bundle.
    curve_refresh_interval_s: float = 1.0
    # Nodes with no data at all are scored with the bundle's fleet fallback curve; scale it by
    # the node's allocatable CPU against the own-model nodes' median (predictor.core_scaling),
    # so a 4-core and a 128-core newcomer do not share one curve. Off: today's single curve.
    fallback_core_scaling: bool = True
    # Live mode is ready when at least this share of known nodes has fresh telemetry.
    ready_min_fresh_share: float = 0.5
    # HTTPS (kube-scheduler's enableHTTPS + tlsConfig): certificate and key in PEM; with a
    # client CA, every client must present a certificate it signed (mutual TLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    log_level: str = "info"
    log_format: str = "json"

    @property
    def mode(self) -> str:
        if self.prometheus_url is not None:
            return "live"
        if self.cluster_file is not None:
            return "snapshot"
        return "demo"

    @property
    def limits(self) -> InputLimits:
        return InputLimits(
            max_body_bytes=self.max_body_bytes,
            max_nodes=self.max_nodes,
            max_json_depth=self.max_json_depth,
        )

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def validate(self) -> ExtenderConfig:
        """Raise ConfigError naming the setting at fault; return self when all is well."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        positive = {
            "--refresh-interval": self.refresh_interval_s,
            "--telemetry-ttl": self.telemetry_ttl_s,
            "--prometheus-timeout": self.prometheus_timeout_s,
            "--bundle-poll-interval": self.bundle_poll_interval_s,
            "--curve-refresh-interval": self.curve_refresh_interval_s,
            "--max-body-bytes": self.max_body_bytes,
            "--max-nodes": self.max_nodes,
            "--max-json-depth": self.max_json_depth,
        }
        for flag, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{flag} must be positive, got {value}")
        if self.assumed_window_s < 0:
            raise ConfigError(f"--assumed-window must be >= 0, got {self.assumed_window_s}")
        for flag, weight in (
            ("--power-weight", self.power_weight),
            ("--energy-weight", self.energy_weight),
        ):
            if weight is not None and not (math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"{flag} must be a finite number >= 0, got {weight}")
        if not 0 <= self.ready_min_fresh_share <= 1:
            raise ConfigError(
                f"--ready-min-fresh-share must be 0..1, got {self.ready_min_fresh_share}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together (HTTPS needs both)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS)")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format must be one of {LOG_FORMATS}")
        if self.prometheus_url is not None:
            if self.cluster_file is not None:
                raise ConfigError(
                    "--cluster (snapshot mode) and --prometheus (live) exclude each other"
                )
            if self.kubeconfig is None and not self.in_cluster:
                raise ConfigError(
                    "live mode (--prometheus) needs --kubeconfig FILE or --in-cluster"
                )
        elif self.kubeconfig is not None or self.in_cluster:
            raise ConfigError("--kubeconfig/--in-cluster need --prometheus URL (live mode)")
        elif self.collect_config is not None:
            raise ConfigError("--collect-config needs --prometheus URL (live mode)")
        return self


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m extender`` argument parser; every default comes from ExtenderConfig."""
    d = ExtenderConfig()
    exponents = shipped_core_exponents()
    parser = argparse.ArgumentParser(
        prog="python -m extender",
        description=(
            "Power-aware kube-scheduler extender: POST /filter and /prioritize (extender v1 "
            "protocol), GET /healthz /readyz /metrics /status, POST /explain. With no flags it "
            "serves the shipped bundle on a built-in 12-node demo cluster. Every flag can also "
            f"be set with an environment variable {ENV_PREFIX}<FLAG> (e.g. {ENV_PREFIX}PORT)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    net = parser.add_argument_group("serving")
    net.add_argument("--host", default=d.host, help="address to bind; 0.0.0.0 in a container")
    net.add_argument(
        "--port", metavar="PORT", type=int, default=d.port, help="TCP port (0 = any free port)"
    )
    net.add_argument(
        "--max-body-bytes",
        metavar="BYTES",
        type=int,
        default=d.max_body_bytes,
        help="largest request body accepted, in bytes (64 MiB: 5000 Node objects of up to "
        "13 KiB); larger bodies get 413",
    )
    net.add_argument(
        "--max-nodes",
        metavar="COUNT",
        type=int,
        default=d.max_nodes,
        help="most candidate nodes (NodeNames or Nodes.items) in one request; more get 400",
    )
    net.add_argument(
        "--max-json-depth",
        metavar="LEVELS",
        type=int,
        default=d.max_json_depth,
        help="deepest nesting of JSON arrays/objects in a request (real ones: ~12), checked "
        "before parsing; deeper bodies get 400",
    )
    tls = parser.add_argument_group("TLS (kube-scheduler extender enableHTTPS + tlsConfig)")
    tls.add_argument(
        "--tls-cert",
        metavar="FILE",
        type=Path,
        default=None,
        help="serve HTTPS with this PEM certificate (chain); needs --tls-key. Default: HTTP",
    )
    tls.add_argument(
        "--tls-key", metavar="FILE", type=Path, default=None, help="PEM private key of --tls-cert"
    )
    tls.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        type=Path,
        default=None,
        help="mutual TLS: PEM CA bundle; clients (kube-scheduler, probes, Prometheus) must "
        "present a certificate it signed, others are refused in the handshake",
    )
    model = parser.add_argument_group("model bundle")
    model.add_argument(
        "--bundle",
        dest="bundle_dir",
        metavar="DIR",
        type=Path,
        default=d.bundle_dir,
        help="model bundle directory (contract 2), e.g. a mounted ConfigMap",
    )
    model.add_argument(
        "--bundle-poll-interval",
        dest="bundle_poll_interval_s",
        metavar="SECONDS",
        type=float,
        default=d.bundle_poll_interval_s,
        help="seconds between checks of the bundle directory for a new version",
    )
    model.add_argument(
        "--curve-refresh-interval",
        dest="curve_refresh_interval_s",
        metavar="SECONDS",
        type=float,
        default=d.curve_refresh_interval_s,
        help="seconds between checks for new telemetry or bundle to re-tabulate power curves",
    )
    model.add_argument(
        "--fallback-core-scaling",
        action=argparse.BooleanOptionalAction,
        default=d.fallback_core_scaling,
        help="scale the bundle's fleet fallback curve (nodes with no model of their own) by "
        "the node's allocatable CPU against the median of the nodes that have one: dynamic "
        f"range by ratio^{exponents.dynamic:.2f}, idle by ratio^{exponents.idle:.2f} "
        f"(SPECpower fits), ratio clipped to {MIN_CORE_RATIO:g}..{MAX_CORE_RATIO:g}; "
        "/explain shows the scale per node. --no-fallback-core-scaling (or "
        f"{ENV_PREFIX}FALLBACK_CORE_SCALING=false): one fleet curve for every such node",
    )
    cluster = parser.add_argument_group("cluster source (default: built-in demo cluster)")
    cluster.add_argument(
        "--cluster",
        dest="cluster_file",
        metavar="FILE",
        type=Path,
        default=None,
        help="cluster snapshot file (JSON or YAML): nodes with fixed telemetry, instead of "
        'Kubernetes and Prometheus. Format: {"nodes": [{"name": "node-a", "allocatable_cpu": '
        '32, "labels": {"energy-status": "vulnerable"}, "annotations": '
        '{"power-aware-scheduler/max-power-w": "450"}, "telemetry": {"cpu_util": 0.35, '
        '"ambient_temp_c": 23, "cpu1_temp_c": 51, "cpu2_temp_c": 49.5}}]}; labels, '
        "annotations and telemetry are optional (no telemetry: scored lowest on power); "
        "telemetry needs cpu_util, ambient_temp_c and cpu1_temp_c (null for a missing reading) "
        "and may add cpu2_temp_c (one-socket nodes leave it out) and power_w. Write one "
        "from a metrics table or a live cluster with python -m "
        "extender.sources.snapshot",
    )
    cluster.add_argument(
        "--prometheus",
        dest="prometheus_url",
        metavar="URL",
        default=None,
        help="live mode: Prometheus base URL for node telemetry, e.g. http://prometheus:9090",
    )
    cluster.add_argument(
        "--collect-config",
        metavar="FILE",
        type=Path,
        default=None,
        help="live mode: the collect settings file training used (YAML/JSON: queries, sensor "
        "names, instance-to-node mapping; see training.collect); default: built-in queries",
    )
    add_kube_arguments(cluster, when="live mode: ", in_cluster_default=d.in_cluster)
    cluster.add_argument(
        "--refresh-interval",
        dest="refresh_interval_s",
        metavar="SECONDS",
        type=float,
        default=d.refresh_interval_s,
        help="live mode: seconds between Prometheus polls",
    )
    cluster.add_argument(
        "--telemetry-ttl",
        dest="telemetry_ttl_s",
        metavar="SECONDS",
        type=float,
        default=d.telemetry_ttl_s,
        help="live mode: seconds after which a node's telemetry counts as missing",
    )
    cluster.add_argument(
        "--prometheus-timeout",
        dest="prometheus_timeout_s",
        metavar="SECONDS",
        type=float,
        default=d.prometheus_timeout_s,
        help="live mode: time budget of one Prometheus poll (all its queries), in seconds",
    )
    cluster.add_argument(
        "--ready-min-fresh-share",
        metavar="FRACTION",
        type=float,
        default=d.ready_min_fresh_share,
        help="live mode: /readyz needs at least this share (0..1) of nodes with fresh telemetry",
    )
    scoring = parser.add_argument_group(
        "scoring",
        "Which plugins filter and score, their weights and arguments, come from --config: a "
        "YAML file shaped like KubeSchedulerConfiguration's plugins/pluginConfig (see "
        "docs/architecture.md). Without it: filters EnergyLevel (powerless nodes fail), "
        "PowerCap (power-aware-scheduler/max-power-w) and PowerState (nodes the node power "
        "controller has off, waking or draining fail); scores PowerIncrease (weight 0.6: "
        "lowest predicted increase best) and EnergyLevel (0.4: label energy-status).",
    )
    scoring.add_argument(
        "--config",
        dest="config_file",
        metavar="FILE",
        type=Path,
        default=None,
        help="scoring profile (YAML/JSON, kind ExtenderConfiguration); default: built-in",
    )
    scoring.add_argument(
        "--assumed-window",
        dest="assumed_window_s",
        metavar="SECONDS",
        type=float,
        default=d.assumed_window_s,
        help="seconds a freshly bound pod's CPU demand is added to its node's assumed load",
    )
    scoring.add_argument(
        "--power-weight",
        metavar="WEIGHT",
        type=float,
        default=d.power_weight,
        help="override the weight of the PowerIncrease score plugin (default 0.6 unless "
        "--config says otherwise)",
    )
    scoring.add_argument(
        "--energy-weight",
        metavar="WEIGHT",
        type=float,
        default=d.energy_weight,
        help="override the weight of the EnergyLevel score plugin (default 0.4 unless "
        "--config says otherwise)",
    )
    logs = parser.add_argument_group("logging")
    logs.add_argument(
        "--log-level",
        default=d.log_level,
        choices=["debug", "info", "warning", "error"],
        help="log level; debug adds one line per request",
    )
    logs.add_argument(
        "--log-format",
        default=d.log_format,
        choices=LOG_FORMATS,
        help="json: one object per line, for log pipelines; text: readable lines",
    )
    logs.add_argument("--quiet", action="store_true", help="only warnings and errors")
    _apply_environment(parser, os.environ)
    return parser


def _apply_environment(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Use PAS_<FLAG> environment variables as defaults, converted like the flag's value."""
    for action in parser._actions:
        flag = next((s for s in action.option_strings if s.startswith("--")), None)
        if flag is None or flag == "--help":
            continue
        name = ENV_PREFIX + flag[2:].upper().replace("-", "_")
        if name not in env:
            continue
        raw = env[name]
        if isinstance(action, argparse._StoreTrueAction):
            value: object = raw.strip().lower() in TRUE_WORDS
        elif isinstance(action, argparse.BooleanOptionalAction):
            # Default on: a typo must not silently turn it off, so only known words count.
            word = raw.strip().lower()
            if word not in TRUE_WORDS + FALSE_WORDS:
                raise ConfigError(
                    f"environment variable {name}={raw!r}: expected one of "
                    f"{', '.join(TRUE_WORDS + FALSE_WORDS)}"
                )
            value = word in TRUE_WORDS
        else:
            try:
                value = action.type(raw) if action.type else raw
            except ValueError as exc:
                raise ConfigError(f"environment variable {name}={raw!r}: {exc}") from exc
        action.default = value


def parse_config(argv: Sequence[str] | None = None) -> ExtenderConfig:
    """Build and validate the config from flags (and PAS_* environment variables)."""
    args = build_parser().parse_args(argv)
    values = vars(args)
    if values.pop("quiet"):
        values["log_level"] = "warning"
    return ExtenderConfig(**values).validate()
