"""Clusters for node power controller tests: the real control plane, and plain objects.

`PowerCluster` builds one test's cluster on the session's real control plane (envtest/):
nodes registered by `envtest.NodeAgent` whose kubelets follow their BMC's power, pods of real
Deployments and DaemonSets run by the agent, PodDisruptionBudgets whose status the real
disruption controller computes; `controller_api_client` is the controller's own ServiceAccount.

`node`, `pod` and `budget` are plain API objects as a real cluster has them, for the pure
functions of `controllers.node_power.views`; `make_kube` puts them into the project's fake
API server, for the one controller test of faults a real server cannot make (410 Gone on
demand, HTTP 500 on every call).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from bench.support.power_controller import CONTROLLER_ACCOUNT, NAMESPACE, SCHEDULER, wait_until
from controllers.node_power.actuator import ActuatorSettings
from controllers.node_power.controller import ControllerSettings, NodePowerController
from controllers.node_power.drivers import BmcSecret
from controllers.node_power.policy import PolicySettings
from envtest import ControlPlane, NodeAgent
from livedata.labels import (
    POWER_DRIVER_LABEL,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_STATE_ANNOTATION,
    POWER_STATE_REASON_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
)
from tests.support.fake_kube import FakeKube


def stamp(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(
    name: str,
    *,
    cores: int = 16,
    managed: bool = True,
    driver: str | None = "dry-run",
    ready: bool = True,
    state: str | None = None,
    since_s: float | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if managed:
        labels[POWER_MANAGEMENT_LABEL] = POWER_MANAGEMENT_ENABLED
    if driver:
        labels[POWER_DRIVER_LABEL] = driver
    annotations = {}
    if state is not None:
        annotations[POWER_STATE_ANNOTATION] = state
        annotations[POWER_STATE_SINCE_ANNOTATION] = stamp(since_s or time.time() - 7200)
    now = stamp(time.time())
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": str(cores), "memory": "64Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "Unknown",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
        },
    }


def pod(
    name: str,
    node_name: str | None,
    cpu: str,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    pending: bool = False,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels or {"app": name.rsplit("-", 1)[0]},
        "annotations": annotations or {},
    }
    if owner:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner,
                "name": f"{name}-owner",
                "uid": f"uid-{name}-owner",
                "controller": True,
            }
        ]
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [{"name": "app", "image": "app", "resources": {"requests": {"cpu": cpu}}}],
        "volumes": volumes or [],
    }
    if node_name:
        spec["nodeName"] = node_name
    if pending:
        status = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/5 nodes are available",
                }
            ],
        }
    else:
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return {"metadata": metadata, "spec": spec, "status": status}


def budget(name: str, labels: dict[str, str], allowed: int, *, namespace: str = "default") -> dict:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": 1 + allowed,
            "desiredHealthy": 1,
            "expectedPods": 1 + allowed,
        },
    }


def make_kube(nodes: Iterable[dict], pods: Iterable[dict] = (), budgets: Iterable[dict] = ()):
    kube = FakeKube(namespaces=("default", "kube-system", NAMESPACE)).start()
    for obj in nodes:
        kube.create("nodes", obj)
    for obj in pods:
        kube.create("pods", obj, obj["metadata"]["namespace"])
    for obj in budgets:
        kube.create("poddisruptionbudgets", obj, obj["metadata"]["namespace"])
    return kube


def settings(**overrides: Any) -> ControllerSettings:
    """Test settings: acting, quick to decide, no cool-down unless asked."""
    policy = overrides.pop("policy", None) or PolicySettings(
        unneeded_time_s=0.0,
        cooldown_s=0.0,
        min_on_nodes=1,
        max_off_fraction=1.0,
        boot_s=0.0,
    )
    actuator = overrides.pop("actuator", None) or ActuatorSettings(
        bmc_timeout_s=5.0, retry_backoff_s=60.0, max_retry_backoff_s=1800.0
    )
    return ControllerSettings(
        policy=policy,
        actuator=actuator,
        apply=overrides.pop("apply", True),
        namespace=NAMESPACE,
        scheduler_name=SCHEDULER,
        max_drain_parallelism=overrides.pop("max_drain_parallelism", 5),
        **overrides,
    )


def _uids(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


def started_controller(
    kube: FakeKube | client.ApiClient,
    controller_settings: ControllerSettings,
    *,
    secret: BmcSecret | None = None,
) -> NodePowerController:
    """A controller whose caches have synced, on the fake API server or a real one's client."""
    api_client = kube.api_client() if isinstance(kube, FakeKube) else kube
    controller = NodePowerController(controller_settings, api_client, secret=secret)
    controller.start()
    wait_until(lambda: controller.synced, what="caches synced")
    return controller


def caught_up(controller: NodePowerController, kube: FakeKube) -> None:
    """Wait until the controller's caches hold what the API server holds (names and versions)."""

    def versions(objects: Iterable[dict]) -> set[tuple[str, str]]:
        return {
            (
                o["metadata"].get("namespace", "") + "/" + o["metadata"]["name"],
                o["metadata"]["resourceVersion"],
            )
            for o in objects
        }

    def same() -> bool:
        return (
            versions(controller.nodes.items()) == versions(kube.objects("nodes"))
            and versions(controller.pods.items()) == versions(kube.objects("pods"))
            and versions(controller.budgets.items())
            == versions(kube.objects("poddisruptionbudgets"))
        )

    wait_until(same, what="controller caches caught up with the API server")


# ---- the real control plane ---------------------------------------------------------------

HTTP_CONFLICT = 409
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
CLUSTER_LABEL = "power-test/cluster"  # on every node of one test; its workloads select it


def controller_api_client(plane: ControlPlane) -> client.ApiClient:
    """A client of the real API server as the controller's own ServiceAccount (its RBAC)."""
    return plane.api_client(plane.service_account_kubeconfig(*CONTROLLER_ACCOUNT))


def as_json(api_client: client.ApiClient, obj: Any) -> dict[str, Any]:
    """An official-client model as the JSON the API server sent (camelCase keys)."""
    return api_client.sanitize_for_serialization(obj)


class PowerCluster:
    """One test's nodes, workloads and budgets on the session's real control plane.

    Nodes are registered by `envtest.NodeAgent`, whose kubelets follow each node's BMC
    (`add_node(power=...)`): a node its BMC powered off stops heartbeating and the real node
    lifecycle controller marks it NotReady; powered on, it boots and turns Ready. Pods come
    from real Deployments and DaemonSets (the real controllers and schedulers), run by the
    agent; budgets' status is the real disruption controller's. Node names are prefixed with
    the test's namespace (`name("keep")`), and every workload selects this test's nodes only.
    `close()` deletes the workloads (waiting until their pods are gone), then the nodes.
    """

    def __init__(self, plane: ControlPlane, namespace: str, *, heartbeat_s: float = 0.5) -> None:
        self.plane = plane
        self.namespace = namespace
        self.admin = plane.api_client()
        self.core = client.CoreV1Api(self.admin)
        self.apps = client.AppsV1Api(self.admin)
        self.policy = client.PolicyV1Api(self.admin)
        self._power: dict[str, Callable[[], Any]] = {}
        self.agent = NodeAgent(self.admin, power_of=self._power_of, heartbeat_s=heartbeat_s)
        self.agent.start()

    # ---- names and reads -------------------------------------------------------------------

    def name(self, short: str) -> str:
        return f"{self.namespace}-{short}"

    def short(self, name: str) -> str:
        return name.removeprefix(f"{self.namespace}-")

    def _power_of(self, node: str) -> Any:
        power = self._power.get(node)
        return "on" if power is None else power()

    def node(self, short: str) -> dict[str, Any]:
        return as_json(self.admin, self.core.read_node(self.name(short)))

    def state_of(self, short: str) -> tuple[str | None, bool, str]:
        """(recorded power state, cordoned, reason) of a node as the API server holds it."""
        obj = self.node(short)
        annotations = obj["metadata"].get("annotations") or {}
        return (
            annotations.get(POWER_STATE_ANNOTATION),
            bool(obj["spec"].get("unschedulable")),
            annotations.get(POWER_STATE_REASON_ANNOTATION, ""),
        )

    def ready(self, short: str) -> bool:
        conditions = self.node(short)["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pods(self, app: str | None = None) -> list[dict[str, Any]]:
        """This test's pods (of one app), as the API server holds them, by name."""
        selector = f"app={app}" if app else None
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return sorted(
            (as_json(self.admin, p) for p in listed.items), key=lambda p: p["metadata"]["name"]
        )

    def running(self, app: str | None = None) -> list[dict[str, Any]]:
        """Pods Running and Ready, not being deleted."""
        return [
            p
            for p in self.pods(app)
            if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions") or []
            )
        ]

    def uids(self) -> set[str]:
        """The uids of this test's pods (a pod evicted and replaced is a new uid)."""
        return {p["metadata"]["uid"] for p in self.pods()}

    def nodes_of(self, app: str) -> list[str]:
        return sorted(self.short(p["spec"]["nodeName"]) for p in self.running(app))

    # ---- nodes -----------------------------------------------------------------------------

    def add_node(
        self,
        short: str,
        *,
        cores: int = 16,
        managed: bool = True,
        driver: str | None = "dry-run",
        state: str | None = None,
        since_s: float | None = None,
        unschedulable: bool = False,
        power: Callable[[], Any] | None = None,
        boot_s: float = 0.0,
        annotations: dict[str, str] | None = None,
    ) -> str:
        """Register a node (its kubelet follows `power()`, "on"/"off"; always on without)."""
        name = self.name(short)
        labels = {CLUSTER_LABEL: self.namespace}
        if managed:
            labels[POWER_MANAGEMENT_LABEL] = POWER_MANAGEMENT_ENABLED
        if driver:
            labels[POWER_DRIVER_LABEL] = driver
        notes = dict(annotations or {})
        if state is not None:
            notes[POWER_STATE_ANNOTATION] = state
            notes[POWER_STATE_SINCE_ANNOTATION] = stamp(since_s or time.time() - 7200)
        if power is not None:
            self._power[name] = power
        try:
            self.agent.add_node(name, cpu=cores, labels=labels, annotations=notes, boot_s=boot_s)
        except ApiException as error:
            # NodeAgent registers the node, then creates its Lease; its heartbeat thread may have
            # created the Lease in between (409). The node and its Lease exist: carry on.
            if error.status != HTTP_CONFLICT:
                raise
        if unschedulable:
            self.cordon(short)
        return name

    def cordon(self, short: str, unschedulable: bool = True) -> None:
        self.core.patch_node(self.name(short), {"spec": {"unschedulable": unschedulable}})

    def wait_ready(self, *shorts: str, timeout_s: float = 30.0) -> None:
        """Ready, and the not-ready taint the API server gives new nodes lifted."""

        def all_ready() -> bool:
            for short in shorts:
                node = self.node(short)
                # A cordoned node keeps the unschedulable taint: that one is expected.
                taints = [
                    t for t in node["spec"].get("taints") or [] if t["key"] != UNSCHEDULABLE_TAINT
                ]
                if not self.ready(short) or taints:
                    return False
            return True

        wait_until(all_ready, timeout_s, f"nodes {', '.join(shorts)} Ready and untainted")

    def wait_not_ready(self, *shorts: str) -> None:
        """The real node lifecycle controller marks nodes that stopped heartbeating NotReady
        (within its grace period)."""
        wait_until(
            lambda: not any(self.ready(s) for s in shorts),
            self.plane.node_monitor_grace_s + 30,
            f"nodes {', '.join(shorts)} NotReady",
        )

    # ---- workloads -------------------------------------------------------------------------

    def _template(
        self,
        app: str,
        cpu: str,
        *,
        scheduler: str,
        annotations: dict[str, str] | None,
        finalizers: list[str] | None,
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"labels": {"app": app}, "annotations": annotations or {}}
        if finalizers:
            metadata["finalizers"] = finalizers
        return {
            "metadata": metadata,
            "spec": {
                "schedulerName": scheduler,
                "nodeSelector": {CLUSTER_LABEL: self.namespace},
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {"name": "app", "image": "app", "resources": {"requests": {"cpu": cpu}}}
                ],
            },
        }

    def deployment(
        self,
        app: str,
        cpu: str,
        replicas: int = 1,
        *,
        on: str | None = None,
        scheduler: str = SCHEDULER,
        annotations: dict[str, str] | None = None,
        finalizers: list[str] | None = None,
    ) -> None:
        """A Deployment of `replicas` pods asking for `cpu`; with `on`, its pods are placed on
        that node (the others cordoned meanwhile) and waited for Running."""
        body = {
            "metadata": {"name": app},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": app}},
                "template": self._template(
                    app, cpu, scheduler=scheduler, annotations=annotations, finalizers=finalizers
                ),
            },
        }
        with self._only(on):
            self.apps.create_namespaced_deployment(self.namespace, body)
            if on is not None:
                self._place_on(app, replicas, on)

    def _place_on(self, app: str, replicas: int, on: str) -> None:
        """Wait for `replicas` pods of `app` running on `on`. The scheduler reads cordons from
        its informer cache: a pod created just after the others were cordoned can still land on
        one of them (seen on a loaded CI machine), so a misplaced pod is deleted for its
        ReplicaSet to replace, a few times, before the setup gives up saying where they ran."""
        for _attempt in range(3):
            wait_until(
                lambda: len(self.running(app)) == replicas,
                30,
                f"{replicas} pod(s) of {app} running on {on}",
            )
            misplaced = [p for p in self.running(app) if self.short(p["spec"]["nodeName"]) != on]
            if not misplaced:
                return
            for pod in misplaced:
                self.core.delete_namespaced_pod(
                    pod["metadata"]["name"], self.namespace, grace_period_seconds=0
                )
            gone = _uids(misplaced)
            wait_until(
                lambda gone=gone: not gone & _uids(self.pods(app)),
                30,
                f"misplaced pods of {app} gone",
            )
        raise AssertionError(f"pods of {app} run on {self.nodes_of(app)}, not only on {on}")

    def daemon_set(self, app: str, cpu: str, *, on: str) -> None:
        """A DaemonSet whose one pod runs on node `on`."""
        template = self._template(app, cpu, scheduler=SCHEDULER, annotations=None, finalizers=None)
        template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.name(on)}
        body = {
            "metadata": {"name": app},
            "spec": {"selector": {"matchLabels": {"app": app}}, "template": template},
        }
        self.apps.create_namespaced_daemon_set(self.namespace, body)
        wait_until(lambda: self.nodes_of(app) == [on], 30, f"DaemonSet {app} running on {on}")

    @contextlib.contextmanager
    def _only(self, short: str | None) -> Iterator[None]:
        """Every other schedulable node of this test cordoned for the duration."""
        if short is None:
            yield
            return
        others = [
            self.short(n)
            for n in self.agent.node_names
            if n != self.name(short) and not self.node(self.short(n))["spec"].get("unschedulable")
        ]
        for other in others:
            self.cordon(other)
        try:
            yield
        finally:
            for other in others:
                self.cordon(other, False)

    def wait_unschedulable(self, app: str, count: int) -> None:
        """The scheduler has marked `count` pods of `app` PodScheduled=False, Unschedulable."""

        def marked() -> bool:
            pods = [
                p
                for p in self.pods(app)
                if any(
                    c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                    for c in p["status"].get("conditions") or []
                )
            ]
            return len(pods) == count

        wait_until(marked, 30, f"{count} pod(s) of {app} Unschedulable")

    def budget(self, name: str, app: str, *, max_unavailable: int) -> None:
        """A PodDisruptionBudget over `app`, waited for until the disruption controller has
        computed its status."""
        body = {
            "metadata": {"name": name},
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}},
        }
        self.policy.create_namespaced_pod_disruption_budget(self.namespace, body)
        self.wait_budget(name)

    def set_budget(self, name: str, *, max_unavailable: int) -> None:
        self.policy.patch_namespaced_pod_disruption_budget(
            name, self.namespace, {"spec": {"maxUnavailable": max_unavailable}}
        )
        self.wait_budget(name)

    def wait_budget(self, name: str) -> dict[str, Any]:
        def processed() -> dict[str, Any] | None:
            budget = as_json(
                self.admin, self.policy.read_namespaced_pod_disruption_budget(name, self.namespace)
            )
            status = budget.get("status") or {}
            generation = budget["metadata"].get("generation")
            return budget if status.get("observedGeneration") == generation else None

        return wait_until(processed, 30, f"budget {name} processed")

    # ---- the controller --------------------------------------------------------------------

    def caught_up(self, controller: NodePowerController) -> None:
        """Wait until the controller's caches hold what the API server holds."""

        def versions(objects: Iterable[Any]) -> set[tuple[str, str]]:
            keys = set()
            for obj in objects:
                metadata = obj["metadata"] if isinstance(obj, dict) else None
                if metadata is None:
                    metadata = as_json(self.admin, obj)["metadata"]
                keys.add(
                    (
                        metadata.get("namespace", "") + "/" + metadata["name"],
                        metadata["resourceVersion"],
                    )
                )
            return keys

        def same() -> bool:
            return (
                versions(controller.nodes.items()) == versions(self.core.list_node().items)
                and versions(controller.pods.items())
                == versions(self.core.list_pod_for_all_namespaces().items)
                and versions(controller.budgets.items())
                == versions(self.policy.list_pod_disruption_budget_for_all_namespaces().items)
            )

        wait_until(same, what="controller caches caught up with the API server")

    # ---- the end ---------------------------------------------------------------------------

    def __enter__(self) -> PowerCluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Delete the workloads and wait for their pods to go (the agent finishes them), then
        stop the agent and delete the nodes."""
        try:
            for deployment in self.apps.list_namespaced_deployment(self.namespace).items:
                self.apps.delete_namespaced_deployment(deployment.metadata.name, self.namespace)
            for daemon_set in self.apps.list_namespaced_daemon_set(self.namespace).items:
                self.apps.delete_namespaced_daemon_set(daemon_set.metadata.name, self.namespace)
            for pod in self.pods():
                if pod["metadata"].get("finalizers"):
                    self.core.patch_namespaced_pod(
                        pod["metadata"]["name"], self.namespace, {"metadata": {"finalizers": None}}
                    )
            for name in self.agent.node_names:  # pods on a node that is off go with the node
                self._power.pop(name, None)
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not self.pods(), 30, "the test's pods gone")
        finally:
            self.agent.stop()
            for name in self.agent.node_names:
                self.agent.remove_node(name)
