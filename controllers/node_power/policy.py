"""What the node power controller decides, as a pure function of one snapshot of the cluster.

The controller (`controllers.node_power.controller`) and the energy simulation
(`bench.sim`) both call `decide`: the simulation runs this code, not a re-implementation.

Each round the caller passes what it sees now: the nodes (power state, pods, allocatable
resources, predicted idle watts), the pods pending for lack of a node, the recent arrival
rate of requested CPU, and when each node was last seen unneeded. `decide` answers:

- **wake**: off nodes to power on, when pods wait as unschedulable or the free capacity is
  below the headroom the arrival rate needs while a node boots. It picks the nodes whose
  predicted watts for that demand are lowest, boot energy included, and never wakes more than
  the demand needs (capacity already waking counts). Before waking anything it cancels
  drains: an uncordon is free, a boot is not;
- **power off** and **drain**: nodes that have been unneeded for `unneeded_time_s`. A node is
  unneeded when it runs nothing but DaemonSet and mirror pods (then it is powered off at
  once), or, with `consolidate`, when its requests are under `utilization_threshold` of its
  allocatable CPU and every pod on it may be evicted and fits on the nodes that stay on
  (then it is drained first). The worst nodes go first: most idle watts per allocatable
  core. Powering off stops before the free capacity of the nodes left on falls below the
  headroom, before fewer than `min_on_nodes` are on, and before more than `max_off_fraction`
  of the managed nodes are off; a node powered on less than `cooldown_s` ago stays on;
- **unneeded_since**: the bookkeeping for the next round.

Only nodes that are `managed` (opted in by the label, no kill switch, no cluster-autoscaler
scale-down-disabled annotation) are ever powered off or on. Every decision carries its reason
in words and the predicted watts it saves or costs, for the controller's log and metrics.

The policy knows nothing of Kubernetes objects, drivers or clocks: the caller maps those in
and out, which keeps this testable and identical in the controller and the simulation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from livedata.labels import POWER_DRAINING, POWER_OFF, POWER_ON, POWER_WAKING


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
    def empty(self) -> bool:
        return all(pod.daemon for pod in self.pods)

    @property
    def idle_w_per_core(self) -> float:
        if not (self.allocatable_cpu > 0 and math.isfinite(self.idle_w)):
            return math.nan
        return self.idle_w / self.allocatable_cpu


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
    # Free CPU to keep on the nodes that stay on: at least `min_headroom_cores`, and the
    # requested CPU that arrives at the recent rate while a node boots (`boot_s`, scaled by
    # `headroom_factor`).
    min_headroom_cores: float = 0.0
    boot_s: float = 300.0
    headroom_factor: float = 1.0
    # Energy a node spends booting (joules), spread over `wake_horizon_s` when comparing the
    # predicted watts of candidates to wake.
    boot_energy_j: float = 0.0
    wake_horizon_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("unneeded_time_s", "cooldown_s", "min_headroom_cores", "boot_s"):
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
        if not self.wake_horizon_s > 0:
            raise ValueError(f"wake_horizon_s must be > 0, got {self.wake_horizon_s}")


@dataclass(frozen=True)
class Action:
    """One decision about one node: what, why, and the predicted watts it saves (or costs)."""

    node: str
    reason: str
    watts: float = math.nan  # predicted idle watts saved (off) or drawn (wake)


@dataclass(frozen=True)
class Decisions:
    wake: tuple[Action, ...] = ()
    cancel_drain: tuple[Action, ...] = ()
    power_off: tuple[Action, ...] = ()  # empty nodes: off now
    drain: tuple[Action, ...] = ()  # nodes with movable pods: cordon, evict, then off
    unneeded_since: Mapping[str, float] = field(default_factory=dict)
    headroom_cores: float = 0.0  # the target this round
    free_cores: float = 0.0  # free CPU on the nodes on (and waking) before the decisions

    @property
    def empty(self) -> bool:
        return not (self.wake or self.cancel_drain or self.power_off or self.drain)


def headroom_cores(arrival_cores_per_s: float, settings: PolicySettings) -> float:
    """Free CPU to keep on: what arrives at the recent rate while a node boots, or the floor."""
    rate = max(arrival_cores_per_s, 0.0) if math.isfinite(arrival_cores_per_s) else 0.0
    return max(settings.min_headroom_cores, rate * settings.boot_s * settings.headroom_factor)


def decide(
    nodes: Sequence[NodeView],
    pending: Sequence[PendingPod],
    arrival_cores_per_s: float,
    unneeded_since: Mapping[str, float],
    now_s: float,
    settings: PolicySettings,
) -> Decisions:
    """The round's decisions; see the module docstring."""
    target = headroom_cores(arrival_cores_per_s, settings)
    serving = [n for n in nodes if n.state in (POWER_ON, POWER_WAKING)]
    free = sum(_free_cpu(n) for n in serving)
    wake, cancel = _plan_wake(nodes, pending, target, free, settings)
    if wake or cancel:
        # Demand is waiting: nothing goes off this round, and nobody is unneeded.
        return Decisions(wake=wake, cancel_drain=cancel, headroom_cores=target, free_cores=free)
    since = _unneeded_since(nodes, unneeded_since, now_s, settings)
    power_off, drain = _plan_off(nodes, since, target, now_s, settings)
    return Decisions(
        power_off=power_off,
        drain=drain,
        unneeded_since=since,
        headroom_cores=target,
        free_cores=free,
    )


# ---- waking -------------------------------------------------------------------------------


def _plan_wake(
    nodes: Sequence[NodeView],
    pending: Sequence[PendingPod],
    target: float,
    free: float,
    settings: PolicySettings,
) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    # What must find room: the pending pods, biggest first (first-fit decreasing), plus the
    # headroom deficit as one more "pod" of free CPU.
    demand = sorted((p.cpu_cores for p in pending if p.cpu_cores > 0), reverse=True)
    deficit = max(target - free, 0.0)
    if not demand and deficit <= 1e-9:
        return (), ()
    cancel: list[Action] = []
    capacity: list[float] = []  # free CPU of what will serve: draining nodes taken back first
    for node in nodes:
        if node.state == POWER_DRAINING:
            cancel.append(Action(node.name, "pods are waiting: the drain is cancelled"))
            capacity.append(_free_cpu(node))
    demand = _unplaced(demand, capacity)
    deficit = max(deficit - sum(capacity), 0.0)
    if not demand and deficit <= 1e-9:
        return (), tuple(cancel)
    wake: list[Action] = []
    candidates = sorted(
        (n for n in nodes if n.state == POWER_OFF and n.managed and n.allocatable_cpu > 0),
        key=lambda n: (_wake_w_per_core(n, settings), n.name),
    )
    for node in candidates:
        if not demand and deficit <= 1e-9:
            break
        room = node.allocatable_cpu - node.daemon_cpu
        fits_one = any(cores <= room for cores in demand)
        if demand and not fits_one and deficit <= 1e-9:
            continue  # too small for every waiting pod: another node must do
        why = (
            f"{len(demand)} pod(s) waiting ({sum(demand):.2f} cores)"
            if demand
            else f"free CPU {free:.1f} cores below the {target:.1f}-core headroom"
        )
        wake.append(Action(node.name, why, _wake_w(node, settings)))
        capacity = [room]
        demand = _unplaced(demand, capacity)
        deficit = max(deficit - capacity[0], 0.0)
    return tuple(wake), tuple(cancel)


def _unplaced(demand: list[float], capacity: list[float]) -> list[float]:
    """First-fit the demand (sorted, biggest first) into `capacity` (changed in place)."""
    left = []
    for cores in demand:
        for i, room in enumerate(capacity):
            if cores <= room + 1e-9:
                capacity[i] = room - cores
                break
        else:
            left.append(cores)
    return left


def _wake_w(node: NodeView, settings: PolicySettings) -> float:
    return node.idle_w + settings.boot_energy_j / settings.wake_horizon_s


def _wake_w_per_core(node: NodeView, settings: PolicySettings) -> float:
    watts = _wake_w(node, settings)
    return watts / node.allocatable_cpu if math.isfinite(watts) else math.inf


# ---- powering off -------------------------------------------------------------------------


def _unneeded_since(
    nodes: Sequence[NodeView],
    previous: Mapping[str, float],
    now_s: float,
    settings: PolicySettings,
) -> dict[str, float]:
    since = {}
    for node in nodes:
        if node.state == POWER_ON and node.managed and _unneeded(node, settings) is not None:
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
    # Worst first: most idle watts per core (unknown idle power last).
    candidates.sort(
        key=lambda n: (-n.idle_w_per_core if math.isfinite(n.idle_w_per_core) else math.inf, n.name)
    )
    staying = {n.name: n for n in on}
    power_off: list[Action] = []
    drain: list[Action] = []
    for node in candidates:
        if len(staying) - 1 < settings.min_on_nodes or off_count + 1 > max_off:
            break
        others = [n for name, n in staying.items() if name != node.name]
        free_after = sum(_free_cpu(n) for n in others)
        moving = [p for p in node.pods if not p.daemon]
        if free_after - sum(p.cpu_cores for p in moving) < target:
            continue  # the headroom would go: keep this one on
        if moving and not _fits_elsewhere(moving, others):
            continue
        saving = node.idle_w
        if moving:
            reason = (
                f"{_unneeded(node, settings)} for {now_s - since[node.name]:.0f} s; its "
                f"{len(moving)} pod(s) fit elsewhere; {node.idle_w_per_core:.1f} W idle per core"
            )
            drain.append(Action(node.name, reason, saving))
            # What moves takes room on the others: account for it before the next candidate.
            staying = _with_pods_placed(others, moving)
        else:
            reason = (
                f"empty for {now_s - since[node.name]:.0f} s; "
                f"{node.idle_w_per_core:.1f} W idle per core"
            )
            power_off.append(Action(node.name, reason, saving))
            del staying[node.name]
        off_count += 1
    return tuple(power_off), tuple(drain)


def _free_cpu(node: NodeView) -> float:
    return max(node.allocatable_cpu - node.requested_cpu - node.daemon_cpu, 0.0)


def _free_memory(node: NodeView) -> int:
    return max(node.allocatable_memory_bytes - node.requested_memory_bytes, 0)


def _fits_elsewhere(pods: Sequence[PodInfo], others: Sequence[NodeView]) -> bool:
    """Whether every pod fits on `others` (first-fit decreasing on CPU and memory)."""
    room = [[_free_cpu(n), _free_memory(n)] for n in others]
    for pod in sorted(pods, key=lambda p: -p.cpu_cores):
        for slot in room:
            if pod.cpu_cores <= slot[0] + 1e-9 and pod.memory_bytes <= slot[1]:
                slot[0] -= pod.cpu_cores
                slot[1] -= pod.memory_bytes
                break
        else:
            return False
    return True


def _with_pods_placed(others: Sequence[NodeView], pods: Sequence[PodInfo]) -> dict[str, NodeView]:
    """`others` with `pods` placed first-fit decreasing (as `_fits_elsewhere` found room)."""
    placed: dict[str, list[PodInfo]] = {n.name: list(n.pods) for n in others}
    room = {n.name: [_free_cpu(n), _free_memory(n)] for n in others}
    for pod in sorted(pods, key=lambda p: -p.cpu_cores):
        for name, slot in room.items():
            if pod.cpu_cores <= slot[0] + 1e-9 and pod.memory_bytes <= slot[1]:
                slot[0] -= pod.cpu_cores
                slot[1] -= pod.memory_bytes
                placed[name].append(pod)
                break
    return {n.name: replace(n, pods=tuple(placed[n.name])) for n in others}
