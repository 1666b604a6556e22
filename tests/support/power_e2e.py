"""The node power controller as it ships, for end-to-end tests: a subprocess and its log.

`python -m controllers.node_power --apply` runs as a subprocess, as its ServiceAccount
power-aware-scheduler/power-node-controller (the manifests' RBAC), with short timings
(`TIMINGS`), against the session's real control plane. Each process has a name: its Lease
identity and its log file (stdout and stderr) in the test's directory, so that two replicas
can run side by side and be told apart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from envtest import ControlPlane
from tests.support.bmc import RedfishEmulator
from tests.support.power_cluster import (
    CONTROLLER_ACCOUNT,
    NAMESPACE,
    SCHEDULER,
    PowerCluster,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "bmc-password-for-e2e"
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


class ControllerProcess:
    """`python -m controllers.node_power --apply ...` in a subprocess, its log in a file.

    Later flags win over `TIMINGS` (argparse keeps the last value of a flag)."""

    def __init__(
        self,
        plane: ControlPlane,
        tmp_path: Path,
        secret_dir: Path,
        *flags: str,
        name: str = "e2e-controller",
    ) -> None:
        self.name = name
        self.log = tmp_path / f"{name}.log"
        kubeconfig = plane.service_account_kubeconfig(
            *CONTROLLER_ACCOUNT, tmp_path / f"{name}.kubeconfig"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.argv = [
            sys.executable,
            "-m",
            "controllers.node_power",
            "--apply",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--scheduler-name={SCHEDULER}",
            f"--bmc-secret-dir={secret_dir}",
            f"--identity={name}",
            *TIMINGS,
            *flags,
        ]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.lines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
            )

    def leading(self) -> bool:
        """Whether its log says it leads now (it started leading and has not stopped since)."""
        state = False
        for line in self.lines():
            if f"{self.name} started leading" in line:
                state = True
            elif "stopped leading" in line:
                state = False
        return state

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, the Lease is left to expire."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


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


def wait_for(
    controller: ControllerProcess, check: Callable[[], object], timeout_s: float, what: str
) -> object:
    """`wait_until`, failing at once with the controller's log if it died."""

    def checked() -> object:
        controller.check_alive()
        return check()

    return wait_until(checked, timeout_s, what)


def secret_dir(tmp_path: Path, addresses: dict[str, str], **extra: str) -> Path:
    """The BMC Secret as kubelet mounts it: one key per node, and `_defaults`."""
    directory = tmp_path / "bmc-secret"
    directory.mkdir()
    for node, address in addresses.items():
        lines = [f"address: {address}"] + [f"{k}: {v}" for k, v in extra.items()]
        (directory / node).write_text("\n".join(lines) + "\n")
    (directory / "_defaults").write_text(f"username: admin\npassword: {PASSWORD}\n")
    return directory


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
