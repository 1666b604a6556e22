"""The node power controller as it ships, for end-to-end tests: a subprocess and its log.

`python -m controllers.node_power --apply` runs as a subprocess
(`bench.support.power_controller`), as its ServiceAccount power-aware-scheduler/
power-node-controller (the manifests' RBAC), with short timings (`TIMINGS`), against the
session's real control plane. Each process has a name: its Lease
identity and its log file (stdout and stderr) in the test's directory, so that two replicas
can run side by side and be told apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.support.bmc import RedfishEmulator
from bench.support.power_controller import PASSWORD, secret_dir, wait_for
from bench.support.power_controller import ControllerProcess as SharedControllerProcess
from envtest import ControlPlane
from tests.support.power_cluster import NAMESPACE, PowerCluster

# The shared helpers the end-to-end tests take from here, with the tests' own.
__all__ = [
    "PASSWORD",
    "ControllerProcess",
    "acted",
    "all_replicas_running",
    "consistent",
    "controller_running",
    "half_drained",
    "keep_and_slow_drain",
    "power_cluster",
    "redfish_nodes",
    "release_finalizer",
    "secret_dir",
    "wait_for",
]

LEASE = "power-node-controller"
BOOT_S = 2.0
LEASE_DURATION_S = 4.0
FINALIZER = "power-test.example.com/hold"  # holds an evicted pod Terminating: a slow drain
# What only an acting replica writes in its log.
ACTING = ("evicted ", "drain and power off node", "power off requested", ": off")
RETRY_PERIOD_S = 1.0
# Short timings: a node is unneeded after 2 s, rounds every second, boots in 2 s.
TIMINGS = [
    "--scan-interval=1s",
    "--scale-down-unneeded-time=2s",
    "--node-cooldown=0s",
    f"--boot-time={BOOT_S:g}s",
    "--off-margin-sd=0",
    "--drain-timeout=60s",
    "--max-graceful-termination-sec=5",
    "--shutdown-timeout=20s",
    "--wake-timeout=90s",
    "--retry-backoff=5s",
    "--max-retry-backoff=20s",
    "--bmc-timeout=5s",
    "--api-timeout=5s",
    f"--leader-elect-lease-duration={LEASE_DURATION_S:g}s",
    "--leader-elect-renew-deadline=3s",
    f"--leader-elect-retry-period={RETRY_PERIOD_S:g}s",
]


class ControllerProcess(SharedControllerProcess):
    """`bench.support.power_controller.ControllerProcess` with the tests' short `TIMINGS`
    first (later flags win over them)."""

    def __init__(
        self,
        plane: ControlPlane,
        tmp_path: Path,
        secret_dir: Path,
        *flags: str,
        name: str = "e2e-controller",
    ) -> None:
        super().__init__(plane, tmp_path, secret_dir, *TIMINGS, *flags, name=name)


@contextlib.contextmanager
def controller_running(
    plane: ControlPlane, tmp_path: Path, secret_dir: Path, *flags: str, name: str = "e2e-controller"
) -> Iterator[ControllerProcess]:
    controller = ControllerProcess(plane, tmp_path, secret_dir, *flags, name=name)
    try:
        yield controller
    except BaseException:
        print(f"---- {name} log ({controller.log}) ----\n{controller.tail(80)}")
        raise
    finally:
        controller.stop()


def all_replicas_running(cluster: PowerCluster, *, ready: bool = True) -> bool:
    """Every Deployment of the test has all its replicas Running (and Ready, with `ready`)."""
    deployments = cluster.apps.list_namespaced_deployment(cluster.namespace).items
    if not ready:
        return all(
            sum(
                p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                for p in cluster.pods(d.metadata.name)
            )
            == d.spec.replicas
            for d in deployments
        )
    return all(
        len(cluster.running(d.metadata.name)) == d.spec.replicas
        and (d.status.ready_replicas or 0) == d.spec.replicas
        for d in deployments
    )


@contextlib.contextmanager
def power_cluster(plane: ControlPlane, namespace: str) -> Iterator[PowerCluster]:
    """A test's `PowerCluster`; closed after, and the controllers' Lease deleted."""
    cluster = PowerCluster(plane, namespace)
    try:
        yield cluster
    finally:
        cluster.close()
        with contextlib.suppress(client.ApiException):
            client.CoordinationV1Api(cluster.admin).delete_namespaced_lease(LEASE, NAMESPACE)


def acted(controller: ControllerProcess) -> list[str]:
    """The lines of its log that only an acting replica writes."""
    return [line for line in controller.lines() if any(word in line for word in ACTING)]


@contextlib.contextmanager
def redfish_nodes(
    cluster: PowerCluster, tmp_path: Path, shorts: list[str], *, cores: int = 16
) -> Iterator[RedfishEmulator]:
    """Nodes `shorts`, Ready, behind one sushy-tools Redfish emulator whose power their
    kubelets follow; the emulator."""
    names = [cluster.name(s) for s in shorts]
    with RedfishEmulator(tmp_path / "redfish", names, auth=("admin", PASSWORD)) as bmc:
        for short, name in zip(shorts, names, strict=True):
            cluster.add_node(
                short,
                cores=cores,
                driver="redfish",
                power=lambda name=name: bmc.power_state(name).lower(),
                boot_s=BOOT_S,
            )
        cluster.wait_ready(*shorts)
        yield bmc


# ---- a slow drain ----------------------------------------------------------------------------


def keep_and_slow_drain(cluster: PowerCluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Node keep busy (10 cores of 16), node slow with two light pods that fit on keep: web,
    which goes at once when evicted, and held, whose finalizer keeps it Terminating until
    `release_finalizer`: a slow drain. (web, held)."""
    cluster.deployment("big", "10", on="keep", scheduler="default-scheduler")
    cluster.deployment("web", "1", on="slow", scheduler="default-scheduler")
    cluster.deployment(
        "held", "1", on="slow", scheduler="default-scheduler", finalizers=[FINALIZER]
    )
    (web,) = cluster.pods("web")
    (held,) = cluster.pods("held")
    return web, held


def half_drained(cluster: PowerCluster, web: dict[str, Any], held: dict[str, Any]) -> bool:
    """The node of `web` and `held` cordoned and recorded draining, web evicted and gone, held
    evicted but still Terminating."""
    pods = {p["metadata"]["uid"]: p for p in cluster.pods()}
    still = pods.get(held["metadata"]["uid"])
    return (
        cluster.state_of(cluster.short(held["spec"]["nodeName"]))[:2] == ("draining", True)
        and web["metadata"]["uid"] not in pods
        and still is not None
        and bool(still["metadata"].get("deletionTimestamp"))
    )


def release_finalizer(cluster: PowerCluster, app: str) -> None:
    for pod in cluster.pods(app):
        cluster.core.patch_namespaced_pod(
            pod["metadata"]["name"], cluster.namespace, {"metadata": {"finalizers": None}}
        )


def consistent(cluster: PowerCluster, bmc: RedfishEmulator, short: str) -> str | None:
    """The node's end state when its record, cordon and BMC agree ("off" or "on"), else None
    (draining, or a record that the BMC or the cordon contradicts)."""
    state, cordoned, _ = cluster.state_of(short)
    power = bmc.power_state(cluster.name(short))
    if state == "off" and cordoned and power == "Off":
        return "off"
    if state in (None, "on") and not cordoned and power == "On":
        return "on"
    return None
