"""Kubernetes objects -> the policy's views: states, opt-in, blockers, pending pods, arrivals.

Plain dicts shaped like the API's JSON; no server. Plus the idle watts a real bundle predicts.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pytest

from controllers.node_power.idle_power import IdlePower, NominalConditions
from controllers.node_power.policy import ArrivalRateMeter, NodeView, PendingPod, PodInfo
from controllers.node_power.views import (
    ArrivalTracker,
    Budget,
    cluster_view,
    eviction_blockers,
    pending_beyond_waking,
    pending_pods,
    power_record,
    selector_matches,
    unmanaged_reason,
)
from livedata.collect_config import CollectConfig
from livedata.instant import read_instant
from livedata.labels import (
    POWER_MANAGEMENT_DISABLED_ANNOTATION,
    POWER_STATE_ANNOTATION,
    POWER_STATE_SINCE_ANNOTATION,
    SAFE_TO_EVICT_ANNOTATION,
    SCALE_DOWN_DISABLED_ANNOTATION,
)
from predictor.core_scaling import shipped_core_exponents
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import two_nodes, wait_until
from tests.support.power_cluster import budget, node, pod, stamp
from tests.support.prometheus import require_prometheus, start_prometheus

SCHEDULER = "power-aware-scheduler"


def with_annotations(obj: dict, **annotations: str) -> dict:
    obj["metadata"].setdefault("annotations", {}).update(annotations)
    return obj


def created(obj: dict, when_s: float) -> dict:
    obj["metadata"]["creationTimestamp"] = stamp(when_s)
    obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
    return obj


# ---- nodes --------------------------------------------------------------------------------


def test_power_state_from_annotations_or_on_since_creation() -> None:
    fresh = created(node("a"), 1000.0)
    assert power_record(fresh).state == "on" and power_record(fresh).since_s == 1000.0
    off = created(node("b", state="off", since_s=5000.0), 1000.0)
    assert (power_record(off).state, power_record(off).since_s) == ("off", 5000.0)
    bad_state = with_annotations(created(node("c"), 1000.0), **{POWER_STATE_ANNOTATION: "asleep"})
    record = power_record(bad_state)
    assert record.state == "on" and "'asleep' is not one of" in record.problem
    bad_since = with_annotations(
        created(node("d"), 1000.0),
        **{POWER_STATE_ANNOTATION: "off", POWER_STATE_SINCE_ANNOTATION: "yesterday"},
    )
    record = power_record(bad_since)
    assert (record.state, record.since_s) == ("off", 1000.0)
    assert "not an RFC 3339 time" in record.problem


def test_managed_only_when_opted_in_and_not_switched_off() -> None:
    namespace = {"metadata": {"name": "power-aware-scheduler", "annotations": {}}}
    assert unmanaged_reason(node("a"), namespace) == ""
    assert "not opted in" in unmanaged_reason(node("a", managed=False), namespace)
    switched = with_annotations(node("b"), **{POWER_MANAGEMENT_DISABLED_ANNOTATION: "True"})
    assert "kill switch on the node" in unmanaged_reason(switched, namespace)
    autoscaler = with_annotations(node("c"), **{SCALE_DOWN_DISABLED_ANNOTATION: "true"})
    assert SCALE_DOWN_DISABLED_ANNOTATION in unmanaged_reason(autoscaler, namespace)
    namespace["metadata"]["annotations"][POWER_MANAGEMENT_DISABLED_ANNOTATION] = "true"
    assert "kill switch on namespace power-aware-scheduler" in unmanaged_reason(
        node("a"), namespace
    )


def test_cluster_view_maps_nodes_pods_and_problems() -> None:
    nodes = [
        node("a", cores=8),
        node("cordoned", unschedulable=True),
        {**node("broken"), "status": {"allocatable": {"cpu": "lots"}}},
        {**node("no-pod-limit"), "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}}},
    ]
    pods = [
        pod("web-1", "a", "2"),
        pod("agent-a", "a", "500m", owner="DaemonSet"),
        with_annotations(
            pod("static-a", "a", "250m", owner=None), **{"kubernetes.io/config.mirror": "x"}
        ),
        {**pod("done-1", "a", "4"), "status": {"phase": "Succeeded"}},
        pod("odd-1", "a", "ten"),
        pod("wait-1", None, "3", pending=True),
        {**pod("other-sched", None, "3", pending=True), "spec": {"schedulerName": "default"}},
    ]
    view = cluster_view(nodes, pods, [], None, {"a": 80.0}, SCHEDULER)
    by_name = {n.name: n for n in view.nodes}
    a = by_name["a"]
    assert (a.allocatable_cpu, a.idle_w, a.managed) == (8.0, 80.0, True)
    # The pod limit (status.allocatable.pods) where the node states it, else unknown.
    assert (a.allocatable_pods, by_name["no-pod-limit"].allocatable_pods) == (110, None)
    assert {p.name: p.daemon for p in a.pods} == {
        "default/web-1": False,
        "default/agent-a": True,
        "default/static-a": True,
        "default/odd-1": False,  # done-1 finished: not on the node any more
    }
    assert a.requested_cpu == 2.0 and a.daemon_cpu == 0.75
    odd = next(p for p in a.pods if p.name == "default/odd-1")
    assert "requests cannot be read" in odd.eviction_blocker
    assert "cordoned outside the controller" in by_name["cordoned"].unmanaged_reason
    assert (
        not by_name["broken"].managed
        and "status.allocatable.cpu" in by_name["broken"].unmanaged_reason
    )
    assert math.isnan(by_name["cordoned"].idle_w)
    assert [p.name for p in view.pending] == ["default/wait-1"]
    assert any("pod default/odd-1 on node a" in problem for problem in view.problems)


# ---- eviction blockers --------------------------------------------------------------------


def test_eviction_blockers_as_cluster_autoscaler_drains() -> None:
    pods = [
        pod("ok-1", "a", "1"),
        pod("bare-1", "a", "1", owner=None),
        pod("scratch-1", "a", "1", volumes=[{"name": "scratch", "emptyDir": {}}]),
        pod("tmpfs-1", "a", "1", volumes=[{"name": "t", "emptyDir": {"medium": "Memory"}}]),
        pod("host-1", "a", "1", volumes=[{"name": "h", "hostPath": {"path": "/var"}}]),
        with_annotations(pod("keep-1", "a", "1"), **{SAFE_TO_EVICT_ANNOTATION: "false"}),
        with_annotations(
            pod("vouched-1", "a", "1", owner=None, volumes=[{"name": "s", "emptyDir": {}}]),
            **{SAFE_TO_EVICT_ANNOTATION: "true"},
        ),
        pod("dns-1", "a", "1", namespace="kube-system"),
    ]
    blockers = eviction_blockers(pods, [])
    assert blockers["default/ok-1"] is None
    assert blockers["default/tmpfs-1"] is None  # memory-backed: nothing stays on the node
    assert "no controller" in blockers["default/bare-1"]
    assert "emptyDir volume 'scratch'" in blockers["default/scratch-1"]
    assert "hostPath volume 'h'" in blockers["default/host-1"]
    assert SAFE_TO_EVICT_ANNOTATION in blockers["default/keep-1"]
    assert blockers["default/vouched-1"] is None
    assert "kube-system pod without a PodDisruptionBudget" in blockers["kube-system/dns-1"]


def test_budgets_are_judged_per_node() -> None:
    web = [pod(f"web-{i}", "a", "1", labels={"app": "web"}) for i in range(2)]
    one = [Budget.from_object(budget("web", {"app": "web"}, allowed=1))]
    blockers = eviction_blockers(web, one)
    assert all("allows 1 disruption(s); the node has 2 of its pods" in b for b in blockers.values())
    two = [Budget.from_object(budget("web", {"app": "web"}, allowed=2))]
    assert set(eviction_blockers(web, two).values()) == {None}
    stale = budget("web", {"app": "web"}, allowed=2)
    stale["metadata"]["generation"] = 2
    assert (
        "still being processed"
        in eviction_blockers(web[:1], [Budget.from_object(stale)])["default/web-0"]
    )
    overlapping = [
        Budget.from_object(budget("web", {"app": "web"}, allowed=5)),
        Budget.from_object(budget("all-web", {"app": "web"}, allowed=5)),
    ]
    assert (
        "several PodDisruptionBudgets" in eviction_blockers(web[:1], overlapping)["default/web-0"]
    )
    # A budget of another namespace, or with an empty selector, does not apply.
    elsewhere = [Budget.from_object(budget("web", {"app": "web"}, allowed=0, namespace="prod"))]
    empty = budget("everything", {}, allowed=0)
    assert set(eviction_blockers(web, [*elsewhere, Budget.from_object(empty)]).values()) == {None}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ({"matchLabels": {"app": "web"}}, True),
        ({"matchLabels": {"app": "db"}}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}, False),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Like", "values": ["f"]}]}, False),
        ({}, False),
        (None, False),
    ],
)
def test_label_selectors(selector: object, matches: bool) -> None:
    assert selector_matches(selector, {"app": "web", "tier": "front"}) is matches


# ---- pending pods, arrivals -------------------------------------------------------------------


def test_pending_pods_already_covered_by_waking_nodes_are_left_out() -> None:
    waking = NodeView(
        "w", 16, 64 * 2**30, "waking", 0.0, True, 100.0, (PodInfo("ds", 1, daemon=True),)
    )
    pending = [PendingPod(f"p{i}", 4) for i in range(5)]  # 20 cores; 15 free on the waking node
    left = pending_beyond_waking(pending, [waking])
    assert [p.cpu_cores for p in left] == [4, 4]
    assert pending_beyond_waking(pending, []) == tuple(pending)
    # A waking node's pod limit holds as its CPU does: two slots left beside its DaemonSet pod.
    limited = replace(waking, allocatable_pods=3)
    assert [p.cpu_cores for p in pending_beyond_waking(pending, [limited])] == [4, 4, 4]


def test_arrival_rate_counts_pods_created_in_the_window_once() -> None:
    now = time.time()
    tracker = ArrivalTracker(ArrivalRateMeter(windows_s=(100.0,)))
    pods = [
        created(pod("new-1", "a", "2"), now - 10),
        created(pod("new-2", None, "1", pending=True), now - 50),
        created(pod("old-1", "a", "8"), now - 500),
        created(pod("agent", "a", "4", owner="DaemonSet"), now - 5),
    ]
    first = tracker.observe(pods, now)
    assert first.cores_per_s == pytest.approx(3 / 100)
    assert first.square_cores_per_s == pytest.approx((2**2 + 1**2) / 100)  # the noise's scale
    # Seen again, nothing counts twice; new-1 is deleted: it still arrived. Later, everything
    # leaves the window.
    assert tracker.observe(pods, now + 1).cores_per_s == pytest.approx(3 / 100)
    assert tracker.observe(pods[1:], now + 20).cores_per_s == pytest.approx(3 / 100)
    assert tracker.observe(pods[1:], now + 60).cores_per_s == pytest.approx(2 / 100)
    assert tracker.observe([], now + 200).cores_per_s == 0.0


# ---- idle watts from a real bundle --------------------------------------------------------


def test_idle_watts_at_nominal_temperatures_from_the_bundle(tmp_path: Path) -> None:
    curves = {
        # 100 W idle, 2 W per degree of CPU above 50 C, CPU 20 C hotter at full load.
        "a": PowerCurveSpec(100.0, 300.0, temp_w_per_c=2.0, thermal={"cpu1_temp_c_per_util": 20.0}),
        "b": PowerCurveSpec(60.0, 200.0),
    }
    make_bundle(tmp_path / "bundle", curves, fallback=PowerCurveSpec(150.0, 400.0))
    idle = IdlePower(tmp_path / "bundle", nominal=NominalConditions(24.0, 32.0))
    assert math.isnan(idle.idle_w(["a"])["a"])  # nothing loaded before the first refresh
    idle.refresh()
    watts = idle.idle_w(["a", "b", "unknown"])
    # a: CPU at 24 + 32 C at half load, 20 C/util cooler at idle -> 46 C -> 100 + 2 * (46 - 50)
    assert watts["a"] == pytest.approx(92.0, abs=0.5)
    assert watts["b"] == pytest.approx(60.0, abs=0.5)
    assert watts["unknown"] == pytest.approx(150.0, abs=0.5)  # the fallback model
    assert idle.bundle_version is not None
    assert math.isnan(IdlePower(None).idle_w(["a"])["a"])


def test_fallback_nodes_idle_watts_scale_with_their_cpu_count(tmp_path: Path) -> None:
    # As the extender scales their curves: against the own-model nodes' median CPU (16 here).
    curves = {"a": PowerCurveSpec(100.0, 300.0), "b": PowerCurveSpec(60.0, 200.0)}
    make_bundle(tmp_path / "bundle", curves, fallback=PowerCurveSpec(150.0, 400.0))
    exponents = shipped_core_exponents()
    idle = IdlePower(tmp_path / "bundle", core_exponents=exponents)
    idle.refresh()
    cores = {"a": 16.0, "b": 16.0, "big": 32.0, "small": 8.0, "unknown-size": 0.0}
    watts = idle.idle_w(["a", "b", "big", "small", "unknown-size"], cores)
    assert watts["a"] == pytest.approx(100.0, abs=0.5)  # own models are never scaled
    assert watts["b"] == pytest.approx(60.0, abs=0.5)
    assert watts["big"] == pytest.approx(150.0 * 2**exponents.idle, abs=0.5)
    assert watts["small"] == pytest.approx(150.0 * 0.5**exponents.idle, abs=0.5)
    assert watts["unknown-size"] == pytest.approx(150.0, abs=0.5)  # unreadable allocatable
    scaling = idle.status()["fallback_core_scaling"]
    assert scaling["anchor_cores"] == 16.0 and scaling["anchor_nodes"] == 2
    # Off (the default of the class; the CLI turns it on): one fleet curve for every size.
    unscaled = IdlePower(tmp_path / "bundle")
    unscaled.refresh()
    assert unscaled.idle_w(["big"], cores)["big"] == pytest.approx(150.0, abs=0.5)


@pytest.mark.prometheus
@pytest.mark.slow
def test_idle_watts_at_current_temperatures_from_prometheus(tmp_path: Path) -> None:
    require_prometheus()
    curves = {
        "node-a": PowerCurveSpec(
            100.0, 300.0, temp_w_per_c=2.0, thermal={"cpu1_temp_c_per_util": 20.0}
        ),
        "node-c": PowerCurveSpec(
            100.0, 300.0, temp_w_per_c=2.0, thermal={"cpu1_temp_c_per_util": 20.0}
        ),
    }
    make_bundle(tmp_path / "bundle", curves)
    with two_nodes() as (node_a, _node_b):
        # Idle: the CPU reads exactly as hot as it is at u = 0 (a measured rate is never
        # exact, and the slope would carry its error into the expected watts).
        node_a.host.cpu_util = 0.0
        # node-a only: node-b has no uname and shares node-a's host, so without an
        # instance mapping its series would be read as node-a's.
        prom = start_prometheus(tmp_path / "prom", scrape_targets=[node_a.target])
        try:
            prom.wait_for(
                f'count_over_time(node_cpu_seconds_total{{instance="{node_a.target}",'
                f'mode="idle",cpu="0"}}[10s]) >= 8'
            )
            config = CollectConfig(url=prom.url, cpu_rate_window="5s")

            def idle_rate_settled() -> bool:
                # Scrapes that come late under load skew the first rate windows.
                readings = {r.node: r for r in read_instant(config)}
                reading = readings.get("node-a")
                return reading is not None and reading.values.get("cpu_util", 1.0) < 0.01

            wait_until(idle_rate_settled, "node-a's measured CPU rate to settle at idle")
            idle = IdlePower(tmp_path / "bundle", prometheus=config)
            idle.refresh()
            watts = idle.idle_w(["node-a", "node-c"])
            # node-a reads 22 C ambient and 55 C on its CPU at u = 0 -> 100 + 2 * (55 - 50).
            assert watts["node-a"] == pytest.approx(110.0, abs=1.0)
            # node-c has no readings (it is off): nominal 24 + 32 - 20 * 0.5 = 46 C -> 92 W.
            assert watts["node-c"] == pytest.approx(92.0, abs=1.0)
            assert idle.last_reading_error is None
            prom.stop()
            # Prometheus gone: nominal temperatures for everyone, and the error says why.
            watts = idle.idle_w(["node-a"])
            assert watts["node-a"] == pytest.approx(92.0, abs=1.0)
            assert idle.last_reading_error
        finally:
            prom.stop()


def test_a_pod_the_carbon_plugin_holds_wakes_no_node() -> None:
    waiting = pod("batch-1", None, "4", pending=True)
    held = pod("batch-2", None, "4", pending=True)
    # kube-scheduler's message carries each failing node's reason from the extender.
    held["status"]["conditions"][0]["message"] = (
        "0/5 nodes are available: 5 power-aware-scheduler/carbon-hold: a cleaner window "
        "(-31 %) starts at 13:00, before the deadline 18:00."
    )
    assert [p.name for p in pending_pods([waiting, held], SCHEDULER)] == ["default/batch-1"]
