"""A kubelet stand-in for nodes without machines, as KWOK's stages do it.

    agent = NodeAgent(plane.api_client(), power_of=lambda node: bmc.power(node))
    agent.add_node("node-a", cpu=16, labels={...})
    agent.start()
    ...
    agent.stop()

For each node it registers, the agent does what a kubelet does that the control plane can see:
- registers the Node with its capacity, labels and a Ready condition;
- renews its Lease in `kube-node-lease` every `heartbeat_s` (the node lifecycle controller reads
  that), and sets Ready back to True when the node lifecycle controller had marked it Unknown;
- moves pods bound to it to Running, with a pod IP, Ready conditions and container statuses;
- finishes graceful deletion: a pod with a deletionTimestamp is deleted for good (grace 0);
- fails pods on request (`fail_pods`): a crash loop, an OOM kill, or never ready, written as a
  kubelet writes them (what the Reward plugin learns from).

A node's life follows its BMC when `power_of(node)` is given ("on"/"off", or True/False): while
the BMC says off the node stops heartbeating and running pods, and the control plane marks it
NotReady as it would a real one; when the BMC says on again, the node boots for `boot_s` and then
turns Ready. Everything runs on two threads (heartbeats, pod watch) of the calling process.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes.client
import kubernetes.watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("envtest.node_agent")

KUBELET_VERSION = "v1.36.2"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40  # the kubelet's default nodeLeaseDurationSeconds
FAIL_MODES = ("crash-loop", "oom-killed", "never-ready")
# Addresses as a cluster's would look; never routed anywhere (nothing listens on them).
NODE_CIDR_START = ipaddress.ip_address("10.0.0.1")
POD_CIDR_START = ipaddress.ip_address("10.244.0.1")


def _now() -> datetime:
    return datetime.now(UTC)


def _stamp(when: datetime | None = None) -> str:
    return (when or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition_true(pod: Any, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in pod.status.conditions or [])


def _is_on(power: Any) -> bool:
    if isinstance(power, str):
        return power.lower() == "on"
    return bool(power)


@dataclass
class _Node:
    name: str
    index: int
    boot_s: float
    ip: str  # its InternalIP, the hostIP of its pods
    up: bool = True
    booted_at_s: float | None = None  # monotonic time the boot ends, while booting
    pod_ips: dict[str, str] = field(default_factory=dict)  # pod uid -> IP


@dataclass(frozen=True)
class _Failure:
    node: str
    mode: str
    labels: Mapping[str, str]

    def matches(self, pod: Any) -> bool:
        if pod.spec.node_name != self.node:
            return False
        pod_labels = pod.metadata.labels or {}
        return all(pod_labels.get(k) == v for k, v in self.labels.items())


class NodeAgent:
    """Kubelets for registered nodes; see the module docstring."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        power_of: Callable[[str], Any] | None = None,
        heartbeat_s: float = 2.0,
        run_pods: bool = True,
    ) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.coordination = kubernetes.client.CoordinationV1Api(api_client)
        self.power_of = power_of
        self.heartbeat_s = heartbeat_s
        # False: nodes stay alive but their pods are the test's to move (it writes their
        # statuses itself, as kubelets would have: a finished Job, restarts, a failed pull).
        self.run_pods = run_pods
        self._nodes: dict[str, _Node] = {}
        self._registered = 0  # nodes ever added: each gets its own addresses
        self._pods_started = 0  # pods ever run: each gets its own IP
        self._failures: list[_Failure] = []
        self._pods: dict[str, Any] = {}  # uid -> pod, pods bound to our nodes
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: kubernetes.watch.Watch | None = None

    # -- nodes ---------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        cpu: int | str = 16,
        memory: str = "64Gi",
        pods: int = 110,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        boot_s: float = 0.0,
        internal_ip: str | None = None,
    ) -> None:
        """Register a Node (as a kubelet does at start) and keep it alive from now on;
        `internal_ip` is its InternalIP (one of the agent's own when not given)."""
        with self._lock:
            self._registered += 1
            index = self._registered
        resources = {"cpu": str(cpu), "memory": memory, "pods": str(pods)}
        now = _stamp()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
                "annotations": dict(annotations or {}),
            },
            "spec": {"taints": taints or []},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "addresses": [
                    {"type": "InternalIP", "address": internal_ip or self._node_ip(index)},
                    {"type": "Hostname", "address": name},
                ],
                "conditions": [self._ready_condition(True, now, now)],
                "nodeInfo": {
                    "kubeletVersion": KUBELET_VERSION,
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "containerRuntimeVersion": "envtest://0",
                    "kernelVersion": "",
                    "osImage": "envtest",
                    "kubeProxyVersion": "",
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                },
            },
        }
        self.core.create_node(body)
        self._renew_lease(name)
        with self._lock:  # only now: the heartbeat thread must not race the registration
            self._nodes[name] = _Node(name, index, boot_s, internal_ip or self._node_ip(index))
        self._wake.set()

    def remove_node(self, name: str) -> None:
        """Forget a node and delete its Node object and Lease."""
        with self._lock:
            self._nodes.pop(name, None)
        with contextlib.suppress(ApiException):
            self.core.delete_node(name)
        with contextlib.suppress(ApiException):
            self.coordination.delete_namespaced_lease(name, LEASE_NAMESPACE)

    @property
    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def is_up(self, name: str) -> bool:
        with self._lock:
            node = self._nodes.get(name)
            return bool(node and node.up)

    # -- pod failures ----------------------------------------------------------------------

    def fail_pods(self, node: str, mode: str, labels: Mapping[str, str] | None = None) -> None:
        """From now on, pods on `node` (matching `labels`) fail: `crash-loop` (restarts, then
        CrashLoopBackOff), `oom-killed` (restarted after an OOM kill) or `never-ready`."""
        if mode not in FAIL_MODES:
            raise ValueError(f"fail mode {mode!r}: expected one of {', '.join(FAIL_MODES)}")
        with self._lock:
            self._failures.append(_Failure(node, mode, dict(labels or {})))
        self._wake.set()

    def _failure_of(self, pod: Any) -> _Failure | None:
        with self._lock:
            return next((f for f in self._failures if f.matches(pod)), None)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> NodeAgent:
        loops = [(self._heartbeat_loop, "heartbeats")]
        if self.run_pods:
            loops.append((self._pod_loop, "pods"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=f"node-agent-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._watch is not None:
            self._watch.stop()
        for thread in self._threads:
            thread.join(timeout=10)
        self._threads.clear()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- heartbeats and power ----------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            for name in self.node_names:
                try:
                    self._tick(name)
                except ApiException as error:
                    if error.status != 404:
                        log.warning("node %s: heartbeat failed: %s", name, error.reason)
                except Exception as error:  # the API server may be restarting under a test
                    log.warning("node %s: heartbeat failed: %s", name, error)
            self._reconcile_pods()
            self._wake.wait(self.heartbeat_s)
            self._wake.clear()

    def _tick(self, name: str) -> None:
        with self._lock:
            node = self._nodes.get(name)
        if node is None:
            return
        powered = True if self.power_of is None else _is_on(self.power_of(name))
        if not powered:
            if node.up:
                log.info("node %s: powered off, stops heartbeating", name)
            node.up, node.booted_at_s = False, None
            return
        if not node.up:
            if node.booted_at_s is None:
                log.info("node %s: powered on, boots for %.0f s", name, node.boot_s)
                node.booted_at_s = time.monotonic() + node.boot_s
            if time.monotonic() < node.booted_at_s:
                return
            node.up, node.booted_at_s = True, None
            node.pod_ips.clear()
            # A kubelet that starts posts a fresh status whatever the old one said: a node off
            # for less than the grace period still reads Ready, but from before it went off.
            self._renew_lease(name)
            self._post_ready(name)
            return
        self._renew_lease(name)
        self._ensure_ready(name)

    def _renew_lease(self, name: str) -> None:
        now = _now()
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            self.coordination.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": spec})
        except ApiException as error:
            if error.status != 404:
                raise
            node = self.core.read_node(name)
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
            body = {
                "metadata": {"name": name, "ownerReferences": [owner]},
                "spec": spec,
            }
            try:
                self.coordination.create_namespaced_lease(LEASE_NAMESPACE, body)
            except ApiException as conflict:
                if conflict.status != 409:  # made meanwhile: renew it
                    raise
                self.coordination.patch_namespaced_lease(name, LEASE_NAMESPACE, {"spec": spec})

    def _ensure_ready(self, name: str) -> None:
        node = self.core.read_node_status(name)
        ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
        if ready is None or ready.status != "True":
            self._post_ready(name)

    def _post_ready(self, name: str) -> None:
        now = _stamp()
        # The node lifecycle controller set every condition Unknown: a kubelet reports them all.
        conditions = [self._ready_condition(True, now, now)] + [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHas{suffix}",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for kind, suffix in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        self.core.patch_node_status(name, {"status": {"conditions": conditions}})
        log.info("node %s: Ready", name)

    @staticmethod
    def _ready_condition(ready: bool, heartbeat: str, transition: str) -> dict[str, str]:
        return {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "kubelet is posting ready status" if ready else "",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": transition,
        }

    # -- pods -------------------------------------------------------------------------------

    def _pod_loop(self) -> None:
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    listed = self.core.list_pod_for_all_namespaces()
                    with self._lock:
                        self._pods = {p.metadata.uid: p for p in listed.items if self._ours(p)}
                    resource_version = listed.metadata.resource_version
                    self._wake.set()
                self._watch = kubernetes.watch.Watch()
                for event in self._watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=resource_version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                ):
                    if self._stop.is_set():
                        return
                    kind, pod = event["type"], event["object"]
                    if kind == "ERROR":
                        resource_version = None  # 410 Gone: too old, list again
                        break
                    resource_version = pod.metadata.resource_version
                    if kind == "BOOKMARK":
                        continue
                    with self._lock:
                        if kind == "DELETED" or not self._ours(pod):
                            self._pods.pop(pod.metadata.uid, None)
                        else:
                            self._pods[pod.metadata.uid] = pod
                    self._wake.set()
            except ApiException as error:
                if error.status == 410:
                    resource_version = None
                else:
                    self._stop.wait(1.0)
            except Exception:  # connection reset while the API server restarts
                resource_version = None
                self._stop.wait(1.0)

    def _ours(self, pod: Any) -> bool:
        with self._lock:
            return pod.spec.node_name in self._nodes

    def _reconcile_pods(self) -> None:
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            if not self.is_up(pod.spec.node_name):
                continue  # a node without power runs nothing and deletes nothing
            try:
                if pod.metadata.deletion_timestamp is not None:
                    self._finish_deletion(pod)
                elif (pod.status.phase or "Pending") == "Pending":
                    self._run(pod)
                elif (failure := self._failure_of(pod)) is not None:
                    self._fail(pod, failure.mode)
                elif pod.status.phase == "Running" and not _condition_true(pod, "Ready"):
                    # The node lifecycle controller marked it not ready while its node was
                    # unreachable; the kubelet, back, reports its containers ready again.
                    self._mark_ready(pod)
            except ApiException as error:
                if error.status not in (404, 409):
                    log.warning("pod %s: %s", pod.metadata.name, error.reason)
            except Exception as error:
                log.warning("pod %s: %s", pod.metadata.name, error)

    def _mark_ready(self, pod: Any) -> None:
        now = _stamp()
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("ContainersReady", "Ready")
        ]
        self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": {"conditions": conditions}}
        )

    def _finish_deletion(self, pod: Any) -> None:
        self.core.delete_namespaced_pod(
            pod.metadata.name,
            pod.metadata.namespace,
            grace_period_seconds=0,
            body=kubernetes.client.V1DeleteOptions(
                grace_period_seconds=0,
                preconditions=kubernetes.client.V1Preconditions(uid=pod.metadata.uid),
            ),
        )

    def _pod_ip(self, pod: Any) -> str:
        with self._lock:
            node = self._nodes[pod.spec.node_name]
            ip = node.pod_ips.get(pod.metadata.uid)
            if ip is None:
                self._pods_started += 1
                ip = str(POD_CIDR_START + self._pods_started)
                node.pod_ips[pod.metadata.uid] = ip
            return ip

    def _run(self, pod: Any) -> None:
        failure = self._failure_of(pod)
        ready = failure is None
        now = _stamp()
        status: dict[str, Any] = {
            "phase": "Running",
            "podIP": self._pod_ip(pod),
            "podIPs": [{"ip": self._pod_ip(pod)}],
            "hostIP": self._host_ip(pod.spec.node_name),
            "startTime": now,
            "conditions": [
                {"type": kind, "status": "True", "lastTransitionTime": now}
                for kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
            ]
            + [
                {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": now}
                for kind in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": ready,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                }
                for container in pod.spec.containers
            ],
        }
        running = self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )
        if failure is not None:  # from the statuses just written: a container ran, then failed
            self._fail(running, failure.mode)

    def _host_ip(self, node_name: str) -> str:
        with self._lock:
            return self._nodes[node_name].ip

    @staticmethod
    def _node_ip(index: int) -> str:
        return str(NODE_CIDR_START + index)

    def _fail(self, pod: Any, mode: str) -> None:
        """Write the status a kubelet writes for a failing container (once per change)."""
        statuses = pod.status.container_statuses or []
        now = _stamp()
        if mode == "never-ready":
            if all(not s.ready for s in statuses) and statuses:
                return
            containers = [
                {
                    "name": s.name,
                    "image": s.image,
                    "imageID": "",
                    "ready": False,
                    "started": True,
                    "restartCount": s.restart_count or 0,
                    "state": {"running": {"startedAt": now}},
                }
                for s in statuses
            ]
        else:
            if any((s.restart_count or 0) > 0 for s in statuses):
                return
            reason, exit_code = ("OOMKilled", 137) if mode == "oom-killed" else ("Error", 1)
            state = (
                {"running": {"startedAt": now}}
                if mode == "oom-killed"
                else {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}}
            )
            containers = [
                {
                    "name": s.name,
                    "image": s.image,
                    "imageID": "",
                    "ready": mode == "oom-killed",
                    "started": mode == "oom-killed",
                    "restartCount": 1 if mode == "oom-killed" else 4,
                    "state": state,
                    "lastState": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
                for s in statuses
            ]
        ready = "True" if mode == "oom-killed" else "False"
        conditions = [
            {"type": kind, "status": ready, "lastTransitionTime": now}
            for kind in ("ContainersReady", "Ready")
        ]
        self.core.patch_namespaced_pod_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {"status": {"conditions": conditions, "containerStatuses": containers}},
        )
