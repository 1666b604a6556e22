"""A small cluster for node power controller tests: nodes, pods and budgets in the fake API.

Objects look as a real cluster's do (allocatable resources, a Ready condition, pods owned by
ReplicaSets and Running, budgets whose status the disruption controller would have written),
and `FakeKubelet` plays the kubelets of nodes whose power a BMC emulator switches: a node
whose system is on reports Ready with a fresh heartbeat, one that is off goes Unknown, as the
node lifecycle controller marks it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from controllers.node_power.actuator import ActuatorSettings
from controllers.node_power.controller import ControllerSettings, NodePowerController
from controllers.node_power.drivers import BmcSecret
from controllers.node_power.policy import PolicySettings
from livedata.labels import (
    POWER_DRIVER_LABEL,
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    POWER_STATE_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
)
from tests.support.fake_kube import FakeKube

NAMESPACE = "power-aware-scheduler"
SCHEDULER = "power-aware-scheduler"


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


def wait_until(check: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


def started_controller(
    kube: FakeKube, controller_settings: ControllerSettings, *, secret: BmcSecret | None = None
) -> NodePowerController:
    controller = NodePowerController(controller_settings, kube.api_client(), secret=secret)
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


class FakeKubelet:
    """Sets each node's Ready condition from its BMC's power state, as kubelets would."""

    def __init__(self, kube: FakeKube, power_of: Callable[[str], str]) -> None:
        self.kube = kube
        self.power_of = power_of  # node -> "on" / "off"
        self._stop = threading.Event()

    def sync(self, now_s: float | None = None) -> None:
        """Report each node as its BMC says, at `now_s` (the test's clock; default now)."""
        for obj in self.kube.objects("nodes"):
            name = obj["metadata"]["name"]
            on = self.power_of(name) == "on"
            (ready,) = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
            now = stamp(time.time() if now_s is None else now_s)
            status = "True" if on else "Unknown"
            if ready["status"] == status and not on:
                continue  # nobody updates a dead node's heartbeat
            changed = {"status": status, "lastHeartbeatTime": now}
            if ready["status"] != status:
                changed["lastTransitionTime"] = now
            conditions = [{**ready, **changed}]
            self.kube.patch(
                "nodes", name, {"status": {"conditions": conditions}}, subresource="status"
            )
