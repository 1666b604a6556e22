"""The node power controller end to end: fake API server, real BMC servers, real rounds.

The API server is the project's fake (it answers as kube-apiserver does, Eviction budget
checks included); the BMCs are sushy-tools' Redfish emulator and pyghmi's IPMI server, or
servers that hang and answer garbage; `FakeKubelet` reports nodes Ready or not from their BMC's
power state. Rounds are run one at a time with an explicit clock, so backoff, timeouts and
floors are checked without waiting for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from controllers.node_power.actuator import ActuatorSettings
from controllers.node_power.controller import NodePowerController
from controllers.node_power.drivers import BmcSecret
from controllers.node_power.lease import LeaderElector, LeaseSettings
from controllers.node_power.policy import PolicySettings
from livedata.labels import (
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_STATE_ANNOTATION,
    POWER_STATE_REASON_ANNOTATION,
)
from tests.support.bmc import GarbageHttpServer, IpmiBmc, RedfishEmulator, SilentTcpServer
from tests.support.fake_kube import FakeKube
from tests.support.power_cluster import (
    NAMESPACE,
    FakeKubelet,
    budget,
    caught_up,
    make_kube,
    node,
    pod,
    settings,
    started_controller,
    wait_until,
)

PASSWORD = "bmc-password-for-tests"


def state_of(kube: FakeKube, name: str) -> tuple[str | None, bool, str]:
    """(recorded power state, cordoned, reason) of a node as the API server holds it."""
    obj = kube.get("nodes", name)
    annotations = obj["metadata"].get("annotations") or {}
    return (
        annotations.get(POWER_STATE_ANNOTATION),
        bool(obj["spec"].get("unschedulable")),
        annotations.get(POWER_STATE_REASON_ANNOTATION, ""),
    )


def writes(kube: FakeKube) -> list[tuple[str, str]]:
    return [(r.method, r.path) for r in kube.requests if r.method in ("POST", "PUT", "PATCH")]


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


# ---- dry run -----------------------------------------------------------------------------


def test_without_apply_nothing_is_written_and_each_decision_is_logged_once(
    cleanup: list, caplog: pytest.LogCaptureFixture
) -> None:
    kube = make_kube([node("busy"), node("idle")], [pod("web-1", "busy", "8")])
    cleanup.append(kube)
    controller = started_controller(kube, settings(apply=False))
    cleanup.append(controller)
    kube.clear_requests()
    now = time.time()
    with caplog.at_level(logging.INFO, logger="controllers.node_power"):
        for i in range(3):
            result = controller.run_round(now + 10 * i)
            assert result.error is None
            assert [a.node for a in result.decisions.power_off] == ["idle"]
    assert writes(kube) == []
    assert state_of(kube, "idle") == (None, False, "")
    announced = [
        r.getMessage() for r in caplog.records if "would power off node idle" in r.getMessage()
    ]
    assert len(announced) == 1


# ---- powering off, floors ----------------------------------------------------------------


def test_empty_nodes_go_off_and_the_controller_never_goes_below_its_floor(cleanup: list) -> None:
    nodes = [node("busy")] + [node(f"idle-{i}") for i in range(5)]
    kube = make_kube(nodes, [pod("web-1", "busy", "12")])
    cleanup.append(kube)
    floor = 3
    policy = PolicySettings(unneeded_time_s=0, cooldown_s=0, min_on_nodes=floor, boot_s=0)
    controller = started_controller(kube, settings(policy=policy))
    cleanup.append(controller)
    now = time.time()
    for i in range(6):
        caught_up(controller, kube)
        assert controller.run_round(now + 60 * i).error is None
        on = [
            n
            for n in kube.objects("nodes")
            if state_of(kube, n["metadata"]["name"])[0] in (None, "on")
        ]
        assert len(on) >= floor
    states = {
        n["metadata"]["name"]: state_of(kube, n["metadata"]["name"]) for n in kube.objects("nodes")
    }
    off = sorted(name for name, (state, _, _) in states.items() if state == "off")
    assert len(off) == len(nodes) - floor
    assert states["busy"][0] is None  # it had work: never touched
    assert all(states[name][1] for name in off)  # off nodes stay cordoned


def test_arrivals_are_measured_as_the_simulation_measures_them_and_keep_a_margin(
    cleanup: list,
) -> None:
    """The controller feeds the policy's own meter (one boot time and six) with the pods' creation
    times, and a node goes off only while the others keep the headroom plus the noise margin."""
    # spare is empty; busy has 16 cores: 7 taken by a DaemonSet pod (not an arrival), and 4
    # one-core pods created now.
    agent = pod("agent", "busy", "7", owner="DaemonSet")
    web = [pod(f"web-{i}", "busy", "1") for i in range(4)]
    kube = make_kube([node("busy"), node("spare")], [agent, *web])
    cleanup.append(kube)
    # 4 cores in the last 300 s boot: 4 cores of headroom, which busy keeps (5 free) without
    # spare. Two standard deviations of a boot time's arrivals: 2 x sqrt(4 / 1800 x 300) = 1.63.
    for margin_sd, goes_off in ((2.0, False), (0.0, True)):
        policy = PolicySettings(
            unneeded_time_s=0, cooldown_s=0, boot_s=300, off_margin_sd=margin_sd, consolidate=False
        )
        controller = started_controller(kube, settings(policy=policy))
        cleanup.append(controller)
        assert controller.arrivals.meter.windows_s == (300.0, 1800.0)
        caught_up(controller, kube)
        decisions = controller.run_round(time.time()).decisions
        assert decisions is not None
        assert decisions.headroom_cores == pytest.approx(4.0, rel=1e-6)
        assert decisions.off_headroom_cores == pytest.approx(4.0 + margin_sd * (2 / 3) ** 0.5)
        assert [a.node for a in decisions.power_off] == (["spare"] if goes_off else [])


# ---- a drain the budget refuses ------------------------------------------------------------


def test_a_drain_refused_by_a_budget_leaves_the_node_on_and_uncordoned(
    cleanup: list, tmp_path: Path
) -> None:
    with RedfishEmulator(tmp_path / "redfish", ["keep", "light"], auth=("admin", PASSWORD)) as bmc:
        kube = make_kube(
            [node("keep", driver="redfish"), node("light", driver="redfish")],
            [pod("big-1", "keep", "10"), pod("db-0", "light", "1", labels={"app": "db"})],
            [budget("db", {"app": "db"}, allowed=1)],
        )
        cleanup.append(kube)
        secret = secret_dir(tmp_path, {"keep": bmc.url, "light": bmc.url})
        controller = started_controller(kube, settings(), secret=secret)
        cleanup.append(controller)
        # The budget's room goes before the controller's cache hears of it (a replica elsewhere
        # was just evicted): the Eviction API is the judge.
        controller.budgets.stop()
        kube.patch(
            "poddisruptionbudgets",
            "db",
            {"status": {"disruptionsAllowed": 0}},
            "default",
            subresource="status",
        )
        now = time.time()
        result = controller.run_round(now)
        assert result.acted == ["drain light"]
        state, cordoned, reason = state_of(kube, "light")
        assert (state, cordoned) == ("on", False)
        assert "disruption budget" in reason and "default/db-0" in reason
        assert kube.get("pods", "db-0", "default") is not None
        assert bmc.power_state("light") == "On"
        # Backoff: not again at the next rounds...
        assert controller.run_round(now + 10).acted == []
        assert controller.run_round(now + 50).acted == []
        # ...but after it, when the budget has room again, the node goes.
        kube.patch(
            "poddisruptionbudgets",
            "db",
            {"status": {"disruptionsAllowed": 1}},
            "default",
            subresource="status",
        )
        controller.budgets = _fresh_informer(controller, kube)
        assert controller.run_round(now + 70).acted == ["drain light"]
        assert kube.get("pods", "db-0", "default") is None
        wait_until(lambda: controller.run_round(now + 80) and state_of(kube, "light")[0] == "off")
        assert bmc.power_state("light") == "Off"
        assert controller.metrics.drain_failures.labels(cause="disruption_budget")._value.get() == 1


def _fresh_informer(controller: NodePowerController, kube: FakeKube):  # type: ignore[no-untyped-def]
    from controllers.node_power.kube import Informer

    informer = Informer(
        "poddisruptionbudgets",
        client.PolicyV1Api(kube.api_client()).list_pod_disruption_budget_for_all_namespaces,
    )
    informer.start()
    wait_until(lambda: informer.synced)
    return informer


# ---- BMCs that hang or answer garbage --------------------------------------------------------


@pytest.mark.parametrize("bmc_kind", ["hung", "garbage"])
def test_a_failing_bmc_changes_nothing_and_is_retried_with_backoff(
    bmc_kind: str, cleanup: list, tmp_path: Path
) -> None:
    if bmc_kind == "hung":
        server = SilentTcpServer().__enter__()
    else:
        server = GarbageHttpServer(
            lambda _path: (200, "text/html", b"<h1>BMC busy</h1>")
        ).__enter__()
    cleanup.append(type("Stop", (), {"stop": lambda self: server.__exit__(None, None, None)})())
    kube = make_kube([node("busy"), node("idle", driver="redfish")], [pod("web-1", "busy", "12")])
    cleanup.append(kube)
    actuator = ActuatorSettings(bmc_timeout_s=1.0, retry_backoff_s=60.0, max_retry_backoff_s=1800.0)
    controller = started_controller(
        kube, settings(actuator=actuator), secret=secret_dir(tmp_path, {"idle": server.url})
    )
    cleanup.append(controller)

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
        state, cordoned, _ = state_of(kube, "idle")
        assert state is None and not cordoned  # never cordoned, never drained, never "off"
    # Exponential backoff: 60 s, then 120 s, then 240 s.
    assert attempts_at == [0, 60, 180, 420]
    assert "power-off not started" in state_of(kube, "idle")[2]
    kinds = {"hung": "timeout", "garbage": "garbage"}
    errors = controller.metrics.driver_errors.labels(driver="redfish", kind=kinds[bmc_kind])
    assert errors._value.get() == 4
    assert controller.actuator.backoff["idle"].failures == 4


# ---- waking ----------------------------------------------------------------------------------


def test_pending_pods_wake_exactly_the_nodes_their_demand_needs(
    cleanup: list, tmp_path: Path
) -> None:
    names = ["full", "off-1", "off-2", "off-3", "off-4"]
    with RedfishEmulator(tmp_path / "redfish", names, auth=("admin", PASSWORD)) as bmc:
        for name in names[1:]:
            _set_emulator_power(bmc, name, "Off")
        nodes = [node("full", driver="redfish")] + [
            node(n, driver="redfish", state="off", unschedulable=True, ready=False)
            for n in names[1:]
        ]
        # 5 pods of 4 cores wait: 20 cores need two 16-core nodes, not more.
        pending = [pod(f"job-{i}", None, "4", pending=True) for i in range(5)]
        kube = make_kube(nodes, [pod("web-1", "full", "16"), *pending])
        cleanup.append(kube)
        secret = secret_dir(tmp_path, {n: bmc.url for n in names})
        controller = started_controller(kube, settings(), secret=secret)
        cleanup.append(controller)
        kubelet = FakeKubelet(kube, lambda name: bmc.power_state(name).lower())
        now = time.time()
        first = controller.run_round(now)
        woken = sorted(a.split()[1] for a in first.acted)
        assert len(woken) == 2
        assert [state_of(kube, n)[:2] for n in woken] == [("waking", True)] * 2
        assert [bmc.power_state(n) for n in woken] == ["On", "On"]
        # The pods still wait while the nodes boot: the waking capacity counts, nothing more.
        caught_up(controller, kube)
        assert controller.run_round(now + 10).acted == []
        kubelet.sync(now + 80)  # the two booted nodes report Ready
        caught_up(controller, kube)
        controller.run_round(now + 90)
        assert [state_of(kube, n)[:2] for n in woken] == [("on", False)] * 2
        asleep = sorted(set(names[1:]) - set(woken))
        assert [state_of(kube, n)[0] for n in asleep] == ["off", "off"]
        assert [bmc.power_state(n) for n in asleep] == ["Off", "Off"]
        assert controller.metrics.wake_latency._sum.get() >= 90 * 2 - 2


def _set_emulator_power(bmc: RedfishEmulator, name: str, power: str) -> None:
    import requests

    reset = "ForceOff" if power == "Off" else "On"
    response = requests.post(
        f"{bmc.url}{bmc.system_path(name)}/Actions/ComputerSystem.Reset",
        json={"ResetType": reset},
        auth=bmc.auth,
        timeout=5,
    )
    response.raise_for_status()
    wait_until(lambda: bmc.power_state(name) == power)


# ---- a whole cycle through each real driver ------------------------------------------------


def test_drain_power_off_and_wake_through_redfish(cleanup: list, tmp_path: Path) -> None:
    with RedfishEmulator(tmp_path / "redfish", ["keep", "light"], auth=("admin", PASSWORD)) as bmc:
        kube = make_kube(
            [node("keep", driver="redfish"), node("light", driver="redfish")],
            [
                pod("big-1", "keep", "10"),
                pod("web-1", "light", "1"),
                pod("agent-light", "light", "100m", owner="DaemonSet"),
            ],
        )
        cleanup.append(kube)
        secret = secret_dir(tmp_path, {"keep": bmc.url, "light": bmc.url})
        controller = started_controller(kube, settings(), secret=secret)
        cleanup.append(controller)
        kubelet = FakeKubelet(kube, lambda name: bmc.power_state(name).lower())
        now = time.time()
        assert controller.run_round(now).acted == ["drain light"]
        assert kube.get("pods", "web-1", "default") is None  # evicted
        assert kube.get("pods", "agent-light", "default") is not None  # DaemonSet pods stay
        caught_up(controller, kube)
        controller.run_round(now + 10)
        assert state_of(kube, "light")[:2] == ("off", True)
        assert bmc.power_state("light") == "Off"
        assert bmc.power_state("keep") == "On"
        kubelet.sync(now + 15)
        # A pod arrives that does not fit on `keep`: the controller wakes `light`.
        kube.create("pods", pod("job-1", None, "12", pending=True), "default")
        caught_up(controller, kube)
        assert controller.run_round(now + 20).acted == ["wake light"]
        assert bmc.power_state("light") == "On"
        kubelet.sync(now + 130)
        caught_up(controller, kube)
        controller.run_round(now + 140)
        assert state_of(kube, "light")[:2] == ("on", False)
        assert controller.metrics.power_cycles._value.get() == 1
        assert controller.metrics.wake_latency._sum.get() == pytest.approx(120, abs=2)


def test_power_off_through_ipmi(cleanup: list, tmp_path: Path) -> None:
    with IpmiBmc(tmp_path / "ipmi", password=PASSWORD) as bmc:
        kube = make_kube([node("busy"), node("idle", driver="ipmi")], [pod("web-1", "busy", "12")])
        cleanup.append(kube)
        secret = secret_dir(tmp_path, {"idle": bmc.address})
        controller = started_controller(kube, settings(), secret=secret)
        cleanup.append(controller)
        now = time.time()
        assert controller.run_round(now).acted == ["power_off idle"]
        assert state_of(kube, "idle")[:2] == ("off", True)
        assert bmc.requests == ["soft-off"]  # a graceful shutdown, nothing forced


def test_a_node_ignoring_the_graceful_shutdown_is_forced_off(cleanup: list, tmp_path: Path) -> None:
    with IpmiBmc(tmp_path / "ipmi", password=PASSWORD, ignore_soft_off=True) as bmc:
        kube = make_kube([node("busy"), node("stuck", driver="ipmi")], [pod("web-1", "busy", "12")])
        cleanup.append(kube)
        actuator = ActuatorSettings(shutdown_timeout_s=300.0, bmc_timeout_s=15.0)
        controller = started_controller(
            kube, settings(actuator=actuator), secret=secret_dir(tmp_path, {"stuck": bmc.address})
        )
        cleanup.append(controller)
        now = time.time()
        controller.run_round(now)
        controller.run_round(now + 200)  # still on, within the shutdown timeout: wait
        assert state_of(kube, "stuck")[:2] == ("draining", True)
        controller.run_round(now + 310)  # past it: forced
        wait_until(lambda: controller.run_round(now + 320) and state_of(kube, "stuck")[0] == "off")
        assert bmc.requests == ["soft-off (ignored)", "off"]


def test_a_woken_node_that_never_becomes_ready_is_recorded_off_and_another_is_woken(
    cleanup: list,
) -> None:
    kube = make_kube(
        [
            node("full"),
            node("dead", state="off", unschedulable=True, ready=False),
            node("spare", state="off", unschedulable=True, ready=False),
        ],
        [pod("web-1", "full", "16"), pod("job-1", None, "4", pending=True)],
    )
    cleanup.append(kube)
    actuator = ActuatorSettings(wake_timeout_s=600.0, retry_backoff_s=60.0)
    controller = started_controller(kube, settings(actuator=actuator))
    cleanup.append(controller)
    now = time.time()
    assert controller.run_round(now).acted == ["wake dead"]  # name order: same idle watts
    caught_up(controller, kube)
    assert controller.run_round(now + 300).acted == []  # still booting, the pod waits
    caught_up(controller, kube)
    controller.run_round(now + 610)
    state, cordoned, reason = state_of(kube, "dead")
    assert (state, cordoned) == ("off", True)
    assert "not Ready within 600 s" in reason
    caught_up(controller, kube)
    assert controller.run_round(now + 620).acted == ["wake spare"]  # dead backs off


def test_a_drain_that_does_not_finish_in_time_is_given_up(cleanup: list) -> None:
    stuck = pod("web-1", "light", "1")
    stuck["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # a finalizer holds it
    stuck["metadata"]["finalizers"] = ["example.com/cleanup"]
    kube = make_kube([node("keep"), node("light")], [pod("big-1", "keep", "10"), stuck])
    cleanup.append(kube)
    actuator = ActuatorSettings(drain_timeout_s=600.0)
    controller = started_controller(kube, settings(actuator=actuator))
    cleanup.append(controller)
    now = time.time()
    assert controller.run_round(now).acted == ["drain light"]
    caught_up(controller, kube)
    controller.run_round(now + 300)
    assert state_of(kube, "light")[:2] == ("draining", True)
    caught_up(controller, kube)
    controller.run_round(now + 601)
    state, cordoned, reason = state_of(kube, "light")
    assert (state, cordoned) == ("on", False)
    assert "drain did not finish within 600 s (1 pod(s) left: default/web-1)" in reason
    assert controller.metrics.drain_failures.labels(cause="timeout")._value.get() == 1


def test_a_node_powered_on_by_hand_is_taken_back_as_on(cleanup: list, tmp_path: Path) -> None:
    with RedfishEmulator(tmp_path / "redfish", ["busy", "spare"], auth=("admin", PASSWORD)) as bmc:
        _set_emulator_power(bmc, "spare", "Off")
        now = time.time()
        kube = make_kube(
            [
                node("busy", driver="redfish"),
                node(
                    "spare",
                    driver="redfish",
                    state="off",
                    since_s=now - 3600,
                    unschedulable=True,
                    ready=False,
                ),
            ],
            [pod("web-1", "busy", "12")],
        )
        cleanup.append(kube)
        secret = secret_dir(tmp_path, {"busy": bmc.url, "spare": bmc.url})
        controller = started_controller(kube, settings(), secret=secret)
        cleanup.append(controller)
        kubelet = FakeKubelet(kube, lambda name: bmc.power_state(name).lower())
        kubelet.sync(now - 3590)  # Unknown since it went off
        caught_up(controller, kube)
        controller.run_round(now)
        assert state_of(kube, "spare")[0] == "off"
        _set_emulator_power(bmc, "spare", "On")  # someone pressed the button
        kubelet.sync(now)
        caught_up(controller, kube)
        controller.run_round(now + 10)
        state, cordoned, reason = state_of(kube, "spare")
        assert (state, cordoned) == ("on", False)
        assert "powered on outside the controller" in reason


# ---- kill switch, watch drops, API errors ---------------------------------------------------


def test_the_kill_switch_stops_actions_and_gives_up_drains(cleanup: list) -> None:
    kube = make_kube(
        [node("keep"), node("idle"), node("light", state="draining", unschedulable=True)],
        [pod("big-1", "keep", "10"), pod("web-1", "light", "1")],
    )
    cleanup.append(kube)
    controller = started_controller(kube, settings())
    cleanup.append(controller)
    switch = {"metadata": {"annotations": {POWER_MANAGEMENT_DISABLED_ANNOTATION: "true"}}}
    kube.patch("namespaces", NAMESPACE, switch)
    caught_up(controller, kube)
    now = time.time()
    result = controller.run_round(now)
    assert result.acted == []
    assert not any(n.managed for n in result.view.nodes)
    assert "kill switch on namespace" in result.view.nodes[0].unmanaged_reason
    # The node caught draining is given back, its pod left alone; the idle node stays on.
    state, cordoned, reason = state_of(kube, "light")
    assert (state, cordoned) == ("on", False)
    assert "power management disabled" in reason and "kill switch on namespace" in reason
    assert kube.get("pods", "web-1", "default") is not None
    assert state_of(kube, "idle")[0] is None
    # Switched back on at the namespace but set on the node: only that node is left alone.
    kube.patch(
        "namespaces",
        NAMESPACE,
        {"metadata": {"annotations": {POWER_MANAGEMENT_DISABLED_ANNOTATION: None}}},
    )
    kube.patch("nodes", "idle", switch)
    caught_up(controller, kube)
    result = controller.run_round(now + 3600)  # past the backoff of light's abandoned drain
    assert state_of(kube, "idle")[0] is None
    assert result.acted == ["drain light"]


def test_the_controller_keeps_going_through_watch_drops_and_api_errors(cleanup: list) -> None:
    kube = make_kube(
        [node("full"), node("spare", state="off", unschedulable=True)], [pod("web-1", "full", "16")]
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
    kube.create("pods", pod("job-1", None, "4", pending=True), "default")
    caught_up(controller, kube)
    assert controller.pods.status.relists_total > relists
    # The API server fails every call: the round changes nothing and says why.
    kube.failing = True
    try:
        failed = controller.run_round(now + 10)
    finally:
        kube.failing = False
    # Whichever call meets the failure first (the namespace read, or a watch that lost its
    # connection and so its sync), the round stops and says so.
    assert failed.error is not None
    assert "HTTP 500" in failed.error or "not synced" in failed.error
    assert state_of(kube, "spare")[0] == "off"
    assert controller.metrics.rounds.labels(result="error")._value.get() == 1
    # Once the caches have listed again, the next round works: the waiting pod wakes the spare.
    wait_until(lambda: controller.synced, what="caches synced again")
    assert controller.run_round(now + 20).acted == ["wake spare"]
    assert state_of(kube, "spare")[0] == "waking"


# ---- two replicas ----------------------------------------------------------------------------


def test_two_replicas_never_both_act(cleanup: list) -> None:
    nodes = [node("busy")] + [node(f"idle-{i}") for i in range(6)]
    kube = make_kube(nodes, [pod("web-1", "busy", "12")])
    cleanup.append(kube)
    policy = PolicySettings(unneeded_time_s=0, cooldown_s=0, min_on_nodes=1, boot_s=0)
    replicas = {}
    for identity in ("replica-a", "replica-b"):
        api_client = kube.api_client()
        api_client.user_agent = identity
        lease = LeaseSettings(
            namespace=NAMESPACE,
            name="power-node-controller",
            identity=identity,
            lease_duration_s=1.5,
            renew_deadline_s=1.0,
            retry_period_s=0.2,
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

    def node_writers() -> list[str]:
        return [
            r.headers.get("User-Agent", "")
            for r in kube.requests
            if r.method in ("PATCH", "POST") and ("/nodes/" in r.path or "/eviction" in r.path)
        ]

    # One of them powers nodes off, one per round.
    wait_until(lambda: len(node_writers()) >= 4, what="node writes")
    first = node_writers()[0]
    other = next(i for i in replicas if i != first)
    assert set(node_writers()) == {first}
    # The leader stops (and releases the Lease): the other takes over and finishes the job.
    stops[first].set()
    threads[first].join(10)
    wait_until(
        lambda: sum(state_of(kube, f"idle-{i}")[0] == "off" for i in range(6)) == 6,
        what="all idle nodes off",
    )
    stops[other].set()
    threads[other].join(10)
    sequence = node_writers()
    switch = sequence.index(other)
    assert set(sequence[:switch]) == {first} and set(sequence[switch:]) == {other}
