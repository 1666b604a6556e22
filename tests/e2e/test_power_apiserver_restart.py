"""The node power controller through an API server restart in the middle of a drain.

In a file of its own: stopping the session's kube-apiserver (about 15 s) disturbs every client
of the session, so the disturbance stays within this one test, which starts the API server
again whatever happens and checks `/readyz` before it ends, so that later tests find the control
plane healthy.

`python -m controllers.node_power --apply` runs as its ServiceAccount with leader election on,
against the real control plane; nodes are `envtest.NodeAgent` kubelets following sushy-tools'
Redfish emulator. The controller has cordoned a node and evicted its pods, one of which a
finalizer holds Terminating (a slow drain), when the API server stops. What must hold: the
controller logs one line per failed try, never a traceback; it stops leading when it cannot
renew its Lease; once the API server is back it relists its caches, leads again and carries on
from the node's record without a wrong action: the node is not powered off while the held pod
is on it, and goes off once the pod is gone; every Deployment ends with all replicas Running.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

from envtest import ControlPlane
from tests.support.power_cluster import PowerCluster, wait_until
from tests.support.power_e2e import (
    all_replicas_running,
    consistent,
    controller_running,
    half_drained,
    keep_and_slow_drain,
    redfish_nodes,
    release_finalizer,
    secret_dir,
    wait_for,
)

APISERVER = "kube-apiserver"
INFORMERS = ("nodes", "pods", "poddisruptionbudgets")


@contextlib.contextmanager
def api_server_stopped(plane: ControlPlane) -> Iterator[None]:
    """The API server stopped for the block; started again after, even when the block fails."""
    plane.stop_component(APISERVER)
    try:
        yield
    finally:
        plane.start_component(APISERVER)


def readyz(plane: ControlPlane) -> str:
    return plane.kubectl("get", "--raw", "/readyz", check=False).stdout.strip()


def test_an_api_server_restart_mid_drain_stops_the_leader_and_it_resumes_without_a_wrong_action(
    control_plane: ControlPlane, cluster: PowerCluster, tmp_path: Path
) -> None:
    keep, slow = cluster.name("keep"), cluster.name("slow")
    try:
        with redfish_nodes(cluster, tmp_path, ["keep", "slow"]) as bmc:
            web, held = keep_and_slow_drain(cluster)
            secret = secret_dir(tmp_path, {keep: bmc.url, slow: bmc.url})
            # The drain outlives the outage: it must be carried on, not given up.
            flags = ("--min-on-nodes=1", "--drain-timeout=300s")
            with controller_running(control_plane, tmp_path, secret, *flags) as controller:
                wait_for(controller, controller.leading, 30, "the controller leading")
                wait_for(
                    controller,
                    lambda: half_drained(cluster, web, held),
                    60,
                    "slow cordoned, web evicted, held Terminating",
                )
                before = len(controller.lines())
                with api_server_stopped(control_plane):
                    wait_for(
                        controller,
                        lambda: not controller.leading(),
                        30,
                        "the controller no longer leading",
                    )
                    time.sleep(5)  # a few back-offs
                    controller.check_alive()
                    assert bmc.power_state(slow) == "On"
                    outage = controller.lines()[before:]
                wait_for(controller, controller.leading, 60, "the controller leading again")
                # Its caches listed again after the restart: resumed by a relist.
                wait_for(
                    controller,
                    lambda: all(
                        any(f"{name} listed:" in line for line in controller.lines()[before:])
                        for name in INFORMERS
                    ),
                    60,
                    "every cache relisted",
                )
                # Carried on from the node's record: still draining, and not powered off while
                # the held pod is on it.
                wait_for(controller, lambda: "held" in str(cluster.pods("held")), 10, "held")
                time.sleep(3)
                assert cluster.state_of("slow")[:2] == ("draining", True)
                assert bmc.power_state(slow) == "On"
                release_finalizer(cluster, "held")
                end = wait_for(
                    controller,
                    lambda: consistent(cluster, bmc, "slow"),
                    60,
                    "slow drained and powered off",
                )
                assert end == "off"
                assert consistent(cluster, bmc, "keep") == "on"
                # Running, not Ready: the outage outlasts the node monitor's grace period, so the
                # node lifecycle controller marks keep's pods not Ready, and envtest's NodeAgent,
                # unlike a kubelet, does not post them Ready again once keep is back.
                wait_for(
                    controller,
                    lambda: all_replicas_running(cluster, ready=False),
                    60,
                    "every replica running",
                )
                log = controller.lines()
            assert controller.process.returncode == 0  # stopped cleanly by SIGTERM
    finally:
        # Whatever happened above: the API server is up and ready for the tests after this one.
        control_plane.start_component(APISERVER)
        wait_until(lambda: readyz(control_plane) == "ok", 60, "the API server ready")

    # During the outage: warnings of one line each, no traceback; leadership ended once.
    assert "Traceback" not in controller.log.read_text()
    assert sum("stopped leading" in line for line in outage) == 1
    retries = [line for line in outage if "cannot reach the API server" in line]
    assert retries, "\n".join(outage)
    assert all(re.search(r"next retry in [\d.]+ s$", line) for line in retries), retries
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ", line) for line in outage)
    # Back: it said so, and it never powered off anything but slow once its pods were gone.
    assert sum("started leading" in line for line in log) == 2  # at the start, and once back
    assert sum(": off" in line and "node " in line for line in log) == 1
