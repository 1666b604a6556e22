"""ClusterWatcher against the real API server (envtest), as ServiceAccount power-extender.

The watcher reads through the official client with the token and rights the manifests give
the extender; connection faults come from a `FaultProxy` between it and the API server, an
expired watch from a real API server restart (see `test_410_gone_relists`). Node names carry
the test's namespace, as the control plane is shared; nodes a NodeAgent serves finish graceful
deletions as a kubelet does, plain nodes keep what the test writes into their pods' status.

Waits are bounded polling loops on the state (never assertions on how fast it happened).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from envtest import ControlPlane, NodeAgent
from extender.node_requests import REQUESTED_CPU_SIGNAL
from extender.plugins.energy_level import ENERGY_LEVEL, EnergyLevel
from extender.sources.kube_watch import (
    POD_FIELD_SELECTOR,
    ClusterWatcher,
    node_info_from_object,
    pod_bound_at_s,
)
from extender.state import ClusterState
from tests.support.exporters import wait_until
from tests.support.fault_proxy import FaultProxy
from tests.support.kube_api import (
    RequestLog,
    component_client,
    force_delete_pods,
    kubeconfig_via,
)

EXTENDER = "power-extender"
NO_SCHEDULER = "nobody"  # pods left for the test to bind, as kube-scheduler would


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
    """A pod body, no scheduler's; `scheduled_at` goes in its status (`Cluster.create_pod`
    writes that through the status subresource: the server drops status on create)."""
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "schedulerName": NO_SCHEDULER,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "x", "resources": {"requests": {"cpu": cpu}}}],
        },
    }
    if scheduled_at is not None:
        body["status"] = {"conditions": [scheduled_condition(scheduled_at)]}
    return body


def scheduled_condition(at: datetime) -> dict[str, str]:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}


def assumed_cpu(state: ClusterState, node_name: str) -> float:
    view = state.view(time.time())
    position = view.node(node_name)
    return float(view.assumed_cpu[position]) if position >= 0 else float("nan")


def energy(state: ClusterState, node_name: str) -> EnergyLevel | None:
    view = state.view(time.time())
    position = view.node(node_name)
    return EnergyLevel(int(view.node_values(ENERGY_LEVEL)[position])) if position >= 0 else None


# ---------------------------------------------------------------------------------------------
# Fixtures: the admin's hands, the extender's identity, and a proxy between it and the server


class Cluster:
    """What the test does as admin, in its own namespace, with node names of its own."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.node_names: list[str] = []

    def name(self, short: str) -> str:
        return f"{self.namespace}-{short}"

    def mine(self, names: list[str]) -> list[str]:
        return sorted(n for n in names if n.startswith(f"{self.namespace}-"))

    def create_node(self, short: str, cpu: str = "8", labels: dict[str, str] | None = None) -> str:
        name = self.name(short)
        self.core.create_node(node(name, cpu, labels))
        self.node_names.append(name)
        return name

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create, then write the body's status, as a scheduler or kubelet would (the server
        drops status on create)."""
        status = body.pop("status", None)
        wait_until(self._default_service_account, "the namespace's default ServiceAccount")
        self.core.create_namespaced_pod(self.namespace, body)
        name = body["metadata"]["name"]
        if status is not None:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})
        return body

    def set_phase(self, name: str, phase: str, reason: str | None = None) -> None:
        status: dict[str, Any] = {"phase": phase}
        if reason:
            status["reason"] = reason
        self.core.patch_namespaced_pod_status(name, self.namespace, {"status": status})

    def bind(self, pod_name: str, node_name: str) -> None:
        # The server answers a Status the client cannot read as a V1Binding: the raw response.
        self.core.create_namespaced_pod_binding(
            pod_name,
            self.namespace,
            {"metadata": {"name": pod_name}, "target": {"kind": "Node", "name": node_name}},
            _preload_content=False,
        )

    def phase(self, name: str) -> str:
        return self.core.read_namespaced_pod(name, self.namespace).status.phase

    def gone(self, name: str) -> bool:
        try:
            self.core.read_namespaced_pod(name, self.namespace)
        except ApiException as error:
            return error.status == 404
        return False

    def _default_service_account(self) -> bool:
        try:
            self.core.read_namespaced_service_account("default", self.namespace)
        except ApiException:
            return False
        return True

    def cleanup(self) -> None:
        force_delete_pods(self.core, self.namespace)
        for name in self.node_names:
            with contextlib.suppress(ApiException):
                self.core.delete_node(name)


@pytest.fixture
def cluster(kube_api: client.ApiClient, namespace: str) -> Iterator[Cluster]:
    admin = Cluster(client.CoreV1Api(kube_api), namespace)
    yield admin
    admin.cleanup()


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", control_plane.apiserver_port) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def sent() -> Iterator[RequestLog]:
    with RequestLog().recording() as log:
        yield log


@pytest.fixture
def api(control_plane: ControlPlane, proxy: FaultProxy) -> client.CoreV1Api:
    """The extender's client: its own ServiceAccount, through the proxy."""
    return client.CoreV1Api(component_client(control_plane, EXTENDER, host=proxy.url))


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


# ---------------------------------------------------------------------------------------------


def test_initial_list_fills_the_state(
    cluster: Cluster, state: ClusterState, watcher: ClusterWatcher, sent: RequestLog
) -> None:
    a = cluster.create_node("a", "16", {"energy-status": "low-powered"})
    b = cluster.create_node("b", "3500m")
    cluster.create_pod(pod("web", a, cpu="1500m"))
    assert not watcher.healthy and watcher.last_sync_at_s is None

    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    wait_until(lambda: cluster.mine(state.node_names()) == [a, b], "both nodes")
    view = state.view(time.time())
    np.testing.assert_allclose(view.allocatable_cpu[view.index_of([a, b])], [16, 3.5])
    assert energy(state, a) == EnergyLevel.LOW_POWERED
    assert energy(state, b) == EnergyLevel.GRID
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(1.5), "the bound pod")
    assert watcher.last_sync_at_s is not None
    # The pod list asked the server for bound, non-terminal pods only.
    pod_lists = [r for r in sent.by(EXTENDER) if r.path == "/api/v1/pods" and not r.watch]
    assert pod_lists[0].query["fieldSelector"] == [POD_FIELD_SELECTOR]
    assert POD_FIELD_SELECTOR == "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def test_node_changes_and_deletions_follow(
    cluster: Cluster, state: ClusterState, watcher: ClusterWatcher
) -> None:
    a = cluster.create_node("a", labels={"energy-status": "well-powered"})
    b = cluster.create_node("b")
    watcher.start()
    wait_until(lambda: len(cluster.mine(state.node_names())) == 2, "the initial nodes")

    cluster.core.patch_node(a, {"metadata": {"labels": {"energy-status": "powerless"}}})
    wait_until(lambda: energy(state, a) == EnergyLevel.POWERLESS, "the label change")
    c = cluster.create_node("c", "2")
    wait_until(lambda: c in state.node_names(), "the new node")
    cluster.core.delete_node(b)
    wait_until(lambda: b not in state.node_names(), "the deletion")
    assert cluster.mine(state.node_names()) == [a, c]


def test_bound_pod_adds_assumed_load_until_deleted(
    cluster: Cluster, node_agent: NodeAgent, state: ClusterState, watcher: ClusterWatcher
) -> None:
    a = cluster.name("a")
    node_agent.add_node(a, cpu=8)  # a kubelet stand-in: runs pods, finishes their deletion
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")

    # Created pending (no node), then bound through the Binding subresource, as kube-scheduler
    # does.
    cluster.create_pod(pod("batch", None, cpu="2"))
    cluster.create_pod(pod("web", a, cpu="250m"))
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(0.25), "the bound pod")
    cluster.bind("batch", a)
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(2.25), "the late binding")
    conditions = cluster.core.read_namespaced_pod("batch", cluster.namespace).status.conditions
    assert ("PodScheduled", "True") in {(c.type, c.status) for c in conditions}

    # Deleted gracefully: the pod stays (terminating) until its kubelet finishes it.
    cluster.core.delete_namespaced_pod("web", cluster.namespace)
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(2.0), "the deleted pod gone")
    assert cluster.gone("web")
    # A finished pod leaves the field selection and arrives as DELETED.
    wait_until(lambda: cluster.phase("batch") == "Running", "the kubelet to run the pod")
    cluster.set_phase("batch", "Succeeded")
    wait_until(lambda: assumed_cpu(state, a) == 0.0, "the finished pod gone")


def test_pods_bound_long_ago_add_nothing(
    cluster: Cluster, state: ClusterState, watcher: ClusterWatcher
) -> None:
    a = cluster.create_node("a")  # no kubelet: nothing rewrites the pods' conditions
    long_ago = datetime.fromtimestamp(time.time() - 3600, UTC)
    cluster.create_pod(pod("old", a, cpu="4", scheduled_at=long_ago))
    cluster.create_pod(pod("new", a, cpu="1", scheduled_at=datetime.now(UTC)))
    watcher.start()
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(1.0), "the recent pod only")
    # A pod that arrives by a watch event already bound long ago: its PodScheduled condition
    # was True before the binding, which keeps a condition's transition time when its status
    # does not change.
    cluster.create_pod(pod("old-2", None, cpu="4", scheduled_at=long_ago))
    cluster.bind("old-2", a)
    cluster.create_pod(pod("marker", a, cpu="100m"))
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(1.1), "the marker pod")
    scheduled = cluster.core.read_namespaced_pod("old-2", cluster.namespace).status.conditions
    assert [c.last_transition_time.timestamp() for c in scheduled if c.type == "PodScheduled"] == [
        long_ago.replace(microsecond=0).timestamp()
    ]


def requested(state: ClusterState, cluster: Cluster) -> dict[str, float] | None:
    signal = state.view(time.time()).signal(REQUESTED_CPU_SIGNAL)
    if signal is None:
        return None
    return {n: cores for n, cores in signal.cores.items() if n in cluster.mine(list(signal.cores))}


def test_requested_cpu_per_node_counts_every_running_pod_but_daemon_and_mirror_pods(
    cluster: Cluster,
    kube_api: client.ApiClient,
    node_agent: NodeAgent,
    state: ClusterState,
    watcher: ClusterWatcher,
) -> None:
    a, b = cluster.name("a"), cluster.name("b")
    node_agent.add_node(a, cpu=8)
    node_agent.add_node(b, cpu=8)
    long_ago = datetime.fromtimestamp(time.time() - 3600, UTC)
    # Bound long ago: no assumed load, but its requests count.
    cluster.create_pod(pod("old", a, cpu="4", scheduled_at=long_ago))
    # A DaemonSet's pod: its owner exists (else the garbage collector deletes the pod) and runs
    # nowhere itself; the pod is only referenced, so the DaemonSet controller leaves it alone.
    daemon_set = client.AppsV1Api(kube_api).create_namespaced_daemon_set(
        cluster.namespace,
        {
            "metadata": {"name": "exporter"},
            "spec": {
                "selector": {"matchLabels": {"app": "exporter-ds"}},
                "template": {
                    "metadata": {"labels": {"app": "exporter-ds"}},
                    "spec": {
                        "nodeSelector": {"no-such-label": "x"},
                        "containers": [{"name": "c", "image": "x"}],
                    },
                },
            },
        },
    )
    daemon = pod("exporter", a, cpu="1")
    daemon["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "exporter",
            "uid": daemon_set.metadata.uid,
        }
    ]
    cluster.create_pod(daemon)
    mirror = pod("etcd", b, cpu="2")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    cluster.create_pod(mirror)
    watcher.start()
    wait_until(lambda: requested(state, cluster) == {a: 4.0}, "the listed requests")

    cluster.create_pod(pod("web", b, cpu="250m"))
    wait_until(lambda: requested(state, cluster) == {a: 4.0, b: 0.25}, "the new pod")
    wait_until(lambda: cluster.phase("old") == "Running", "the kubelet to run the pod")
    cluster.set_phase("old", "Succeeded")
    wait_until(lambda: requested(state, cluster) == {b: 0.25}, "the finished pod gone")
    cluster.core.delete_namespaced_pod("web", cluster.namespace)
    wait_until(lambda: requested(state, cluster) == {}, "the deleted pod gone")


def test_a_pod_whose_demand_cannot_be_counted_is_skipped_and_counted(
    cluster: Cluster, state: ClusterState, watcher: ClusterWatcher
) -> None:
    a = cluster.create_node("a")
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    # A valid quantity to the API server (two million cores), absurd to the extender.
    cluster.create_pod(pod("typo", a, cpu="2M"))
    cluster.create_pod(pod("good", a, cpu="300m"))
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(0.3), "the good pod")
    assert watcher.invalid_pods_total == 1


def test_dropped_streams_reconnect_and_keep_following(
    cluster: Cluster,
    proxy: FaultProxy,
    state: ClusterState,
    watcher: ClusterWatcher,
    sent: RequestLog,
) -> None:
    a = cluster.create_node("a")
    watcher.start()
    wait_until(lambda: watcher.healthy, "the watcher to sync")
    relists_before = {r: watcher.status()[r]["relists_total"] for r in ("nodes", "pods")}

    for round_number in range(3):
        wait_until(lambda: proxy.open_connections >= 2, "both watches open")
        assert proxy.reset_connections() >= 2  # every stream cut mid-flight
        extra = cluster.create_node(f"extra-{round_number}")
        cluster.create_pod(pod(f"p{round_number}", a, cpu="1"))
        wait_until(
            lambda n=round_number, name=extra: (
                name in state.node_names() and assumed_cpu(state, a) == pytest.approx(n + 1)
            ),
            f"changes after drop {round_number}",
        )
    # Resumed from the last resourceVersion: dropping a stream does not force a relist.
    assert {r: watcher.status()[r]["relists_total"] for r in ("nodes", "pods")} == relists_before
    assert watcher.status()["nodes"]["failures_total"] >= 1
    resumed = [r for r in sent.by(EXTENDER) if r.watch]
    assert len(resumed) >= 6
    assert all(r.query["resourceVersion"][0] not in ("", "0") for r in resumed)
    wait_until(lambda: watcher.healthy, "health back after the drops")


def test_410_gone_relists(
    control_plane: ControlPlane,
    cluster: Cluster,
    node_agent: NodeAgent,
    proxy: FaultProxy,
    state: ClusterState,
    watcher: ClusterWatcher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = cluster.name("a"), cluster.name("b")
    node_agent.add_node(a, cpu=8)
    node_agent.add_node(b, cpu=8)
    cluster.create_pod(pod("web", a, cpu="1"))
    watcher.start()
    wait_until(lambda: watcher.status()["pods"]["relists_total"] == 1, "the first pod list")
    wait_until(lambda: watcher.status()["nodes"]["relists_total"] == 1, "the first node list")
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(1.0), "the bound pod")

    # The extender loses the API server (its watches cut, reconnections refused) while the
    # cluster changes: a deletion it will never see as a watch event...
    proxy.refuse()
    proxy.reset_connections()
    node_agent.remove_node(b)
    cluster.core.delete_namespaced_pod("web", cluster.namespace)
    wait_until(lambda: cluster.gone("web"), "the kubelet to finish the deletion")
    # ... and the API server restarts meanwhile. Its watch cache starts again from etcd's
    # current revision, after those deletions: a watch resumed from any older resourceVersion
    # is answered 410 Gone ("too old resource version"), and only a relist can show that
    # node-b and the pod are gone.
    control_plane.stop_component("kube-apiserver")
    control_plane.start_component("kube-apiserver")
    with caplog.at_level(logging.INFO, logger="livedata.list_watch"):
        proxy.resume()
        wait_until(lambda: cluster.mine(state.node_names()) == [a], "the relisted nodes")
        wait_until(lambda: assumed_cpu(state, a) == 0.0, "the relisted pods")
        wait_until(lambda: watcher.healthy, "health back")
    assert "nodes watch expired (410 Gone); relisting" in caplog.text
    assert "pods watch expired (410 Gone); relisting" in caplog.text
    assert watcher.status()["nodes"]["relists_total"] >= 2
    assert watcher.status()["pods"]["relists_total"] >= 2


def test_api_errors_for_a_while_then_recovery(
    control_plane: ControlPlane,
    cluster: Cluster,
    kube_api: client.ApiClient,
    proxy: FaultProxy,
    state: ClusterState,
) -> None:
    # Errors the API server answers itself: an identity without the extender's rights gets
    # 403 Forbidden until it is bound to the extender's ClusterRole.
    cluster.core.create_namespaced_service_account(cluster.namespace, {"metadata": {"name": "x"}})
    kubeconfig = control_plane.service_account_kubeconfig(cluster.namespace, "x")
    newcomer = control_plane.api_client(kubeconfig_via(kubeconfig, proxy.url))
    a = cluster.create_node("a")
    watcher = ClusterWatcher(
        client.CoreV1Api(newcomer),
        state,
        resync_backoff_s=0.05,
        max_backoff_s=0.2,
        watch_timeout_s=2,
    )
    rbac = client.RbacAuthorizationV1Api(kube_api)
    binding = f"{cluster.namespace}-extender"
    try:
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
        assert watcher.status()["nodes"]["last_error"].startswith("API error 403")

        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": binding},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": EXTENDER,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": "x", "namespace": cluster.namespace}
                ],
            }
        )
        wait_until(lambda: watcher.healthy, "recovery")
        assert a in state.node_names()
        assert watcher.status()["nodes"]["consecutive_failures"] == 0
        assert watcher.status()["nodes"]["failures_total"] >= 3

        # An outage mid-watch: the streams are cut, reconnections fail, then it all comes back.
        proxy.refuse()
        proxy.reset_connections()
        wait_until(lambda: not watcher.healthy, "the outage to be noticed")
        b = cluster.create_node("b")  # written while the extender cannot reach the API
        proxy.resume()
        wait_until(lambda: b in state.node_names(), "the change made during the outage")
        wait_until(lambda: watcher.healthy, "recovery after the second outage")
    finally:
        watcher.stop()
        with contextlib.suppress(ApiException):
            rbac.delete_cluster_role_binding(binding)


def test_stop_ends_the_threads(
    cluster: Cluster, api: client.CoreV1Api, state: ClusterState
) -> None:
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

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str, str | None]] = []

    def _ours(self, pod: dict[str, Any]) -> bool:
        return pod["metadata"]["namespace"] == self.namespace

    def pods_listed(self, pods: list[dict[str, Any]]) -> None:
        self.lists.append(sorted(p["metadata"]["name"] for p in pods if self._ours(p)))
        if len(self.lists) == 1:
            raise RuntimeError("a listener's bug must not stop the watch")

    def pod_event(self, event_type: str, pod: dict[str, Any]) -> None:
        if self._ours(pod):
            phase = (pod.get("status") or {}).get("phase")
            self.events.append((event_type, pod["metadata"]["name"], phase))


def test_pod_listeners_see_every_bound_pod_finished_ones_included(
    cluster: Cluster, state: ClusterState, watcher: ClusterWatcher
) -> None:
    a = cluster.create_node("a")  # no kubelet: the test writes the pod's end itself
    cluster.create_pod(pod("web", a, cpu="1"))
    cluster.create_pod(pod("pending", None))
    listener = _Listener(cluster.namespace)
    watcher.add_pod_listener(listener)
    watcher.start()
    with pytest.raises(RuntimeError, match="before starting"):
        watcher.add_pod_listener(_Listener(cluster.namespace))
    wait_until(lambda: listener.lists == [["web"]], "the first list, despite the failure")
    wait_until(lambda: assumed_cpu(state, a) == pytest.approx(1.0), "the bound pod")

    # A pod that fails stays in the selection (MODIFIED, phase Failed): the listener sees how
    # it ended, and the state drops its assumed load as before.
    cluster.set_phase("web", "Failed", reason="Evicted")
    wait_until(lambda: ("MODIFIED", "web", "Failed") in listener.events, "the Failed pod")
    wait_until(lambda: assumed_cpu(state, a) == 0.0, "its load gone")
    # A finished pod's deletion is immediate (no kubelet has anything left to stop).
    cluster.core.delete_namespaced_pod("web", cluster.namespace)
    wait_until(lambda: listener.events[-1][:2] == ("DELETED", "web"), "the deletion")
    assert all(name != "pending" for _, name, _ in listener.events)  # not bound: not selected
