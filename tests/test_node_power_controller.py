"""The node power controller against the real control plane, real BMC servers, real rounds.

The API server is a real kube-apiserver (envtest/, with the real controller manager and
schedulers), and the controller talks to it as its own ServiceAccount, under the RBAC the
manifests ship. Nodes are kubelet stand-ins (`envtest.NodeAgent`) that follow their BMC: a node
powered off through sushy-tools' Redfish emulator or pyghmi's IPMI server stops heartbeating
and the real node lifecycle controller marks it NotReady; powered on, it boots and turns Ready.
Pods belong to real Deployments and DaemonSets; budgets' status is the real disruption
controller's; evictions go through the real Eviction API. Rounds are run one at a time with an
explicit clock, so backoff, timeouts and floors are checked without waiting for them.

The BMCs that hang or answer garbage are servers of our own: no emulator fails that way. One
test keeps the project's fake API server, for the faults a real one cannot be made to show on
demand (a watch's history gone, HTTP 500 on every call); a network outage is a real one, cut
by a proxy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from kubernetes import client

from controllers.node_power.actuator import ActuatorSettings
from controllers.node_power.controller import NodePowerController
from controllers.node_power.drivers import BmcSecret
from controllers.node_power.kube import Informer
from controllers.node_power.lease import LeaderElector, LeaseSettings
from controllers.node_power.policy import PolicySettings
from envtest import ControlPlane
from livedata.labels import (
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_STATE_ANNOTATION,
)
from tests.support.bmc import GarbageHttpServer, IpmiBmc, RedfishEmulator, SilentTcpServer
from tests.support.fault_proxy import FaultProxy, kubeconfig_through
from tests.support.power_cluster import (
    CONTROLLER_ACCOUNT,
    NAMESPACE,
    PowerCluster,
    controller_api_client,
    make_kube,
    settings,
    started_controller,
    wait_until,
)
from tests.support.power_cluster import caught_up as fake_caught_up
from tests.support.power_cluster import node as fake_node
from tests.support.power_cluster import pod as fake_pod

PASSWORD = "bmc-password-for-tests"


@pytest.fixture
def cluster(control_plane: ControlPlane, namespace: str) -> Iterator[PowerCluster]:
    with PowerCluster(control_plane, namespace) as power_cluster:
        yield power_cluster


@pytest.fixture
def api(control_plane: ControlPlane) -> client.ApiClient:
    """The controller's client: ServiceAccount power-aware-scheduler/power-node-controller."""
    return controller_api_client(control_plane)


@pytest.fixture
def cleanup() -> Iterator[list]:
    """Things to stop after the test (controllers, servers), last first."""
    items: list = []
    yield items
    for item in reversed(items):
        item.stop()


def secret_dir(tmp_path: Path, entries: dict[str, str]) -> BmcSecret:
    directory = tmp_path / "bmc-secret"
    directory.mkdir()
    for key, address in entries.items():
        (directory / key).write_text(f"address: {address}\n")
    (directory / "_defaults").write_text(f"username: admin\npassword: {PASSWORD}\n")
    return BmcSecret(directory)


def redfish_power(bmc: RedfishEmulator, node: str):  # type: ignore[no-untyped-def]
    """A kubelet's life as the Redfish emulator's system says: "on" or "off"."""
    return lambda: bmc.power_state(node).lower()


@contextlib.contextmanager
def keep_and_light(
    cluster: PowerCluster, tmp_path: Path, boot_s: float = 0.0
) -> Iterator[tuple[RedfishEmulator, str, str]]:
    """Nodes keep and light behind one Redfish emulator; (emulator, keep's name, light's)."""
    keep, light = cluster.name("keep"), cluster.name("light")
    with RedfishEmulator(tmp_path / "redfish", [keep, light], auth=("admin", PASSWORD)) as bmc:
        for short, name in (("keep", keep), ("light", light)):
            cluster.add_node(short, driver="redfish", power=redfish_power(bmc, name), boot_s=boot_s)
        yield bmc, keep, light


def set_emulator_power(bmc: RedfishEmulator, name: str, power: str) -> None:
    """Switch a system by hand (someone at the BMC's web page)."""
    reset = "ForceOff" if power == "Off" else "On"
    response = requests.post(
        f"{bmc.url}{bmc.system_path(name)}/Actions/ComputerSystem.Reset",
        json={"ResetType": reset},
        auth=bmc.auth,
        timeout=5,
    )
    response.raise_for_status()
    wait_until(lambda: bmc.power_state(name) == power)


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def writable_state(cluster: PowerCluster) -> dict[str, object]:
    """All the controller may change on the test's nodes and pods: its labels and annotations,
    cordons and taints, and each pod's node and deletion. (Not resourceVersions: the control
    plane's own controllers and the kubelets write nodes too.)"""
    found: dict[str, object] = {}
    for name in cluster.agent.node_names:
        node = cluster.node(cluster.short(name))
        meta, spec = node["metadata"], node.get("spec") or {}
        ours = {
            k: v
            for k, v in {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}.items()
            if k.startswith("power-aware-scheduler/")
        }
        # Not node.kubernetes.io/unschedulable: kube-controller-manager mirrors the cordon
        # (compared above) into that taint, some time after it changes (the cordons that
        # placed the test's pods can still be catching up).
        taints = sorted(
            t["key"] for t in spec.get("taints") or [] if t["key"] != UNSCHEDULABLE_TAINT
        )
        found[f"node {name}"] = (ours, bool(spec.get("unschedulable")), taints)
    for pod in cluster.pods():
        meta = pod["metadata"]
        found[f"pod {meta['uid']}"] = (pod["spec"].get("nodeName"), meta.get("deletionTimestamp"))
    return found


def busy_and_idle(cluster: PowerCluster, idle_count: int) -> list[str]:
    """Node busy running 12 of its 16 cores, and `idle_count` empty nodes idle-0, idle-1..."""
    shorts = ["busy"] + [f"idle-{i}" for i in range(idle_count)]
    for short in shorts:
        cluster.add_node(short)
    cluster.wait_ready(*shorts)
    cluster.deployment("web", "12", on="busy")
    return shorts


# ---- dry run -----------------------------------------------------------------------------


def test_without_apply_nothing_is_written_and_each_decision_is_logged_once(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, caplog: pytest.LogCaptureFixture
) -> None:
    busy, idle = cluster.add_node("busy"), cluster.add_node("idle")
    cluster.wait_ready("busy", "idle")
    cluster.deployment("web", "8", on="busy")
    before = writable_state(cluster)
    controller = started_controller(api, settings(apply=False))
    cleanup.append(controller)
    cluster.caught_up(controller)
    now = time.time()
    with caplog.at_level(logging.INFO, logger="controllers.node_power"):
        for i in range(3):
            result = controller.run_round(now + 10 * i)
            assert result.error is None
            assert [a.node for a in result.decisions.power_off] == [idle]
    assert writable_state(cluster) == before  # no node and no pod changed
    assert cluster.state_of("idle") == (None, False, "")
    announced = [
        r.getMessage() for r in caplog.records if f"would power off node {idle}" in r.getMessage()
    ]
    assert len(announced) == 1
    assert busy not in " ".join(r.getMessage() for r in caplog.records if "would" in r.getMessage())


# ---- powering off, floors ----------------------------------------------------------------


def test_empty_nodes_go_off_and_the_controller_never_goes_below_its_floor(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list
) -> None:
    shorts = busy_and_idle(cluster, 5)
    floor = 3
    policy = PolicySettings(unneeded_time_s=0, cooldown_s=0, min_on_nodes=floor, boot_s=0)
    controller = started_controller(api, settings(policy=policy))
    cleanup.append(controller)
    now = time.time()
    for i in range(6):
        cluster.caught_up(controller)
        assert controller.run_round(now + 60 * i).error is None
        on = [s for s in shorts if cluster.state_of(s)[0] in (None, "on")]
        assert len(on) >= floor
    states = {short: cluster.state_of(short) for short in shorts}
    off = sorted(short for short, (state, _, _) in states.items() if state == "off")
    assert len(off) == len(shorts) - floor
    assert states["busy"][0] is None  # it had work: never touched
    assert all(states[short][1] for short in off)  # off nodes stay cordoned
    assert cluster.nodes_of("web") == ["busy"]


def test_arrivals_are_measured_as_the_simulation_measures_them_and_keep_a_margin(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list
) -> None:
    """The controller feeds the policy's own meter (one boot time and six) with the pods' creation
    times, and a node goes off only while the others keep the headroom plus the noise margin."""
    # The meter counts every pod of the cluster: those other tests left behind must be gone.
    wait_until(
        lambda: not recent_pods_elsewhere(cluster, 1800), 120, "other tests' recent pods gone"
    )
    # spare is empty; busy has 16 cores: 7 taken by a DaemonSet pod (not an arrival), and 4
    # one-core pods created now.
    cluster.add_node("busy")
    spare = cluster.add_node("spare")
    cluster.wait_ready("busy", "spare")
    cluster.daemon_set("agent", "7", on="busy")
    cluster.deployment("web", "1", replicas=4, on="busy")
    # 4 cores in the last 300 s boot: 4 cores of headroom, which busy keeps (5 free) without
    # spare. Two standard deviations of a boot time's arrivals: 2 x sqrt(4 / 1800 x 300) = 1.63.
    for margin_sd, goes_off in ((2.0, False), (0.0, True)):
        policy = PolicySettings(
            unneeded_time_s=0, cooldown_s=0, boot_s=300, off_margin_sd=margin_sd, consolidate=False
        )
        controller = started_controller(api, settings(policy=policy))
        cleanup.append(controller)
        assert controller.arrivals.meter.windows_s == (300.0, 1800.0)
        cluster.caught_up(controller)
        decisions = controller.run_round(time.time()).decisions
        assert decisions is not None
        assert decisions.headroom_cores == pytest.approx(4.0, rel=1e-6)
        assert decisions.off_headroom_cores == pytest.approx(4.0 + margin_sd * (2 / 3) ** 0.5)
        assert [a.node for a in decisions.power_off] == ([spare] if goes_off else [])


def recent_pods_elsewhere(cluster: PowerCluster, within_s: float) -> list[str]:
    """Pods outside the test's namespace created less than `within_s` ago."""
    since = datetime.now(UTC) - timedelta(seconds=within_s)
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in cluster.core.list_pod_for_all_namespaces().items
        if p.metadata.namespace != cluster.namespace and p.metadata.creation_timestamp > since
    ]


# ---- a drain the budget refuses ------------------------------------------------------------


def test_a_drain_refused_by_a_budget_leaves_the_node_on_and_uncordoned(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    with keep_and_light(cluster, tmp_path) as (bmc, keep, light):
        cluster.wait_ready("keep", "light")
        cluster.deployment("big", "10", on="keep")
        cluster.deployment("db", "1", on="light")
        cluster.budget("db", "db", max_unavailable=1)
        (db_pod,) = cluster.running("db")
        db_key = f"{cluster.namespace}/{db_pod['metadata']['name']}"
        secret = secret_dir(tmp_path, {keep: bmc.url, light: bmc.url})
        controller = started_controller(api, settings(), secret=secret)
        cleanup.append(controller)
        cluster.caught_up(controller)
        # The budget's room goes before the controller's cache hears of it (a replica elsewhere
        # was just evicted): the Eviction API is the judge.
        controller.budgets.stop()
        cluster.set_budget("db", max_unavailable=0)
        now = time.time()
        result = controller.run_round(now)
        assert result.acted == [f"drain {light}"]
        state, cordoned, reason = cluster.state_of("light")
        assert (state, cordoned) == ("on", False)
        assert "disruption budget" in reason and db_key in reason
        assert [p["metadata"]["uid"] for p in cluster.running("db")] == [db_pod["metadata"]["uid"]]
        assert bmc.power_state(light) == "On"
        # Backoff: not again at the next rounds...
        assert controller.run_round(now + 10).acted == []
        assert controller.run_round(now + 50).acted == []
        # ...but after it, when the budget has room again, the node goes.
        cluster.set_budget("db", max_unavailable=1)
        controller.budgets = _fresh_informer(api)
        cluster.caught_up(controller)
        assert controller.run_round(now + 70).acted == [f"drain {light}"]
        wait_until(
            lambda: db_pod["metadata"]["uid"] not in cluster.uids(),
            what="the evicted pod gone",
        )
        wait_until(
            lambda: controller.run_round(now + 80) and cluster.state_of("light")[0] == "off",
            what="light off",
        )
        assert bmc.power_state(light) == "Off"
        assert controller.metrics.drain_failures.labels(cause="disruption_budget")._value.get() == 1
        # The evicted replica runs again, on the node that stays on.
        wait_until(lambda: cluster.nodes_of("db") == ["keep"], what="db running on keep")


def _fresh_informer(api: client.ApiClient) -> Informer:
    informer = Informer(
        "poddisruptionbudgets",
        client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
    )
    informer.start()
    wait_until(lambda: informer.synced)
    return informer


# ---- BMCs that hang or answer garbage --------------------------------------------------------


@pytest.mark.parametrize("bmc_kind", ["hung", "garbage"])
def test_a_failing_bmc_changes_nothing_and_is_retried_with_backoff(
    bmc_kind: str, cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    # No BMC emulator hangs or answers HTML: these two are servers of our own.
    if bmc_kind == "hung":
        server = SilentTcpServer().__enter__()
    else:
        server = GarbageHttpServer(
            lambda _path: (200, "text/html", b"<h1>BMC busy</h1>")
        ).__enter__()
    cleanup.append(type("Stop", (), {"stop": lambda self: server.__exit__(None, None, None)})())
    cluster.add_node("busy")
    idle = cluster.add_node("idle", driver="redfish")
    cluster.wait_ready("busy", "idle")
    cluster.deployment("web", "12", on="busy")
    actuator = ActuatorSettings(bmc_timeout_s=1.0, retry_backoff_s=60.0, max_retry_backoff_s=1800.0)
    controller = started_controller(
        api, settings(actuator=actuator), secret=secret_dir(tmp_path, {idle: server.url})
    )
    cleanup.append(controller)
    cluster.caught_up(controller)

    def bmc_contacts() -> int:
        return len(server.connections) if bmc_kind == "hung" else len(server.paths)

    now = time.time()
    attempts_at = []
    for second in range(0, 500, 10):
        before = bmc_contacts()
        result = controller.run_round(now + second)
        assert result.error is None
        if bmc_contacts() > before:
            attempts_at.append(second)
        state, cordoned, _ = cluster.state_of("idle")
        assert state is None and not cordoned  # never cordoned, never drained, never "off"
    # Exponential backoff: 60 s, then 120 s, then 240 s.
    assert attempts_at == [0, 60, 180, 420]
    assert "power-off not started" in cluster.state_of("idle")[2]
    kinds = {"hung": "timeout", "garbage": "garbage"}
    errors = controller.metrics.driver_errors.labels(driver="redfish", kind=kinds[bmc_kind])
    assert errors._value.get() == 4
    assert controller.actuator.backoff[idle].failures == 4


# ---- waking ----------------------------------------------------------------------------------


def test_pending_pods_wake_exactly_the_nodes_their_demand_needs(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    shorts = ["full", "off-1", "off-2", "off-3", "off-4"]
    names = [cluster.name(s) for s in shorts]
    with RedfishEmulator(tmp_path / "redfish", names, auth=("admin", PASSWORD)) as bmc:
        cluster.add_node("full", driver="redfish", power=redfish_power(bmc, names[0]))
        cluster.wait_ready("full")
        cluster.deployment("web", "16", on="full")
        for short, name in zip(shorts[1:], names[1:], strict=True):
            set_emulator_power(bmc, name, "Off")
            cluster.add_node(
                short,
                driver="redfish",
                state="off",
                unschedulable=True,
                power=redfish_power(bmc, name),
                boot_s=1.0,
            )
        cluster.wait_not_ready(*shorts[1:])
        # 5 pods of 4 cores wait: 20 cores need two 16-core nodes, not more.
        cluster.deployment("job", "4", replicas=5)
        cluster.wait_unschedulable("job", 5)
        secret = secret_dir(tmp_path, dict.fromkeys(names, bmc.url))
        controller = started_controller(api, settings(), secret=secret)
        cleanup.append(controller)
        cluster.caught_up(controller)
        now = time.time()
        first = controller.run_round(now)
        woken = sorted(cluster.short(a.split()[1]) for a in first.acted)
        assert len(woken) == 2
        assert [cluster.state_of(n)[:2] for n in woken] == [("waking", True)] * 2
        assert [bmc.power_state(cluster.name(n)) for n in woken] == ["On", "On"]
        # The pods still wait while the nodes boot: the waking capacity counts, nothing more.
        cluster.caught_up(controller)
        assert controller.run_round(now + 10).acted == []
        cluster.wait_ready(*woken)  # booted, their kubelets report Ready
        cluster.caught_up(controller)
        controller.run_round(now + 90)
        assert [cluster.state_of(n)[:2] for n in woken] == [("on", False)] * 2
        asleep = sorted(set(shorts[1:]) - set(woken))
        assert [cluster.state_of(n)[0] for n in asleep] == ["off", "off"]
        assert [bmc.power_state(cluster.name(n)) for n in asleep] == ["Off", "Off"]
        assert controller.metrics.wake_latency._sum.get() >= 90 * 2 - 2
        # The scheduler places the waiting pods on the woken nodes.
        wait_until(lambda: len(cluster.running("job")) == 5, what="the 5 pods running")
        assert set(cluster.nodes_of("job")) == set(woken)


# ---- a whole cycle through each real driver ------------------------------------------------


def test_drain_power_off_and_wake_through_redfish(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    with keep_and_light(cluster, tmp_path, boot_s=1.0) as (bmc, keep, light):
        cluster.wait_ready("keep", "light")
        cluster.deployment("big", "10", on="keep")
        cluster.deployment("web", "1", on="light")
        cluster.daemon_set("agent", "100m", on="light")
        (web_pod,) = cluster.running("web")
        secret = secret_dir(tmp_path, {keep: bmc.url, light: bmc.url})
        controller = started_controller(api, settings(), secret=secret)
        cleanup.append(controller)
        cluster.caught_up(controller)
        now = time.time()
        assert controller.run_round(now).acted == [f"drain {light}"]
        # Evicted: the agent finishes its graceful deletion; the ReplicaSet's new pod goes to keep.
        wait_until(
            lambda: web_pod["metadata"]["uid"] not in cluster.uids(),
            what="the evicted pod gone",
        )
        assert cluster.nodes_of("agent") == ["light"]  # DaemonSet pods stay
        cluster.caught_up(controller)
        controller.run_round(now + 10)
        assert cluster.state_of("light")[:2] == ("off", True)
        assert bmc.power_state(light) == "Off"
        assert bmc.power_state(keep) == "On"
        wait_until(lambda: cluster.nodes_of("web") == ["keep"], what="web running on keep")
        cluster.wait_not_ready("light")  # no more heartbeats: the node lifecycle controller says so
        # A pod arrives that does not fit on `keep`: the controller wakes `light`.
        cluster.deployment("job", "12")
        cluster.wait_unschedulable("job", 1)
        cluster.caught_up(controller)
        assert controller.run_round(now + 20).acted == [f"wake {light}"]
        assert bmc.power_state(light) == "On"
        cluster.wait_ready("light")
        cluster.caught_up(controller)
        controller.run_round(now + 140)
        assert cluster.state_of("light")[:2] == ("on", False)
        assert controller.metrics.power_cycles._value.get() == 1
        assert controller.metrics.wake_latency._sum.get() == pytest.approx(120, abs=2)
        wait_until(lambda: cluster.nodes_of("job") == ["light"], what="job running on light")


def test_power_off_through_ipmi(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    with IpmiBmc(tmp_path / "ipmi", password=PASSWORD) as bmc:
        cluster.add_node("busy")
        idle = cluster.add_node("idle", driver="ipmi", power=bmc.power_state)
        cluster.wait_ready("busy", "idle")
        cluster.deployment("web", "12", on="busy")
        secret = secret_dir(tmp_path, {idle: bmc.address})
        controller = started_controller(api, settings(), secret=secret)
        cleanup.append(controller)
        cluster.caught_up(controller)
        now = time.time()
        assert controller.run_round(now).acted == [f"power_off {idle}"]
        assert cluster.state_of("idle")[:2] == ("off", True)
        assert bmc.requests == ["soft-off"]  # a graceful shutdown, nothing forced


def test_a_node_ignoring_the_graceful_shutdown_is_forced_off(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    with IpmiBmc(tmp_path / "ipmi", password=PASSWORD, ignore_soft_off=True) as bmc:
        cluster.add_node("busy")
        stuck = cluster.add_node("stuck", driver="ipmi", power=bmc.power_state)
        cluster.wait_ready("busy", "stuck")
        cluster.deployment("web", "12", on="busy")
        actuator = ActuatorSettings(shutdown_timeout_s=300.0, bmc_timeout_s=15.0)
        controller = started_controller(
            api, settings(actuator=actuator), secret=secret_dir(tmp_path, {stuck: bmc.address})
        )
        cleanup.append(controller)
        cluster.caught_up(controller)
        now = time.time()
        controller.run_round(now)
        controller.run_round(now + 200)  # still on, within the shutdown timeout: wait
        assert cluster.state_of("stuck")[:2] == ("draining", True)
        assert cluster.ready("stuck")
        controller.run_round(now + 310)  # past it: forced
        wait_until(
            lambda: controller.run_round(now + 320) and cluster.state_of("stuck")[0] == "off"
        )
        assert bmc.requests == ["soft-off (ignored)", "off"]


def test_a_woken_node_that_never_becomes_ready_is_recorded_off_and_another_is_woken(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list
) -> None:
    cluster.add_node("full")
    cluster.wait_ready("full")
    cluster.deployment("web", "16", on="full")
    # Dry-run driver: nothing switches them on, so their kubelets stay silent.
    dead = cluster.add_node("dead", state="off", unschedulable=True, power=lambda: "off")
    spare = cluster.add_node("spare", state="off", unschedulable=True, power=lambda: "off")
    cluster.wait_not_ready("dead", "spare")
    cluster.deployment("job", "4")
    cluster.wait_unschedulable("job", 1)
    actuator = ActuatorSettings(wake_timeout_s=600.0, retry_backoff_s=60.0)
    controller = started_controller(api, settings(actuator=actuator))
    cleanup.append(controller)
    cluster.caught_up(controller)
    now = time.time()
    assert controller.run_round(now).acted == [f"wake {dead}"]  # name order: same idle watts
    cluster.caught_up(controller)
    assert controller.run_round(now + 300).acted == []  # still booting, the pod waits
    cluster.caught_up(controller)
    controller.run_round(now + 610)
    state, cordoned, reason = cluster.state_of("dead")
    assert (state, cordoned) == ("off", True)
    assert "not Ready within 600 s" in reason
    cluster.caught_up(controller)
    assert controller.run_round(now + 620).acted == [f"wake {spare}"]  # dead backs off


def test_a_drain_that_does_not_finish_in_time_is_given_up(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list
) -> None:
    cluster.add_node("keep")
    light = cluster.add_node("light")
    cluster.wait_ready("keep", "light")
    cluster.deployment("big", "10", on="keep")
    # A finalizer holds the evicted pod: its deletion never finishes.
    cluster.deployment("web", "1", on="light", finalizers=["example.com/cleanup"])
    (stuck,) = cluster.running("web")
    actuator = ActuatorSettings(drain_timeout_s=600.0)
    controller = started_controller(api, settings(actuator=actuator))
    cleanup.append(controller)
    cluster.caught_up(controller)
    now = time.time()
    assert controller.run_round(now).acted == [f"drain {light}"]
    wait_until(
        lambda: any(
            p["metadata"]["uid"] == stuck["metadata"]["uid"]
            and p["metadata"].get("deletionTimestamp")
            for p in cluster.pods()
        ),
        what="the evicted pod terminating",
    )
    cluster.caught_up(controller)
    controller.run_round(now + 300)
    assert cluster.state_of("light")[:2] == ("draining", True)
    cluster.caught_up(controller)
    controller.run_round(now + 601)
    state, cordoned, reason = cluster.state_of("light")
    assert (state, cordoned) == ("on", False)
    key = f"{cluster.namespace}/{stuck['metadata']['name']}"
    assert f"drain did not finish within 600 s (1 pod(s) left: {key})" in reason
    assert controller.metrics.drain_failures.labels(cause="timeout")._value.get() == 1


def test_a_node_powered_on_by_hand_is_taken_back_as_on(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list, tmp_path: Path
) -> None:
    busy, spare = cluster.name("busy"), cluster.name("spare")
    with RedfishEmulator(tmp_path / "redfish", [busy, spare], auth=("admin", PASSWORD)) as bmc:
        set_emulator_power(bmc, spare, "Off")
        now = time.time()
        cluster.add_node("busy", driver="redfish", power=redfish_power(bmc, busy))
        cluster.add_node(
            "spare",
            driver="redfish",
            state="off",
            since_s=now - 3600,
            unschedulable=True,
            power=redfish_power(bmc, spare),
            boot_s=1.0,
        )
        cluster.wait_ready("busy")
        cluster.deployment("web", "12", on="busy")
        cluster.wait_not_ready("spare")
        secret = secret_dir(tmp_path, {busy: bmc.url, spare: bmc.url})
        controller = started_controller(api, settings(), secret=secret)
        cleanup.append(controller)
        cluster.caught_up(controller)
        controller.run_round(now)
        assert cluster.state_of("spare")[0] == "off"
        set_emulator_power(bmc, spare, "On")  # someone pressed the button
        cluster.wait_ready("spare")
        cluster.caught_up(controller)
        controller.run_round(now + 10)
        state, cordoned, reason = cluster.state_of("spare")
        assert (state, cordoned) == ("on", False)
        assert "powered on outside the controller" in reason


# ---- kill switch, outages -----------------------------------------------------------


def _set_namespace_switch(plane_client: client.ApiClient, value: str | None) -> None:
    client.CoreV1Api(plane_client).patch_namespace(
        NAMESPACE, {"metadata": {"annotations": {POWER_MANAGEMENT_DISABLED_ANNOTATION: value}}}
    )


def test_the_kill_switch_stops_actions_and_gives_up_drains(
    cluster: PowerCluster, api: client.ApiClient, cleanup: list
) -> None:
    cluster.add_node("keep")
    cluster.add_node("idle")
    light = cluster.add_node("light")
    cluster.wait_ready("keep", "idle", "light")
    cluster.deployment("big", "10", on="keep")
    cluster.deployment("web", "1", on="light")
    # Caught draining by an earlier controller.
    cluster.core.patch_node(
        light,
        {
            "metadata": {"annotations": {POWER_STATE_ANNOTATION: "draining"}},
            "spec": {"unschedulable": True},
        },
    )
    (web_pod,) = cluster.running("web")
    _set_namespace_switch(cluster.admin, "true")  # the namespace is shared: switched back below
    try:
        controller = started_controller(api, settings())
        cleanup.append(controller)
        cluster.caught_up(controller)
        now = time.time()
        result = controller.run_round(now)
        assert result.acted == []
        ours = [n for n in result.view.nodes if n.name.startswith(cluster.namespace)]
        assert not any(n.managed for n in ours)
        assert "kill switch on namespace" in ours[0].unmanaged_reason
        # The node caught draining is given back, its pod left alone; the idle node stays on.
        state, cordoned, reason = cluster.state_of("light")
        assert (state, cordoned) == ("on", False)
        assert "power management disabled" in reason and "kill switch on namespace" in reason
        assert [p["metadata"]["uid"] for p in cluster.running("web")] == [
            web_pod["metadata"]["uid"]
        ]
        assert cluster.state_of("idle")[0] is None
    finally:
        _set_namespace_switch(cluster.admin, None)
    # Switched back on at the namespace but set on the node: only that node is left alone.
    cluster.core.patch_node(
        cluster.name("idle"),
        {"metadata": {"annotations": {POWER_MANAGEMENT_DISABLED_ANNOTATION: "true"}}},
    )
    cluster.caught_up(controller)
    result = controller.run_round(now + 3600)  # past the backoff of light's abandoned drain
    assert cluster.state_of("idle")[0] is None
    assert result.acted == [f"drain {light}"]


def test_the_controller_keeps_going_through_a_network_outage(
    control_plane: ControlPlane, cluster: PowerCluster, cleanup: list, tmp_path: Path
) -> None:
    """The route to the real API server breaks (open connections reset, new ones refused) and
    comes back: the round in between fails and says why, the watches resume, the next round
    works. A proxy cuts the route: stopping the shared API server would stop more than this."""
    cluster.add_node("full")
    spare = cluster.add_node("spare", state="off", unschedulable=True, power=lambda: "off")
    cluster.wait_ready("full")
    cluster.deployment("web", "16", on="full")
    proxy = FaultProxy("127.0.0.1", control_plane.apiserver_port).start()
    cleanup.append(proxy)
    kubeconfig = control_plane.service_account_kubeconfig(*CONTROLLER_ACCOUNT)
    api = control_plane.api_client(
        kubeconfig_through(kubeconfig, proxy.port, tmp_path / "through-proxy.kubeconfig")
    )
    controller = started_controller(api, settings(api_timeout_s=2.0))
    cleanup.append(controller)
    cluster.caught_up(controller)
    now = time.time()
    assert controller.run_round(now).acted == []
    proxy.cut()
    try:
        wait_until(lambda: not controller.synced, what="the watches noticing the cut")
        failed = controller.run_round(now + 10)
        cluster.deployment("job", "4")  # arrives meanwhile
        cluster.wait_unschedulable("job", 1)
    finally:
        proxy.resume()
    assert failed.error is not None
    assert "not synced" in failed.error, failed.error
    assert controller.metrics.rounds.labels(result="error")._value.get() == 1
    wait_until(lambda: controller.synced, 60, what="caches synced again")
    cluster.caught_up(controller)  # the pod that arrived during the outage included
    assert cluster.state_of("spare")[0] == "off"
    # The next round works: the waiting pod wakes the spare.
    assert controller.run_round(now + 20).acted == [f"wake {spare}"]
    assert cluster.state_of("spare")[0] == "waking"


def test_the_controller_keeps_going_through_expired_watches_and_server_errors(
    cleanup: list,
) -> None:
    """On the project's fake API server: a real one cannot be made, on demand and without
    disturbing the session's other clients, to forget a watch's history (410 Gone) or to answer
    every call with HTTP 500."""
    kube = make_kube(
        [fake_node("full"), fake_node("spare", state="off", unschedulable=True)],
        [fake_pod("web-1", "full", "16")],
    )
    cleanup.append(kube)
    controller = started_controller(kube, settings())
    cleanup.append(controller)
    now = time.time()
    assert controller.run_round(now).acted == []
    relists = controller.pods.status.relists_total
    # Watches cut, and the history gone: resuming answers 410 Gone, the caches list again.
    kube.drop_watches()
    kube.expire_watches()
    kube.create("pods", fake_pod("job-1", None, "4", pending=True), "default")
    fake_caught_up(controller, kube)
    assert controller.pods.status.relists_total > relists
    # The API server fails every call: the round changes nothing and says why.
    kube.failing = True
    try:
        failed = controller.run_round(now + 10)
    finally:
        kube.failing = False
    assert failed.error is not None
    assert "HTTP 500" in failed.error or "not synced" in failed.error
    assert kube.get("nodes", "spare")["metadata"]["annotations"][POWER_STATE_ANNOTATION] == "off"
    assert controller.metrics.rounds.labels(result="error")._value.get() == 1
    wait_until(lambda: controller.synced, what="caches synced again")
    assert controller.run_round(now + 20).acted == ["wake spare"]


# ---- two replicas ----------------------------------------------------------------------------


def test_two_replicas_never_both_act(
    control_plane: ControlPlane, cluster: PowerCluster, cleanup: list
) -> None:
    shorts = busy_and_idle(cluster, 6)
    policy = PolicySettings(unneeded_time_s=0, cooldown_s=0, min_on_nodes=1, boot_s=0)
    lease_name = "power-node-controller"  # the one Lease the shipped Role grants
    replicas = {}
    for identity in ("replica-a", "replica-b"):
        api_client = controller_api_client(control_plane)
        api_client.user_agent = identity  # the field manager of its node writes
        lease = LeaseSettings(
            namespace=NAMESPACE,
            name=lease_name,
            identity=identity,
            # Long enough that a leader never loses the Lease to a slow renewal on a busy machine.
            lease_duration_s=6.0,
            renew_deadline_s=4.0,
            retry_period_s=0.3,
        )
        elector = LeaderElector(client.CoordinationV1Api(api_client), lease)
        replicas[identity] = NodePowerController(
            settings(policy=policy, scan_interval_s=0.05, max_bulk_power_off=1),
            api_client,
            elector=elector,
        )
    stops = {identity: threading.Event() for identity in replicas}
    threads = {
        identity: threading.Thread(target=c.run_forever, args=(stops[identity],), daemon=True)
        for identity, c in replicas.items()
    }
    for thread in threads.values():
        thread.start()
    idle = [s for s in shorts if s != "busy"]

    def writers() -> dict[str, set[str]]:
        """Node -> the replicas that wrote its power state (the fields' managers)."""
        found = {}
        for short in idle:
            node = cluster.node(short)
            found[short] = {
                entry["manager"]
                for entry in node["metadata"].get("managedFields") or []
                if POWER_STATE_ANNOTATION in str(entry.get("fieldsV1"))
            }
        return found

    try:
        # One of them powers nodes off, one per round.
        wait_until(lambda: sum(bool(w) for w in writers().values()) >= 2, what="two nodes off")
        stops_first = {m for ms in writers().values() for m in ms}
        assert len(stops_first) == 1, writers()
        (first,) = stops_first
        other = next(i for i in replicas if i != first)
        # The leader stops (and releases the Lease): the other takes over and finishes the job.
        stops[first].set()
        threads[first].join(10)
        # What the first leader finished (off); a node it had only begun (draining) is the
        # other's to finish, so both may have written that one, one after the other.
        done_by_first = {
            s for s, w in writers().items() if w == {first} and cluster.state_of(s)[0] == "off"
        }
        wait_until(
            lambda: all(cluster.state_of(s)[0] == "off" for s in idle),
            what="all idle nodes off",
        )
    finally:
        for stop in stops.values():
            stop.set()
        for thread in threads.values():
            thread.join(10)
        with contextlib.suppress(client.ApiException):
            client.CoordinationV1Api(cluster.admin).delete_namespaced_lease(lease_name, NAMESPACE)
    final = writers()
    assert all(final[s] == {first} for s in done_by_first)  # it wrote nothing once stopped
    assert all(other in final[s] <= {first, other} for s in idle if s not in done_by_first)
    assert any(final[s] == {other} for s in idle)
