"""Pod JSON as the API server and the kubelet write it, at the moments the reward source reads.

A pod of a Deployment goes through these shapes (what `kubectl get pod -o json` shows):
bound and still creating its container (`bound_pod`), running and ready (`running_pod`), a
container that crashed and waits in CrashLoopBackOff (`crash_looping_pod`), a container that
cannot start (`waiting_pod`: ImagePullBackOff, CreateContainerConfigError...), and the end:
Succeeded (`succeeded_pod`) or Failed, evicted or not (`failed_pod`). Times are Unix seconds,
written as RFC 3339 like the API server does (second precision, `Z`). The simulator feeds
these to the extender's reward source as its pod watch would; the tests use them beside
literal fixtures captured in the same shape.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

JsonObject = dict[str, Any]
CONTAINER = "app"
IMAGE = "registry.example/app:1.4.2"


def rfc3339(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def deployment_pod_metadata(
    name: str, uid: str, deployment: str, template_hash: str, namespace: str = "default"
) -> JsonObject:
    """Metadata of a pod a Deployment's ReplicaSet created."""
    return {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "labels": {"app": deployment, "pod-template-hash": template_hash},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{deployment}-{template_hash}",
                "uid": f"rs-{deployment}-{template_hash}",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def bound_pod(metadata: JsonObject, node: str, *, at_s: float) -> JsonObject:
    """Just bound to `node`: Pending, PodScheduled, the container being created."""
    return {
        "metadata": copy.deepcopy(metadata),
        "spec": {
            "nodeName": node,
            "schedulerName": "power-aware-scheduler",
            "restartPolicy": "Always",
            "containers": [{"name": CONTAINER, "image": IMAGE}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                _condition("PodReadyToStartContainers", "False", at_s),
                _condition("Initialized", "True", at_s),
                _condition("Ready", "False", at_s, "ContainersNotReady"),
                _condition("ContainersReady", "False", at_s, "ContainersNotReady"),
                _condition("PodScheduled", "True", at_s),
            ],
            "hostIP": "10.0.0.7",
            "startTime": rfc3339(at_s),
            "containerStatuses": [
                _container({"waiting": {"reason": "ContainerCreating"}}, ready=False, restarts=0)
            ],
            "qosClass": "Burstable",
        },
    }


def running_pod(
    pod: JsonObject,
    *,
    started_at_s: float,
    ready: bool = True,
    ready_changed_at_s: float | None = None,
    restarts: int = 0,
    last_terminated: JsonObject | None = None,
) -> JsonObject:
    """Its container running since `started_at_s`, Ready (or not) since `ready_changed_at_s`."""
    changed_s = started_at_s if ready_changed_at_s is None else ready_changed_at_s
    status = _status(pod, "Running")
    flag = "True" if ready else "False"
    reason = None if ready else "ContainersNotReady"
    _set_condition(status, "PodReadyToStartContainers", "True", started_at_s)
    _set_condition(status, "Ready", flag, changed_s, reason)
    _set_condition(status, "ContainersReady", flag, changed_s, reason)
    status["podIP"] = "10.244.3.17"
    status["containerStatuses"] = [
        _container(
            {"running": {"startedAt": rfc3339(started_at_s)}},
            ready=ready,
            restarts=restarts,
            last_state={"terminated": last_terminated} if last_terminated else {},
            started=True,
        )
    ]
    return _with_status(pod, status)


def terminated(
    reason: str, exit_code: int, started_at_s: float, finished_at_s: float
) -> JsonObject:
    """A container's `terminated` state (as in lastState.terminated)."""
    return {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": rfc3339(started_at_s),
        "finishedAt": rfc3339(finished_at_s),
        "containerID": "containerd://4f0c0d2b9a3e",
    }


def crash_looping_pod(
    pod: JsonObject,
    *,
    restarts: int,
    reason: str,
    exit_code: int,
    finished_at_s: float,
    started_at_s: float,
) -> JsonObject:
    """The container crashed (`reason`) and waits in CrashLoopBackOff to be restarted."""
    status = _status(pod, "Running")
    _set_condition(status, "Ready", "False", finished_at_s, "ContainersNotReady")
    _set_condition(status, "ContainersReady", "False", finished_at_s, "ContainersNotReady")
    backoff_s = min(10 * 2 ** max(restarts - 1, 0), 300)
    status["containerStatuses"] = [
        _container(
            {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff_s}s restarting failed container={CONTAINER}",
                }
            },
            ready=False,
            restarts=restarts,
            last_state={"terminated": terminated(reason, exit_code, started_at_s, finished_at_s)},
        )
    ]
    return _with_status(pod, status)


def waiting_pod(pod: JsonObject, reason: str, message: str) -> JsonObject:
    """Pending with the container waiting for `reason` (ImagePullBackOff, ...)."""
    status = _status(pod, "Pending")
    status["containerStatuses"] = [
        _container({"waiting": {"reason": reason, "message": message}}, ready=False, restarts=0)
    ]
    return _with_status(pod, status)


def succeeded_pod(pod: JsonObject, *, started_at_s: float, finished_at_s: float) -> JsonObject:
    status = _status(pod, "Succeeded")
    _set_condition(status, "Ready", "False", finished_at_s, "PodCompleted")
    _set_condition(status, "ContainersReady", "False", finished_at_s, "PodCompleted")
    status["containerStatuses"] = [
        _container(
            {"terminated": terminated("Completed", 0, started_at_s, finished_at_s)},
            ready=False,
            restarts=_restarts(pod),
        )
    ]
    return _with_status(pod, status)


def failed_pod(
    pod: JsonObject,
    *,
    started_at_s: float,
    finished_at_s: float,
    container_reason: str = "Error",
    exit_code: int = 1,
    reason: str | None = None,
    message: str | None = None,
    disruption: str | None = None,
) -> JsonObject:
    """Failed: the container ended (`container_reason`); `reason` Evicted for an eviction;
    `disruption` the DisruptionTarget condition's reason (TerminationByKubelet, ...)."""
    status = _status(pod, "Failed")
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    if disruption is not None:
        _set_condition(status, "DisruptionTarget", "True", finished_at_s, disruption, message)
    _set_condition(status, "Ready", "False", finished_at_s, "PodFailed")
    _set_condition(status, "ContainersReady", "False", finished_at_s, "PodFailed")
    status["containerStatuses"] = [
        _container(
            {"terminated": terminated(container_reason, exit_code, started_at_s, finished_at_s)},
            ready=False,
            restarts=_restarts(pod),
        )
    ]
    return _with_status(pod, status)


# ---- internals ----------------------------------------------------------------------------------


def _condition(
    kind: str, status: str, at_s: float, reason: str | None = None, message: str | None = None
) -> JsonObject:
    condition: JsonObject = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(at_s),
    }
    if reason is not None:
        condition["reason"] = reason
    if message is not None:
        condition["message"] = message
    return condition


def _set_condition(
    status: JsonObject,
    kind: str,
    value: str,
    at_s: float,
    reason: str | None = None,
    message: str | None = None,
) -> None:
    conditions = status.setdefault("conditions", [])
    for i, condition in enumerate(conditions):
        if condition["type"] == kind:
            if condition["status"] != value:  # the transition time moves only on a change
                conditions[i] = _condition(kind, value, at_s, reason, message)
            return
    conditions.append(_condition(kind, value, at_s, reason, message))


def _container(
    state: JsonObject,
    *,
    ready: bool,
    restarts: int,
    last_state: JsonObject | None = None,
    started: bool = False,
) -> JsonObject:
    return {
        "name": CONTAINER,
        "state": state,
        "lastState": last_state or {},
        "ready": ready,
        "restartCount": restarts,
        "image": IMAGE,
        "imageID": "registry.example/app@sha256:9b1f0e3c",
        "containerID": "containerd://4f0c0d2b9a3e",
        "started": started,
    }


def _status(pod: JsonObject, phase: str) -> JsonObject:
    status = copy.deepcopy(pod.get("status") or {})
    status["phase"] = phase
    return status


def _with_status(pod: JsonObject, status: JsonObject) -> JsonObject:
    updated = copy.deepcopy(pod)
    updated["status"] = status
    return updated


def _restarts(pod: JsonObject) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount") or 0)
