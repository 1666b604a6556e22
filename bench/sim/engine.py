"""The simulation loop: pods arrive, a policy places them, nodes draw power, telemetry lags.

Arrivals are events at their exact trace times (the policy sees the simulated clock at that
instant); node physics advances in fixed ticks of `tick_s`. Per tick:

1. pods that arrived in the tick are placed in arrival order, then pending pods due for a
   retry (kube-scheduler's backoff, simplified to a fixed `retry_interval_s`); a pod still
   unplaced `max_pending_s` after arrival counts as unplaced. A policy that reschedules
   (`Policy.reschedule_interval_s`) is then offered the running pods, and its moves are
   applied (free and instant; recorded as decisions);
2. running pods progress: a pod uses `cpu_request x usage_ratio` cores; a node whose pods
   want more CPU than it has runs them all slower by the same factor (processor sharing), so
   work is conserved and overcommit shows up as slowdown (wall time / work);
3. utilisation (capped at 1), CPU temperatures (first-order lag) and power are updated and
   power x tick is added to the energy; so are, apart, what fans add and what nodes draw above
   their curves' convex envelopes (running partly loaded where a curve is concave), the two
   parts of the energy that `bench.sim.ceiling`'s bound leaves out;
4. every `scrape_interval_s` the policy is sent the telemetry of `telemetry_lag_s` ago (what
   a Prometheus rate over a scrape window shows), so pods bound since then are only known
   through the assumed-load mechanism (`ClusterState.pod_bound`);
5. battery nodes charge from solar and drain by their power; when a battery's share crosses
   an `energy-status` boundary the policy is told the new label.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from bench.sim.ceiling import envelope_curves_w, envelope_power_w
from bench.sim.cluster import (
    SimCluster,
    ambient_c,
    cpu_temperature_targets_c,
    curve_power_w,
    energy_kwh,
    energy_status,
    fan_power_w,
    solar_w,
)
from bench.sim.kube_default import NodeLedger, PodRequest
from bench.sim.policies import Policy
from bench.sim.workload import Trace
from livedata.labels import ENERGY_LABEL, POWERLESS


@dataclass(frozen=True)
class SimSettings:
    tick_s: float = 5.0
    scrape_interval_s: float = 15.0
    telemetry_lag_s: float = 45.0
    retry_interval_s: float = 30.0
    max_pending_s: float = 600.0
    tail_s: float = 3600.0  # simulated time after the last arrival
    # None: every node stays on and pays its idle power (the default assumption). A number:
    # a node with no pods sleeps at this power and wakes instantly when a pod is bound
    # (optimistic: real wake-ups take seconds to minutes and autoscalers wait ~10 min).
    empty_node_power_w: float | None = None
    initial_battery_share: float = 0.7
    power_series_step_s: float = 60.0  # resolution of the stored power-over-time series


@dataclass
class DecisionRecord:
    time_s: float
    pod: str
    node: str  # "" when not placed
    predicted_increase_w: float
    score: float
    attempt: int
    note: str


@dataclass
class PolicyResult:
    policy: str
    energy_kwh: float
    idle_energy_kwh: float  # what the nodes draw idle (at ambient) over the run: paid by any policy
    fan_energy_kwh: float  # what fans added (CPUs above 50 C)
    above_envelope_energy_kwh: float  # drawn above the curves' convex envelopes (partly loaded)
    mean_power_w: float
    peak_power_w: float
    pods: int
    placed_pods: int
    unplaced_pods: int
    unfinished_pods: int
    moved_pods: int  # moves of running pods by a rescheduling policy
    mean_slowdown: float
    p95_slowdown: float
    overcommitted_node_hours: float
    powerless_node_hours: float
    mean_requested_share: float  # requested CPU / allocatable CPU, time average
    mean_cpu_util: float  # CPU used / CPU allocatable, time average
    duration_s: float
    power_times_s: np.ndarray = field(repr=False)
    power_w: np.ndarray = field(repr=False)
    decisions: list[DecisionRecord] = field(repr=False, default_factory=list)

    @property
    def dynamic_energy_kwh(self) -> float:
        """Energy above idle: the part placement can change while every node stays on."""
        return self.energy_kwh - self.idle_energy_kwh

    def summary(self) -> dict[str, float | int]:
        return {
            "energy_kwh": round(self.energy_kwh, 4),
            "dynamic_energy_kwh": round(self.dynamic_energy_kwh, 4),
            "fan_energy_kwh": round(self.fan_energy_kwh, 4),
            "above_envelope_energy_kwh": round(self.above_envelope_energy_kwh, 4),
            "mean_power_w": round(self.mean_power_w, 1),
            "peak_power_w": round(self.peak_power_w, 1),
            "pods": self.pods,
            "placed_pods": self.placed_pods,
            "unplaced_pods": self.unplaced_pods,
            "unfinished_pods": self.unfinished_pods,
            "moved_pods": self.moved_pods,
            "mean_slowdown": round(self.mean_slowdown, 4),
            "p95_slowdown": round(self.p95_slowdown, 4),
            "overcommitted_node_hours": round(self.overcommitted_node_hours, 3),
            "powerless_node_hours": round(self.powerless_node_hours, 3),
            "mean_requested_share": round(self.mean_requested_share, 4),
            "mean_cpu_util": round(self.mean_cpu_util, 4),
            "duration_h": round(self.duration_s / 3600.0, 3),
        }


def simulate(
    cluster: SimCluster,
    trace: Trace,
    policy: Policy,
    settings: SimSettings = SimSettings(),
    *,
    progress: bool = False,
) -> PolicyResult:
    """Run `trace` on `cluster` with `policy`; deterministic for a deterministic policy."""
    tick_s = settings.tick_s
    n_nodes = len(cluster)
    names = cluster.names
    horizon_s = trace.end_s + settings.tail_s
    n_ticks = math.ceil(horizon_s / tick_s)
    scrape_every = max(1, round(settings.scrape_interval_s / tick_s))
    lag_ticks = max(0, round(settings.telemetry_lag_s / tick_s))
    series_every = max(1, round(settings.power_series_step_s / tick_s))
    reschedule_every = (
        None
        if policy.reschedule_interval_s is None
        else max(1, round(policy.reschedule_interval_s / tick_s))
    )

    ledger = NodeLedger(np.round(cluster.cores * 1000.0), cluster.memory_bytes)
    requests = [
        PodRequest(int(c), int(m)) for c, m in zip(trace.cpu_m, trace.memory_bytes, strict=True)
    ]

    # Running pods, as parallel arrays (a few hundred at a time).
    run_pod = np.zeros(0, dtype=np.intp)
    run_node = np.zeros(0, dtype=np.intp)
    run_used_cores = np.zeros(0)
    run_remaining_s = np.zeros(0)
    run_started_s = np.zeros(0)
    slowdowns: list[float] = []
    pending: dict[int, tuple[float, int]] = {}  # pod -> (next retry time, attempts)
    placed = unplaced = moved = 0
    decisions: list[DecisionRecord] = []

    # Thermal state and the telemetry history the lag reads from.
    util = np.zeros(n_nodes)
    start_ambient = ambient_c(cluster, 0.0)
    cpu1_c, cpu2_c = cpu_temperature_targets_c(cluster, start_ambient, util)
    alpha = 1.0 - np.exp(-tick_s / cluster.spec.thermal_tau_s)
    two_sockets = cluster.spec.sockets > 1
    # The cluster was idle before the run: that is what the first poll shows.
    history = [(0.0, util.copy(), start_ambient, cpu1_c.copy(), cpu2_c.copy())]

    def send_telemetry() -> None:
        """The oldest state in the history: what Prometheus shows `telemetry_lag_s` later."""
        observed_s, h_util, h_ambient, h_cpu1, h_cpu2 = history[0]
        readings = []
        for i, name in enumerate(names):
            # BMC temperatures come in whole degrees; one-socket nodes have no cpu2 sensor.
            values = {
                "cpu_util": round(float(h_util[i]), 4),
                "ambient_temp_c": float(round(h_ambient[i])),
                "cpu1_temp_c": float(round(h_cpu1[i])),
            }
            if two_sockets[i]:
                values["cpu2_temp_c"] = float(round(h_cpu2[i]))
            readings.append((name, values, observed_s))
        policy.telemetry(readings)

    battery_wh = cluster.battery_capacity_wh * settings.initial_battery_share
    labels = [
        energy_status(settings.initial_battery_share) if cluster.on_battery[i] else None
        for i in range(n_nodes)
    ]
    for i in np.flatnonzero(cluster.on_battery):
        policy.labels_changed(int(i), {ENERGY_LABEL: labels[i]})

    total_power = np.zeros(n_ticks)
    fan_power = np.zeros(n_ticks)
    above_envelope_power = np.zeros(n_ticks)
    envelopes_w = envelope_curves_w(cluster)
    requested_share = np.zeros(n_ticks)
    used_share = np.zeros(n_ticks)
    overcommitted_ticks = 0
    powerless_ticks = 0
    next_arrival = 0
    total_cores = float(cluster.cores.sum())
    cluster_idle_w = float((cluster.spec.idle_share * cluster.spec.max_power_w).sum())

    def try_place(pod: int, now_s: float, attempt: int) -> bool:
        nonlocal run_pod, run_node, run_used_cores, run_remaining_s, run_started_s
        nonlocal placed, unplaced
        uid = trace.names[pod]
        decision = policy.place(uid, requests[pod], ledger, now_s)
        node = decision.node
        decisions.append(
            DecisionRecord(
                time_s=now_s,
                pod=uid,
                node="" if node is None else names[node],
                predicted_increase_w=decision.predicted_increase_w,
                score=decision.score,
                attempt=attempt,
                note=decision.reason,
            )
        )
        if node is None:
            return False
        ledger.add(node, requests[pod])
        cpu_cores = trace.cpu_m[pod] / 1000.0
        policy.bound(node, uid, cpu_cores, now_s)
        run_pod = np.append(run_pod, pod)
        run_node = np.append(run_node, node)
        run_used_cores = np.append(run_used_cores, cpu_cores * trace.usage_ratio[pod])
        run_remaining_s = np.append(run_remaining_s, trace.duration_s[pod])
        run_started_s = np.append(run_started_s, now_s)
        placed += 1
        return True

    send_telemetry()
    bar = tqdm(
        total=n_ticks,
        desc=f"simulating {policy.name}",
        unit="tick",
        disable=not progress or not sys.stderr.isatty(),
        mininterval=0.5,
    )
    for tick in range(n_ticks):
        t0_s = tick * tick_s
        t1_s = t0_s + tick_s

        # 1. arrivals, then due retries
        while next_arrival < len(trace) and trace.arrival_s[next_arrival] < t1_s:
            pod = next_arrival
            next_arrival += 1
            arrival_s = float(trace.arrival_s[pod])
            if not try_place(pod, arrival_s, 1):
                pending[pod] = (arrival_s + settings.retry_interval_s, 1)
        for pod, (retry_s, attempts) in list(pending.items()):
            if retry_s >= t1_s:
                continue
            if try_place(pod, t0_s, attempts + 1):
                del pending[pod]
            elif (
                retry_s + settings.retry_interval_s > trace.arrival_s[pod] + settings.max_pending_s
            ):
                del pending[pod]
                unplaced += 1
            else:
                pending[pod] = (retry_s + settings.retry_interval_s, attempts + 1)

        if reschedule_every is not None and tick % reschedule_every == 0 and run_pod.size:
            pods_running = [requests[pod] for pod in run_pod.tolist()]
            for slot, node in policy.reschedule(run_node, run_used_cores, pods_running, ledger):
                pod, source = int(run_pod[slot]), int(run_node[slot])
                uid = trace.names[pod]
                ledger.remove(source, requests[pod])
                ledger.add(node, requests[pod])
                run_node[slot] = node
                policy.gone(uid)
                policy.bound(node, uid, trace.cpu_m[pod] / 1000.0, t0_s)
                decisions.append(
                    DecisionRecord(
                        time_s=t0_s,
                        pod=uid,
                        node=names[node],
                        predicted_increase_w=math.nan,
                        score=math.nan,
                        attempt=0,
                        note=f"moved from {names[source]}",
                    )
                )
                moved += 1

        # 2. progress of running pods (processor sharing on overcommitted nodes)
        wanted = np.bincount(run_node, weights=run_used_cores, minlength=n_nodes)
        hosts_pods = np.bincount(run_node, minlength=n_nodes) > 0  # during this tick
        slow_factor = np.maximum(1.0, wanted / cluster.cores)
        overcommitted_ticks += int(np.count_nonzero(slow_factor > 1.0))
        run_remaining_s -= tick_s / slow_factor[run_node]
        done = run_remaining_s <= 0
        if done.any():
            for pod, node, started_s in zip(
                run_pod[done].tolist(),
                run_node[done].tolist(),
                run_started_s[done].tolist(),
                strict=True,
            ):
                ledger.remove(node, requests[pod])
                policy.gone(trace.names[pod])
                slowdowns.append((t1_s - started_s) / trace.duration_s[pod])
            keep = ~done
            run_pod, run_node = run_pod[keep], run_node[keep]
            run_used_cores, run_remaining_s = run_used_cores[keep], run_remaining_s[keep]
            run_started_s = run_started_s[keep]

        # 3. utilisation, temperatures, power (the state over this tick)
        util = np.minimum(wanted / cluster.cores, 1.0)
        ambient = ambient_c(cluster, t0_s)
        target1, target2 = cpu_temperature_targets_c(cluster, ambient, util)
        cpu1_c = cpu1_c + alpha * (target1 - cpu1_c)
        cpu2_c = cpu2_c + alpha * (target2 - cpu2_c)
        hottest = np.where(two_sockets, np.maximum(cpu1_c, cpu2_c), cpu1_c)
        curve_w = curve_power_w(cluster, util)
        fan_w = fan_power_w(cluster, hottest)
        # Clipped at 0: between grid points the curve can dip a hair below the envelope line.
        above_envelope_w = np.maximum(curve_w - envelope_power_w(envelopes_w, util), 0.0)
        power_w = curve_w + fan_w
        if settings.empty_node_power_w is not None:
            power_w = np.where(hosts_pods, power_w, settings.empty_node_power_w)
            fan_w = np.where(hosts_pods, fan_w, 0.0)
            above_envelope_w = np.where(hosts_pods, above_envelope_w, 0.0)
        total_power[tick] = power_w.sum()
        fan_power[tick] = fan_w.sum()
        above_envelope_power[tick] = above_envelope_w.sum()
        requested_share[tick] = ledger.requested_cpu_m.sum() / 1000.0 / total_cores
        used_share[tick] = float(np.minimum(wanted, cluster.cores).sum()) / total_cores
        history.append((t0_s, util.copy(), ambient, cpu1_c.copy(), cpu2_c.copy()))
        if len(history) > lag_ticks + 1:
            history.pop(0)

        # 4. lagged telemetry, as a Prometheus poll would see it
        if tick % scrape_every == 0:
            send_telemetry()

        # 5. batteries
        if cluster.on_battery.any():
            battery_wh = np.clip(
                battery_wh + (solar_w(cluster, t0_s) - power_w) * tick_s / 3600.0,
                0.0,
                cluster.battery_capacity_wh,
            )
            for i in np.flatnonzero(cluster.on_battery).tolist():
                label = energy_status(battery_wh[i] / cluster.battery_capacity_wh[i])
                if label == POWERLESS:
                    powerless_ticks += 1
                if label != labels[i]:
                    labels[i] = label
                    policy.labels_changed(i, {ENERGY_LABEL: label})
        bar.update(1)
    bar.close()

    unplaced += len(pending)
    series = total_power[: n_ticks - n_ticks % series_every].reshape(-1, series_every).mean(axis=1)
    slowdown_array = np.array(slowdowns) if slowdowns else np.ones(1)
    return PolicyResult(
        policy=policy.name,
        energy_kwh=energy_kwh(total_power, tick_s),
        idle_energy_kwh=energy_kwh(np.full(n_ticks, cluster_idle_w), tick_s),
        fan_energy_kwh=energy_kwh(fan_power, tick_s),
        above_envelope_energy_kwh=energy_kwh(above_envelope_power, tick_s),
        mean_power_w=float(total_power.mean()),
        peak_power_w=float(total_power.max()),
        pods=len(trace),
        placed_pods=placed,
        unplaced_pods=unplaced,
        unfinished_pods=int(run_pod.size),
        moved_pods=moved,
        mean_slowdown=float(slowdown_array.mean()),
        p95_slowdown=float(np.percentile(slowdown_array, 95)),
        overcommitted_node_hours=overcommitted_ticks * tick_s / 3600.0,
        powerless_node_hours=powerless_ticks * tick_s / 3600.0,
        mean_requested_share=float(requested_share.mean()),
        mean_cpu_util=float(used_share.mean()),
        duration_s=n_ticks * tick_s,
        power_times_s=np.arange(series.size) * settings.power_series_step_s,
        power_w=series,
        decisions=decisions,
    )
