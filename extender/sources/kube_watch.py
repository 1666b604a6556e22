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

Each resource runs the reflector pattern of client-go in one daemon thread: list (replacing what
the state holds), then watch from the list's resourceVersion with a server-side timeout, resume
the watch where it ended, and relist on `410 Gone`. Errors and dropped streams are retried with
exponential backoff; the failure is logged once per streak, and `healthy`/`last_sync_at_s` tell
`/readyz` whether the view can be trusted. Nothing here is on the request path.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol

import orjson
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from extender.node_requests import REQUESTED_CPU_SIGNAL, NodeRequests, is_daemon_pod
from extender.pods import PODS_SIGNAL, PodIndexBuilder, PodPlacement
from extender.state import ClusterState, NodeInfo
from livedata.pod_resources import parse_cpu_quantity, pod_cpu_demand_cores

log = logging.getLogger(__name__)

DEFAULT_WATCH_TIMEOUT_S = 300
DEFAULT_RESYNC_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 30.0
# Slack on top of the server-side watch timeout before the client gives up on a silent socket.
READ_TIMEOUT_SLACK_S = 30.0
CONNECT_TIMEOUT_S = 10.0
LIST_READ_TIMEOUT_S = 60.0
# Only pods bound to a node and still running can add load; the server filters the rest out
# (a pod that finishes leaves the selection and arrives as DELETED).
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
# With a pod listener: every bound pod, finished ones included (what kube-scheduler's own
# informer leaves out is what a listener learns from).
BOUND_POD_FIELD_SELECTOR = "spec.nodeName!="
TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
HTTP_GONE = 410

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


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


# --------------------------------------------------------------------------------------------
# One list+watch loop per resource
# --------------------------------------------------------------------------------------------


@dataclass
class LoopStatus:
    """Health of one list+watch loop, for /readyz, /status and /metrics."""

    synced: bool = False  # listed successfully and no error since
    last_ok_at_s: float | None = None  # last successful list, watch event or clean watch end
    consecutive_failures: int = 0
    failures_total: int = 0
    relists_total: int = 0
    events_total: int = 0


class _ListWatchLoop:
    """List, then watch from the list's resourceVersion; resume, relist on 410, back off."""

    def __init__(
        self,
        *,
        name: str,
        list_func: Callable[..., Any],
        list_kwargs: Mapping[str, Any],
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        stop_event: threading.Event,
        clock: Clock,
        backoff_s: float,
        max_backoff_s: float,
        watch_timeout_s: int,
    ) -> None:
        self.name = name
        self.status = LoopStatus()
        self._list_func = list_func
        self.list_kwargs = dict(list_kwargs)
        self._on_list = on_list
        self._on_event = on_event
        self._stop = stop_event
        self._clock = clock
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._watch_timeout_s = watch_timeout_s
        self._watch: watch.Watch | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"kube-{name}", daemon=True)

    def interrupt(self) -> None:
        """Unblock a watch in progress (used by stop)."""
        with self._lock:
            current = self._watch
        if current is not None:
            current.stop()

    def _run(self) -> None:
        # None means "list first"; after an error the watch resumes from the last version seen.
        resource_version: str | None = None
        delay_s = self._backoff_s
        relisted_for_gone = False
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch_from(resource_version)
                delay_s = self._backoff_s
                relisted_for_gone = False
                continue
            except ApiException as error:
                if error.status == HTTP_GONE:
                    # Our resourceVersion fell out of the server's history: start over, at once
                    # the first time; a server that keeps answering 410 gets the backoff.
                    log.info("%s watch expired (410 Gone); relisting", self.name)
                    resource_version = None
                    if not relisted_for_gone:
                        relisted_for_gone = True
                        continue
                self._failed(f"API error {error.status} {error.reason}".strip())
            except Exception as error:  # dropped streams, refused connections, bad JSON...
                if self._stop.is_set():
                    break
                self._failed(f"{type(error).__name__}: {error}")
            if self._stop.wait(delay_s):
                break
            delay_s = min(delay_s * 2, self._max_backoff_s)

    def _list(self) -> str:
        response = self._list_func(
            **self.list_kwargs,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, LIST_READ_TIMEOUT_S),
        )
        try:
            body = orjson.loads(response.data)
        finally:
            response.release_conn()
        items = body.get("items") or []
        self._on_list(items)
        resource_version = (body.get("metadata") or {}).get("resourceVersion") or "0"
        self._succeeded()
        self.status.relists_total += 1
        log.info(
            "%s listed: %d objects at resourceVersion %s", self.name, len(items), resource_version
        )
        return resource_version

    def _connect_watch(self, **kwargs: Any) -> Any:
        """Open the watch request; the server answering 200 counts as back in sync."""
        response = self._list_func(**kwargs)
        self._succeeded()
        return response

    def _watch_from(self, resource_version: str) -> str:
        """Stream events until the server-side timeout ends the watch; the last version seen."""
        # return_type "object" keeps raw JSON dicts: no model deserialisation per event.
        stream_watch = watch.Watch(return_type="object")
        with self._lock:
            self._watch = stream_watch
        try:
            for event in stream_watch.stream(
                self._connect_watch,
                **self.list_kwargs,
                resource_version=resource_version,
                timeout_seconds=self._watch_timeout_s,
                allow_watch_bookmarks=True,
                _request_timeout=(CONNECT_TIMEOUT_S, self._watch_timeout_s + READ_TIMEOUT_SLACK_S),
            ):
                if self._stop.is_set():
                    break
                obj = event["raw_object"]
                resource_version = _resource_version(obj) or resource_version
                if event["type"] != "BOOKMARK":
                    self.status.events_total += 1
                    try:
                        self._on_event(event["type"], obj)
                    except Exception:
                        # One odd object must not stall the stream by being retried forever.
                        log.exception("%s: skipped a %s event", self.name, event["type"])
                self._succeeded()
        finally:
            with self._lock:
                self._watch = None
        if not self._stop.is_set():
            self._succeeded()
        return resource_version

    def _succeeded(self) -> None:
        if self.status.consecutive_failures:
            log.info(
                "%s watch recovered after %d failed attempts",
                self.name,
                self.status.consecutive_failures,
            )
            self.status.consecutive_failures = 0
        # Only reached after a list: a resumed watch continues from a consistent state.
        self.status.synced = True
        self.status.last_ok_at_s = self._clock()

    def _failed(self, what: str) -> None:
        status = self.status
        if status.consecutive_failures == 0:
            log.warning("%s list/watch failed (%s); retrying with backoff", self.name, what)
        status.consecutive_failures += 1
        status.failures_total += 1
        status.synced = False


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
        resync_backoff_s: float = DEFAULT_RESYNC_BACKOFF_S,
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
        self._nodes = _ListWatchLoop(
            name="nodes",
            list_func=api.list_node,
            list_kwargs={},
            on_list=self._nodes_listed,
            on_event=self._node_event,
            **common,
        )
        self._pods = _ListWatchLoop(
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
