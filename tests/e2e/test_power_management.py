"""Power management end to end: the node power controller as it ships, on a real control plane.

`python -m controllers.node_power --apply` runs as a subprocess, as its ServiceAccount
power-aware-scheduler/power-node-controller (the manifests' RBAC), with short timings, against
the session's real control plane (etcd, kube-apiserver, kube-controller-manager, the default
and power-aware schedulers). Nodes are `envtest.NodeAgent` kubelets whose lives follow their
BMC: sushy-tools' Redfish emulator in one scenario, pyghmi IPMI servers (one per node) in the
other; the controller finds each BMC through the node's driver label and the BMC Secret
directory (`--bmc-secret-dir`), as in a cluster.

What must hold, checked from the API server and the BMCs, never from the controller's word:
consolidation empties nodes through the Eviction API, powers them off and records `off`; the
node lifecycle controller then sees them NotReady. Pods that no node can take wake exactly the
nodes they need, which boot, turn Ready, are uncordoned and run them. Pods under a budget that
allows no disruption, or annotated safe-to-evict "false", are never evicted and their nodes
stay on, uncordoned. Nodes drained in the same round are all cordoned before the first
eviction, so that no pod is evicted twice. The floor (`--min-on-nodes`) and
`--max-off-fraction` hold all along. No pod is lost: every Deployment ends with all its
replicas Running.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envtest import ControlPlane
from livedata.labels import (
    POWER_MANAGEMENT_ENABLED,
    POWER_MANAGEMENT_LABEL,
    SAFE_TO_EVICT_ANNOTATION,
)
from tests.support.bmc import IpmiBmc, RedfishEmulator
from tests.support.power_cluster import SCHEDULER, PowerCluster
from tests.support.power_e2e import (
    PASSWORD,
    ControllerProcess,
    all_replicas_running,
    controller_running,
    redfish_nodes,
    secret_dir,
    wait_for,
)


class Limits:
    """Samples the nodes' recorded states all along a scenario: the floor and the off share."""

    def __init__(self, cluster: PowerCluster, shorts: list[str]) -> None:
        self.cluster, self.shorts = cluster, shorts
        self.samples: list[dict[str, str | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Limits:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            with contextlib.suppress(Exception):
                self.samples.append({s: self.cluster.state_of(s)[0] for s in self.shorts})

    def most_off(self) -> int:
        return max(sum(state == "off" for state in sample.values()) for sample in self.samples)

    def fewest_on(self) -> int:
        return min(
            sum(state in (None, "on", "draining") for state in sample.values())
            for sample in self.samples
        )


@contextlib.contextmanager
def light_nodes(
    cluster: PowerCluster, tmp_path: Path, shorts: list[str]
) -> Iterator[tuple[RedfishEmulator, Path]]:
    """Nodes `shorts` of 8 cores behind one Redfish emulator, each running one light pod
    (Deployment web-<node>): every node under the utilisation threshold. (emulator, BMC Secret
    directory)."""
    with redfish_nodes(cluster, tmp_path, shorts, cores=8) as bmc:
        for short in shorts:
            cluster.deployment(f"web-{short}", "1", on=short, scheduler="default-scheduler")
        yield bmc, secret_dir(tmp_path, dict.fromkeys(map(cluster.name, shorts), bmc.url))


def two_recorded_off(
    controller: ControllerProcess, cluster: PowerCluster, shorts: list[str]
) -> list[str]:
    """Wait until two of the nodes `shorts` are recorded off (and no more); those two."""
    return wait_for(
        controller,
        lambda: (
            (found := [s for s in shorts if cluster.state_of(s)[0] == "off"])
            and len(found) == 2
            and found
        ),
        90,
        "two nodes recorded off",
    )


# ---- consolidation, power off through Redfish, waking for waiting pods ------------------------


@pytest.mark.parametrize("scheduler", [SCHEDULER, "default-scheduler"])
def test_consolidation_powers_off_through_redfish_and_waiting_pods_wake_what_they_need(
    scheduler: str, control_plane: ControlPlane, cluster: PowerCluster, tmp_path: Path
) -> None:
    """The waiting pods are for the power-aware scheduler, or for the default one with a
    controller told so (`--scheduler-name`): either scheduler marks them Unschedulable."""
    shorts = ["a", "b", "c", "d"]
    with light_nodes(cluster, tmp_path, shorts) as (bmc, secret):
        flags = ("--min-on-nodes=1", "--max-off-fraction=0.5", f"--scheduler-name={scheduler}")
        with (
            Limits(cluster, shorts) as limits,
            controller_running(control_plane, tmp_path, secret, *flags) as controller,
        ):
            # Two of four may be off (--max-off-fraction 0.5): two are drained and powered off.
            off = two_recorded_off(controller, cluster, shorts)
            on = [s for s in shorts if s not in off]
            for short in off:
                assert bmc.power_state(cluster.name(short)) == "Off"
                assert cluster.state_of(short)[1]  # cordoned
            assert [bmc.power_state(cluster.name(s)) for s in on] == ["On", "On"]
            # Drained through evictions: their pods run again on the nodes that stay on.
            wait_for(controller, lambda: all_replicas_running(cluster), 60, "web replicas back")
            assert {n for s in shorts for n in cluster.nodes_of(f"web-{s}")} == set(on)
            # Powered off for real: no heartbeats, the node lifecycle controller says NotReady.
            cluster.wait_not_ready(*off)
            time.sleep(3)  # a few rounds: nothing more goes off (the off share is reached)
            assert sorted(s for s in shorts if cluster.state_of(s)[0] == "off") == sorted(off)

            # Three pods of 5 cores: the two nodes on take one each (6 cores free on each), the
            # third waits as Unschedulable: one node is woken.
            cluster.deployment("batch", "5", replicas=3, scheduler=scheduler)
            wait_for(
                controller,
                lambda: [s for s in off if cluster.state_of(s)[0] in ("waking", "on")],
                60,
                "a node woken",
            )
            wait_for(controller, lambda: all_replicas_running(cluster), 90, "batch running")
            woken = [s for s in off if cluster.state_of(s)[0] == "on"]
            asleep = [s for s in off if s not in woken]
            assert len(woken) == 1 and len(asleep) == 1
            state, cordoned, reason = cluster.state_of(woken[0])
            assert (state, cordoned) == ("on", False) and "woken" in reason
            assert cluster.ready(woken[0])
            assert bmc.power_state(cluster.name(woken[0])) == "On"
            assert woken[0] in cluster.nodes_of("batch")
            time.sleep(3)
            assert cluster.state_of(asleep[0])[:2] == ("off", True)
            assert bmc.power_state(cluster.name(asleep[0])) == "Off"
            controller.check_alive()
    assert limits.most_off() <= 2  # --max-off-fraction 0.5 of 4
    assert limits.fewest_on() >= 1  # --min-on-nodes 1
    assert all_replicas_running(cluster)  # no pod lost


# ---- drains started together ----------------------------------------------------------------


def test_nodes_drained_in_one_round_are_all_cordoned_before_any_eviction(
    control_plane: ControlPlane, cluster: PowerCluster, tmp_path: Path
) -> None:
    """With `--max-drain-parallelism 2` two light nodes are drained in the same round, both
    cordoned before the first eviction: no evicted pod lands on the other node being drained,
    to be evicted a second time."""
    shorts = ["a", "b", "c", "d"]
    with light_nodes(cluster, tmp_path, shorts) as (_, secret):
        flags = (
            "--min-on-nodes=1",
            "--max-off-fraction=0.5",
            "--max-drain-parallelism=2",
            # Every node unneeded from the first round on: both drains can start in that round.
            "--scale-down-unneeded-time=0s",
        )
        with controller_running(control_plane, tmp_path, secret, *flags) as controller:
            off = two_recorded_off(controller, cluster, shorts)
            wait_for(controller, lambda: all_replicas_running(cluster), 60, "web replicas back")
            log = controller.lines()
    drained = [i for i, line in enumerate(log) if "drain and power off node" in line]
    evicted = [line for line in log if " evicted " in line]
    assert len(drained) == 2, log
    first_eviction = next(i for i, line in enumerate(log) if " evicted " in line)
    assert max(drained) < first_eviction  # both decided (and cordoned) before any eviction
    # One eviction per drained node's pod, none of a pod that had moved onto the other.
    assert sorted(line.split(f"evicted {cluster.namespace}/web-")[1][0] for line in evicted) == (
        sorted(off)
    )
    on = [s for s in shorts if s not in off]
    assert {n for s in shorts for n in cluster.nodes_of(f"web-{s}")} == set(on)


# ---- what must never be evicted, and the floor, through IPMI ---------------------------------


def test_budgets_and_safe_to_evict_keep_their_nodes_on_and_the_floor_holds_through_ipmi(
    control_plane: ControlPlane, cluster: PowerCluster, tmp_path: Path
) -> None:
    shorts = ["db", "cache", "app", "spare"]
    with contextlib.ExitStack() as stack:
        bmcs = {
            short: stack.enter_context(IpmiBmc(tmp_path / f"ipmi-{short}", password=PASSWORD))
            for short in shorts
        }
        for short in shorts:
            # spare opts in only once app is off: an empty node and a drainable one may go in
            # either order, and this test follows a drain through IPMI before the floor binds.
            cluster.add_node(
                short,
                cores=8,
                driver="ipmi",
                power=bmcs[short].power_state,
                managed=short != "spare",
            )
        cluster.wait_ready(*shorts)
        # db: a budget that allows no disruption. cache: safe-to-evict "false". app: movable.
        cluster.deployment("db", "1", on="db", scheduler="default-scheduler")
        cluster.budget("db", "db", max_unavailable=0)
        cluster.deployment(
            "cache", "1", on="cache", annotations={SAFE_TO_EVICT_ANNOTATION: "false"}
        )
        cluster.deployment("app", "1", on="app")
        kept = {p["metadata"]["uid"] for p in cluster.pods("db") + cluster.pods("cache")}
        (app_pod,) = cluster.pods("app")
        assert len(kept) == 2
        secret = secret_dir(tmp_path, {cluster.name(s): bmcs[s].address for s in shorts})
        # The floor binds: app (drained), then spare (empty, opted in) could go, but 3 must
        # stay on.
        flags = ("--min-on-nodes=3", "--max-off-fraction=1")
        with (
            Limits(cluster, shorts) as limits,
            controller_running(control_plane, tmp_path, secret, *flags) as controller,
        ):
            wait_for(
                controller, lambda: cluster.state_of("app")[0] == "off", 90, "app drained, off"
            )
            assert bmcs["app"].requests == ["soft-off"]
            # Evicted, replaced, running on a node that stays on.
            wait_for(controller, lambda: all_replicas_running(cluster), 60, "app running")
            assert app_pod["metadata"]["uid"] not in cluster.uids()
            assert cluster.nodes_of("app")[0] in ("db", "cache", "spare")
            cluster.wait_not_ready("app")  # a node's kubelet dies with its power
            cluster.core.patch_node(
                cluster.name("spare"),
                {"metadata": {"labels": {POWER_MANAGEMENT_LABEL: POWER_MANAGEMENT_ENABLED}}},
            )
            time.sleep(6)  # rounds every second: spare, empty and opted in, stays on
            controller.check_alive()
            assert cluster.state_of("spare")[:2] in ((None, False), ("on", False))
            assert bmcs["spare"].requests == []
    for short in ("db", "cache"):
        assert cluster.state_of(short)[:2] in ((None, False), ("on", False))
        assert bmcs[short].requests == []
    assert {p["metadata"]["uid"] for p in cluster.pods("db") + cluster.pods("cache")} == kept
    assert cluster.nodes_of("db") == ["db"] and cluster.nodes_of("cache") == ["cache"]
    assert limits.fewest_on() >= 3 and limits.most_off() == 1  # --min-on-nodes 3
    assert all_replicas_running(cluster)  # no pod lost
