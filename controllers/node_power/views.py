"""Kubernetes objects in, the policy's views out: nodes, their pods, pending pods, arrivals.

The node power policy (`policy.decide`) knows nothing of Kubernetes. This module turns what
the API says (Node, Pod and PodDisruptionBudget JSON, the controller's Namespace) into the
policy's `NodeView`, `PodInfo` and `PendingPod`, with no I/O, so that every rule below is
tested on plain dicts:

- **power state**: the node annotation `power-aware-scheduler/power-state` (`on`, `draining`,
  `off`, `waking`) and `...-since` (RFC 3339); a node without them is `on` since it was
  created (so a new node sits out the cool-down before it is ever powered off);
- **managed**: the node opted in (label `power-aware-scheduler/power-management=enabled`),
  and neither it nor the controller's namespace carries the kill switch
  (`power-aware-scheduler/power-management-disabled: "true"`), nor the node
  cluster-autoscaler's `scale-down-disabled: "true"`; otherwise the reason, in words;
- **pods on a node**: requests as kube-scheduler counts them (`livedata.pod_resources`),
  finished pods left out; DaemonSet and mirror (static) pods marked `daemon`, since they go
  with their node;
- **eviction blockers**, in words, as cluster-autoscaler's drain rules have them: the
  `safe-to-evict: "false"` annotation; a PodDisruptionBudget with less room than the node has
  of its pods (or still being processed, or several budgets over one pod, which the Eviction
  API refuses); and, unless the pod is annotated `safe-to-evict: "true"`: no controller that
  would recreate it, local storage (hostPath, or emptyDir not in memory), a kube-system pod
  without a budget;
- **pending pods**: pods for our scheduler that wait with PodScheduled=False, reason
  Unschedulable;
- **unneeded since, from evidence**: the earliest a node can have been unneeded, read from what
  the cluster holds (`unneeded_evidence_s`), to start the unneeded clock of a round with no
  memory (a `--once` run, a new leader) where the evidence puts it rather than at that round;
- **arrivals**: each pod's creation time and requested CPU, into the policy's own
  `ArrivalRateMeter` (as the simulation feeds it); `ArrivalTracker` remembers pods seen once,
  so pods that came and went still count, and each counts once.

A pod or node the API describes in a way that cannot be read (a malformed quantity) is never
guessed: the pod blocks its node's drain, the node is left unmanaged, and the reason says
which field was wrong.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controllers.node_power.headroom import HeadroomLearner
from controllers.node_power.policy import (
    ArrivalRate,
    ArrivalRateMeter,
    NodeView,
    PendingPod,
    PodInfo,
    left_over,
)
from livedata.deferral import is_carbon_hold
from livedata.labels import (
    MIRROR_POD_ANNOTATION,
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_ON,
    POWER_STATE_ANNOTATION,
    POWER_STATE_REASON_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
    POWER_STATES,
    POWER_WAKING,
    SAFE_TO_EVICT_ANNOTATION,
    SCALE_DOWN_DISABLED_ANNOTATION,
)
from livedata.pod_resources import (
    parse_cpu_quantity,
    parse_memory_quantity,
    pod_cpu_demand_cores,
    pod_memory_request_bytes,
)

JsonObject = Mapping[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
SYSTEM_NAMESPACE = "kube-system"


# ---- small readers ------------------------------------------------------------------------


def parse_rfc3339_s(text: str) -> float:
    """Unix seconds from an RFC 3339 time as the API server writes it; ValueError if not one."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _metadata(obj: JsonObject) -> JsonObject:
    return obj.get("metadata") or {}


def _annotations(obj: JsonObject) -> JsonObject:
    return _metadata(obj).get("annotations") or {}


def _labels(obj: JsonObject) -> JsonObject:
    return _metadata(obj).get("labels") or {}


def _time_s(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return parse_rfc3339_s(text)
    except ValueError:
        return None


def pod_key(pod: JsonObject) -> str:
    """`namespace/name`, as the policy and the logs name pods."""
    metadata = _metadata(pod)
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def is_true(value: object) -> bool:
    return isinstance(value, str) and value.strip().lower() == "true"


# ---- nodes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePowerRecord:
    """What the controller wrote on a node: state, since when, why."""

    state: str
    since_s: float
    reason: str = ""
    problem: str = ""  # an annotation that could not be read, in words


def power_record(node: JsonObject) -> NodePowerRecord:
    """The node's recorded power state; `on` since its creation when none (or a bad one)."""
    annotations = _annotations(node)
    created_s = _time_s(_metadata(node).get("creationTimestamp")) or 0.0
    state = annotations.get(POWER_STATE_ANNOTATION)
    reason = annotations.get(POWER_STATE_REASON_ANNOTATION) or ""
    if state is None:
        return NodePowerRecord(POWER_ON, created_s, reason)
    if state not in POWER_STATES:
        return NodePowerRecord(
            POWER_ON,
            created_s,
            reason,
            f"annotation {POWER_STATE_ANNOTATION}={state!r} is not one of {POWER_STATES}; "
            "taken as on",
        )
    since_text = annotations.get(POWER_STATE_SINCE_ANNOTATION)
    since_s = _time_s(since_text)
    if since_s is None:
        return NodePowerRecord(
            state,
            created_s,
            reason,
            f"annotation {POWER_STATE_SINCE_ANNOTATION}={since_text!r} is not an RFC 3339 time; "
            "the node's creation time stands in",
        )
    return NodePowerRecord(state, since_s, reason)


def node_ready(node: JsonObject) -> tuple[bool, float]:
    """(Ready condition is True, the latest time kubelet or the node controller touched it).

    The time is the later of the condition's heartbeat and transition, so a caller can tell a
    Ready reported after some moment (a node that came back) from a stale one.
    """
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            stamps = [
                _time_s(condition.get(key)) for key in ("lastHeartbeatTime", "lastTransitionTime")
            ]
            latest = max((s for s in stamps if s is not None), default=0.0)
            return condition.get("status") == "True", latest
    return False, 0.0


def unmanaged_reason(node: JsonObject, namespace: JsonObject | None) -> str:
    """Why the controller must leave this node alone, in words; "" when it may manage it."""
    labels, annotations = _labels(node), _annotations(node)
    if labels.get(POWER_MANAGEMENT_LABEL) != POWER_MANAGEMENT_ENABLED:
        return f"not opted in (label {POWER_MANAGEMENT_LABEL}={POWER_MANAGEMENT_ENABLED})"
    if is_true(annotations.get(POWER_MANAGEMENT_DISABLED_ANNOTATION)):
        return f"kill switch on the node ({POWER_MANAGEMENT_DISABLED_ANNOTATION})"
    if namespace is not None and is_true(
        _annotations(namespace).get(POWER_MANAGEMENT_DISABLED_ANNOTATION)
    ):
        name = _metadata(namespace).get("name", "")
        return f"kill switch on namespace {name} ({POWER_MANAGEMENT_DISABLED_ANNOTATION})"
    if is_true(annotations.get(SCALE_DOWN_DISABLED_ANNOTATION)):
        return f"{SCALE_DOWN_DISABLED_ANNOTATION} is true"
    return ""


def node_allocatable(node: JsonObject) -> tuple[float, int, str]:
    """(allocatable cores, allocatable memory bytes, problem in words or "")."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = parse_cpu_quantity(allocatable["cpu"])
    except (KeyError, ValueError) as error:
        return 0.0, 0, f"status.allocatable.cpu unreadable ({error})"
    try:
        memory = parse_memory_quantity(allocatable.get("memory", 0))
    except ValueError as error:
        return cpu, 0, f"status.allocatable.memory unreadable ({error})"
    return cpu, memory, ""


def node_allocatable_pods(node: JsonObject) -> int | None:
    """The pods the node admits (status.allocatable.pods, the kubelet's --max-pods); None when
    absent or unreadable (the policy then packs on CPU and memory alone)."""
    pods = ((node.get("status") or {}).get("allocatable") or {}).get("pods")
    try:
        return int(str(pods)) if pods is not None else None
    except ValueError:
        return None


# ---- pods ---------------------------------------------------------------------------------


def is_daemon_pod(pod: JsonObject) -> bool:
    """DaemonSet pods and mirror pods of static pods: they go with their node."""
    if MIRROR_POD_ANNOTATION in _annotations(pod):
        return True
    return any(
        owner.get("kind") == "DaemonSet" and owner.get("controller")
        for owner in _metadata(pod).get("ownerReferences") or []
    )


def has_controller(pod: JsonObject) -> bool:
    return any(owner.get("controller") for owner in _metadata(pod).get("ownerReferences") or [])


def local_storage_volume(pod: JsonObject) -> str | None:
    """The first volume that keeps data on the node (hostPath, emptyDir not in memory)."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("hostPath") is not None:
            return f"hostPath volume {volume.get('name')!r}"
        empty_dir = volume.get("emptyDir")
        if empty_dir is not None and (empty_dir or {}).get("medium") != "Memory":
            return f"emptyDir volume {volume.get('name')!r}"
    return None


def selector_matches(selector: object, labels: Mapping[str, str]) -> bool:
    """A LabelSelector object against labels, as the Eviction API applies a budget's selector.

    An absent or empty selector matches nothing there (pkg/registry/core/pod/storage), so a
    budget without one never refuses an eviction.
    """
    if not isinstance(selector, Mapping):
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    for expression in expressions:
        key, operator = expression.get("key"), expression.get("operator")
        values = set(expression.get("values") or [])
        present = key in labels
        if (
            (operator == "In" and labels.get(key) not in values)
            or (operator == "NotIn" and present and labels[key] in values)
            or (operator == "Exists" and not present)
            or (operator == "DoesNotExist" and present)
            or operator not in ("In", "NotIn", "Exists", "DoesNotExist")
        ):
            return False
    return True


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as the drain rules need it."""

    key: str  # namespace/name
    namespace: str
    selector: Mapping[str, Any]
    disruptions_allowed: int
    processed: bool  # status.observedGeneration has caught up with metadata.generation

    @classmethod
    def from_object(cls, budget: JsonObject) -> Budget:
        metadata = _metadata(budget)
        status = budget.get("status") or {}
        generation = metadata.get("generation") or 0
        return cls(
            key=f"{metadata.get('namespace', '')}/{metadata.get('name', '')}",
            namespace=metadata.get("namespace", ""),
            selector=(budget.get("spec") or {}).get("selector") or {},
            disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
            processed=int(status.get("observedGeneration") or 0) >= generation,
        )


def budgets_of(pod: JsonObject, budgets: Sequence[Budget]) -> list[Budget]:
    namespace = _metadata(pod).get("namespace", "")
    labels = _labels(pod)
    return [b for b in budgets if b.namespace == namespace and selector_matches(b.selector, labels)]


def eviction_blockers(
    pods: Sequence[JsonObject], budgets: Sequence[Budget]
) -> dict[str, str | None]:
    """Why each of one node's movable pods may not be evicted (None when it may), by pod key.

    Budgets are judged per node: draining evicts all the node's pods of a budget, so a budget
    allowing one disruption blocks a node holding two of its pods.
    """
    matched = {pod_key(pod): budgets_of(pod, budgets) for pod in pods}
    on_node: dict[str, int] = {}
    for pod_budgets in matched.values():
        for budget in pod_budgets:
            on_node[budget.key] = on_node.get(budget.key, 0) + 1
    blockers: dict[str, str | None] = {}
    for pod in pods:
        key = pod_key(pod)
        blockers[key] = _blocker(pod, matched[key], on_node)
    return blockers


def _blocker(
    pod: JsonObject, pod_budgets: Sequence[Budget], on_node: Mapping[str, int]
) -> str | None:
    safe_to_evict = _annotations(pod).get(SAFE_TO_EVICT_ANNOTATION)
    if isinstance(safe_to_evict, str) and safe_to_evict.strip().lower() == "false":
        return f'annotated {SAFE_TO_EVICT_ANNOTATION}: "false"'
    if len(pod_budgets) > 1:
        names = ", ".join(b.key for b in pod_budgets)
        return f"matched by several PodDisruptionBudgets ({names}); the Eviction API refuses it"
    if pod_budgets:
        budget = pod_budgets[0]
        if not budget.processed:
            return f"PodDisruptionBudget {budget.key} is still being processed"
        if budget.disruptions_allowed < on_node[budget.key]:
            return (
                f"PodDisruptionBudget {budget.key} allows {budget.disruptions_allowed} "
                f"disruption(s); the node has {on_node[budget.key]} of its pods"
            )
    if is_true(safe_to_evict):
        return None  # cluster-autoscaler's meaning: the owner vouches for it
    if not has_controller(pod):
        return "no controller would recreate it (a bare pod)"
    volume = local_storage_volume(pod)
    if volume is not None:
        return f"uses local storage ({volume})"
    if _metadata(pod).get("namespace") == SYSTEM_NAMESPACE and not pod_budgets:
        return "a kube-system pod without a PodDisruptionBudget"
    return None


def pod_requests(pod: JsonObject) -> tuple[float, int, str]:
    """(CPU cores, memory bytes, problem in words or "") as kube-scheduler counts them."""
    try:
        return pod_cpu_demand_cores(pod), pod_memory_request_bytes(pod), ""
    except ValueError as error:
        return 0.0, 0, f"its requests cannot be read ({error})"


def pods_by_node(pods: Iterable[JsonObject]) -> dict[str, list[JsonObject]]:
    """Pods bound to a node and not finished, by node name."""
    by_node: dict[str, list[JsonObject]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES:
            by_node.setdefault(node, []).append(pod)
    return by_node


def pod_infos(pods: Sequence[JsonObject], budgets: Sequence[Budget]) -> tuple[PodInfo, ...]:
    """The policy's view of one node's pods."""
    movable = [pod for pod in pods if not is_daemon_pod(pod)]
    blockers = eviction_blockers(movable, budgets)
    infos = []
    for pod in pods:
        cpu, memory, problem = pod_requests(pod)
        daemon = is_daemon_pod(pod)
        blocker = None if daemon else (problem or blockers[pod_key(pod)])
        infos.append(PodInfo(pod_key(pod), cpu, memory, daemon, blocker))
    return tuple(infos)


def is_pending_unschedulable(pod: JsonObject, scheduler_name: str) -> bool:
    """A pod for `scheduler_name` that waits because no node could take it.

    A pod the Carbon plugin holds for a cleaner hour (its PodScheduled message carries the
    hold reason) is not waiting for a node: waking one for it would burn the very energy the
    hold saves.
    """
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("schedulerName") != scheduler_name or spec.get("nodeName"):
        return False
    if status.get("phase", "Pending") != "Pending" or _metadata(pod).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        and not is_carbon_hold(c.get("message"))
        for c in status.get("conditions") or []
    )


def pending_pods(pods: Iterable[JsonObject], scheduler_name: str) -> list[PendingPod]:
    pending = []
    for pod in pods:
        if is_pending_unschedulable(pod, scheduler_name):
            cpu, memory, _ = pod_requests(pod)
            pending.append(PendingPod(pod_key(pod), cpu, memory))
    return pending


def pending_beyond_waking(
    pending: Sequence[PendingPod], nodes: Sequence[NodeView]
) -> tuple[PendingPod, ...]:
    """The pending pods that will not fit on the nodes already waking (first fit, biggest first).

    Pods wait as Unschedulable while a woken node boots (it stays cordoned until Ready), and
    `policy.decide` counts waking capacity only against the headroom, not against waiting
    pods: without this, every round of a boot would wake more nodes for the same pods.
    """
    return tuple(left_over(pending, (n for n in nodes if n.state == POWER_WAKING)))


# ---- arrivals -----------------------------------------------------------------------------


class ArrivalTracker:
    """Feeds `meter` (and `learner`, with a wait target) each pod's creation once (DaemonSet
    pods aside); the meter's estimate."""

    def __init__(self, meter: ArrivalRateMeter, learner: HeadroomLearner | None = None) -> None:
        self.meter = meter
        self.learner = learner
        self._seen: dict[str, float] = {}  # uid -> created, while inside the longest window

    def observe(self, pods: Iterable[JsonObject], now_s: float) -> ArrivalRate:
        """Count the new pods among `pods`, forget old ones; the rate and its noise."""
        horizon_s = now_s - self.meter.windows_s[-1]
        for pod in pods:
            uid = _metadata(pod).get("uid")
            if not uid or uid in self._seen or is_daemon_pod(pod):
                continue
            created_s = _time_s(_metadata(pod).get("creationTimestamp"))
            if created_s is None or created_s < horizon_s:
                continue
            self._seen[uid] = created_s
            cores = pod_requests(pod)[0]
            self.meter.add(created_s, cores)
            if self.learner is not None:
                self.learner.add_arrival(created_s, cores)
        for uid in [u for u, created_s in self._seen.items() if created_s < horizon_s]:
            del self._seen[uid]
        return self.meter.estimate(now_s)


def pod_scheduled_s(pod: JsonObject) -> float | None:
    """When the pod was bound to a node: its PodScheduled condition's transition to True
    (None while unscheduled or without the condition)."""
    status = pod.get("status") or {}
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            return _time_s(condition.get("lastTransitionTime"))
    return None


class WaitTracker:
    """Feeds `learner` each pod's wait once: creation to scheduled (DaemonSet and mirror pods
    aside: they are bound by their controller, not scheduled). Pods scheduled before the last
    `window_s` are history the learner's window would drop anyway: not fed."""

    def __init__(self, learner: HeadroomLearner, window_s: float) -> None:
        self.learner = learner
        self.window_s = window_s
        self._seen: dict[str, float] = {}  # uid -> scheduled, while inside the window

    def observe(self, pods: Iterable[JsonObject], now_s: float) -> int:
        """Feed the newly scheduled pods among `pods`; how many."""
        horizon_s = now_s - self.window_s
        fed = 0
        for pod in pods:
            uid = _metadata(pod).get("uid")
            if not uid or uid in self._seen or is_daemon_pod(pod):
                continue
            scheduled_s = pod_scheduled_s(pod)
            created_s = _time_s(_metadata(pod).get("creationTimestamp"))
            if scheduled_s is None or created_s is None or scheduled_s < horizon_s:
                continue
            self._seen[uid] = scheduled_s
            self.learner.add_wait(scheduled_s, scheduled_s - created_s)
            fed += 1
        for uid in [u for u, scheduled_s in self._seen.items() if scheduled_s < horizon_s]:
            del self._seen[uid]
        return fed


# ---- the whole picture --------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterView:
    """One round's input of the policy, plus what the controller needs beside it."""

    nodes: tuple[NodeView, ...]
    pending: tuple[PendingPod, ...]
    records: Mapping[str, NodePowerRecord]  # node -> recorded power state
    ready_at_s: Mapping[str, float]  # node -> latest Ready heartbeat/transition (0 if none)
    problems: tuple[str, ...] = ()  # unreadable annotations and quantities, in words


def cluster_view(
    nodes: Sequence[JsonObject],
    pods: Sequence[JsonObject],
    budgets: Sequence[JsonObject],
    namespace: JsonObject | None,
    idle_w: Mapping[str, float],
    scheduler_name: str,
    g_per_kwh: Mapping[str, float] | None = None,
) -> ClusterView:
    """Every node as a `NodeView`, and the pods pending for our scheduler. `g_per_kwh`: each
    node's carbon intensity now, for ranking by grams (missing: unknown)."""
    parsed_budgets = [Budget.from_object(b) for b in budgets]
    on_nodes = pods_by_node(pods)
    views, records, ready_at, problems = [], {}, {}, []
    for node in sorted(nodes, key=lambda n: _metadata(n).get("name", "")):
        name = _metadata(node).get("name", "")
        record = power_record(node)
        if record.problem:
            problems.append(f"node {name}: {record.problem}")
        cpu, memory, allocatable_problem = node_allocatable(node)
        reason = unmanaged_reason(node, namespace)
        if allocatable_problem:
            problems.append(f"node {name}: {allocatable_problem}")
            reason = reason or allocatable_problem
        if record.state == POWER_ON and (node.get("spec") or {}).get("unschedulable"):
            # The controller cordons only what it drains, powers off or wakes.
            reason = reason or "cordoned outside the controller (spec.unschedulable)"
        ready, ready_at_s = node_ready(node)
        infos = pod_infos(on_nodes.get(name, []), parsed_budgets)
        problems += [
            f"pod {p.name} on node {name}: {p.eviction_blocker}"
            for p in infos
            if p.eviction_blocker and p.eviction_blocker.startswith("its requests")
        ]
        views.append(
            NodeView(
                name=name,
                allocatable_cpu=cpu,
                allocatable_memory_bytes=memory,
                state=record.state,
                state_since_s=record.since_s,
                managed=not reason,
                idle_w=idle_w.get(name, math.nan),
                pods=infos,
                ready=ready,
                unmanaged_reason=reason,
                g_per_kwh=(g_per_kwh or {}).get(name, math.nan),
                allocatable_pods=node_allocatable_pods(node),
            )
        )
        records[name] = record
        ready_at[name] = ready_at_s
    return ClusterView(
        nodes=tuple(views),
        pending=tuple(pending_pods(pods, scheduler_name)),
        records=records,
        ready_at_s=ready_at,
        problems=tuple(problems),
    )


# ---- unneeded since, from the evidence the cluster holds --------------------------------------


def pod_activity_s(pod: JsonObject) -> float | None:
    """The latest time a pod is known to have been alive on its node: its creation, start,
    containers' starts and ends, and condition changes (a finished pod's end among them)."""
    status = pod.get("status") or {}
    stamps = [_time_s(_metadata(pod).get("creationTimestamp")), _time_s(status.get("startTime"))]
    stamps += [_time_s(c.get("lastTransitionTime")) for c in status.get("conditions") or []]
    for container in (status.get("containerStatuses") or []) + (
        status.get("initContainerStatuses") or []
    ):
        for key in ("state", "lastState"):
            for phase in (container.get(key) or {}).values():
                if isinstance(phase, Mapping):
                    stamps += [_time_s(phase.get("startedAt")), _time_s(phase.get("finishedAt"))]
    if _metadata(pod).get("deletionTimestamp"):
        return math.inf  # still being stopped: alive now
    return max((s for s in stamps if s is not None), default=None)


def event_time_s(event: JsonObject) -> float | None:
    """When a core/v1 Event last happened (series, last, event or first timestamp)."""
    stamps = [_time_s(event.get(key)) for key in ("lastTimestamp", "eventTime", "firstTimestamp")]
    stamps.append(_time_s((event.get("series") or {}).get("lastObservedTime")))
    return max((s for s in stamps if s is not None), default=None)


def event_node(event: JsonObject) -> str:
    """The node a kubelet Event came from ("" when it is not a kubelet's)."""
    source = event.get("source") or {}
    if source.get("component") == "kubelet" and source.get("host"):
        return str(source["host"])
    if event.get("reportingComponent") == "kubelet":
        return str(event.get("reportingInstance") or "")
    return ""


def unneeded_evidence_s(
    records: Mapping[str, NodePowerRecord],
    pods: Iterable[JsonObject],
    pod_events: Iterable[JsonObject],
    now_s: float,
    lookback_s: float,
) -> dict[str, float]:
    """By node: the earliest time it can have been unneeded, from what the cluster holds.

    That is the latest of:

    - when it entered its recorded power state (the `power-state-since` annotation, written on
      every power-on, wake and cancelled drain), or its creation when it has none;
    - the latest sign of life of any non-DaemonSet pod bound to it that the API still lists
      (running or finished: creation, start, containers' starts and ends);
    - the latest kubelet Event on the node about a pod that is not a known DaemonSet or mirror
      pod: a pod deleted since leaves no object, but its kubelet's "Killing", "Started" and
      "Pulled" Events name the node for the API server's `--event-ttl`;
    - `now_s - lookback_s`, with `lookback_s` that event retention: further back the absence
      of Events proves nothing, so no clock is started earlier than it.

    Every sign of a pod is from before the node became empty, so this is never later than
    the truth, and it is the truth (to within the last pod's grace period) when the last pod
    left a trace: it is still listed, or its kubelet's "Killing" Event is. A pod whose Events
    were dropped (the kubelet's event rate limit, an API server shedding load) goes unseen and
    the clock starts early by as much; that is the limit of what the cluster holds, and why
    only a round with no memory reads it: later rounds carry their own observation. The
    other half of "unneeded", that the nodes left on keep the headroom without this one, is
    judged on the round's own arrival estimate, which `ArrivalTracker` rebuilds from the
    pods' creation times.
    """
    floor_s = now_s - lookback_s
    since = {name: max(record.since_s, floor_s) for name, record in records.items()}
    daemon_uids = set()
    for pod in pods:
        if is_daemon_pod(pod):
            daemon_uids.add(_metadata(pod).get("uid"))
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        activity = pod_activity_s(pod)
        if node in since and activity is not None:
            since[node] = max(since[node], min(activity, now_s))
    for event in pod_events:
        node = event_node(event)
        involved = event.get("involvedObject") or {}
        if node not in since or involved.get("kind") != "Pod":
            continue
        if involved.get("uid") and involved.get("uid") in daemon_uids:
            continue
        happened = event_time_s(event)
        if happened is not None:
            since[node] = max(since[node], min(happened, now_s))
    return since
