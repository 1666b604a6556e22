"""ClusterWatcher against the fake API server, through the official client, end to end.

Waits are bounded polling loops on the state (never assertions on how fast it happened).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from extender.node_requests import REQUESTED_CPU_SIGNAL
from extender.plugins.energy_level import ENERGY_LEVEL, EnergyLevel
from extender.sources.kube_watch import ClusterWatcher, node_info_from_object, pod_bound_at_s
from extender.state import ClusterState
from tests.support.fake_kube import FakeKube

WAIT_S = 20.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(0.02)


def node(name: str, cpu: str = "8", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": cpu, "memory": "32Gi"}},
    }


def pod(
    name: str,
    node_name: str | None,
    cpu: str = "500m",
    scheduled_at: datetime | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        },
    }
    if scheduled_at is not None:
        stamp = scheduled_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        body["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}],
        }
    return body


def assumed_cpu(state: ClusterState, node_name: str) -> float:
    view = state.view(time.time())
    position = view.node(node_name)
    return float(view.assumed_cpu[position]) if position >= 0 else float("nan")


def energy(state: ClusterState, node_name: str) -> EnergyLevel | None:
    view = state.view(time.time())
    position = view.node(node_name)
    return EnergyLevel(int(view.node_values(ENERGY_LEVEL)[position])) if position >= 0 else None


def count_lists(kube: FakeKube) -> int:
    return sum(1 for r in kube.requests if r.method == "GET" and not r.query.get("watch"))


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


@pytest.fixture
def api(kube: FakeKube) -> client.CoreV1Api:
    return kube.core_v1()


@pytest.fixture
def state() -> ClusterState:
    return ClusterState(assumed_window_s=600.0)


@pytest.fixture
def watcher(api: client.CoreV1Api, state: ClusterState) -> Iterator[ClusterWatcher]:
    # A short server-side watch timeout makes the tests cross several watch restarts too.
    cluster_watcher = ClusterWatcher(
        api, state, resync_backoff_s=0.05, max_backoff_s=0.2, watch_timeout_s=2
    )
    yield cluster_watcher
    cluster_watcher.stop()


def test_initial_list_fills_the_state(
    kube: FakeKube, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a", "16", {"energy-status": "low-powered"}))
    kube.create("nodes", node("node-b", "3500m"))
    kube.create("pods", pod("web", "node-a", cpu="1500m"))
    assert not watcher.healthy and watcher.last_sync_at_s is None

    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    wait_until(lambda: sorted(state.node_names()) == ["node-a", "node-b"], "both nodes")
    view = state.view(time.time())
    np.testing.assert_allclose(view.allocatable_cpu[view.index_of(["node-a", "node-b"])], [16, 3.5])
    assert energy(state, "node-a") == EnergyLevel.LOW_POWERED
    assert energy(state, "node-b") == EnergyLevel.GRID
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(1.5), "the bound pod")
    assert watcher.last_sync_at_s is not None
    # The pod list asked the server for bound, non-terminal pods only.
    pod_lists = [r for r in kube.requests if r.path == "/api/v1/pods"]
    assert pod_lists[0].query["fieldSelector"] == [
        "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    ]


def test_node_changes_and_deletions_follow(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a", labels={"energy-status": "well-powered"}))
    kube.create("nodes", node("node-b"))
    watcher.start()
    wait_until(lambda: len(state.node_names()) == 2, "the initial nodes")

    api.patch_node("node-a", {"metadata": {"labels": {"energy-status": "powerless"}}})
    wait_until(lambda: energy(state, "node-a") == EnergyLevel.POWERLESS, "the label change")
    api.create_node(node("node-c", "2"))
    wait_until(lambda: "node-c" in state.node_names(), "the new node")
    api.delete_node("node-b")
    wait_until(lambda: "node-b" not in state.node_names(), "the deletion")
    assert sorted(state.node_names()) == ["node-a", "node-c"]


def test_bound_pod_adds_assumed_load_until_deleted(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")

    # Created pending (no node), then bound through the Binding subresource, as kube-scheduler
    # does. (The client cannot read the Status the server answers as a V1Binding, hence the raw
    # response.)
    api.create_namespaced_pod("default", pod("batch", None, cpu="2"))
    api.create_namespaced_pod("default", pod("web", "node-a", cpu="250m"))
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(0.25), "the bound pod")
    api.create_namespaced_pod_binding(
        "batch",
        "default",
        {"metadata": {"name": "batch"}, "target": {"kind": "Node", "name": "node-a"}},
        _preload_content=False,
    )
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(2.25), "the late binding")
    scheduled = api.read_namespaced_pod("batch", "default").status.conditions[0]
    assert (scheduled.type, scheduled.status) == ("PodScheduled", "True")

    api.delete_namespaced_pod("web", "default")
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(2.0), "the deleted pod gone")
    # A finished pod leaves the field selection and arrives as DELETED.
    api.patch_namespaced_pod("batch", "default", {"status": {"phase": "Succeeded"}})
    wait_until(lambda: assumed_cpu(state, "node-a") == 0.0, "the finished pod gone")
    assert state.assumed_pod_count() == 0


def test_pods_bound_long_ago_add_nothing(
    kube: FakeKube, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    long_ago = datetime.fromtimestamp(time.time() - 3600, UTC)
    kube.create("pods", pod("old", "node-a", cpu="4", scheduled_at=long_ago))
    kube.create("pods", pod("new", "node-a", cpu="1", scheduled_at=datetime.now(UTC)))
    watcher.start()
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(1.0), "the recent pod only")
    kube.create("pods", pod("old-2", "node-a", cpu="4", scheduled_at=long_ago))
    kube.create("pods", pod("marker", "node-a", cpu="100m"))
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(1.1), "the marker pod")


def requested(state: ClusterState) -> dict[str, float] | None:
    signal = state.view(time.time()).signal(REQUESTED_CPU_SIGNAL)
    return None if signal is None else dict(signal.cores)


def test_requested_cpu_per_node_counts_every_running_pod_but_daemon_and_mirror_pods(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    kube.create("nodes", node("node-b"))
    long_ago = datetime.fromtimestamp(time.time() - 3600, UTC)
    # Bound long ago: no assumed load, but its requests count.
    kube.create("pods", pod("old", "node-a", cpu="4", scheduled_at=long_ago))
    daemon = pod("exporter", "node-a", cpu="1")
    daemon["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "x", "uid": "u1"}]
    kube.create("pods", daemon)
    mirror = pod("etcd", "node-b", cpu="2")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    kube.create("pods", mirror)
    watcher.start()
    wait_until(lambda: requested(state) == {"node-a": 4.0}, "the listed requests")

    api.create_namespaced_pod("default", pod("web", "node-b", cpu="250m"))
    wait_until(lambda: requested(state) == {"node-a": 4.0, "node-b": 0.25}, "the new pod")
    api.patch_namespaced_pod("old", "default", {"status": {"phase": "Succeeded"}})
    wait_until(lambda: requested(state) == {"node-b": 0.25}, "the finished pod gone")
    api.delete_namespaced_pod("web", "default")
    wait_until(lambda: requested(state) == {}, "the deleted pod gone")


def test_bad_pod_is_skipped_and_counted(
    kube: FakeKube, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    kube.create("pods", pod("bad", "node-a", cpu="lots"))
    kube.create("pods", pod("good", "node-a", cpu="300m"))
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(0.3), "the good pod")
    assert watcher.invalid_pods_total == 1


def test_dropped_streams_reconnect_and_keep_following(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    lists_before = count_lists(kube)

    for round_number in range(3):
        kube.drop_watches()
        api.create_node(node(f"node-extra-{round_number}"))
        api.create_namespaced_pod("default", pod(f"p{round_number}", "node-a", cpu="1"))
        wait_until(
            lambda n=round_number: (
                f"node-extra-{n}" in state.node_names()
                and assumed_cpu(state, "node-a") == pytest.approx(n + 1)
            ),
            f"changes after drop {round_number}",
        )
    # Resumed from the last resourceVersion: dropping a stream does not force a relist.
    assert count_lists(kube) == lists_before
    resumed = [r for r in kube.requests if r.query.get("watch") and r.query.get("resourceVersion")]
    assert all(r.query["resourceVersion"][0] != "0" for r in resumed)
    wait_until(lambda: watcher.healthy, "health back after the drops")


def test_410_gone_relists(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    kube.create("nodes", node("node-b"))
    kube.create("pods", pod("web", "node-a", cpu="1"))
    watcher.start()
    wait_until(lambda: watcher.status()["pods"]["relists_total"] == 1, "the first pod list")
    wait_until(lambda: watcher.status()["nodes"]["relists_total"] == 1, "the first node list")

    # While the watches are cut and the history is gone, the cluster changes: a relist must
    # pick up the deletion that no watch event will ever report.
    kube.expire_watches()
    kube.delete("nodes", "node-b")
    kube.delete("pods", "web")
    wait_until(lambda: state.node_names() == ["node-a"], "the relisted nodes")
    wait_until(lambda: assumed_cpu(state, "node-a") == 0.0, "the relisted pods")
    assert watcher.status()["nodes"]["relists_total"] >= 2
    gone = [r for r in kube.requests if r.query.get("watch") and r.path == "/api/v1/nodes"]
    assert len(gone) >= 2


def test_api_errors_for_a_while_then_recovery(
    kube: FakeKube, api: client.CoreV1Api, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    kube.failing = True
    watcher.start()
    wait_until(
        lambda: (
            watcher.status()["nodes"]["consecutive_failures"] >= 3
            and watcher.status()["pods"]["consecutive_failures"] >= 3
        ),
        "several failed attempts",
    )
    assert not watcher.healthy
    assert state.node_names() == []

    kube.failing = False
    wait_until(lambda: watcher.healthy, "recovery")
    assert state.node_names() == ["node-a"]
    assert watcher.status()["nodes"]["consecutive_failures"] == 0
    assert watcher.status()["nodes"]["failures_total"] >= 3

    # Failing again mid-watch: the stream is cut, reconnects fail, then it all comes back.
    kube.failing = True
    kube.drop_watches()
    wait_until(lambda: not watcher.healthy, "the outage to be noticed")
    api_node = node("node-b")
    kube.create("nodes", api_node)  # written while the API refuses the watcher
    kube.failing = False
    wait_until(lambda: "node-b" in state.node_names(), "the change made during the outage")
    wait_until(lambda: watcher.healthy, "recovery after the second outage")


def test_stop_ends_the_threads(api: client.CoreV1Api, state: ClusterState) -> None:
    # This watcher's threads, not every "kube-" thread of the process: a live service another
    # test stopped may still be winding its watches down on a loaded machine.
    before = set(threading.enumerate())
    cluster_watcher = ClusterWatcher(api, state, watch_timeout_s=60)
    cluster_watcher.start()
    wait_until(lambda: cluster_watcher.healthy, "the watcher to sync")
    started = [t for t in threading.enumerate() if t.name.startswith("kube-") and t not in before]
    assert len(started) == 2  # the node and pod watch loops
    cluster_watcher.stop()
    assert [t.name for t in started if t.is_alive()] == []


def test_node_info_and_bound_time_conversions() -> None:
    info = node_info_from_object(
        {
            "metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"x": "y"}},
            "status": {"allocatable": {"cpu": "7900m"}},
        }
    )
    assert (info.name, info.allocatable_cpu, dict(info.labels), dict(info.annotations)) == (
        "n",
        7.9,
        {"a": "b"},
        {"x": "y"},
    )
    assert np.isnan(node_info_from_object({"metadata": {"name": "m"}}).allocatable_cpu)
    assert np.isnan(
        node_info_from_object(
            {"metadata": {"name": "m"}, "status": {"allocatable": {"cpu": "-1"}}}
        ).allocatable_cpu
    )
    scheduled = pod("p", "n", scheduled_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert (
        pod_bound_at_s(scheduled, now_s=2e9)
        == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()
    )
    assert pod_bound_at_s(pod("p", "n"), now_s=123.0) == 123.0


class _Listener:
    """A pod listener as the Reward plugin's source is one; the first call fails."""

    def __init__(self) -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str, str | None]] = []

    def pods_listed(self, pods: list[dict[str, Any]]) -> None:
        self.lists.append(sorted(p["metadata"]["name"] for p in pods))
        if len(self.lists) == 1:
            raise RuntimeError("a listener's bug must not stop the watch")

    def pod_event(self, event_type: str, pod: dict[str, Any]) -> None:
        phase = (pod.get("status") or {}).get("phase")
        self.events.append((event_type, pod["metadata"]["name"], phase))


def test_pod_listeners_see_every_bound_pod_finished_ones_included(
    kube: FakeKube, state: ClusterState, watcher: ClusterWatcher
) -> None:
    kube.create("nodes", node("node-a"))
    kube.create("pods", pod("web", "node-a", cpu="1"))
    kube.create("pods", pod("pending", None))
    listener = _Listener()
    watcher.add_pod_listener(listener)
    watcher.start()
    with pytest.raises(RuntimeError, match="before starting"):
        watcher.add_pod_listener(_Listener())
    wait_until(lambda: listener.lists == [["web"]], "the first list, despite the failure")
    wait_until(lambda: assumed_cpu(state, "node-a") == pytest.approx(1.0), "the bound pod")

    # A pod that fails stays in the selection (MODIFIED, phase Failed): the listener sees how
    # it ended, and the state drops its assumed load as before.
    kube.patch("pods", "web", {"status": {"phase": "Failed", "reason": "Evicted"}}, "default")
    wait_until(lambda: ("MODIFIED", "web", "Failed") in listener.events, "the Failed pod")
    wait_until(lambda: assumed_cpu(state, "node-a") == 0.0, "its load gone")
    kube.delete("pods", "web", "default")
    wait_until(lambda: listener.events[-1][:2] == ("DELETED", "web"), "the deletion")
    assert all(name != "pending" for _, name, _ in listener.events)  # not bound: not selected
