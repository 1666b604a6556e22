"""The node power controller's Prometheus metrics (`power_aware_node_power_*`, at /metrics).

Per node series are avoided (a fleet has thousands of nodes); the node-level story is in the
node annotations and the logs. The one exception is what ranking by grams compares, which an
operator checks node by node: each managed node's carbon outlook, only with `--rank-by grams`.
What an operator graphs and alerts on:

- how many nodes are in each power state, and how many the controller manages;
- power cycles (completed power-offs) and power actions by kind and result;
- wake latency (power-on command to node Ready), as a histogram with boot-time buckets;
- the watts saved by the nodes that are off, by the model's estimate of their idle power;
- driver errors by driver and kind, drains that failed by cause, API errors;
- the policy's inputs: pending pods, free CPU, headroom target, arrival rate;
- with `--target-wait-p99-s`: the learned headroom, its quantile and the observed p99 wait;
- leadership, and the rounds (count by result, time of the last one);
- ranking by grams: each managed node's mean intensity over the horizon, and the horizon.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controllers.node_power.headroom import HeadroomState
from livedata.labels import POWER_STATES

PREFIX = "power_aware_node_power_"
# The API calls acting makes that can fail: the `operation` label of api_errors_total.
API_OPERATIONS = ("patch_node", "list_pods", "evict")
# Servers take one to several minutes to boot (POST, firmware, OS, kubelet registration).
WAKE_LATENCY_BUCKETS_S = (15, 30, 60, 90, 120, 180, 240, 300, 420, 600, 900, 1200, 1800)


class ControllerMetrics:
    """Counters, gauges and the wake histogram of one controller process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.nodes = Gauge(
            PREFIX + "nodes", "Nodes per recorded power state", ["state"], registry=r
        )
        self.managed_nodes = Gauge(
            PREFIX + "managed_nodes",
            "Nodes the controller may power off and on (opted in, no kill switch, no backoff)",
            registry=r,
        )
        self.power_cycles = Counter(
            PREFIX + "cycles_total",
            "Nodes powered off (each off is one power cycle)",
            registry=r,
        )
        self.actions = Counter(
            PREFIX + "actions_total",
            "Power actions by kind (drain, power_off, wake, cancel_drain, abort) and result "
            "(ok, failed, dry_run)",
            ["action", "result"],
            registry=r,
        )
        self.wake_latency = Histogram(
            PREFIX + "wake_latency_seconds",
            "Time from the power-on command to the node being Ready",
            buckets=WAKE_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.saved_watts = Gauge(
            PREFIX + "saved_watts",
            "Idle watts of the nodes that are off, by the model's estimate",
            registry=r,
        )
        self.driver_errors = Counter(
            PREFIX + "driver_errors_total",
            "Failed BMC calls by driver and kind (timeout, unreachable, refused, garbage, config)",
            ["driver", "kind"],
            registry=r,
        )
        self.drain_failures = Counter(
            PREFIX + "drain_failures_total",
            "Drains given up, node uncordoned, by cause (disruption_budget, eviction_error, "
            "timeout, driver, disabled)",
            ["cause"],
            registry=r,
        )
        self.api_errors = Counter(
            PREFIX + "api_errors_total",
            f"Failed Kubernetes API calls in acting, by operation ({', '.join(API_OPERATIONS)})",
            ["operation"],
            registry=r,
        )
        self.pending_pods = Gauge(
            PREFIX + "pending_pods", "Pods for our scheduler waiting as unschedulable", registry=r
        )
        self.free_cores = Gauge(
            PREFIX + "free_cores", "Free requested-CPU room on nodes on or waking", registry=r
        )
        self.headroom_cores = Gauge(
            PREFIX + "headroom_target_cores",
            "Free CPU the policy keeps on: below it, a node is woken",
            registry=r,
        )
        self.off_headroom_cores = Gauge(
            PREFIX + "off_headroom_target_cores",
            "Free CPU the nodes left on must keep before another node goes off "
            "(the headroom plus --off-margin-sd standard deviations of a boot time's arrivals)",
            registry=r,
        )
        self.arrival_rate = Gauge(
            PREFIX + "arrival_cores_per_second",
            "Requested CPU of recently created pods, per second: the highest mean over the "
            "arrival windows (one boot time and six by default)",
            registry=r,
        )
        # With --target-wait-p99-s (registered always: 0 / NaN without a target).
        self.learned_headroom = Gauge(
            PREFIX + "learned_headroom_cores",
            "Free CPU the wait target asks for: the quantile of the demand growth within a "
            "boot time learned for this hour of day",
            registry=r,
        )
        self.headroom_quantile = Gauge(
            PREFIX + "headroom_quantile_ratio",
            "The quantile of the demand growth the learned headroom covers (raised while the "
            "wait target is missed, lowered slowly while met)",
            registry=r,
        )
        self.pod_wait_p99 = Gauge(
            PREFIX + "pod_wait_p99_seconds",
            "99th percentile of pods' wait (creation to scheduled) over the learning window; "
            "NaN with too few pods placed",
            registry=r,
        )
        self.leader = Gauge(
            PREFIX + "leader", "1 while this replica holds the Lease and may act", registry=r
        )
        self.apply = Gauge(PREFIX + "apply", "1 when acting (--apply), 0 in dry-run", registry=r)
        self.rounds = Counter(
            PREFIX + "rounds_total", "Control rounds by result (ok, error)", ["result"], registry=r
        )
        self.last_round = Gauge(
            PREFIX + "last_round_timestamp_seconds",
            "Unix time the last successful round ended",
            registry=r,
        )
        for state in POWER_STATES:
            self.nodes.labels(state=state)
        # Series at 0 from the start, so a dashboard's increase() shows "none" rather than
        # "no data" (client_python's advice for labels known in advance).
        for operation in API_OPERATIONS:
            self.api_errors.labels(operation=operation)
        self.carbon_outlook: Gauge | None = None
        self.carbon_horizon: Gauge | None = None

    def set_headroom(self, state: HeadroomState) -> None:
        self.learned_headroom.set(state.learned_cores)
        self.headroom_quantile.set(state.quantile)
        self.pod_wait_p99.set(state.wait_p99_s)

    def rank_by_grams(self, horizon_s: float) -> None:
        """Add the carbon outlook's gauges: only a controller ranking by grams has them."""
        if self.carbon_outlook is not None:
            return
        self.carbon_outlook = Gauge(
            PREFIX + "carbon_node_outlook_g_per_kwh",
            "Mean carbon intensity over the next horizon that ranks each managed node "
            "(gCO2eq/kWh; a node without one ranks at the mean of the others and has no series)",
            ["node"],
            registry=self.registry,
        )
        self.carbon_horizon = Gauge(
            PREFIX + "carbon_outlook_horizon_seconds",
            "How far ahead the carbon outlook looks (--carbon-horizon; 0: the present value)",
            registry=self.registry,
        )
        self.carbon_horizon.set(horizon_s)

    def set_carbon_outlook(self, g_per_kwh: Mapping[str, float]) -> None:
        """This round's outlook per managed node; nodes gone or unknown lose their series."""
        if self.carbon_outlook is None:
            return
        self.carbon_outlook.clear()
        for node, value in g_per_kwh.items():
            if math.isfinite(value):
                self.carbon_outlook.labels(node=node).set(value)
