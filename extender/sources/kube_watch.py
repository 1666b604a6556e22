"""Live cluster state from the Kubernetes API: Node and Pod watches feeding `ClusterState`.

This is the edge where the extender learns what kube-scheduler knows and the metrics do not:

- **Nodes** give each node's allocatable CPU (the denominator of a pod's share of the node),
  its labels (`energy-status`) and annotations (`power-aware-scheduler/max-power-w`).
- **Pods** bound to a node a moment ago add load that `cpu_util` will only show a scrape or
  two later. Each such pod is reported with `state.pod_bound` (its CPU demand as kube-scheduler
  counts it, and the time it was bound), so a burst of pods does not all land on the node that
  looked idlest; the state drops the assumption after its window, or when the pod is gone
  (deleted, Succeeded or Failed).
- **Where pods run**: every running pod's node and IPs, published as an `extender.pods.PodIndex`
  (signal `PODS_SIGNAL`) whenever one changes, for plugins that place pods near other pods
  (Delay's `delay_<pod-prefix>`) or meet nodes through pod IPs (Goldpinger).
- **Requested CPU per node**: what every running pod requests, DaemonSet and mirror pods left
  out, summed per node and published as the signal `requested_cpu`
  (`extender.node_requests.NodeRequests`, for the Consolidation plugin) after each list and
  change.

Pod listeners (`ClusterWatcher.add_pod_listener`, e.g. the `Reward` plugin's source) get every
pod list and event too, to learn what became of the pods; with one, the pod watch also keeps
Succeeded and Failed pods (a pod leaving a field selection arrives as DELETED with its previous
content, so the end of a pod would otherwise be invisible).

Each resource runs the reflector pattern of client-go in one daemon thread
(`livedata.list_watch.ListWatchLoop`, shared with the node power controller): list (replacing
what the state holds), then watch from the list's resourceVersion, resume where it ended,
relist on `410 Gone`, retry the rest with backoff; `healthy`/`last_sync_at_s` tell `/readyz`
whether the view can be trusted. Nothing here is on the request path.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol

from kubernetes import client

from extender.node_requests import REQUESTED_CPU_SIGNAL, NodeRequests, is_daemon_pod
from extender.pods import PODS_SIGNAL, PodIndexBuilder, PodPlacement
from extender.state import ClusterState, NodeInfo
from livedata.list_watch import (
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_WATCH_TIMEOUT_S,
    ListWatchLoop,
)
from livedata.pod_resources import parse_cpu_quantity, pod_cpu_demand_cores

log = logging.getLogger(__name__)

# Only pods bound to a node and still running can add load; the server filters the rest out
# (a pod that finishes leaves the selection and arrives as DELETED).
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# With a pod listener: every bound pod, finished ones included (what kube-scheduler's own
# informer leaves out is what a listener learns from).
BOUND_POD_FIELD_SELECTOR = "spec.nodeName!="
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})

Clock = Callable[[], float]


class PodListener(Protocol):
    """Gets the pod watch's lists and events (on the watch's thread: return quickly)."""

    def pods_listed(self, pods: list[dict[str, Any]]) -> None: ...

    def pod_event(self, event_type: str, pod: dict[str, Any]) -> None: ...


# --------------------------------------------------------------------------------------------
# Pure conversions from API objects (raw JSON dicts) to what the state wants
# --------------------------------------------------------------------------------------------


def node_info_from_object(node: Mapping[str, Any]) -> NodeInfo:
    """NodeInfo from a Node's JSON; allocatable CPU is NaN (and logged) when absent or bad."""
    metadata = node.get("metadata") or {}
    name = metadata.get("name") or ""
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get("cpu")
    try:
        allocatable_cpu = parse_cpu_quantity(allocatable) if allocatable is not None else math.nan
    except ValueError as error:
        log.warning("node %s: status.allocatable.cpu: %s; treated as unknown", name, error)
        allocatable_cpu = math.nan
    if allocatable is None:
        log.warning("node %s: no status.allocatable.cpu; treated as unknown", name)
    addresses = tuple(
        str(entry["address"])
        for entry in (node.get("status") or {}).get("addresses") or []
        if isinstance(entry, Mapping) and entry.get("address")
    )
    return NodeInfo(
        name=name,
        allocatable_cpu=allocatable_cpu,
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        addresses=addresses,
    )


def parse_rfc3339_s(text: str) -> float:
    """Unix seconds from an RFC 3339 timestamp as the API server writes it."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def pod_bound_at_s(pod: Mapping[str, Any], now_s: float) -> float:
    """When the pod was bound: the PodScheduled condition's transition time, else `now_s`."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
            stamp = condition.get("lastTransitionTime")
            if stamp:
                try:
                    return min(parse_rfc3339_s(stamp), now_s)
                except ValueError:
                    break
    return now_s


def pod_placement_from_object(pod: Mapping[str, Any]) -> PodPlacement | None:
    """Where a pod runs and its IPs; None when it is not bound to a node."""
    metadata = pod.get("metadata") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return None
    status = pod.get("status") or {}
    return PodPlacement(
        namespace=metadata.get("namespace") or "",
        name=metadata.get("name") or "",
        node=node,
        pod_ip=status.get("podIP") or None,
        host_ip=status.get("hostIP") or None,
    )


def _pod_name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


# --------------------------------------------------------------------------------------------
# The watcher
# --------------------------------------------------------------------------------------------


class ClusterWatcher:
    """Keeps `ClusterState`'s nodes and recently bound pods in step with the API server."""

    def __init__(
        self,
        api: client.CoreV1Api,
        state: ClusterState,
        *,
        clock: Clock = time.time,
        resync_backoff_s: float = DEFAULT_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
    ) -> None:
        self._state = state
        self._clock = clock
        self._stop = threading.Event()
        # uid -> node of the pods reported to the state as bound, to report each binding once
        # (bound_at without a PodScheduled condition is "now", which must not keep moving).
        self._bound: dict[str, str] = {}
        self._bound_lock = threading.Lock()
        # Every running pod's node and IPs, published to the state when one changes. Written
        # by the pods loop's thread only.
        self._pod_index = PodIndexBuilder()
        # uid -> (node, millicores requested) of running pods that are not DaemonSet or mirror
        # pods, and their sum per node (integers: sums of floats would drift over months).
        self._requests: dict[str, tuple[str, int]] = {}
        self._requested_m: dict[str, int] = {}
        self._requests_changed = True  # publish (empty) after the first list
        self.invalid_pods_total = 0
        self._pod_listeners: list[PodListener] = []
        common = {
            "stop_event": self._stop,
            "clock": clock,
            "backoff_s": resync_backoff_s,
            "max_backoff_s": max_backoff_s,
            "watch_timeout_s": watch_timeout_s,
        }
        self._nodes = ListWatchLoop(
            name="nodes",
            list_func=api.list_node,
            list_kwargs={},
            on_list=self._nodes_listed,
            on_event=self._node_event,
            **common,
        )
        self._pods = ListWatchLoop(
            name="pods",
            list_func=api.list_pod_for_all_namespaces,
            list_kwargs={"field_selector": POD_FIELD_SELECTOR},
            on_list=self._pods_listed,
            on_event=self._pod_event,
            **common,
        )

    # ---- lifecycle ------------------------------------------------------------------------

    def add_pod_listener(self, listener: PodListener) -> None:
        """Pass every pod list and event to `listener` too (before `start`).

        The pod watch then selects every bound pod, Succeeded and Failed ones included; what
        the state is told does not change (finished pods are never assumed load).
        """
        if self._pods.thread.is_alive():
            raise RuntimeError("add pod listeners before starting the watch")
        self._pod_listeners.append(listener)
        self._pods.list_kwargs["field_selector"] = BOUND_POD_FIELD_SELECTOR

    def start(self) -> None:
        self._nodes.thread.start()
        self._pods.thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for loop in (self._nodes, self._pods):
            loop.interrupt()
        for loop in (self._nodes, self._pods):
            if loop.thread.is_alive():
                loop.thread.join(timeout=timeout_s)

    # ---- health ---------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Both loops listed successfully and have not failed since."""
        return self._nodes.status.synced and self._pods.status.synced

    @property
    def last_sync_at_s(self) -> float | None:
        """When the staler of the two loops last heard from the API server (None: never)."""
        times = [loop.status.last_ok_at_s for loop in (self._nodes, self._pods)]
        if any(t is None for t in times):
            return None
        return min(t for t in times if t is not None)

    def status(self) -> dict[str, Any]:
        """Per-resource health and counters (JSON-ready) for /status and /metrics."""
        return {
            "healthy": self.healthy,
            "last_sync_at_s": self.last_sync_at_s,
            "invalid_pods_total": self.invalid_pods_total,
            **{loop.name: vars(loop.status).copy() for loop in (self._nodes, self._pods)},
        }

    # ---- nodes ----------------------------------------------------------------------------

    def _nodes_listed(self, nodes: list[dict[str, Any]]) -> None:
        self._state.replace_nodes(node_info_from_object(node) for node in nodes)

    def _node_event(self, event_type: str, node: dict[str, Any]) -> None:
        if event_type == "DELETED":
            self._state.remove_node((node.get("metadata") or {}).get("name") or "")
        elif event_type in ("ADDED", "MODIFIED"):
            self._state.upsert_node(node_info_from_object(node))

    # ---- pods -----------------------------------------------------------------------------

    def _pods_listed(self, pods: list[dict[str, Any]]) -> None:
        listed: set[str] = set()
        for pod in pods:
            uid = (pod.get("metadata") or {}).get("uid")
            if uid:
                listed.add(uid)
                self._pod_seen(uid, pod, publish=False)
        # Pods that vanished while we were not watching.
        with self._bound_lock:
            vanished = [uid for uid in self._bound if uid not in listed]
        for uid in vanished:
            self._pod_removed(uid, publish=False)
        self._publish_pods()
        self._publish_requests()
        for listener in self._pod_listeners:
            _tell(listener.pods_listed, pods)

    def _pod_event(self, event_type: str, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return
        if event_type == "DELETED":
            self._pod_removed(uid)
        elif event_type in ("ADDED", "MODIFIED"):
            self._pod_seen(uid, pod)
        self._publish_requests()
        for listener in self._pod_listeners:
            _tell(listener.pod_event, event_type, pod)

    def _pod_seen(self, uid: str, pod: dict[str, Any], *, publish: bool = True) -> None:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in TERMINAL_POD_PHASES:
            self._pod_removed(uid, publish=publish)
            return
        placement = pod_placement_from_object(pod)
        if placement is not None and self._pod_index.put(uid, placement) and publish:
            self._publish_pods()
        with self._bound_lock:
            if self._bound.get(uid) == node:
                return  # already reported: later updates (status, labels) change nothing
        now_s = self._clock()
        bound_at_s = pod_bound_at_s(pod, now_s)
        with self._bound_lock:
            self._bound[uid] = node
        try:
            cpu_cores = pod_cpu_demand_cores(pod)
        except ValueError as error:
            self.invalid_pods_total += 1
            log.warning(
                "pod %s: cannot count its CPU demand (%s); not assumed", _pod_name(pod), error
            )
            return
        if not is_daemon_pod(pod):
            self._count_request(uid, node, round(cpu_cores * 1000))
        if bound_at_s + self._state.assumed_window_s <= now_s:
            return  # bound long ago: its load is in the metrics already
        self._state.pod_bound(node, uid, cpu_cores, bound_at_s)

    def _pod_removed(self, uid: str, *, publish: bool = True) -> None:
        with self._bound_lock:
            known = self._bound.pop(uid, None) is not None
            self._forget_request_locked(uid)
        if known:
            self._state.pod_gone(uid)
        if self._pod_index.remove(uid) and publish:
            self._publish_pods()

    def _publish_pods(self) -> None:
        self._state.set_signal(PODS_SIGNAL, self._pod_index.snapshot())

    # ---- requested CPU per node -------------------------------------------------------------

    def _count_request(self, uid: str, node: str, millicores: int) -> None:
        with self._bound_lock:
            self._forget_request_locked(uid)
            self._requests[uid] = (node, millicores)
            self._requested_m[node] = self._requested_m.get(node, 0) + millicores
            self._requests_changed = True

    def _forget_request_locked(self, uid: str) -> None:
        entry = self._requests.pop(uid, None)
        if entry is None:
            return
        node, millicores = entry
        left = self._requested_m.get(node, 0) - millicores
        if left > 0:
            self._requested_m[node] = left
        else:
            self._requested_m.pop(node, None)
        self._requests_changed = True

    def _publish_requests(self) -> None:
        """Publish the per-node sums if they changed (once per list, once per event)."""
        with self._bound_lock:
            if not self._requests_changed:
                return
            self._requests_changed = False
            cores = MappingProxyType({n: m / 1000.0 for n, m in self._requested_m.items()})
        self._state.set_signal(REQUESTED_CPU_SIGNAL, NodeRequests(cores))


def _tell(callback: Callable[..., None], *args: Any) -> None:
    """Call a pod listener; its failure is logged, never stops the watch."""
    try:
        callback(*args)
    except Exception:
        log.exception("pod listener %s failed", getattr(callback, "__qualname__", callback))
