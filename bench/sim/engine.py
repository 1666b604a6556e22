"""The simulation loop: pods arrive, a policy places them, nodes draw power, telemetry lags.

Arrivals are events at their exact trace times (the policy sees the simulated clock at that
instant); node physics advances in fixed ticks of `tick_s`. Per tick:

1. the pods that arrive in the tick and the pending pods due for a retry are placed in time
   order, as kube-scheduler's queue would pop them. A pod that found no node waits in its
   unschedulable pool until a cluster event may have made room (a pod ended, a node became
   Ready or changed labels: `Simulation.room_may_have_changed`), never sooner than its backoff
   (1 s, doubling per attempt, at most 10 s) and never longer than 5 minutes without one (the
   scheduler's defaults); a pod still unplaced `max_pending_s` after arrival counts as
   unplaced. A policy that reschedules
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

A policy with power management (`Policy.power`, `bench.sim.power`) also powers nodes off and
on: after the placements of step 1 its manager advances boots and shutdowns and, every
`power_interval_s`, decides (pods it evicts wait again as pending, with the work they have
left); in step 3 it sets what nodes off, booting or shutting down draw.

In code: `simulate` runs a `Simulation` tick by tick. `Simulation.step` is the list above, one
method per step, in that order; `Simulation.result` sums the run up as a `PolicyResult`.
A preset may add `Meter`s: each sees every tick's per-node power and then fills its figures
into the result (e.g. `bench.sim.carbon`'s grams of CO2). A trace may give pods their own
patience (`Trace.max_wait_s`, e.g. deferrable pods that may wait hours).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
from bench.sim.kube_default import DEFAULT_KUBE_VERSION, DEFAULT_MAX_PODS, NodeLedger, PodRequest
from bench.sim.pod_faults import PodFaults
from bench.sim.policies import Decision, Policy
from bench.sim.workload import Trace
from livedata.labels import ENERGY_LABEL, POWERLESS


@dataclass(frozen=True)
class SimSettings:
    tick_s: float = 5.0
    scrape_interval_s: float = 15.0
    telemetry_lag_s: float = 45.0
    # kube-scheduler's queue at its defaults: podInitialBackoffSeconds, podMaxBackoffSeconds,
    # and podMaxInUnschedulablePodsDuration (how long a pod waits for a cluster event at most).
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0
    unschedulable_flush_s: float = 300.0
    max_pending_s: float = 600.0
    tail_s: float = 3600.0  # simulated time after the last arrival
    # None: every node stays on and pays its idle power (the default assumption). A number:
    # a node with no pods sleeps at this power and wakes instantly when a pod is bound
    # (optimistic: real wake-ups take seconds to minutes and autoscalers wait ~10 min).
    empty_node_power_w: float | None = None
    initial_battery_share: float = 0.7
    power_series_step_s: float = 60.0  # resolution of the stored power-over-time series
    # Power states, for policies with power management (`bench.sim.power` cites the figures):
    # what a node draws while off (BMC standby: an assumption), how long it boots and shuts
    # down, what it draws booting (idle + share x (peak - idle)), how often the manager runs.
    off_power_w: float = 10.0
    boot_s: float = 300.0
    boot_power_share: float = 0.5
    shutdown_s: float = 60.0
    power_interval_s: float = 10.0
    # Whose default scores the simulated kube-scheduler gives (`bench.sim.kube_default`).
    kube_version: str = DEFAULT_KUBE_VERSION


class Meter(Protocol):
    """A preset's own accounting over a run: sees every tick, then adds to the result."""

    def tick(self, t0_s: float, tick_s: float, node_power_w: np.ndarray) -> None: ...

    def finish(self, result: PolicyResult) -> None: ...


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
    nodes: int = 0
    # Seconds from each placed pod's arrival to its placement (kube-scheduler's retries).
    pod_waits_s: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    # Contract 5's keys that only some presets and policies fill (0 where they do not apply).
    power_cycles: int = 0  # node power-offs (each followed by a power-on, or the run's end)
    co2_kg: float = 0.0
    delay_violations: int = 0
    failed_pod_starts: int = 0
    # A preset's own figures (e.g. mean carbon intensity), reported as they are.
    kpis: dict[str, float] = field(default_factory=dict)
    # Nodes on (taking pods) over time, on `power_times_s`; None when every node stays on.
    nodes_on: np.ndarray | None = field(repr=False, default=None)

    @property
    def power_cycles_per_node_day(self) -> float:
        node_days = self.nodes * self.duration_s / 86_400.0
        return self.power_cycles / node_days if node_days > 0 else 0.0

    def pod_wait_summary_s(self) -> dict[str, float]:
        """p50, p99 and max of the placed pods' waits (0 when none was placed)."""
        waits = self.pod_waits_s
        if waits.size == 0:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0}
        return {
            "p50": round(float(np.percentile(waits, 50)), 3),
            "p99": round(float(np.percentile(waits, 99)), 3),
            "max": round(float(waits.max()), 3),
        }

    @property
    def pods_waiting_over_30_s(self) -> int:
        """Placements that came more than 30 s after the pod's arrival (or eviction): the
        power-management target is a p99 wait of 30 s, and this says how many miss it."""
        return int((self.pod_waits_s > 30.0).sum())

    @property
    def dynamic_energy_kwh(self) -> float:
        """Energy above idle: the part placement can change while every node stays on."""
        return self.energy_kwh - self.idle_energy_kwh

    def summary(self) -> dict[str, object]:
        return {
            "energy_kwh": round(self.energy_kwh, 4),
            "unplaced_pods": self.unplaced_pods,
            "pod_wait_s": self.pod_wait_summary_s(),
            "pods_waiting_over_30_s": self.pods_waiting_over_30_s,
            "power_cycles_per_node_day": round(self.power_cycles_per_node_day, 3),
            "co2_kg": round(self.co2_kg, 4),
            "delay_violations": self.delay_violations,
            "failed_pod_starts": self.failed_pod_starts,
            "dynamic_energy_kwh": round(self.dynamic_energy_kwh, 4),
            "fan_energy_kwh": round(self.fan_energy_kwh, 4),
            "above_envelope_energy_kwh": round(self.above_envelope_energy_kwh, 4),
            "mean_power_w": round(self.mean_power_w, 1),
            "peak_power_w": round(self.peak_power_w, 1),
            "pods": self.pods,
            "placed_pods": self.placed_pods,
            "unfinished_pods": self.unfinished_pods,
            "moved_pods": self.moved_pods,
            "mean_slowdown": round(self.mean_slowdown, 4),
            "p95_slowdown": round(self.p95_slowdown, 4),
            "overcommitted_node_hours": round(self.overcommitted_node_hours, 3),
            "powerless_node_hours": round(self.powerless_node_hours, 3),
            "mean_requested_share": round(self.mean_requested_share, 4),
            "mean_cpu_util": round(self.mean_cpu_util, 4),
            "duration_h": round(self.duration_s / 3600.0, 3),
            **self.kpis,
        }


@dataclass
class RunningPods:
    """The pods running now, as parallel arrays (a few hundred at a time), one entry per pod."""

    pod: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))  # trace index
    node: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    used_cores: np.ndarray = field(default_factory=lambda: np.zeros(0))  # request x usage ratio
    remaining_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # work left, full speed
    started_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def count(self) -> int:
        return int(self.pod.size)

    def add(self, pod: int, node: int, used_cores: float, work_s: float, now_s: float) -> None:
        """A pod bound to `node` at `now_s`, with `work_s` seconds of work at full speed."""
        self.pod = np.append(self.pod, pod)
        self.node = np.append(self.node, node)
        self.used_cores = np.append(self.used_cores, used_cores)
        self.remaining_s = np.append(self.remaining_s, work_s)
        self.started_s = np.append(self.started_s, now_s)

    def drop(self, done: np.ndarray) -> None:
        """Forget the pods where `done` is True."""
        keep = ~done
        self.pod, self.node = self.pod[keep], self.node[keep]
        self.used_cores, self.remaining_s = self.used_cores[keep], self.remaining_s[keep]
        self.started_s = self.started_s[keep]


@dataclass(frozen=True)
class NodeSample:
    """The nodes' state over one tick, as the telemetry shows it `telemetry_lag_s` later."""

    time_s: float
    util: np.ndarray
    ambient_c: np.ndarray
    cpu1_c: np.ndarray
    cpu2_c: np.ndarray


@dataclass(frozen=True)
class NodePower:
    """What the nodes draw over one tick, per node, in watts."""

    total_w: np.ndarray  # curve + fans (or the sleep power of an empty node)
    fan_w: np.ndarray
    above_envelope_w: np.ndarray  # above the curve's convex envelope (partly loaded)


class Simulation:
    """One run of a trace on a cluster with a policy: the state that the steps of a tick change.

    Use: `start()`, then `step(tick)` for every tick in `range(n_ticks)`, then `result()`.
    """

    def __init__(
        self,
        cluster: SimCluster,
        trace: Trace,
        policy: Policy,
        settings: SimSettings,
        meters: Sequence[Meter] = (),
        faults: PodFaults | None = None,
    ) -> None:
        self.cluster = cluster
        self.meters = tuple(meters)
        self.trace = trace
        self.policy = policy
        self.settings = settings
        tick_s = settings.tick_s
        self.n_ticks = math.ceil((trace.end_s + settings.tail_s) / tick_s)
        self.scrape_every_ticks = max(1, round(settings.scrape_interval_s / tick_s))
        self.lag_ticks = max(0, round(settings.telemetry_lag_s / tick_s))
        self.series_every_ticks = max(1, round(settings.power_series_step_s / tick_s))
        self.reschedule_every_ticks = (
            None
            if policy.reschedule_interval_s is None
            else max(1, round(policy.reschedule_interval_s / tick_s))
        )

        # Pods: the scheduler's view of each node (requests), what runs, what waits to retry.
        # Every node runs its DaemonSet pods, whose requests count as any pod's.
        self.ledger = NodeLedger(
            np.round(cluster.cores * 1000.0),
            cluster.memory_bytes,
            cluster.zone_labels,
            kube_version=settings.kube_version,
            max_pods=DEFAULT_MAX_PODS if cluster.max_pods is None else cluster.max_pods,
        )
        for daemon_pod in cluster.daemon_pods:
            for node in range(len(cluster)):
                self.ledger.add(node, daemon_pod)
        self.requests = [
            PodRequest(int(c), int(m), int(o))
            for c, m, o in zip(trace.cpu_m, trace.memory_bytes, trace.owners, strict=True)
        ]
        self.running = RunningPods()
        # Pods waiting for a node: pod -> (not before, attempts so far). A pod never tried (new,
        # or re-created) is due at its time; one that found no node also waits for an event.
        self.pending: dict[int, tuple[float, int]] = {}
        self.failed_at_s: dict[int, float] = {}  # a pending pod's last attempt that found no node
        self.room_changed_at_s = -math.inf  # the last cluster event that may have made room
        self.faults = faults
        self.next_arrival = 0  # the first pod of the trace not yet arrived
        self.placed = self.unplaced = self.moved = 0
        self.decisions: list[DecisionRecord] = []
        self.slowdowns: list[float] = []
        self.waits_s: list[float] = []
        # Pods evicted by power management, or whose start failed (`faults`) and were
        # re-created, wait again: since when, and (evicted ones) the work they have left.
        self.queued_at_s: dict[int, float] = {}
        self.work_left_s: dict[int, float] = {}

        # Nodes: utilisation, CPU temperatures (first-order lag) and what telemetry will show.
        self.util = np.zeros(len(cluster))
        self.ambient_c = ambient_c(cluster, 0.0)
        self.cpu1_c, self.cpu2_c = cpu_temperature_targets_c(cluster, self.ambient_c, self.util)
        self.thermal_alpha = 1.0 - np.exp(-tick_s / cluster.spec.thermal_tau_s)
        self.two_sockets = cluster.spec.sockets > 1
        self.envelopes_w = envelope_curves_w(cluster)
        # The cluster was idle before the run: that is what the first poll shows.
        self.history: list[NodeSample] = []
        self._remember_telemetry(0.0)

        # Batteries: stored energy and the energy-status label the policy was last told.
        self.battery_wh = cluster.battery_capacity_wh * settings.initial_battery_share
        self.labels = [
            energy_status(settings.initial_battery_share) if on_battery else None
            for on_battery in cluster.on_battery
        ]

        # Per tick, summed over the nodes.
        self.total_power_w = np.zeros(self.n_ticks)
        self.fan_power_w = np.zeros(self.n_ticks)
        self.above_envelope_power_w = np.zeros(self.n_ticks)
        self.requested_share = np.zeros(self.n_ticks)
        self.used_share = np.zeros(self.n_ticks)
        self.total_cores = float(cluster.cores.sum())
        self.overcommitted_node_ticks = 0
        self.powerless_node_ticks = 0

        # Power management, when the policy has it (`bench.sim.power`).
        self.power = policy.power
        if self.power is not None:
            self.power.attach(self)

    def start(self) -> None:
        """What the policy knows before the first pod: the battery nodes' labels, a first poll."""
        for i in np.flatnonzero(self.cluster.on_battery):
            self.policy.labels_changed(int(i), {ENERGY_LABEL: self.labels[i]})
        self._send_telemetry()

    def step(self, tick: int) -> None:
        """One tick of `tick_s`: the five steps of the module docstring, in order."""
        t0_s = tick * self.settings.tick_s
        t1_s = t0_s + self.settings.tick_s
        # 1. arrivals and due retries in time order, then the moves of a rescheduling policy
        self._place_arrivals_and_retries(t0_s, t1_s)
        if self.power is not None:
            self.power.step(self, t0_s, t1_s)
        every = self.reschedule_every_ticks
        if every is not None and tick % every == 0 and self.running.count:
            self._reschedule(t0_s)
        # 2. running pods progress (processor sharing on overcommitted nodes)
        if self.faults is not None:
            self.faults.running(self.running)  # the failing pods of this tick, before any ends
        wanted_cores, hosts_pods = self._progress_pods(t1_s)
        if self.faults is not None:
            self.faults.tick(t1_s, self.policy)
        # 3. utilisation, temperatures, power (the state over this tick)
        power = self._advance_nodes(t0_s, wanted_cores, hosts_pods)
        if self.faults is not None:
            self.faults.account(power.total_w, wanted_cores, self.settings.tick_s)
        self._tally(tick, power, wanted_cores)
        for meter in self.meters:
            meter.tick(t0_s, self.settings.tick_s, power.total_w)
        self._remember_telemetry(t0_s)
        # 4. lagged telemetry, as a Prometheus poll would see it
        if tick % self.scrape_every_ticks == 0:
            self._send_telemetry()
        # 5. batteries
        if self.cluster.on_battery.any():
            self._update_batteries(t0_s, power.total_w)

    # ---- 1. placement ---------------------------------------------------------------------

    def _place_arrivals_and_retries(self, t0_s: float, t1_s: float) -> None:
        """Try the pods arriving before `t1_s` and the pending pods due by then, in time order
        (a retry before an arrival at the same instant: it entered the queue first); give up on
        the pods that have waited longer than their patience."""
        attempts_due: list[tuple[float, int, int, int]] = []  # (time, arrival?, pod, attempts)
        for pod, (not_before_s, attempts) in list(self.pending.items()):
            give_up_s = self._queued_s(pod) + self._max_wait_s(pod)
            if t0_s > give_up_s:
                del self.pending[pod]
                self.failed_at_s.pop(pod, None)
                self.unplaced += 1
                continue
            retry_s = max(self._retry_s(pod, not_before_s), t0_s)
            if retry_s < t1_s and retry_s <= give_up_s:
                attempts_due.append((retry_s, 0, pod, attempts))
        trace = self.trace
        while self.next_arrival < len(trace) and trace.arrival_s[self.next_arrival] < t1_s:
            pod = self.next_arrival
            self.next_arrival += 1
            attempts_due.append((float(trace.arrival_s[pod]), 1, pod, 0))
        attempts_due.sort()
        for now_s, _, pod, attempts in attempts_due:
            decision = self._try_place(pod, now_s, attempts + 1)
            if decision.node is not None:
                self.pending.pop(pod, None)
                self.failed_at_s.pop(pod, None)
            elif decision.retry_at_s is not None:  # held on purpose until then
                self.pending[pod] = (decision.retry_at_s, attempts + 1)
                self.failed_at_s.pop(pod, None)
            else:
                self.pending[pod] = (now_s + self._backoff_s(attempts + 1), attempts + 1)
                self.failed_at_s[pod] = now_s

    def _retry_s(self, pod: int, not_before_s: float) -> float:
        """When kube-scheduler tries a pending pod next: a pod never tried (or held until a
        time) then; one that found no node after an event that may have made room (and its
        backoff), or after `unschedulable_flush_s` with none."""
        failed_at_s = self.failed_at_s.get(pod)
        if failed_at_s is None:
            return not_before_s
        if self.room_changed_at_s > failed_at_s:
            return max(not_before_s, self.room_changed_at_s)
        return failed_at_s + self.settings.unschedulable_flush_s

    def _backoff_s(self, attempts: int) -> float:
        """kube-scheduler's backoff after `attempts` failed attempts: doubling, capped."""
        settings = self.settings
        return min(settings.backoff_initial_s * 2.0 ** (attempts - 1), settings.backoff_max_s)

    def room_may_have_changed(self, now_s: float) -> None:
        """A cluster event that moves unschedulable pods back to kube-scheduler's queue: a pod
        ended (its failed start given up counts), a node became Ready or changed its labels.
        Evictions by power management do not: they empty a cordoned node."""
        self.room_changed_at_s = max(self.room_changed_at_s, now_s)

    def _queued_s(self, pod: int) -> float:
        """Since when the pod waits: its arrival, or its re-creation after an eviction."""
        return self.queued_at_s.get(pod, float(self.trace.arrival_s[pod]))

    def _max_wait_s(self, pod: int) -> float:
        """How long the pod may wait for a node: its own patience, else `max_pending_s`."""
        max_wait_s = self.trace.max_wait_s
        return self.settings.max_pending_s if max_wait_s is None else float(max_wait_s[pod])

    def _try_place(self, pod: int, now_s: float, attempt: int) -> Decision:
        """Ask the policy for a node; bind the pod there if it found one. Recorded either way."""
        uid = self.trace.names[pod]
        decision = self.policy.place(uid, self.requests[pod], self.ledger, now_s)
        node = decision.node
        self.decisions.append(
            DecisionRecord(
                time_s=now_s,
                pod=uid,
                node="" if node is None else self.cluster.names[node],
                predicted_increase_w=decision.predicted_increase_w,
                score=decision.score,
                attempt=attempt,
                note=decision.reason,
            )
        )
        if node is None:
            return decision
        self.ledger.add(node, self.requests[pod])
        cpu_cores = self.trace.cpu_m[pod] / 1000.0
        self.policy.bound(node, uid, cpu_cores, now_s)
        # Evicted pods resume with the work they had left.
        work_s = self.work_left_s.pop(pod, self.trace.duration_s[pod])
        if self.faults is not None:
            # A start that a node's fault will fail runs only until it is given up.
            work_s = self.faults.started(pod, node, uid, now_s) or work_s
        self.running.add(
            pod,
            node,
            used_cores=cpu_cores * self.trace.usage_ratio[pod],
            work_s=work_s,
            now_s=now_s,
        )
        self.placed += 1
        self.waits_s.append(now_s - self.queued_at_s.pop(pod, float(self.trace.arrival_s[pod])))
        return decision

    def _reschedule(self, t0_s: float) -> None:
        """Offer the running pods to the policy and apply its moves (free and instant)."""
        running, names = self.running, self.cluster.names
        pods_running = [self.requests[pod] for pod in running.pod.tolist()]
        moves = self.policy.reschedule(running.node, running.used_cores, pods_running, self.ledger)
        for slot, node in moves:
            pod, source = int(running.pod[slot]), int(running.node[slot])
            uid = self.trace.names[pod]
            self.ledger.remove(source, self.requests[pod])
            self.ledger.add(node, self.requests[pod])
            running.node[slot] = node
            self.policy.gone(uid)
            self.policy.bound(node, uid, self.trace.cpu_m[pod] / 1000.0, t0_s)
            self.decisions.append(
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
            self.moved += 1

    # ---- 2. running pods ------------------------------------------------------------------

    def _progress_pods(self, t1_s: float) -> tuple[np.ndarray, np.ndarray]:
        """Advance every running pod by one tick; finished pods leave their nodes.

        Returns the cores the pods of each node wanted during the tick, and which nodes ran
        pods at all (finished pods count: they ran during this tick).
        """
        running, cores = self.running, self.cluster.cores
        n_nodes = len(self.cluster)
        wanted_cores = np.bincount(running.node, weights=running.used_cores, minlength=n_nodes)
        hosts_pods = np.bincount(running.node, minlength=n_nodes) > 0
        slow_factor = np.maximum(1.0, wanted_cores / cores)
        self.overcommitted_node_ticks += int(np.count_nonzero(slow_factor > 1.0))
        running.remaining_s -= self.settings.tick_s / slow_factor[running.node]
        done = running.remaining_s <= 0
        if done.any():
            self.room_may_have_changed(t1_s)
            for pod, node, started_s in zip(
                running.pod[done].tolist(),
                running.node[done].tolist(),
                running.started_s[done].tolist(),
                strict=True,
            ):
                self.ledger.remove(node, self.requests[pod])
                if self.faults is not None and self.faults.ended(pod, node, t1_s, self.policy):
                    # The failed start is given up; its controller re-creates the pod.
                    self.policy.gone(self.trace.names[pod])
                    self.pending[pod] = (t1_s, 0)
                    self.queued_at_s[pod] = t1_s
                    continue
                self.policy.gone(self.trace.names[pod])
                self.slowdowns.append((t1_s - started_s) / self.trace.duration_s[pod])
            running.drop(done)
        return wanted_cores, hosts_pods

    # ---- 3. node physics and energy -------------------------------------------------------

    def _advance_nodes(
        self, t0_s: float, wanted_cores: np.ndarray, hosts_pods: np.ndarray
    ) -> NodePower:
        """Utilisation, CPU temperatures and power of every node over the tick."""
        cluster = self.cluster
        self.util = np.minimum(wanted_cores / cluster.cores, 1.0)
        self.ambient_c = ambient_c(cluster, t0_s)
        target1_c, target2_c = cpu_temperature_targets_c(cluster, self.ambient_c, self.util)
        self.cpu1_c = self.cpu1_c + self.thermal_alpha * (target1_c - self.cpu1_c)
        self.cpu2_c = self.cpu2_c + self.thermal_alpha * (target2_c - self.cpu2_c)
        hottest_c = np.where(self.two_sockets, np.maximum(self.cpu1_c, self.cpu2_c), self.cpu1_c)
        curve_w = curve_power_w(cluster, self.util)
        fan_w = fan_power_w(cluster, hottest_c)
        # Clipped at 0: between grid points the curve can dip a hair below the envelope line.
        above_envelope_w = np.maximum(curve_w - envelope_power_w(self.envelopes_w, self.util), 0.0)
        total_w = curve_w + fan_w
        sleep_w = self.settings.empty_node_power_w
        if sleep_w is not None:
            total_w = np.where(hosts_pods, total_w, sleep_w)
            fan_w = np.where(hosts_pods, fan_w, 0.0)
            above_envelope_w = np.where(hosts_pods, above_envelope_w, 0.0)
        power = NodePower(total_w, fan_w, above_envelope_w)
        if self.power is not None:
            power = self.power.node_power(self, t0_s, power)
        return power

    def _tally(self, tick: int, power: NodePower, wanted_cores: np.ndarray) -> None:
        """Add the tick's cluster totals: power (-> energy) and requested and used CPU."""
        self.total_power_w[tick] = power.total_w.sum()
        self.fan_power_w[tick] = power.fan_w.sum()
        self.above_envelope_power_w[tick] = power.above_envelope_w.sum()
        requested_cores = self.ledger.requested_cpu_m.sum() / 1000.0
        self.requested_share[tick] = requested_cores / self.total_cores
        used_cores = float(np.minimum(wanted_cores, self.cluster.cores).sum())
        self.used_share[tick] = used_cores / self.total_cores

    # ---- 4. telemetry ---------------------------------------------------------------------

    def _remember_telemetry(self, t0_s: float) -> None:
        """Keep this tick's node state until the telemetry lag has passed."""
        self.history.append(
            NodeSample(
                t0_s, self.util.copy(), self.ambient_c, self.cpu1_c.copy(), self.cpu2_c.copy()
            )
        )
        if len(self.history) > self.lag_ticks + 1:
            self.history.pop(0)

    def _send_telemetry(self) -> None:
        """The oldest state in the history: what Prometheus shows `telemetry_lag_s` later."""
        sample = self.history[0]
        readings = []
        for i, name in enumerate(self.cluster.names):
            # BMC temperatures come in whole degrees; one-socket nodes have no cpu2 sensor.
            values = {
                "cpu_util": round(float(sample.util[i]), 4),
                "ambient_temp_c": float(round(sample.ambient_c[i])),
                "cpu1_temp_c": float(round(sample.cpu1_c[i])),
            }
            if self.two_sockets[i]:
                values["cpu2_temp_c"] = float(round(sample.cpu2_c[i]))
            readings.append((name, values, sample.time_s))
        self.policy.telemetry(readings)

    # ---- 5. batteries ---------------------------------------------------------------------

    def _update_batteries(self, t0_s: float, power_w: np.ndarray) -> None:
        """Charge from solar, drain by the node's power; tell the policy of new labels."""
        cluster = self.cluster
        self.battery_wh = np.clip(
            self.battery_wh + (solar_w(cluster, t0_s) - power_w) * self.settings.tick_s / 3600.0,
            0.0,
            cluster.battery_capacity_wh,
        )
        for i in np.flatnonzero(cluster.on_battery).tolist():
            label = energy_status(self.battery_wh[i] / cluster.battery_capacity_wh[i])
            if label == POWERLESS:
                self.powerless_node_ticks += 1
            if label != self.labels[i]:
                self.labels[i] = label
                self.policy.labels_changed(i, {ENERGY_LABEL: label})
                self.room_may_have_changed(t0_s + self.settings.tick_s)

    # ---- the run's figures ----------------------------------------------------------------

    def result(self) -> PolicyResult:
        """The run summed up; pods still pending at the end count as unplaced."""
        cluster, tick_s, n_ticks = self.cluster, self.settings.tick_s, self.n_ticks
        failed_pod_starts, kpis = (
            (0, {}) if self.faults is None else self.faults.summary(self.n_ticks * tick_s)
        )
        every = self.series_every_ticks
        series_w = self.total_power_w[: n_ticks - n_ticks % every].reshape(-1, every).mean(axis=1)
        slowdowns = np.array(self.slowdowns) if self.slowdowns else np.ones(1)
        cluster_idle_w = float((cluster.spec.idle_share * cluster.spec.max_power_w).sum())
        result = PolicyResult(
            policy=self.policy.name,
            energy_kwh=energy_kwh(self.total_power_w, tick_s),
            idle_energy_kwh=energy_kwh(np.full(n_ticks, cluster_idle_w), tick_s),
            fan_energy_kwh=energy_kwh(self.fan_power_w, tick_s),
            above_envelope_energy_kwh=energy_kwh(self.above_envelope_power_w, tick_s),
            mean_power_w=float(self.total_power_w.mean()),
            peak_power_w=float(self.total_power_w.max()),
            pods=len(self.trace),
            placed_pods=self.placed,
            unplaced_pods=self.unplaced + len(self.pending),
            unfinished_pods=self.running.count,
            moved_pods=self.moved,
            mean_slowdown=float(slowdowns.mean()),
            p95_slowdown=float(np.percentile(slowdowns, 95)),
            overcommitted_node_hours=self.overcommitted_node_ticks * tick_s / 3600.0,
            powerless_node_hours=self.powerless_node_ticks * tick_s / 3600.0,
            mean_requested_share=float(self.requested_share.mean()),
            mean_cpu_util=float(self.used_share.mean()),
            duration_s=n_ticks * tick_s,
            power_times_s=np.arange(series_w.size) * self.settings.power_series_step_s,
            power_w=series_w,
            decisions=self.decisions,
            nodes=len(cluster),
            pod_waits_s=np.array(self.waits_s),
            failed_pod_starts=failed_pod_starts,
            kpis=kpis,
        )
        for meter in self.meters:
            meter.finish(result)
        if self.power is not None:
            self.power.finish(self, result)
        return result


def simulate(
    cluster: SimCluster,
    trace: Trace,
    policy: Policy,
    settings: SimSettings = SimSettings(),
    *,
    progress: bool = False,
    meters: Sequence[Meter] = (),
    faults: PodFaults | None = None,
) -> PolicyResult:
    """Run `trace` on `cluster` with `policy`; deterministic for a deterministic policy.

    `meters` count what a preset measures beside energy (e.g. CO2); `faults` (a preset's,
    fresh for each run) fails some pod starts on some nodes.
    """
    run = Simulation(cluster, trace, policy, settings, meters, faults)
    run.start()
    bar = tqdm(
        total=run.n_ticks,
        desc=f"simulating {policy.name}",
        unit="tick",
        disable=not progress or not sys.stderr.isatty(),
        mininterval=0.5,
    )
    for tick in range(run.n_ticks):
        run.step(tick)
        bar.update(1)
    bar.close()
    return run.result()
