"""What the node power controller decides, as a pure function of one snapshot of the cluster.

The controller (`controllers.node_power.controller`) and the energy simulation
(`bench.sim.power`) both call `decide`: the simulation runs this code, not a re-implementation.

Each round the caller passes what it sees now: the nodes (power state, pods, allocatable
resources, predicted idle watts and, when it has them, predicted watts along utilisation),
the pods pending for lack of a node, the recent arrival rate of requested CPU and its noise
(`ArrivalRateMeter.for_boot_time` measures them), and when each node was last seen
unneeded. `decide` answers:

- **wake**: off nodes to power on, when pods wait that fit on no node that is on or waking
  (cluster-autoscaler's "filter out schedulable" step: a pod that fits somewhere is not a
  reason to boot anything), or when the free CPU is below the headroom the arrival rate needs
  while a node boots. For waiting pods it wakes, one node at a time, the node whose predicted
  watts for the pods it would take are lowest per core it takes, boot energy included
  (spread over `wake_horizon_s`); for headroom, the node whose idle watts (plus boot) per
  free core are lowest. Then it drops any woken node the others can do without, so it never
  wakes more nodes than the demand needs. Before waking anything it takes drains back: an
  uncordon is free, a boot is not;
- **power off** and **drain**: nodes that have been unneeded for `unneeded_time_s`. A node is
  unneeded while the other nodes on would keep the headroom without it, plus `off_margin_sd`
  standard deviations of what arrives in a boot time (so a burst of arrivals restarts its
  clock, and the next few pods after a power-off do not wake a node again: the hysteresis
  between waking and powering off, in time and in cores), and it runs
  nothing but DaemonSet and mirror pods (then it is powered off at once) or, with
  `consolidate`, its requests are under `utilization_threshold` of its allocatable CPU and
  every pod on it may be evicted and fits on the nodes that stay on (then it is drained
  first, at most `max_drains_per_round` per round). The worst nodes go first: most idle watts
  per allocatable core. Powering off stops before the free capacity of the nodes left on
  falls below that margin over the headroom, before fewer than `min_on_nodes` are on, and
  before more than `max_off_fraction` of the managed nodes are off; a node powered on less
  than `cooldown_s` ago stays on (at most one power cycle per cool-down per node);
- **unneeded_since**: the bookkeeping for the next round.

Every choice among nodes above compares watts; with `rank_by` "grams" it compares the grams
of CO2 per hour those watts emit at each node's carbon intensity (`NodeView.g_per_kwh`), so
the dirtiest idle core goes off first and the cleanest wakes (the limits and the headroom
stay in cores). The callers read that intensity as the mean over the next
`carbon_horizon_s` (the zone's forecast), not the present hour's: a node powered off stays
off, and one woken stays on, for hours, so a node about to enter a dirty hour is the better
one to empty and one about to enter a clean hour the better one to wake.

Only nodes that are `managed` (opted in by the label, no kill switch, no cluster-autoscaler
scale-down-disabled annotation) are ever powered off or on. Every decision carries its reason
in words and the predicted watts it saves or costs, for the controller's log and metrics.

The policy knows nothing of Kubernetes objects, drivers or clocks: the caller maps those in
and out, which keeps this testable and identical in the controller and the simulation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from livedata.labels import POWER_DRAINING, POWER_OFF, POWER_ON, POWER_WAKING

# Requests are compared in cores; this absorbs float sums of millicores.
_EPS_CORES = 1e-9
RANK_BY_WATTS = "watts"
RANK_BY_GRAMS = "grams"
RANK_BY = (RANK_BY_WATTS, RANK_BY_GRAMS)


@dataclass(frozen=True)
class PodInfo:
    """A pod on a node, as the policy needs it."""

    name: str  # namespace/name
    cpu_cores: float  # requests, as kube-scheduler counts them
    memory_bytes: int = 0
    # DaemonSet and mirror pods go with their node: they neither keep it on nor move.
    daemon: bool = False
    # Why the pod may not be evicted (no controller, local storage, safe-to-evict "false",
    # a disruption budget with no room...), in words; None when it may.
    eviction_blocker: str | None = None


@dataclass(frozen=True)
class NodeView:
    """A node as the policy needs it."""

    name: str
    allocatable_cpu: float  # cores
    allocatable_memory_bytes: int
    state: str  # livedata.labels POWER_ON, POWER_DRAINING, POWER_OFF or POWER_WAKING
    state_since_s: float  # when it entered that state
    managed: bool  # opted in, no kill switch, not scale-down-disabled
    idle_w: float  # predicted power with no pods (from the bundle's model); NaN if unknown
    pods: tuple[PodInfo, ...] = ()
    ready: bool = True  # Kubernetes Ready condition (a waking node is on once Ready)
    unmanaged_reason: str = ""  # why not managed, in words
    # Predicted watts at evenly spaced CPU utilisations from 0 to 1 (the bundle's model, e.g.
    # 11 points), to price the pending demand on a node to wake; empty when only `idle_w` is
    # known (then running pods is priced at idle watts).
    curve_w: tuple[float, ...] = ()
    # Energy (joules) this node spends booting; NaN: `PolicySettings.boot_energy_j`.
    boot_energy_j: float = math.nan
    # Carbon intensity of the power the node draws (g CO2/kWh: its zone's, or its own
    # supply's), for `PolicySettings.rank_by` "grams": the mean the callers read over the next
    # `PolicySettings.carbon_horizon_s` (the present value when 0); NaN when unknown.
    g_per_kwh: float = math.nan
    # Pods the node admits (status.allocatable.pods: the kubelet's --max-pods), DaemonSet pods
    # included, as kube-scheduler's NodeResourcesFit counts them; None when not known.
    allocatable_pods: int | None = None

    @property
    def requested_cpu(self) -> float:
        return sum(pod.cpu_cores for pod in self.pods if not pod.daemon)

    @property
    def requested_memory_bytes(self) -> int:
        return sum(pod.memory_bytes for pod in self.pods if not pod.daemon)

    @property
    def daemon_cpu(self) -> float:
        return sum(pod.cpu_cores for pod in self.pods if pod.daemon)

    @property
    def daemon_memory_bytes(self) -> int:
        return sum(pod.memory_bytes for pod in self.pods if pod.daemon)

    @property
    def empty(self) -> bool:
        return all(pod.daemon for pod in self.pods)

    @property
    def idle_w_per_core(self) -> float:
        if not (self.allocatable_cpu > 0 and math.isfinite(self.idle_w)):
            return math.nan
        return self.idle_w / self.allocatable_cpu

    def predicted_w(self, requested_cores: float) -> float:
        """Predicted watts running `requested_cores` of pods (on its curve, else idle watts)."""
        curve = self.curve_w
        if len(curve) < 2 or not self.allocatable_cpu > 0:
            return self.idle_w
        position = min(max(requested_cores / self.allocatable_cpu, 0.0), 1.0) * (len(curve) - 1)
        left = min(int(position), len(curve) - 2)
        return curve[left] + (position - left) * (curve[left + 1] - curve[left])


@dataclass(frozen=True)
class PendingPod:
    """A pod waiting as unschedulable for lack of a node (for our scheduler)."""

    name: str
    cpu_cores: float
    memory_bytes: int = 0


@dataclass(frozen=True)
class PolicySettings:
    """The knobs; defaults follow cluster-autoscaler's where it has one."""

    # cluster-autoscaler --scale-down-unneeded-time (10 min).
    unneeded_time_s: float = 600.0
    # cluster-autoscaler --scale-down-utilization-threshold (0.5): below it a node with
    # movable pods is a consolidation candidate.
    utilization_threshold: float = 0.5
    # Drain nodes that still run movable pods (consolidation), not only empty ones.
    consolidate: bool = True
    # A node powered on (or off) less than this long ago is not powered off again: at most
    # one cycle per cool-down per node.
    cooldown_s: float = 1800.0
    # Never fewer on-nodes than this, and never more than this share of managed nodes off.
    min_on_nodes: int = 1
    max_off_fraction: float = 1.0
    # Free CPU to keep on the nodes that are on: at least `min_headroom_cores`, and the
    # requested CPU that arrives at the recent rate while a node boots (`boot_s`, scaled by
    # `headroom_factor`).
    min_headroom_cores: float = 0.0
    boot_s: float = 300.0
    headroom_factor: float = 1.0
    # A target for pods' p99 wait (creation to scheduled), seconds; 0: none. With one, the
    # callers learn a headroom from the demand growth within a boot time and the waits they
    # observe (`headroom.HeadroomLearner`) and pass it to `decide`: the larger of it, the
    # rate's and `min_headroom_cores` applies.
    target_wait_p99_s: float = 0.0
    # A node goes off only while the others keep the headroom plus this many standard
    # deviations of what arrives in a boot time (`off_headroom_cores`): the hysteresis between
    # waking and powering off. 0: none.
    off_margin_sd: float = 2.0
    # Energy a node spends booting (joules) when its NodeView does not say, spread over
    # `wake_horizon_s` when comparing the predicted watts of candidates to wake.
    boot_energy_j: float = 0.0
    wake_horizon_s: float = 3600.0
    # Nodes with movable pods drained per round (cluster-autoscaler --max-drain-parallelism 1):
    # evicting pods from many nodes at once disrupts more than it saves.
    max_drains_per_round: int = 1
    # What the choice among nodes minimises: "watts", the predicted power; or "grams", the
    # predicted power times each node's carbon intensity (CO2 per hour). With "grams" a node
    # whose intensity is unknown counts at the mean of the nodes whose intensity is known
    # (neutral, as the extender's Carbon score treats it); with none known it is "watts".
    rank_by: str = "watts"
    # How far ahead the callers' `NodeView.g_per_kwh` looks: the zone's mean intensity over the
    # next this many seconds (`livedata.carbon_source.node_g_per_kwh`), 0 the present value.
    # The policy only names it in its reasons; the callers read the intensities with it (the
    # controller's `CarbonSettings.horizon_s`, the same --carbon-horizon, 4 h by default).
    carbon_horizon_s: float = 4 * 3600.0

    def __post_init__(self) -> None:
        if self.rank_by not in RANK_BY:
            raise ValueError(f"rank_by must be one of {', '.join(RANK_BY)}, got {self.rank_by!r}")
        if not (self.carbon_horizon_s >= 0 and math.isfinite(self.carbon_horizon_s)):
            raise ValueError(f"carbon_horizon_s must be >= 0, got {self.carbon_horizon_s!r}")
        for name in (
            "unneeded_time_s",
            "cooldown_s",
            "min_headroom_cores",
            "boot_s",
            "target_wait_p99_s",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.utilization_threshold <= 1:
            raise ValueError(
                f"utilization_threshold must be 0..1, got {self.utilization_threshold}"
            )
        if not 0 <= self.max_off_fraction <= 1:
            raise ValueError(f"max_off_fraction must be 0..1, got {self.max_off_fraction}")
        if self.min_on_nodes < 0:
            raise ValueError(f"min_on_nodes must be >= 0, got {self.min_on_nodes}")
        if not math.isfinite(self.target_wait_p99_s):
            raise ValueError(f"target_wait_p99_s must be finite, got {self.target_wait_p99_s!r}")
        if not self.wake_horizon_s > 0:
            raise ValueError(f"wake_horizon_s must be > 0, got {self.wake_horizon_s}")
        if not self.off_margin_sd >= 0:
            raise ValueError(f"off_margin_sd must be >= 0, got {self.off_margin_sd!r}")
        if not (self.headroom_factor >= 0 and self.boot_energy_j >= 0):
            raise ValueError(
                f"headroom_factor and boot_energy_j must be >= 0, got {self.headroom_factor!r} "
                f"and {self.boot_energy_j!r}"
            )
        if self.max_drains_per_round < 0:
            raise ValueError(f"max_drains_per_round must be >= 0, got {self.max_drains_per_round}")


@dataclass(frozen=True)
class Action:
    """One decision about one node: what, why, and the predicted watts it saves (or costs)."""

    node: str
    reason: str
    watts: float = math.nan  # predicted idle watts saved (off) or drawn (wake)
    # Ranking by grams: the node's intensity the choice used (g CO2/kWh over the next
    # `PolicySettings.carbon_horizon_s`), for the logs; NaN otherwise.
    g_per_kwh: float = math.nan


@dataclass(frozen=True)
class Decisions:
    wake: tuple[Action, ...] = ()
    cancel_drain: tuple[Action, ...] = ()
    power_off: tuple[Action, ...] = ()  # empty nodes: off now
    drain: tuple[Action, ...] = ()  # nodes with movable pods: cordon, evict, then off
    unneeded_since: Mapping[str, float] = field(default_factory=dict)
    headroom_cores: float = 0.0  # the target this round: free CPU below it wakes a node
    off_headroom_cores: float = 0.0  # free CPU the nodes left on keep before another goes off
    free_cores: float = 0.0  # free CPU on the nodes on (and waking) before the decisions
    # Pending pods that no node, on or off, can take (too big for every node): waking
    # anything would not help them. Their names, for the controller's log.
    unplaceable: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.wake or self.cancel_drain or self.power_off or self.drain)


@dataclass(frozen=True)
class ArrivalRate:
    """The recent arrival of requested CPU, as `ArrivalRateMeter.estimate` measures it."""

    # The rate the headroom covers (cores per second).
    cores_per_s: float
    # Sum of squared requests per second over the meter's long window: arrivals are a compound
    # Poisson process, so the requests that arrive in `t` seconds vary by sqrt(this x t) cores.
    square_cores_per_s: float = 0.0

    def sd_cores(self, over_s: float) -> float:
        """Standard deviation of the requested CPU that arrives over `over_s` seconds."""
        square = self.square_cores_per_s
        return math.sqrt(square * over_s) if math.isfinite(square) and square > 0 else 0.0


def headroom_cores(
    arrival_cores_per_s: float, settings: PolicySettings, learned_cores: float = 0.0
) -> float:
    """Free CPU to keep on: what arrives at the recent rate while a node boots, the headroom
    learned for the wait target (`headroom.HeadroomLearner`), or the floor: the largest."""
    rate = max(arrival_cores_per_s, 0.0) if math.isfinite(arrival_cores_per_s) else 0.0
    learned = max(learned_cores, 0.0) if math.isfinite(learned_cores) else 0.0
    return max(
        settings.min_headroom_cores, learned, rate * settings.boot_s * settings.headroom_factor
    )


def off_headroom_cores(
    arrival: ArrivalRate, settings: PolicySettings, learned_cores: float = 0.0
) -> float:
    """Free CPU the nodes left on must keep before one more goes off: the wake headroom plus
    `off_margin_sd` standard deviations of what arrives while a node boots.

    The gap between the two is the hysteresis of a thermostat: with none, a node goes off as
    soon as the others keep the headroom exactly, and the next few pods push the free CPU back
    under it and wake a node (measured in `bench.energy_sim`: a quarter of the power-offs were
    woken again within ten minutes, before their boot energy was paid back).
    """
    boot_s = settings.boot_s * settings.headroom_factor
    return headroom_cores(arrival.cores_per_s, settings, learned_cores) + settings.off_margin_sd * (
        arrival.sd_cores(boot_s)
    )


class ArrivalRateMeter:
    """The recent arrival rate of requested CPU (cores per second), for `decide`.

    The rate over each of `windows_s`, the highest one: a short window sees a burst at once, a
    long one keeps the headroom through the lulls inside a busy hour. With it, the noise of
    arrivals over the longest window (`ArrivalRate.square_cores_per_s`), for the margin between
    waking and powering off. Memory is bounded by what arrives within the longest window.
    """

    # The shortest window worth having: a minute of arrivals is a handful of pods.
    MIN_WINDOW_S = 60.0
    # The long window, in boot times: how long the headroom outlives a burst.
    LONG_WINDOW_BOOTS = 6

    @classmethod
    def for_boot_time(cls, boot_s: float) -> ArrivalRateMeter:
        """Windows of one boot time and of `LONG_WINDOW_BOOTS` boot times (at least a minute).

        The headroom covers what arrives while a node boots, so the rate that predicts it is
        the one over the last boot time: a shorter window multiplies a minute's noise by
        boot time / window and wakes nodes for bursts that are over before they boot (measured
        in `bench.energy_sim`: windows of 60 s and 600 s booted nodes 154 times a day and kept
        them on idle; with 300 s boots, 300 s and 1800 s booted them 114 times). A one-minute
        window that counts only arrivals its noise cannot explain (a 3-sigma test) saw the
        bursts sooner but placed no more pods within 30 s: what arrives in a burst's first
        minutes waits for a boot either way.
        """
        short_s = max(boot_s, cls.MIN_WINDOW_S)
        return cls((short_s, cls.LONG_WINDOW_BOOTS * short_s))

    def __init__(self, windows_s: Sequence[float] = (60.0, 600.0)) -> None:
        if not windows_s or not all(w > 0 for w in windows_s):
            raise ValueError(f"windows_s must be positive seconds, got {windows_s!r}")
        self.windows_s = tuple(sorted(float(w) for w in windows_s))
        self._arrivals: deque[tuple[float, float]] = deque()  # (time_s, cores)

    def add(self, time_s: float, cores: float) -> None:
        """A pod asking for `cores` of CPU arrived (was created) at `time_s`.

        Arrivals may come a little out of time order (a watch sees pods late); each window
        counts only what falls inside it.
        """
        if cores > 0 and math.isfinite(cores) and math.isfinite(time_s):
            self._arrivals.append((time_s, cores))

    def rate(self, now_s: float) -> float:
        """Cores per second: the highest mean rate over the windows ending at `now_s`."""
        return self.estimate(now_s).cores_per_s

    def estimate(self, now_s: float) -> ArrivalRate:
        """The highest mean rate over the windows ending at `now_s`, and the noise of arrivals
        over the longest one."""
        longest = self.windows_s[-1]
        while self._arrivals and self._arrivals[0][0] <= now_s - longest:
            self._arrivals.popleft()
        inside = [(t, c) for t, c in self._arrivals if now_s - longest < t <= now_s]
        rate = max(sum(c for t, c in inside if now_s - w < t) / w for w in self.windows_s)
        return ArrivalRate(rate, sum(c * c for _, c in inside) / longest)


def decide(
    nodes: Sequence[NodeView],
    pending: Sequence[PendingPod],
    arrival: ArrivalRate | float,
    unneeded_since: Mapping[str, float],
    now_s: float,
    settings: PolicySettings,
    learned_headroom_cores: float = 0.0,
) -> Decisions:
    """The round's decisions; see the module docstring. `arrival` is the meter's estimate, or
    a bare rate in cores per second (no noise: no margin between waking and powering off).
    `learned_headroom_cores`: the headroom the wait target asks for (`headroom.HeadroomLearner`,
    0 without a target)."""
    if not isinstance(arrival, ArrivalRate):
        arrival = ArrivalRate(arrival)
    if settings.rank_by == RANK_BY_GRAMS:
        nodes = _with_neutral_intensity(nodes)
    target = headroom_cores(arrival.cores_per_s, settings, learned_headroom_cores)
    off_target = off_headroom_cores(arrival, settings, learned_headroom_cores)
    serving = [n for n in nodes if n.state in (POWER_ON, POWER_WAKING)]
    free = sum(_free_cpu(n) for n in serving)
    plan = _plan_wake(nodes, pending, target, settings)
    if plan.wake or plan.cancel:
        # Demand is waiting: nothing goes off this round, and nobody is unneeded.
        return Decisions(
            wake=plan.wake,
            cancel_drain=plan.cancel,
            headroom_cores=target,
            off_headroom_cores=off_target,
            free_cores=free,
            unplaceable=plan.unplaceable,
        )
    since = _unneeded_since(nodes, unneeded_since, off_target, now_s, settings)
    power_off, drain = _plan_off(nodes, since, off_target, now_s, settings)
    return Decisions(
        power_off=power_off,
        drain=drain,
        unneeded_since=since,
        headroom_cores=target,
        off_headroom_cores=off_target,
        free_cores=free,
        unplaceable=plan.unplaceable,
    )


# ---- room on nodes: first-fit decreasing on CPU and memory ---------------------------------


@dataclass
class _Room:
    """Free CPU, memory and pod slots of one node, as pods are packed onto it."""

    node: NodeView
    cpu: float
    memory: int
    pod_slots: int
    placed_cores: float = 0.0
    placed: list[PendingPod] = field(default_factory=list)

    @classmethod
    def of(cls, node: NodeView) -> _Room:
        return cls(node, _free_cpu(node), _free_memory(node), _free_pod_slots(node))

    def fits(self, pod: PendingPod) -> bool:
        return (
            pod.cpu_cores <= self.cpu + _EPS_CORES
            and pod.memory_bytes <= self.memory
            and self.pod_slots > 0
        )

    def take(self, pod: PendingPod) -> None:
        self.cpu -= pod.cpu_cores
        self.memory -= pod.memory_bytes
        self.pod_slots -= 1
        self.placed_cores += pod.cpu_cores
        self.placed.append(pod)


def _pack(pods: Iterable[PendingPod], rooms: Sequence[_Room]) -> list[PendingPod]:
    """First-fit `pods` (biggest first) into `rooms` (changed in place); the pods left over."""
    left = []
    for pod in pods:
        for room in rooms:
            if room.fits(pod):
                room.take(pod)
                break
        else:
            left.append(pod)
    return left


def _biggest_first(pods: Iterable[PendingPod]) -> list[PendingPod]:
    return sorted(pods, key=lambda p: (-p.cpu_cores, -p.memory_bytes, p.name))


def left_over(pods: Iterable[PendingPod], nodes: Iterable[NodeView]) -> list[PendingPod]:
    """The pods that do not fit on `nodes` as they are (first fit, biggest first, on CPU,
    memory and pod slots)."""
    return _pack(_biggest_first(pods), [_Room.of(n) for n in nodes])


# ---- waking -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _WakePlan:
    wake: tuple[Action, ...] = ()
    cancel: tuple[Action, ...] = ()
    unplaceable: tuple[str, ...] = ()


def _plan_wake(
    nodes: Sequence[NodeView],
    pending: Sequence[PendingPod],
    target: float,
    settings: PolicySettings,
) -> _WakePlan:
    # 1. Pods that fit on a node that is on, or waking (it will be soon), need no boot.
    waiting = _biggest_first(p for p in pending if p.cpu_cores > 0 or p.memory_bytes > 0)
    serving = [_Room.of(n) for n in nodes if n.state in (POWER_ON, POWER_WAKING)]
    waiting = _pack(waiting, serving)
    base_free = sum(room.cpu for room in serving)  # free CPU that serves without a boot
    deficit = max(target - base_free, 0.0)
    off = [n for n in nodes if n.state == POWER_OFF and n.managed and n.allocatable_cpu > 0]
    unplaceable = tuple(p.name for p in waiting if not any(_could_ever_fit(p, n) for n in nodes))
    waiting = [p for p in waiting if p.name not in unplaceable]
    if not waiting and deficit <= _EPS_CORES:
        return _WakePlan(unplaceable=unplaceable)

    # 2. Take drains back, least idle watts per core first: an uncordon costs nothing.
    cancel: list[Action] = []
    draining = sorted(
        (n for n in nodes if n.state == POWER_DRAINING), key=lambda n: _per_core_key(n, settings)
    )
    for node in draining:
        if not waiting and deficit <= _EPS_CORES:
            break
        room = _Room.of(node)
        still_waiting = _pack(waiting, [room])
        if len(still_waiting) == len(waiting) and deficit <= _EPS_CORES:
            continue  # none of the waiting pods fits here
        why = (
            f"{len(waiting) - len(still_waiting)} waiting pod(s) fit here"
            if len(still_waiting) < len(waiting)
            else f"free CPU below the {target:.1f}-core headroom"
        )
        cancel.append(Action(node.name, f"drain cancelled: {why}"))
        waiting = still_waiting
        base_free += room.cpu
        deficit = max(deficit - room.cpu, 0.0)
    if not waiting and deficit <= _EPS_CORES:
        return _WakePlan(cancel=tuple(cancel), unplaceable=unplaceable)

    # 3. Wake off nodes: for the waiting pods, the fewest predicted watts per core they take;
    # for the headroom left short, the cheapest idle watts per free core.
    woken: list[_Room] = []
    candidates = list(off)
    for_pods = list(waiting)
    while for_pods and candidates:
        best = _cheapest_for_pods(candidates, for_pods, settings)
        if best is None:
            break  # what still waits fits on no off node (memory, size): waking cannot help
        room, for_pods = best
        woken.append(room)
        candidates.remove(room.node)
    deficit = max(deficit - sum(room.cpu for room in woken), 0.0)
    for node in sorted(candidates, key=lambda n: (_idle_per_free_core(n, settings), n.name)):
        if deficit <= _EPS_CORES:
            break
        room = _Room.of(node)
        if room.cpu <= _EPS_CORES:
            continue
        woken.append(room)
        deficit = max(deficit - room.cpu, 0.0)

    # 4. Never more than the demand needs: drop any woken node the others can do without.
    woken = _without_spare_nodes(woken, waiting, base_free, target, settings)
    wake = tuple(_wake_action(room, target, settings) for room in woken)
    return _WakePlan(wake=wake, cancel=tuple(cancel), unplaceable=unplaceable)


def _cheapest_for_pods(
    candidates: Sequence[NodeView], pods: Sequence[PendingPod], settings: PolicySettings
) -> tuple[_Room, list[PendingPod]] | None:
    """The off node whose predicted watts per core of the pods it would take are lowest."""
    best: tuple[float, str, _Room, list[PendingPod]] | None = None
    for node in candidates:
        room = _Room.of(node)
        left = _pack(pods, [room])
        if room.placed_cores <= _EPS_CORES and not room.placed:
            continue
        watts = _ranked(
            node, node.predicted_w(room.placed_cores) + _boot_w(node, settings), settings
        )
        per_core = watts / max(room.placed_cores, 1e-3) if math.isfinite(watts) else math.inf
        key = (per_core, node.name)
        if best is None or key < best[:2]:
            best = (per_core, node.name, room, left)
    return None if best is None else (best[2], best[3])


def _without_spare_nodes(
    woken: list[_Room],
    waiting: Sequence[PendingPod],
    base_free: float,
    target: float,
    settings: PolicySettings,
) -> list[_Room]:
    """`woken` less the nodes (dearest first) the others can do without.

    A node goes when the rest still take as many of the waiting pods and keep as much of the
    headroom as all of them would; the rooms come back re-packed (which pods each takes).
    """

    def coverage(nodes: Sequence[NodeView]) -> tuple[int, float, list[_Room]]:
        rooms = [_Room.of(n) for n in nodes]
        left = _pack(waiting, rooms)
        return len(waiting) - len(left), base_free + sum(r.cpu for r in rooms), rooms

    kept = [room.node for room in woken]
    all_served, all_free, rooms = coverage(kept)
    free_needed = min(target, all_free)
    for node in sorted(
        kept, key=lambda n: (_ranked(n, _wake_w(n, settings), settings), n.name), reverse=True
    ):
        trial = [n for n in kept if n is not node]
        served, free, trial_rooms = coverage(trial)
        if served >= all_served and free >= free_needed - _EPS_CORES:
            kept, rooms = trial, trial_rooms
    return rooms


def _wake_action(room: _Room, target: float, settings: PolicySettings) -> Action:
    node = room.node
    if room.placed:
        why = (
            f"{len(room.placed)} pending pod(s) ({room.placed_cores:.2f} cores) fit on no node "
            f"that is on; predicted {node.predicted_w(room.placed_cores):.0f} W with them"
        )
    else:
        why = f"free CPU below the {target:.1f}-core headroom; {node.idle_w:.0f} W idle"
    boot_w = _boot_w(node, settings)
    if boot_w > 0:
        why += f", boot {boot_w:.0f} W over {settings.wake_horizon_s:.0f} s"
    why += _intensity_note(node, settings)
    watts = node.predicted_w(room.placed_cores) + boot_w
    return Action(node.name, why, watts, _ranked_intensity(node, settings))


def _could_ever_fit(pod: PendingPod, node: NodeView) -> bool:
    """Whether the pod fits on the node with nothing on it but its DaemonSet pods."""
    daemon_pods = sum(1 for p in node.pods if p.daemon)
    return (
        pod.cpu_cores <= node.allocatable_cpu - node.daemon_cpu + _EPS_CORES
        and pod.memory_bytes <= node.allocatable_memory_bytes - node.daemon_memory_bytes
        and (node.allocatable_pods is None or daemon_pods < node.allocatable_pods)
    )


def _boot_w(node: NodeView, settings: PolicySettings) -> float:
    """Boot energy spread over the wake horizon, in watts."""
    energy_j = node.boot_energy_j if math.isfinite(node.boot_energy_j) else settings.boot_energy_j
    return max(energy_j, 0.0) / settings.wake_horizon_s


def _wake_w(node: NodeView, settings: PolicySettings) -> float:
    watts = node.idle_w + _boot_w(node, settings)
    return watts if math.isfinite(watts) else math.inf


def _idle_per_free_core(node: NodeView, settings: PolicySettings) -> float:
    free = _free_cpu(node)
    return _ranked(node, _wake_w(node, settings), settings) / free if free > 0 else math.inf


def _per_core_key(node: NodeView, settings: PolicySettings) -> tuple[float, str]:
    per_core = _ranked(node, node.idle_w_per_core, settings)
    return (per_core if math.isfinite(per_core) else math.inf, node.name)


def _ranked(node: NodeView, watts: float, settings: PolicySettings) -> float:
    """What the choices among nodes compare: `watts`, or with `rank_by` "grams" the grams of
    CO2 per hour they emit at the node's intensity."""
    if settings.rank_by == RANK_BY_GRAMS and math.isfinite(node.g_per_kwh):
        return watts * node.g_per_kwh / 1000.0
    return watts


def _with_neutral_intensity(nodes: Sequence[NodeView]) -> list[NodeView]:
    """`nodes`, those without a known intensity given the mean of those with one: unknown
    intensity neither wins nor loses a choice (all unknown: every node is ranked by watts)."""
    known = [n.g_per_kwh for n in nodes if math.isfinite(n.g_per_kwh) and n.g_per_kwh >= 0]
    if not known or len(known) == len(nodes):
        return list(nodes)
    mean = sum(known) / len(known)
    return [n if math.isfinite(n.g_per_kwh) else replace(n, g_per_kwh=mean) for n in nodes]


def _intensity_note(node: NodeView, settings: PolicySettings) -> str:
    if settings.rank_by != RANK_BY_GRAMS or not math.isfinite(node.g_per_kwh):
        return ""
    return f", {node.g_per_kwh:.0f} g CO2/kWh {intensity_window(settings.carbon_horizon_s)}"


def _ranked_intensity(node: NodeView, settings: PolicySettings) -> float:
    return node.g_per_kwh if settings.rank_by == RANK_BY_GRAMS else math.nan


def intensity_window(horizon_s: float) -> str:
    """The window an intensity describes, in the words reasons and logs use."""
    return f"over the next {horizon_s / 3600.0:g} h" if horizon_s > 0 else "now"


# ---- powering off -------------------------------------------------------------------------


def _unneeded_since(
    nodes: Sequence[NodeView],
    previous: Mapping[str, float],
    target: float,
    now_s: float,
    settings: PolicySettings,
) -> dict[str, float]:
    """Since when each unneeded node has been unneeded (its clock restarts when it is needed).

    Unneeded includes the headroom: the other nodes on could take the node's pods and still
    keep the headroom this round. So a node goes off only after the headroom has held without
    it for the whole `unneeded_time_s`, like the scale-down stabilization window of
    Kubernetes' HorizontalPodAutoscaler: a burst of arrivals restarts the clock, and a node
    woken for a burst is not powered off again the minute the burst's rate dips.
    """
    on = [n for n in nodes if n.state == POWER_ON]
    free_on = sum(_free_cpu(n) for n in on)
    since = {}
    for node in on:
        if not node.managed or _unneeded(node, settings) is None:
            continue
        free_without = free_on - _free_cpu(node) - node.requested_cpu
        if free_without + _EPS_CORES < target:
            continue
        since[node.name] = previous.get(node.name, now_s)
    return since


def _unneeded(node: NodeView, settings: PolicySettings) -> str | None:
    """Why the node is unneeded (in words), or None when it is needed."""
    if node.empty:
        return "runs only DaemonSet/mirror pods"
    if not settings.consolidate or node.allocatable_cpu <= 0:
        return None
    share = node.requested_cpu / node.allocatable_cpu
    if share >= settings.utilization_threshold:
        return None
    if any(p.eviction_blocker for p in node.pods if not p.daemon):
        return None
    return f"requests {share:.0%} of its CPU (< {settings.utilization_threshold:.0%})"


def _plan_off(
    nodes: Sequence[NodeView],
    since: Mapping[str, float],
    target: float,
    now_s: float,
    settings: PolicySettings,
) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    on = [n for n in nodes if n.state == POWER_ON]
    managed = [n for n in nodes if n.managed]
    off_count = sum(1 for n in managed if n.state in (POWER_OFF, POWER_DRAINING))
    max_off = math.floor(settings.max_off_fraction * len(managed) + 1e-9)
    candidates = [
        n
        for n in on
        if n.name in since
        and now_s - since[n.name] >= settings.unneeded_time_s
        and now_s - n.state_since_s >= settings.cooldown_s
    ]

    # Worst first: most idle watts (or grams per hour) per core (unknown idle power last).
    def worst_first(node: NodeView) -> tuple[float, str]:
        per_core = _ranked(node, node.idle_w_per_core, settings)
        return (-per_core if math.isfinite(per_core) else math.inf, node.name)

    candidates.sort(key=worst_first)
    staying = {n.name: n for n in on}
    power_off: list[Action] = []
    drain: list[Action] = []
    for node in candidates:
        if len(staying) - 1 < settings.min_on_nodes or off_count + 1 > max_off:
            break
        moving = [p for p in node.pods if not p.daemon]
        if moving and len(drain) >= settings.max_drains_per_round:
            continue
        others = [n for name, n in staying.items() if name != node.name]
        free_after = sum(_free_cpu(n) for n in others)
        if free_after - sum(p.cpu_cores for p in moving) < target:
            continue  # the headroom would go: keep this one on
        if moving and not _fits_elsewhere(moving, others):
            continue
        saving = node.idle_w
        if moving:
            reason = (
                f"{_unneeded(node, settings)} for {now_s - since[node.name]:.0f} s; its "
                f"{len(moving)} pod(s) fit elsewhere; {node.idle_w_per_core:.1f} W idle per core"
                f"{_intensity_note(node, settings)}"
            )
            drain.append(Action(node.name, reason, saving, _ranked_intensity(node, settings)))
            # What moves takes room on the others: account for it before the next candidate.
            staying = _with_pods_placed(others, moving)
        else:
            reason = (
                f"empty for {now_s - since[node.name]:.0f} s; "
                f"{node.idle_w_per_core:.1f} W idle per core{_intensity_note(node, settings)}"
            )
            power_off.append(Action(node.name, reason, saving, _ranked_intensity(node, settings)))
            del staying[node.name]
        off_count += 1
    return tuple(power_off), tuple(drain)


def _free_cpu(node: NodeView) -> float:
    return max(node.allocatable_cpu - node.requested_cpu - node.daemon_cpu, 0.0)


def _free_memory(node: NodeView) -> int:
    return max(
        node.allocatable_memory_bytes - node.requested_memory_bytes - node.daemon_memory_bytes, 0
    )


# Pod slots of a node whose pod limit is not known: more than any node admits.
_UNLIMITED_POD_SLOTS = 1 << 30


def _free_pod_slots(node: NodeView) -> int:
    """More pods the node admits (its pod limit less every pod on it, DaemonSet ones too)."""
    if node.allocatable_pods is None:
        return _UNLIMITED_POD_SLOTS
    return max(node.allocatable_pods - len(node.pods), 0)


def _fits_elsewhere(pods: Sequence[PodInfo], others: Sequence[NodeView]) -> bool:
    """Whether every pod fits on `others` (first-fit decreasing on CPU and memory, within
    each node's pod limit)."""
    return not left_over(_as_pending(pods), others)


def _with_pods_placed(others: Sequence[NodeView], pods: Sequence[PodInfo]) -> dict[str, NodeView]:
    """`others` with `pods` placed first-fit decreasing (as `_fits_elsewhere` found room)."""
    by_name = {p.name: p for p in pods}
    rooms = [_Room.of(n) for n in others]
    _pack(_biggest_first(_as_pending(pods)), rooms)
    return {
        r.node.name: replace(r.node, pods=(*r.node.pods, *(by_name[p.name] for p in r.placed)))
        for r in rooms
    }


def _as_pending(pods: Iterable[PodInfo]) -> list[PendingPod]:
    return [PendingPod(p.name, p.cpu_cores, p.memory_bytes) for p in pods]
