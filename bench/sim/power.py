"""Power states in the simulation: nodes that shut down, stay off, boot, and who decides when.

A node is in one of four states:

    ON             takes pods; draws what its curve and fans say
    SHUTTING_DOWN  cordoned, its pods evicted; draws its idle power for `shutdown_s`
    OFF            draws `off_power_w`; a wake-up boots it
    BOOTING        draws its boot power for `boot_s`, then is ON and takes pods (kube-scheduler
                   retries the pods waiting for it at once, as the Node event requeues them)

A `PowerManager` is attached to a policy (`Policy.power`) and driven by the engine: after each
tick's placements it advances boots and shutdowns and, every `power_interval_s`, runs its
`control` round; it sets what nodes off, booting or shutting down draw; at the end it adds its
figures to the result. Two managers:

- `PowerManagement` (policy `power-aware+power-management`): the node power controller's own
  decision, `controllers.node_power.policy.decide`, fed the simulated cluster the way the
  controller maps Kubernetes: node views with watts predicted by the bundle's models (never
  the simulator's true curves), the pending pods, the recent arrival rate of requested CPU.
  It also writes each node's `power-aware-scheduler/power-state` annotation and the Pod
  watch's requested CPU per node into the extender's state, so the extender's PowerState and
  Consolidation plugins run as they would live;
- `bench.sim.autoscaler.ClusterAutoscaler` (policy `default+autoscaler`): cluster-autoscaler's
  rule at its defaults.

Pods on a node that is drained are evicted: each waits again as a pending pod (a Deployment's
replacement) with the work it had left, and is placed by the policy like any other; its wait
counts from the eviction.

The parameters (`SimSettings`, flags of `python -m bench.energy_sim`) and where they come from:

- `boot_s` 300 s: from power-on to a Ready node that takes pods. Published figures span
  seconds to a quarter of an hour: tuned fleets POST in 8-20 s; a Dell R720 takes "a couple
  minutes to boot" (Dell forum); cluster-autoscaler's FAQ says "on GCE it usually takes 3 to 4
  minutes from CA request to when pods can be scheduled"; OpenShift's docs (openshift-docs PR
  #46241) say "in physical bare metal hosts the reboot takes more than 15 minutes", and EKS
  Anywhere waits up to 20 minutes for a bare-metal node (aws/eks-anywhere #5755). Five
  minutes is in the middle; the README sweeps 2 to 15 minutes;
- `boot_power_share` 0.5: a booting server draws between its idle and its peak power (POST
  runs fans and memory tests, then the OS starts); with no measured figure we take the middle,
  idle + 0.5 x (peak - idle), and sweep 0 and 1. Setup time with a power cost is the model of
  Gandhi, Harchol-Balter and Adan, "Server farms with setup costs" (Performance Evaluation,
  2010): a server being set up draws power and serves nothing;
- `shutdown_s` 60 s: an assumption (pods' termination grace, 30 s by Kubernetes' default
  `terminationGracePeriodSeconds`, plus an OS halt), at idle power;
- `off_power_w` 10 W: an assumption, labelled as such: what a server draws off (its BMC on
  standby power); we found no citable figure, 5-15 W is the range we assume;
- idle power itself is each node's SPECpower curve at 0 % (about 50-60 % of peak on the
  curves of the fleet, as Barroso and Hoelzle, "The Case for Energy-Proportional Computing",
  IEEE Computer 2007, and Meisner, Gold and Wenisch, "PowerNap", ASPLOS 2009, report).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from enum import IntEnum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from bench.sim.ceiling import used_cores_series
from bench.sim.engine import NodePower
from bench.sim.policies import ExtenderPolicy
from controllers.node_power.headroom import HeadroomLearner, HeadroomSettings, HeadroomState
from controllers.node_power.policy import (
    ArrivalRate,
    ArrivalRateMeter,
    Decisions,
    NodeView,
    PendingPod,
    PodInfo,
    PolicySettings,
    decide,
)
from extender.node_requests import REQUESTED_CPU_SIGNAL, NodeRequests
from extender.state import NodeInfo
from livedata.labels import POWER_OFF, POWER_ON, POWER_STATE_ANNOTATION, POWER_WAKING
from predictor.curves import CurveBuilder, CurveTable
from predictor.model import Predictor

if TYPE_CHECKING:
    from bench.sim.engine import PolicyResult, SimSettings, Simulation
    from bench.sim.workload import Trace

CURVE_POINTS = 11  # predicted watts at 0 %, 10 %, ..., 100 % CPU in each NodeView
CURVE_REFRESH_S = 300.0  # how often the power manager re-reads the models' curves


class NodeState(IntEnum):
    ON = 0
    SHUTTING_DOWN = 1
    OFF = 2
    BOOTING = 3


class PowerManager:
    """Power states of the nodes and their transitions; subclasses decide in `control`."""

    def __init__(self, settings: SimSettings) -> None:
        for name in ("boot_s", "shutdown_s", "off_power_w"):
            if not getattr(settings, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(settings, name)!r}")
        if not 0 <= settings.boot_power_share <= 1:
            raise ValueError(f"boot_power_share must be 0..1, got {settings.boot_power_share}")
        if not settings.power_interval_s > 0:
            raise ValueError(f"power_interval_s must be > 0, got {settings.power_interval_s}")
        self.settings = settings
        self.power_offs = 0
        self.wakes = 0
        self.evicted_pods = 0
        self._next_control_s = 0.0

    # ---- engine hooks -------------------------------------------------------------------

    def attach(self, sim: Simulation) -> None:
        """Start of a run: every node on."""
        count = len(sim.cluster)
        spec = sim.cluster.spec
        self.state = np.full(count, NodeState.ON, dtype=np.int8)
        self.since_s = np.zeros(count)
        self.wake_queued = np.zeros(count, dtype=bool)  # woken while still shutting down
        self.true_idle_w = spec.idle_share * spec.max_power_w
        self.true_boot_w = self.true_idle_w + self.settings.boot_power_share * (
            spec.max_power_w - self.true_idle_w
        )
        self.baseline_j = 0.0  # what the nodes would draw with no pods, in their power states
        self.off_node_s = 0.0
        self.booting_node_s = 0.0
        self.nodes_on = np.zeros(sim.n_ticks)  # per tick

    def step(self, sim: Simulation, t0_s: float, t1_s: float) -> None:
        """After the tick's placements: finish boots and shutdowns, then maybe a control round."""
        self._advance(sim, t0_s)
        if t0_s >= self._next_control_s:
            self.control(sim, t0_s)
            self._next_control_s = t0_s + self.settings.power_interval_s

    def node_power(self, sim: Simulation, t0_s: float, power: NodePower) -> NodePower:
        """What each node draws over the tick in its power state."""
        state = self.state
        on = state == NodeState.ON
        tick_s = sim.settings.tick_s
        off = state == NodeState.OFF
        booting = state == NodeState.BOOTING
        total_w = np.where(off, self.settings.off_power_w, power.total_w)
        total_w = np.where(booting, self.true_boot_w, total_w)
        powered = on | (state == NodeState.SHUTTING_DOWN)
        baseline_w = np.where(powered, self.true_idle_w, total_w)
        self.baseline_j += float(baseline_w.sum()) * tick_s
        self.off_node_s += int(np.count_nonzero(off)) * tick_s
        self.booting_node_s += int(np.count_nonzero(booting)) * tick_s
        tick = round(t0_s / tick_s)
        if tick < self.nodes_on.size:
            self.nodes_on[tick] = np.count_nonzero(on)
        return NodePower(
            total_w,
            np.where(powered, power.fan_w, 0.0),
            np.where(powered, power.above_envelope_w, 0.0),
        )

    def finish(self, sim: Simulation, result: PolicyResult) -> None:
        """The run's power figures into the result."""
        result.power_cycles = self.power_offs
        every = max(1, round(sim.settings.power_series_step_s / sim.settings.tick_s))
        whole = self.nodes_on.size - self.nodes_on.size % every
        result.nodes_on = self.nodes_on[:whole].reshape(-1, every).mean(axis=1)
        # "Above idle" for a power-managed policy: above what the nodes draw with no pods in
        # the power states they were in (off nodes at their off power, booting at boot power).
        result.idle_energy_kwh = self.baseline_j / 3.6e6
        hours = result.duration_s / 3600.0
        result.kpis.update(
            {
                "wakes": self.wakes,
                "evicted_pods": self.evicted_pods,
                "mean_nodes_off": round(self.off_node_s / 3600.0 / hours, 3) if hours else 0.0,
                "booting_node_hours": round(self.booting_node_s / 3600.0, 3),
            }
        )

    # ---- what subclasses decide -----------------------------------------------------------

    def control(self, sim: Simulation, now_s: float) -> None:
        raise NotImplementedError

    def state_changed(self, sim: Simulation, node: int, state: NodeState) -> None:
        """A node changed power state (for subclasses that tell someone)."""

    # ---- actions --------------------------------------------------------------------------

    def power_off(self, sim: Simulation, node: int, now_s: float) -> None:
        """Cordon the node, evict its pods (they wait again), shut it down."""
        if self.state[node] != NodeState.ON:
            return
        sim.ledger.schedulable[node] = False
        self._evict(sim, node, now_s)
        self._enter(sim, node, NodeState.SHUTTING_DOWN, now_s)
        self.power_offs += 1

    def wake(self, sim: Simulation, node: int, now_s: float) -> None:
        """Boot an off node (one still shutting down boots when it is down)."""
        if self.state[node] == NodeState.OFF:
            self._enter(sim, node, NodeState.BOOTING, now_s)
            self.wakes += 1
        elif self.state[node] == NodeState.SHUTTING_DOWN and not self.wake_queued[node]:
            self.wake_queued[node] = True
            self.wakes += 1

    def _evict(self, sim: Simulation, node: int, now_s: float) -> None:
        running = sim.running
        on_node = running.node == node
        for slot in np.flatnonzero(on_node).tolist():
            pod = int(running.pod[slot])
            sim.ledger.remove(node, sim.requests[pod])
            sim.policy.gone(sim.trace.names[pod])
            sim.work_left_s[pod] = float(running.remaining_s[slot])
            sim.queued_at_s[pod] = now_s
            sim.pending[pod] = (now_s, 0)  # the replacement is tried at the next tick
            self.evicted_pods += 1
        running.drop(on_node)

    def _advance(self, sim: Simulation, now_s: float) -> None:
        """Finish the boots and shutdowns that are due."""
        state, since_s = self.state, self.since_s
        for node in np.flatnonzero(state == NodeState.BOOTING).tolist():
            if now_s - since_s[node] >= self.settings.boot_s:
                self._enter(sim, node, NodeState.ON, now_s)
                sim.ledger.schedulable[node] = True
                # A Node event, after this tick's placements: the pods waiting for this node
                # are tried at the next tick.
                sim.room_may_have_changed(now_s + sim.settings.tick_s)
        for node in np.flatnonzero(state == NodeState.SHUTTING_DOWN).tolist():
            if now_s - since_s[node] >= self.settings.shutdown_s:
                self._enter(sim, node, NodeState.OFF, now_s)
                if self.wake_queued[node]:
                    self.wake_queued[node] = False
                    self._enter(sim, node, NodeState.BOOTING, now_s)

    def _enter(self, sim: Simulation, node: int, state: NodeState, now_s: float) -> None:
        self.state[node] = state
        self.since_s[node] = now_s
        self.state_changed(sim, node, state)


# ---- ours: the node power controller's policy ------------------------------------------------


class PowerAwareExtenderPolicy(ExtenderPolicy):
    """The extender policy, also playing the Pod watch's requested CPU per node.

    The live Pod watch publishes `NodeRequests` (DaemonSet pods left out) for the
    Consolidation plugin; here every binding and every pod gone publishes it. `power_state`
    plays the Node watch for the controller's power-state annotation.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._pods: dict[str, tuple[str, int]] = {}  # uid -> (node, millicores)
        self._requested_m: dict[str, int] = {}
        self._publish_requests()

    def bound(self, node: int, uid: str, cpu_cores: float, now_s: float) -> None:
        super().bound(node, uid, cpu_cores, now_s)
        name, millicores = self.node_names[node], round(cpu_cores * 1000.0)
        self._pods[uid] = (name, millicores)
        self._requested_m[name] = self._requested_m.get(name, 0) + millicores
        self._publish_requests()

    def gone(self, uid: str) -> None:
        super().gone(uid)
        entry = self._pods.pop(uid, None)
        if entry is not None:
            name, millicores = entry
            self._requested_m[name] -= millicores
            self._publish_requests()

    def power_state(self, node: int, state: str) -> None:
        name = self.node_names[node]
        annotations = {POWER_STATE_ANNOTATION: state}
        self.state.upsert_node(
            NodeInfo(name, float(self.node_cores[node]), self.node_labels(node), annotations)
        )

    def node_labels(self, node: int) -> dict[str, str]:
        """The labels the Node watch shows beside the annotation (a preset's world adds its own,
        e.g. the multizone preset's zones)."""
        return {}

    def _publish_requests(self) -> None:
        cores = MappingProxyType({n: m / 1000.0 for n, m in self._requested_m.items() if m})
        self.state.set_signal(REQUESTED_CPU_SIGNAL, NodeRequests(cores))


# The controller's annotation for each simulated state: a node shutting down is as good as off
# to the policy (it cannot take pods back; a wake-up boots it once it is down).
_ANNOTATION = {
    NodeState.ON: POWER_ON,
    NodeState.SHUTTING_DOWN: POWER_OFF,
    NodeState.OFF: POWER_OFF,
    NodeState.BOOTING: POWER_WAKING,
}


class PowerManagement(PowerManager):
    """The node power controller in the simulation: `decide` every `power_interval_s`."""

    def __init__(
        self,
        settings: SimSettings,
        bundle_dir: Path,
        policy_settings: PolicySettings | None = None,
        extender: PowerAwareExtenderPolicy | None = None,
    ) -> None:
        super().__init__(settings)
        self.policy_settings = policy_settings or PolicySettings(boot_s=settings.boot_s)
        self.predictor = Predictor.load(bundle_dir)
        self.extender = extender
        self.meter = ArrivalRateMeter.for_boot_time(settings.boot_s)
        # With a wait target, the headroom learned as the controller learns it: from the pods'
        # creations and their waits (creation, or eviction, to placement).
        target_s = self.policy_settings.target_wait_p99_s
        self.learner = (
            HeadroomLearner(HeadroomSettings(target_s, boot_s=self.policy_settings.boot_s))
            if target_s > 0
            else None
        )
        self.headroom_state: HeadroomState | None = None
        # A reference, not a policy anyone can run: with `foresight` the headroom is how far
        # the trace's requested CPU will rise within the next boot time (no rate meter, no
        # learner), so a run measures what knowing the next boot time's demand is worth.
        self.foresight = False
        self._requested: np.ndarray | None = None
        self._requested_times_s = np.zeros(0)
        self.quantile_moves: list[tuple[float, str]] = []  # (time, why), as the controller logs
        self._next_wait = 0
        # Each node's carbon intensity now (g/kWh, NaN unknown), as the controller reads it
        # for `PolicySettings.rank_by` "grams"; None: not read (the carbon-blind controller).
        self.g_per_kwh: Callable[[str, float], float] | None = None
        self.unneeded_since: Mapping[str, float] = {}
        self.decision_log: list[tuple[float, str, str, str]] = []  # (time, what, node, why)
        self._curves: CurveTable | None = None
        self._curves_at_s = -math.inf
        self._next_arrival = 0

    def finish(self, sim: Simulation, result: PolicyResult) -> None:
        super().finish(sim, result)
        state = self.headroom_state
        if state is not None:
            result.kpis.update(
                {
                    "headroom_quantile_end": round(state.quantile, 4),
                    "learned_headroom_cores_end": round(state.learned_cores, 2),
                    "headroom_quantile_moves": len(self.quantile_moves),
                }
            )

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self._daemon_pods = tuple(
            PodInfo(f"daemonset-{i}", pod.cpu_m / 1000.0, pod.memory_bytes, daemon=True)
            for i, pod in enumerate(sim.cluster.daemon_pods)
        )

    def state_changed(self, sim: Simulation, node: int, state: NodeState) -> None:
        if self.extender is not None:
            self.extender.power_state(node, _ANNOTATION[NodeState(state)])

    def control(self, sim: Simulation, now_s: float) -> None:
        trace = sim.trace
        while self._next_arrival < len(trace) and trace.arrival_s[self._next_arrival] <= now_s:
            created_s = float(trace.arrival_s[self._next_arrival])
            cores = trace.cpu_m[self._next_arrival] / 1000.0
            self.meter.add(created_s, cores)
            if self.learner is not None:
                self.learner.add_arrival(created_s, cores)
            self._next_arrival += 1
        arrival = self.meter.estimate(now_s)
        if self.foresight:
            # The meter's noise stays for the margin between waking and powering off: only
            # the headroom knows the future.
            arrival = ArrivalRate(0.0, arrival.square_cores_per_s)
            learned_cores = self._requested_growth(trace, now_s)
        else:
            learned_cores = self._learned_headroom(sim, now_s)
        pending = [
            PendingPod(trace.names[pod], trace.cpu_m[pod] / 1000.0, int(trace.memory_bytes[pod]))
            for pod in sim.pending
        ]
        decisions = decide(
            self.node_views(sim, now_s),
            pending,
            arrival,
            self.unneeded_since,
            now_s,
            self.policy_settings,
            learned_cores,
        )
        self.unneeded_since = decisions.unneeded_since
        self._apply(sim, decisions, now_s)

    def _requested_growth(self, trace: Trace, now_s: float) -> float:
        """How far the CPU the trace's pods request rises above now's within the next boot
        time, each pod from its arrival for its duration (as `bench.sim.bound` counts them):
        the free CPU a node booting now would have to have kept, known exactly."""
        if self._requested is None:
            end_s = float((trace.arrival_s + trace.duration_s).max(initial=0.0))
            self._requested_times_s = np.arange(0.0, end_s + 2 * self.settings.boot_s, 10.0)
            every_pod_requesting = dataclasses.replace(trace, usage_ratio=np.ones(len(trace)))
            self._requested = used_cores_series(every_pod_requesting, self._requested_times_s)
        times_s, requested = self._requested_times_s, self._requested
        first, last = np.searchsorted(
            times_s, (now_s, now_s + self.policy_settings.boot_s), side="right"
        )
        if first == 0 or first >= last:
            return 0.0
        return max(float(requested[first:last].max() - requested[first - 1]), 0.0)

    def _learned_headroom(self, sim: Simulation, now_s: float) -> float:
        """The learner fed the waits of the pods placed since the last round (placed within
        one `power_interval_s`: their placement time is taken as now); its headroom."""
        if self.learner is None:
            return 0.0
        waits = sim.waits_s
        for wait_s in waits[self._next_wait :]:
            self.learner.add_wait(now_s, wait_s)
        self._next_wait = len(waits)
        before = self.learner.last_change
        state = self.learner.update(now_s)
        if state.last_change != before:
            self.quantile_moves.append((now_s, state.last_change))
        self.headroom_state = state
        return state.learned_cores

    def node_views(self, sim: Simulation, now_s: float) -> list[NodeView]:
        """The nodes as the controller maps them: state, pods, predicted watts."""
        curves = self._predicted_curves(sim, now_s)
        cluster, running = sim.cluster, sim.running
        pods_by_node: list[list[PodInfo]] = [[] for _ in range(len(cluster))]
        for pod, node in zip(running.pod.tolist(), running.node.tolist(), strict=True):
            request = sim.requests[pod]
            pods_by_node[node].append(
                PodInfo(sim.trace.names[pod], request.cpu_m / 1000.0, request.memory_bytes)
            )
        share = self.settings.boot_power_share
        views = []
        for node, name in enumerate(cluster.names):
            row = curves.row_of(name)
            grid = curves.power_w_grid[row] if row >= 0 else None
            idle_w = float(grid[0]) if grid is not None else math.nan
            peak_w = float(grid[-1]) if grid is not None else math.nan
            step = (len(grid) - 1) // (CURVE_POINTS - 1) if grid is not None else 1
            views.append(
                NodeView(
                    name=name,
                    allocatable_cpu=float(cluster.cores[node]),
                    allocatable_memory_bytes=int(cluster.memory_bytes[node]),
                    state=_ANNOTATION[NodeState(self.state[node])],
                    state_since_s=float(self.since_s[node]),
                    managed=True,
                    idle_w=idle_w,
                    pods=(*self._daemon_pods, *pods_by_node[node]),
                    curve_w=tuple(grid[::step].tolist()) if grid is not None else (),
                    boot_energy_j=self.settings.boot_s * (idle_w + share * (peak_w - idle_w)),
                    g_per_kwh=self.g_per_kwh(name, now_s) if self.g_per_kwh else math.nan,
                    allocatable_pods=int(sim.ledger.allowed_pods[node]),
                )
            )
        return views

    def _predicted_curves(self, sim: Simulation, now_s: float) -> CurveTable:
        """Each node's P(u) from the bundle at its latest (lagged) telemetry, every few minutes."""
        if self._curves is not None and now_s - self._curves_at_s < CURVE_REFRESH_S:
            return self._curves
        sample = sim.history[0]
        telemetry = {}
        for i, name in enumerate(sim.cluster.names):
            values = {
                "cpu_util": float(sample.util[i]),
                "ambient_temp_c": float(round(sample.ambient_c[i])),
                "cpu1_temp_c": float(round(sample.cpu1_c[i])),
            }
            if sim.two_sockets[i]:
                values["cpu2_temp_c"] = float(round(sample.cpu2_c[i]))
            telemetry[name] = values
        self._curves = CurveBuilder().build(self.predictor, telemetry, self._curves)
        self._curves_at_s = now_s
        return self._curves

    def _apply(self, sim: Simulation, decisions: Decisions, now_s: float) -> None:
        index = {name: i for i, name in enumerate(sim.cluster.names)}
        for action in decisions.wake:
            self.decision_log.append((now_s, "wake", action.node, action.reason))
            self.wake(sim, index[action.node], now_s)
        for action in (*decisions.power_off, *decisions.drain):
            self.decision_log.append((now_s, "off", action.node, action.reason))
            self.power_off(sim, index[action.node], now_s)
        # Drains are instant here (the pods are evicted at once), so there is never one to
        # cancel: decisions.cancel_drain stays empty.
