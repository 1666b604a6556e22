"""The simulated nodes: real server power curves, temperatures, and optional batteries.

Each node is a node of `training.synth`'s heterogeneous fleet (same seed, same fleet): its
power curve is a SPECpower_ssj2008 shape (embedded in `training/data/`) scaled and perturbed,
its allocatable CPU is the core count of that SPEC result, and its temperatures follow load
and a daily ambient cycle through a first-order lag, with fans adding power above 50 C.

Which servers the curves come from is the *fleet* (`FLEETS`): `old` (the default), servers of
2007-2016, `training.synth.fleet_spec`'s fleet as it always was; `modern`, servers of
2017-2025 only; `mixed`, as data centres that buy hardware over the years run them: every other
node a 2007-2016 server (node-01, node-03, ...), the others 2017-2025 servers. Nodes keep their
server's real core count, so a modern fleet of the same node count has several times the cores
(the bench scales its workload by the total, `bench.sim.workload.generate_trace`).

Every node admits at most `max_pods` pods (the kubelet's `--max-pods`, its allocatable
"pods"): 110, the kubelet's default, on 2007-2016 servers; 250 on 2017-2025 ones, what
operators of such many-core nodes set (OpenShift's default; at 110, a 128-core node with ~1-core
pods would turn pods away with most of its CPU free). The
physics deliberately matches the generator the extender's models are trained on, but the
models only ever see sampled, noisy telemetry: the simulator's ground truth never reaches
the extender.

What the model assumes (and so what energy figures mean): every node is on for the whole run
and pays its idle power whatever runs on it, except under the policies with power management
(`bench.sim.power`: nodes off, booting, shutting down); power depends on CPU utilisation and
temperature only (memory, disks and network are not modelled).

Every node carries a `topology.kubernetes.io/zone` label (`ZONES`, in turn: three failure
zones, as cloud regions and most on-premises layouts have) and runs the DaemonSet pods of
`DAEMONSET_PODS` (a CNI agent, kube-proxy, node-exporter), whose requests count on every node
as they do for kube-scheduler.

Battery nodes (edge sites with solar panels) store energy: the battery charges from a daily
solar profile and discharges by the node's power; an empty battery is backed by the grid.
The stored share is published as the `energy-status` label the extender reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.sim.kube_default import DEFAULT_MAX_PODS, PodRequest
from livedata.labels import energy_band_for
from training.synth import (
    AMBIENT_DAILY_SWING_C,
    AMBIENT_MEAN_C,
    AMBIENT_PEAK_HOUR,
    FAN_THRESHOLD_C,
    FleetSpec,
    _curve_power_w,
    fleet_spec,
    load_shapes,
    node_names,
)

GIB = 1024**3
MEMORY_PER_CORE_BYTES = 4 * GIB
SOLAR_FIRST_HOUR, SOLAR_LAST_HOUR = 6.0, 18.0
MIB = 1024**2
ZONES = ("zone-a", "zone-b", "zone-c")
# The DaemonSet pods of every node, with their requests as their upstream manifests set them:
# calico-node (Calico's calico.yaml: cpu 250m), node-exporter with its kube-rbac-proxy
# (kube-prometheus manifests/nodeExporter-daemonset.yaml: 102m + 10m, 180Mi + 20Mi), and
# kube-proxy (kubeadm sets no requests: it counts 0 for fit, 100m/200Mi for scoring).
DAEMONSET_PODS: tuple[PodRequest, ...] = (
    PodRequest(250, 0),
    PodRequest(112, 200 * MIB),
    PodRequest(0, 0),
)


# The SPECpower periods (`training.synth.load_shapes`) each fleet draws its nodes from, in turn
# (node i from periods[i % len]), and the pods a node of each period admits.
FLEETS: dict[str, tuple[str, ...]] = {
    "old": ("old",),
    "mixed": ("old", "modern"),
    "modern": ("modern",),
}
DEFAULT_FLEET = "old"
MAX_PODS_BY_PERIOD: dict[str, int] = {"old": DEFAULT_MAX_PODS, "modern": 250}
FLEET_DESCRIPTIONS: dict[str, str] = {
    "old": "SPECpower servers of 2007-2016",
    "mixed": "every other node a SPECpower server of 2007-2016, the others of 2017-2025",
    "modern": "SPECpower servers of 2017-2025",
}


def node_periods(fleet: str, n_nodes: int) -> list[str]:
    """The SPECpower period of each node of `fleet` (`FLEETS`), in node order."""
    if fleet not in FLEETS:
        raise ValueError(f"unknown fleet {fleet!r}: expected one of {', '.join(FLEETS)}")
    periods = FLEETS[fleet]
    return [periods[i % len(periods)] for i in range(n_nodes)]


def fleet_node_spec(fleet: str, n_nodes: int, seed: int) -> FleetSpec:
    """The nodes of `fleet` for (n_nodes, seed): `training.synth.fleet_spec` per period.

    A one-period fleet is `fleet_spec(n_nodes, seed, periods=...)` itself (so `old` is the
    cluster the bench always simulated). A mixed fleet draws each period's nodes as a fleet of
    their own, from a stream of their own (seed + the period's position), and deals them in turn.
    """
    periods = node_periods(fleet, n_nodes)
    kinds = FLEETS[fleet]
    if len(kinds) == 1:
        return fleet_spec(n_nodes, seed, periods=kinds)
    parts = {
        kind: fleet_spec(periods.count(kind), seed + position, periods=(kind,))
        for position, kind in enumerate(kinds)
        if kind in periods
    }
    # Where each node comes from: (its period's part, its row there).
    taken = dict.fromkeys(parts, 0)
    rows: list[tuple[str, int]] = []
    for kind in periods:
        rows.append((kind, taken[kind]))
        taken[kind] += 1
    values: dict[str, object] = {"names": node_names(n_nodes)}
    for name in FleetSpec.__dataclass_fields__:
        if name == "names":
            continue
        columns = [getattr(parts[kind], name) for kind, _ in rows]
        if any(column is None for column in columns):
            values[name] = None
            continue
        picked = [column[row] for column, (_, row) in zip(columns, rows, strict=True)]
        values[name] = np.array(picked, dtype=columns[0].dtype)
    return FleetSpec(**values)  # type: ignore[arg-type]


def fleet_max_pods(fleet: str, n_nodes: int) -> np.ndarray:
    """Each node's `--max-pods` in `fleet`: `MAX_PODS_BY_PERIOD` of its server's period."""
    return np.array([MAX_PODS_BY_PERIOD[p] for p in node_periods(fleet, n_nodes)], dtype=np.int64)


def energy_status(stored_share: float) -> str:
    """The `energy-status` label for a battery's stored share (0..1): contract 4's bands."""
    return energy_band_for(100.0 * stored_share).name


@dataclass(frozen=True)
class SimCluster:
    """Static description of the simulated nodes; every array has one entry per node."""

    spec: FleetSpec
    cores: np.ndarray  # allocatable CPU, cores
    memory_bytes: np.ndarray  # allocatable memory
    on_battery: np.ndarray  # bool: battery + solar node
    battery_capacity_wh: np.ndarray  # 0 for grid nodes
    solar_peak_w: np.ndarray  # 0 for grid nodes
    zone_labels: tuple[str, ...] | None = None  # topology.kubernetes.io/zone; None: no label
    daemon_pods: tuple[PodRequest, ...] = ()  # the DaemonSet pods every node runs
    # Pods each node admits (kubelet --max-pods, DaemonSet pods included); None: 110 each.
    max_pods: np.ndarray | None = None

    @property
    def names(self) -> list[str]:
        return self.spec.names

    def __len__(self) -> int:
        return len(self.spec.names)


def build_cluster(
    n_nodes: int,
    seed: int,
    *,
    battery_share: float = 0.0,
    battery_hours: float = 6.0,
    solar_peak_share: float = 1.2,
    fleet: str = DEFAULT_FLEET,
    max_pods: int | None = None,
) -> SimCluster:
    """`fleet`'s nodes for (n_nodes, seed) (`fleet_node_spec`), with CPU, memory and batteries.

    `battery_share` of the nodes (at least one when > 0) run on a battery of
    `battery_hours` x their maximum power, charged by solar panels peaking at
    `solar_peak_share` x their maximum power. Every node admits `max_pods` pods (None: the
    fleet's, `fleet_max_pods`).
    """
    spec = fleet_node_spec(fleet, n_nodes, seed)
    shapes = load_shapes(FLEETS[fleet]).drop_duplicates("result").set_index("result")
    cores = shapes.loc[spec.shape_result, "cores"].to_numpy(dtype=float)
    rng = np.random.default_rng([seed, 3])
    on_battery = np.zeros(n_nodes, dtype=bool)
    if battery_share > 0:
        count = max(1, round(battery_share * n_nodes))
        on_battery[rng.choice(n_nodes, count, replace=False)] = True
    return SimCluster(
        spec=spec,
        cores=cores,
        memory_bytes=(cores * MEMORY_PER_CORE_BYTES).astype(np.int64),
        on_battery=on_battery,
        battery_capacity_wh=np.where(on_battery, battery_hours * spec.max_power_w, 0.0),
        solar_peak_w=np.where(on_battery, solar_peak_share * spec.max_power_w, 0.0),
        zone_labels=tuple(ZONES[i % len(ZONES)] for i in range(n_nodes)),
        daemon_pods=DAEMONSET_PODS,
        max_pods=(
            fleet_max_pods(fleet, n_nodes)
            if max_pods is None
            else np.full(n_nodes, max_pods, dtype=np.int64)
        ),
    )


def ambient_c(cluster: SimCluster, time_s: float) -> np.ndarray:
    """Inlet temperature per node: the synthetic fleet's daily cycle plus each node's offset."""
    hour = (time_s / 3600.0) % 24.0
    daily = AMBIENT_DAILY_SWING_C * np.cos(2 * np.pi * (hour - AMBIENT_PEAK_HOUR) / 24.0)
    return AMBIENT_MEAN_C + daily + cluster.spec.ambient_offset_c


def cpu_temperature_targets_c(
    cluster: SimCluster, ambient: np.ndarray, util: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Steady-state CPU socket temperatures at `util` (what the lag converges to)."""
    spec = cluster.spec
    target1 = ambient + spec.idle_rise_c + spec.load_rise_c * util
    target2 = target1 + spec.cpu2_offset_c + 0.05 * spec.load_rise_c * util
    return target1, target2


def curve_power_w(cluster: SimCluster, util: np.ndarray) -> np.ndarray:
    """Each node's SPECpower-shaped curve at `util` (one value per node, or [nodes, k]), no fans."""
    util = np.asarray(util, dtype=float)
    if util.ndim == 1:
        return _curve_power_w(cluster.spec, util[:, None])[:, 0]
    return _curve_power_w(cluster.spec, util)


def fan_power_w(cluster: SimCluster, hottest_c: np.ndarray) -> np.ndarray:
    """What fans (and leakage) add per node: watts per degree of the hottest CPU above 50 C."""
    return cluster.spec.fan_w_per_c * np.maximum(hottest_c - FAN_THRESHOLD_C, 0.0)


def node_power_w(cluster: SimCluster, util: np.ndarray, hottest_c: np.ndarray) -> np.ndarray:
    """True node input power: the SPECpower-shaped curve at `util` plus fans above 50 C."""
    return curve_power_w(cluster, util) + fan_power_w(cluster, hottest_c)


def solar_w(cluster: SimCluster, time_s: float) -> np.ndarray:
    """Solar input per node: a half-sine from 06:00 to 18:00, zero at night and on grid nodes."""
    hour = (time_s / 3600.0) % 24.0
    if not SOLAR_FIRST_HOUR < hour < SOLAR_LAST_HOUR:
        return np.zeros(len(cluster))
    phase = (hour - SOLAR_FIRST_HOUR) / (SOLAR_LAST_HOUR - SOLAR_FIRST_HOUR)
    return cluster.solar_peak_w * np.sin(np.pi * phase)


def energy_kwh(power_w: np.ndarray, step_s: float) -> float:
    """Energy of a power series sampled every `step_s` (held constant over each step)."""
    return float(np.sum(power_w) * step_s / 3.6e6)
