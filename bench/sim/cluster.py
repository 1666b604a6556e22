"""The simulated nodes: real server power curves, temperatures, and optional batteries.

Each node is a node of `training.synth`'s heterogeneous fleet (same seed, same fleet): its
power curve is a SPECpower_ssj2008 shape (embedded in `training/data/`) scaled and perturbed,
its allocatable CPU is the core count of that SPEC result, and its temperatures follow load
and a daily ambient cycle through a first-order lag, with fans adding power above 50 C. The
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

from bench.sim.kube_default import PodRequest
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
) -> SimCluster:
    """`training.synth`'s fleet for (n_nodes, seed), with CPU, memory and batteries.

    `battery_share` of the nodes (at least one when > 0) run on a battery of
    `battery_hours` x their maximum power, charged by solar panels peaking at
    `solar_peak_share` x their maximum power.
    """
    spec = fleet_spec(n_nodes, seed)
    shapes = load_shapes().drop_duplicates("result").set_index("result")
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
