"""kube-scheduler's default placement for CPU/memory-only pods, reimplemented from upstream.

The energy bench compares the extender against what kube-scheduler does without it, so this
must be the real default, not a straw man. Two versions are kept: v1.36 (the default, what
`tests/test_kube_default_fidelity.py` checks score by score against a real v1.36.2
kube-scheduler) and v1.28 (`NodeLedger(kube_version="1.28")`, the bench's `--kube-version`).
For pods without affinities, tolerations, their own topology spread constraints, images or
resource claims, the default plugins that run are:

- Filter ``NodeUnschedulable`` (and ``TaintToleration`` for the taints of a NotReady node): a
  cordoned node, or one that is off or booting, takes no pod (``NodeLedger.schedulable``).

- Filter ``NodeResourcesFit`` (``pkg/scheduler/framework/plugins/noderesources/fit.go``,
  ``fitsRequest``): a node fails when the pod's *requested* CPU or memory exceeds
  ``allocatable - sum(requests of pods on the node)``, or when the node already runs
  ``allowedPodNumber`` pods (the node's allocatable "pods": kubelet's ``--max-pods``, 110
  unless the operator sets it; ``NodeLedger(max_pods=...)``). Zero requests always fit.
- Score ``NodeResourcesFit`` with the default ``LeastAllocated`` strategy
  (``least_allocated.go``: ``leastResourceScorer``, ``leastRequestedScore``), resources cpu
  and memory with weight 1 each: per resource ``(capacity - requested) * 100 / capacity`` in
  int64 arithmetic (0 when requested > capacity), then the weighted integer mean. "requested"
  is the node's *non-zero* requests plus the pod's non-zero request
  (``resource_allocation.go``: ``calculateResourceAllocatableRequest`` reads
  ``NonZeroRequested`` unless ``useRequested``; ``calculatePodResourceRequest`` uses
  ``schedutil.GetNonzeroRequestForResource``: a container without a CPU request counts 100m,
  without a memory request 200 MiB). The same in both versions.
- Score ``NodeResourcesBalancedAllocation`` (``balanced_allocation.go``:
  ``balancedResourceScorer``, built with ``useRequested: true``, so the *actual* requests):
  fractions ``requested / allocatable`` capped at 1, for two resources
  ``std = |f_cpu - f_mem| / 2``, balance ``int64((1 - std) * 100)`` (50..100).
  v1.28 scores the balance with the pod placed. v1.36 scores the change the pod makes
  (kubernetes PR 135573): ``50 + (50 + after - before) / 2`` in int64, where ``before`` is the
  node's balance without the pod and ``after`` with it, so a pod that changes nothing scores 75
  and the range stays 50..100; and it skips best-effort pods (no CPU and no memory request:
  PreScore returns Skip, the plugin adds nothing).

- Score ``PodTopologySpread`` with the system default constraints
  (``pkg/scheduler/framework/plugins/podtopologyspread/scoring.go``; the constraints are
  kubernetes.io/docs "Pod Topology Spread Constraints", "Internal default constraints":
  ``kubernetes.io/hostname`` maxSkew 3 and ``topology.kubernetes.io/zone`` maxSkew 5, both
  ``ScheduleAnyway``), for pods owned by a ReplicaSet (Deployment), StatefulSet or
  ReplicationController or selected by a Service (``PodRequest.owner``). Per feasible node:
  ``round(n_host * ln(F + 2) + 2 + n_zone * ln(Z + 2) + 4)``, where ``n_host`` counts the
  owner's pods on the node, ``n_zone`` on every node of its zone, ``F`` is the number of
  feasible nodes and ``Z`` of their zones; normalised as ``100 * (max + min - s) // max``
  over the feasible nodes (fewest matching pods best). Pods with no owner (Jobs, bare pods)
  get no default constraint: the plugin is skipped. The same in both versions.

- Score plugins that run but score every node alike here: ``TaintToleration`` (no node has a
  PreferNoSchedule taint: 0 intolerable taints, normalised in reverse to 100), ``ImageLocality``
  (no image is on any node: 0) and, in v1.36, ``DynamicResources`` (no claims: 0). They change
  no decision; they are counted so that a node's total is the scheduler's final score.
  ``NodeAffinity``, ``InterPodAffinity`` and ``VolumeBinding`` skip these pods.

Weights in the default profile (``pkg/scheduler/apis/config/v1/default_plugins.go``, read from a
v1.36.2 scheduler's log): TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1,
VolumeBinding 1, PodTopologySpread 2, InterPodAffinity 2, DynamicResources 2 (v1.36),
NodeResourcesBalancedAllocation 1, ImageLocality 1. The framework multiplies each plugin's
score by its weight and sums per node; an extender's 0..10 score is added as
``score * weight * (MaxNodeScore / MaxExtenderPriority)`` = ``score * weight * 10``
(``pkg/scheduler/schedule_one.go``: ``prioritizeNodes``). ``selectHost`` takes the highest
total and breaks ties uniformly at random (reservoir sampling). When only one node is feasible
``schedulePod`` returns it without scoring (and so never calls the extender's prioritize).

Quantities are kept as Go keeps them: CPU in int64 millicores, memory in int64 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_NODE_SCORE = 100  # framework.MaxNodeScore
MAX_EXTENDER_PRIORITY = 10  # extenderv1.MaxExtenderPriority
DEFAULT_MILLI_CPU_REQUEST = 100  # schedutil.DefaultMilliCPURequest
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024  # schedutil.DefaultMemoryRequest, bytes
DEFAULT_MAX_PODS = 110  # kubelet maxPods default -> node allocatable "pods"
LEAST_ALLOCATED_WEIGHTS = (1, 1)  # scoringStrategy.resources: cpu 1, memory 1
# The kube-scheduler versions reproduced; the first is the default.
KUBE_VERSIONS = ("1.36", "1.28")
DEFAULT_KUBE_VERSION = KUBE_VERSIONS[0]
# Weights of the score plugins in the default profile (the same in both versions).
TAINT_PLUGIN_WEIGHT = 3  # TaintToleration
FIT_PLUGIN_WEIGHT = 1  # NodeResourcesFit
BALANCED_PLUGIN_WEIGHT = 1  # NodeResourcesBalancedAllocation
SPREAD_PLUGIN_WEIGHT = 2  # PodTopologySpread
IMAGE_PLUGIN_WEIGHT = 1  # ImageLocality
DRA_PLUGIN_WEIGHT = 2  # DynamicResources (v1.36; no Score in v1.28)
# PodTopologySpread's system default constraints: (topology key, maxSkew), ScheduleAnyway.
DEFAULT_HOSTNAME_MAX_SKEW = 3
DEFAULT_ZONE_MAX_SKEW = 5
NO_OWNER = -1


@dataclass(frozen=True)
class PodRequest:
    """What the scheduler counts of one pod (one container): requests, 0 = not set.

    `owner` identifies the ReplicaSet (Deployment) or StatefulSet that owns the pod, for the
    default topology spreading; `NO_OWNER` for pods without one (Jobs, bare pods).
    """

    cpu_m: int
    memory_bytes: int
    owner: int = NO_OWNER

    @property
    def nonzero_cpu_m(self) -> int:
        return self.cpu_m if self.cpu_m > 0 else DEFAULT_MILLI_CPU_REQUEST

    @property
    def nonzero_memory_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes > 0 else DEFAULT_MEMORY_REQUEST


class NodeLedger:
    """Per-node allocatable and the requests of pods bound there (the scheduler's NodeInfo).

    `zones` are the nodes' `topology.kubernetes.io/zone` labels (None: no node has one);
    `schedulable` is False for nodes that take no pod (cordoned, off, booting); the pods of
    each owner are counted per node for the default topology spreading. `kube_version` is
    the kube-scheduler whose scores this cluster's scheduler gives (`KUBE_VERSIONS`);
    `max_pods` the pods each node admits (one for all, or one per node).
    """

    def __init__(
        self,
        allocatable_cpu_m: np.ndarray,
        allocatable_memory_bytes: np.ndarray,
        zones: Sequence[str] | None = None,
        kube_version: str = DEFAULT_KUBE_VERSION,
        max_pods: int | np.ndarray = DEFAULT_MAX_PODS,
    ):
        if kube_version not in KUBE_VERSIONS:
            raise ValueError(
                f"kube-scheduler version {kube_version!r}: expected one of "
                f"{', '.join(KUBE_VERSIONS)}"
            )
        self.kube_version = kube_version
        self.allocatable_cpu_m = np.asarray(allocatable_cpu_m, dtype=np.int64)
        self.allocatable_memory_bytes = np.asarray(allocatable_memory_bytes, dtype=np.int64)
        n_nodes = self.allocatable_cpu_m.size
        self.allowed_pods = np.broadcast_to(np.asarray(max_pods, dtype=np.int64), n_nodes).copy()
        self.requested_cpu_m = np.zeros(n_nodes, dtype=np.int64)
        self.requested_memory_bytes = np.zeros(n_nodes, dtype=np.int64)
        self.nonzero_cpu_m = np.zeros(n_nodes, dtype=np.int64)
        self.nonzero_memory_bytes = np.zeros(n_nodes, dtype=np.int64)
        self.pod_count = np.zeros(n_nodes, dtype=np.int64)
        self.schedulable = np.ones(n_nodes, dtype=bool)
        if zones is not None and len(zones) != n_nodes:
            raise ValueError(f"{len(zones)} zone labels for {n_nodes} nodes")
        # Zone of each node as an index into its distinct labels (None: no zone labels).
        self.zone_index: np.ndarray | None = (
            None if zones is None else np.unique(np.asarray(zones), return_inverse=True)[1]
        )
        self.owner_pods: dict[int, np.ndarray] = {}  # owner -> its pods per node

    def add(self, node: int, pod: PodRequest) -> None:
        self._change(node, pod, +1)

    def remove(self, node: int, pod: PodRequest) -> None:
        self._change(node, pod, -1)

    def _change(self, node: int, pod: PodRequest, sign: int) -> None:
        self.requested_cpu_m[node] += sign * pod.cpu_m
        self.requested_memory_bytes[node] += sign * pod.memory_bytes
        self.nonzero_cpu_m[node] += sign * pod.nonzero_cpu_m
        self.nonzero_memory_bytes[node] += sign * pod.nonzero_memory_bytes
        self.pod_count[node] += sign
        if pod.owner != NO_OWNER:
            counts = self.owner_pods.get(pod.owner)
            if counts is None:
                counts = self.owner_pods[pod.owner] = np.zeros(self.pod_count.size, np.int64)
            counts[node] += sign


def fits(ledger: NodeLedger, pod: PodRequest) -> np.ndarray:
    """NodeUnschedulable + NodeResourcesFit filters: True where the pod fits (fitsRequest)."""
    ok = ledger.schedulable & (ledger.pod_count + 1 <= ledger.allowed_pods)
    # fitsRequest skips a resource the pod does not request at all.
    if pod.cpu_m > 0:
        ok &= pod.cpu_m <= ledger.allocatable_cpu_m - ledger.requested_cpu_m
    if pod.memory_bytes > 0:
        ok &= pod.memory_bytes <= ledger.allocatable_memory_bytes - ledger.requested_memory_bytes
    return ok


def least_requested_score(requested: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """least_allocated.go leastRequestedScore, int64 arithmetic."""
    requested = np.asarray(requested, dtype=np.int64)
    capacity = np.asarray(capacity, dtype=np.int64)
    safe = np.where(capacity == 0, 1, capacity)
    score = ((capacity - requested) * MAX_NODE_SCORE) // safe
    return np.where((capacity == 0) | (requested > capacity), 0, score)


def least_allocated_scores(ledger: NodeLedger, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """NodeResourcesFit score (LeastAllocated, cpu:1 memory:1) of `nodes` (indices), 0..100."""
    cpu = least_requested_score(
        ledger.nonzero_cpu_m[nodes] + pod.nonzero_cpu_m, ledger.allocatable_cpu_m[nodes]
    )
    memory = least_requested_score(
        ledger.nonzero_memory_bytes[nodes] + pod.nonzero_memory_bytes,
        ledger.allocatable_memory_bytes[nodes],
    )
    cpu_weight, memory_weight = LEAST_ALLOCATED_WEIGHTS
    # Go integer division of non-negative int64s is floor division.
    return (cpu * cpu_weight + memory * memory_weight) // (cpu_weight + memory_weight)


def balance_scores(
    requested_cpu_m: np.ndarray,
    requested_memory_bytes: np.ndarray,
    allocatable_cpu_m: np.ndarray,
    allocatable_memory_bytes: np.ndarray,
) -> np.ndarray:
    """balancedResourceScorer for cpu and memory: int64((1 - |f_cpu - f_mem| / 2) * 100)."""
    cpu_fraction = np.minimum(requested_cpu_m / allocatable_cpu_m, 1.0)
    memory_fraction = np.minimum(requested_memory_bytes / allocatable_memory_bytes, 1.0)
    std = np.abs((cpu_fraction - memory_fraction) / 2.0)
    # Go's conversion truncates toward zero; the value is >= 0.
    return np.trunc((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)


def is_best_effort(pod: PodRequest) -> bool:
    """No CPU and no memory request: v1.36's BalancedAllocation skips the pod."""
    return pod.cpu_m == 0 and pod.memory_bytes == 0


def balanced_allocation_scores(
    ledger: NodeLedger, pod: PodRequest, nodes: np.ndarray
) -> np.ndarray:
    """NodeResourcesBalancedAllocation score of `nodes`, 0..100 (useRequested: true).

    v1.28: the balance with the pod placed. v1.36: `50 + (50 + after - before) // 2` (the
    change the pod makes; every term is int64 and the sum is >= 0), and 0 everywhere for a
    best-effort pod, which the plugin skips (`plugin_scores` leaves it out).
    """
    allocatable_cpu = ledger.allocatable_cpu_m[nodes]
    allocatable_memory = ledger.allocatable_memory_bytes[nodes]
    cpu_before = ledger.requested_cpu_m[nodes]
    memory_before = ledger.requested_memory_bytes[nodes]
    after = balance_scores(
        cpu_before + pod.cpu_m,
        memory_before + pod.memory_bytes,
        allocatable_cpu,
        allocatable_memory,
    )
    if ledger.kube_version == "1.28":
        return after
    if is_best_effort(pod):
        return np.zeros(nodes.size, dtype=np.int64)
    before = balance_scores(cpu_before, memory_before, allocatable_cpu, allocatable_memory)
    half = MAX_NODE_SCORE // 2
    return half + (half + after - before) // 2


def topology_spread_scores(ledger: NodeLedger, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """PodTopologySpread score of `nodes` (the feasible ones) with the system defaults, 0..100.

    scoring.go: PreScore counts the owner's pods per zone over every node (the zones of the
    feasible nodes only), Score adds `count * ln(size + 2) + maxSkew - 1` per constraint and
    rounds, NormalizeScore maps to `100 * (max + min - s) // max`. A pod without an owner has
    no default constraint: the plugin is skipped, 0 everywhere.
    """
    if pod.owner == NO_OWNER or nodes.size == 0:
        return np.zeros(nodes.size, dtype=np.int64)
    counts = ledger.owner_pods.get(pod.owner)
    if counts is None:
        counts = np.zeros(ledger.pod_count.size, dtype=np.int64)
    raw = counts[nodes] * math.log(nodes.size + 2) + (DEFAULT_HOSTNAME_MAX_SKEW - 1)
    zone_index = ledger.zone_index
    if zone_index is not None:
        per_zone = np.bincount(zone_index, weights=counts, minlength=int(zone_index.max()) + 1)
        zones = zone_index[nodes]
        zone_weight = math.log(np.unique(zones).size + 2)
        raw = raw + per_zone[zones] * zone_weight + (DEFAULT_ZONE_MAX_SKEW - 1)
    # int64(math.Round(score)): half away from zero; every score here is positive.
    score = np.floor(raw + 0.5).astype(np.int64)
    high, low = int(score.max()), int(score.min())
    if high == 0:
        return np.full(nodes.size, MAX_NODE_SCORE, dtype=np.int64)
    return MAX_NODE_SCORE * (high + low - score) // high


def plugin_scores(ledger: NodeLedger, pod: PodRequest, nodes: np.ndarray) -> dict[str, np.ndarray]:
    """Each default score plugin that runs for `pod`, its weighted score per node in `nodes`
    (what kube-scheduler logs at -v=10 as "Plugin scored node for pod"), by plugin name."""
    same = np.ones(nodes.size, dtype=np.int64)
    scores = {
        "TaintToleration": TAINT_PLUGIN_WEIGHT * MAX_NODE_SCORE * same,
        "NodeResourcesFit": FIT_PLUGIN_WEIGHT * least_allocated_scores(ledger, pod, nodes),
    }
    if ledger.kube_version != "1.28":
        scores["DynamicResources"] = DRA_PLUGIN_WEIGHT * 0 * same
    if ledger.kube_version == "1.28" or not is_best_effort(pod):
        scores["NodeResourcesBalancedAllocation"] = BALANCED_PLUGIN_WEIGHT * (
            balanced_allocation_scores(ledger, pod, nodes)
        )
    scores["ImageLocality"] = IMAGE_PLUGIN_WEIGHT * 0 * same
    if pod.owner != NO_OWNER:
        scores["PodTopologySpread"] = SPREAD_PLUGIN_WEIGHT * topology_spread_scores(
            ledger, pod, nodes
        )
    return scores


def default_plugin_scores(ledger: NodeLedger, pod: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """Weighted sum of the default score plugins per node: the scheduler's final score."""
    return np.sum(list(plugin_scores(ledger, pod, nodes).values()), axis=0, dtype=np.int64)


def extender_contribution(extender_scores: np.ndarray, weight: int) -> np.ndarray:
    """An extender's 0..10 scores as prioritizeNodes adds them: score * weight * 10."""
    return (
        np.asarray(extender_scores, dtype=np.int64)
        * weight
        * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    )


def select_host(nodes: np.ndarray, totals: np.ndarray, rng: np.random.Generator) -> int:
    """schedule_one.go selectHost: the highest total, ties broken uniformly at random."""
    best = np.flatnonzero(totals == totals.max())
    return int(nodes[best[0]] if best.size == 1 else nodes[rng.choice(best)])


def default_schedule(ledger: NodeLedger, pod: PodRequest, rng: np.random.Generator) -> int | None:
    """The node kube-scheduler's default profile picks for `pod`, or None if none fits."""
    feasible = np.flatnonzero(fits(ledger, pod))
    if feasible.size == 0:
        return None
    if feasible.size == 1:
        return int(feasible[0])
    return select_host(feasible, default_plugin_scores(ledger, pod, feasible), rng)
