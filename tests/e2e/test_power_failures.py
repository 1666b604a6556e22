"""Two replicas of the node power controller, end to end: only the Lease holder acts, and a
leader killed in the middle of a drain is replaced and its drain is never forgotten.

Both replicas are `python -m controllers.node_power --apply` subprocesses (as their
ServiceAccount, with leader election on the shipped Lease), against the session's real
control plane; nodes are `envtest.NodeAgent` kubelets following sushy-tools' Redfish emulator.
A pod with a finalizer makes the drain slow: once evicted it stays Terminating until the test
removes the finalizer, so the leader can be killed (SIGKILL: no release of the Lease) with the
node cordoned, one pod evicted and gone, and one still on it.

What must hold, from the API server, the BMC and the replicas' logs: the replica that does not
hold the Lease never evicts nor powers anything; the other replica leads within the lease
duration of the kill; it never powers off the node while a pod is still on it; the node ends
consistent: drained and off (recorded `off`, cordoned, BMC Off) once the pod can go, or given
back (recorded `on`, uncordoned, BMC On) once the drain timeout, counted from the killed
leader's start, is past.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from envtest import ControlPlane
from tests.support.power_cluster import PowerCluster, wait_until
from tests.support.power_e2e import (
    LEASE_DURATION_S,
    RETRY_PERIOD_S,
    acted,
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


@pytest.mark.parametrize("ending", ["finished", "given back"])
def test_a_leader_killed_mid_drain_is_replaced_and_its_drain_is_finished_or_given_back(
    ending: str, control_plane: ControlPlane, cluster: PowerCluster, tmp_path: Path
) -> None:
    """Finished: the held pod is let go after the new leader took over, and the node goes off.
    Given back: the pod is held past the drain timeout, and the node is uncordoned, on."""
    keep, slow = cluster.name("keep"), cluster.name("slow")
    with redfish_nodes(cluster, tmp_path, ["keep", "slow"]) as bmc:
        web, held = keep_and_slow_drain(cluster)
        secret = secret_dir(tmp_path, {keep: bmc.url, slow: bmc.url})
        # Given back: the drain times out 25 s after the killed leader began it.
        drain_timeout_s = 180 if ending == "finished" else 25
        flags = ("--min-on-nodes=1", f"--drain-timeout={drain_timeout_s}s")
        with (
            controller_running(control_plane, tmp_path, secret, *flags, name="replica-a") as a,
            controller_running(control_plane, tmp_path, secret, *flags, name="replica-b") as b,
        ):
            leader = wait_until(
                lambda: next((r for r in (a, b) if r.leading()), None),
                30,
                "a replica leading",
            )
            standby = b if leader is a else a
            wait_for(
                leader,
                lambda: half_drained(cluster, web, held),
                60,
                "slow cordoned, web evicted, held Terminating",
            )
            standby.check_alive()
            assert not standby.leading()
            assert acted(standby) == []  # the replica without the Lease touched nothing
            assert any(f"evicted {cluster.namespace}/" in line for line in acted(leader))

            leader.kill()
            killed_at = time.monotonic()
            wait_for(standby, standby.leading, 30, f"{standby.name} leading")
            # The Lease expires lease-duration after the killed leader's last renewal; the
            # standby sees that within a retry period, and a busy machine adds a little.
            assert time.monotonic() - killed_at <= LEASE_DURATION_S + 2 * RETRY_PERIOD_S + 2

            # The held pod is still on slow: a few rounds, and slow is still draining and on.
            time.sleep(3)
            assert cluster.state_of("slow")[:2] == ("draining", True)
            assert bmc.power_state(slow) == "On"
            if ending == "finished":
                release_finalizer(cluster, "held")
                end = wait_for(
                    standby,
                    lambda: consistent(cluster, bmc, "slow"),
                    30,
                    "slow drained and powered off",
                )
                assert end == "off"
                assert any(f"node {slow}: off" in line for line in acted(standby))
            else:
                end = wait_for(
                    standby,
                    lambda: consistent(cluster, bmc, "slow"),
                    drain_timeout_s + 15,
                    "slow's drain given back",
                )
                assert end == "on"
                assert "drain did not finish within 25 s" in cluster.state_of("slow")[2]
                release_finalizer(cluster, "held")
            assert not any(f"node {slow}: off" in line for line in leader.lines())
        assert consistent(cluster, bmc, "slow") == end
        assert consistent(cluster, bmc, "keep") == "on"
        wait_until(lambda: all_replicas_running(cluster), 60, "every replica running")
        assert "Traceback" not in a.log.read_text() + b.log.read_text()
