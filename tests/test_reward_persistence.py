"""Learned rewards against the real API server (envtest): the pod watch feeds them, a ConfigMap
keeps them over a restart, deleting it resets them, and an API outage never overwrites them.

The extender runs as ServiceAccount power-extender with the rights manifests/base/extender.yaml
gives it (its rewards ConfigMap by name, pods and nodes read-only); an outage is a `FaultProxy`
refusing its connections. The ConfigMap's name is the one those rights name, in a namespace the
control plane shares: every test starts and ends without it.

Waits are bounded polling loops (never assertions on how fast something happened).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from bench.support import pods
from envtest import ControlPlane
from extender.plugins.base import SourceContext
from extender.plugins.reward import Reward, RewardArgs
from extender.rewards.source import REWARD_SIGNAL, RewardSettings, RewardSource
from extender.rewards.store import DATA_KEY, ConfigMapStore, SaveResult
from extender.sources.kube_watch import BOUND_POD_FIELD_SELECTOR, ClusterWatcher
from extender.state import ClusterState
from livedata.labels import REWARD_RESET_AT_ANNOTATION
from tests.support.exporters import wait_until
from tests.support.fault_proxy import FaultProxy
from tests.support.kube_api import (
    COMPONENT_NAMESPACE,
    RequestLog,
    component_client,
    force_delete_pods,
)

NAMESPACE = COMPONENT_NAMESPACE
CONFIG_MAP = "power-extender-rewards"  # the one ConfigMap manifests/base/extender.yaml grants
EXTENDER = "power-extender"
HASH = "6f8b9c7d54"


class Kube:
    """The admin's hands; `extender()` is a client as the extender's ServiceAccount."""

    def __init__(self, plane: ControlPlane, proxy: FaultProxy) -> None:
        self.plane = plane
        self.proxy = proxy
        self.core = client.CoreV1Api(plane.api_client())

    def extender(self) -> client.ApiClient:
        """The extender's client, through the proxy (which a test may make refuse it)."""
        return component_client(self.plane, EXTENDER, host=self.proxy.url)

    def config_map(self) -> dict[str, Any] | None:
        try:
            response = self.core.read_namespaced_config_map(
                CONFIG_MAP, NAMESPACE, _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return json.loads(response.data)

    def delete_config_map(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_config_map(CONFIG_MAP, NAMESPACE)


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    with FaultProxy("127.0.0.1", control_plane.apiserver_port) as proxy:
        admin = Kube(control_plane, proxy)
        admin.delete_config_map()
        yield admin
        admin.delete_config_map()


def new_source(kube: Kube, state: ClusterState | None = None) -> RewardSource:
    store = ConfigMapStore(kube.extender(), NAMESPACE, CONFIG_MAP)
    return RewardSource(
        RewardSettings(half_life_s=6 * 3600.0), state or ClusterState(), store=store
    )


def feed_crashes(source: RewardSource, node: str, deployment: str, restarts: int) -> None:
    now_s = time.time()
    name = f"{deployment}-{HASH}-x{restarts}"
    metadata = pods.deployment_pod_metadata(name, f"uid-{name}", deployment, HASH, "shop")
    bound = pods.bound_pod(metadata, node, at_s=now_s - 300)
    source.pod_event("ADDED", bound)
    source.pod_event("MODIFIED", pods.running_pod(bound, started_at_s=now_s - 290))
    source.pod_event(
        "MODIFIED",
        pods.crash_looping_pod(
            bound,
            restarts=restarts,
            reason="OOMKilled",
            exit_code=137,
            finished_at_s=now_s - 1,
            started_at_s=now_s - 20,
        ),
    )


def evidence(source: RewardSource, workload: str, node: str) -> tuple[float, float]:
    return source.publish().pair_counts(workload, node, time.time())


def test_learned_rewards_survive_a_restart(kube: Kube) -> None:
    first = new_source(kube)
    assert first.load()  # no ConfigMap yet: nothing to merge, and saving is allowed
    feed_crashes(first, "node-a", "web", restarts=5)
    feed_crashes(first, "node-b", "api", restarts=2)
    assert first.save() is SaveResult.SAVED
    saved = kube.config_map()
    assert saved is not None and saved["metadata"]["labels"]["app.kubernetes.io/name"]
    document = json.loads(gzip.decompress(base64.b64decode(saved["binaryData"][DATA_KEY])))
    assert document["workloads"]["shop/Deployment/web"]["node-a"][1] == pytest.approx(5, rel=1e-3)
    assert "pairs=2" in saved["data"]["summary"]

    # A new process (the extender restarted): the same evidence, a little faded.
    second = new_source(kube)
    assert second.load()
    good, bad = evidence(second, "shop/Deployment/web", "node-a")
    assert good == 0.0 and bad == pytest.approx(5.0, rel=1e-3)
    assert evidence(second, "shop/Deployment/api", "node-b")[1] == pytest.approx(2.0, rel=1e-3)
    # ... and it keeps learning on top and saving to the same ConfigMap.
    feed_crashes(second, "node-a", "web", restarts=1)
    assert second.save() is SaveResult.SAVED
    assert kube.config_map()["metadata"]["uid"] == saved["metadata"]["uid"]


def test_deleting_the_configmap_resets_what_was_learned(kube: Kube) -> None:
    source = new_source(kube)
    source.load()
    feed_crashes(source, "node-a", "web", restarts=5)
    assert source.save() is SaveResult.SAVED
    kube.delete_config_map()  # the operator's reset

    assert source.save() is SaveResult.RESET
    assert source.model.nodes == 0 and source.status()["persistence"]["resets"] == 1
    assert kube.config_map() is None  # nothing old written back
    feed_crashes(source, "node-c", "web", restarts=1)
    assert source.save() is SaveResult.SAVED  # a fresh start, saved anew
    fresh = new_source(kube)
    fresh.load()
    assert set(fresh.publish().node_rows) == {"node-c"}


def test_an_api_outage_at_start_never_overwrites_saved_rewards(kube: Kube) -> None:
    first = new_source(kube)
    first.load()
    feed_crashes(first, "node-a", "web", restarts=4)
    first.save()

    kube.proxy.refuse()  # the API server unreachable for the restarted extender
    second = new_source(kube)
    assert not second.load()  # learns from scratch meanwhile...
    feed_crashes(second, "node-b", "web", restarts=1)
    assert second.save() is None  # ... but saves nothing while it could not read
    assert (
        f"reading ConfigMap {NAMESPACE}/{CONFIG_MAP}"
        in second.status()["persistence"]["last_error"]
    )
    kube.proxy.resume()
    assert second.save() is SaveResult.SAVED  # read, merged, written
    third = new_source(kube)
    third.load()
    assert evidence(third, "shop/Deployment/web", "node-a")[1] == pytest.approx(4.0, rel=1e-3)
    assert evidence(third, "shop/Deployment/web", "node-b")[1] == pytest.approx(1.0, rel=1e-3)


def test_a_refusal_of_the_api_is_reported_with_the_rbac_to_look_at(kube: Kube) -> None:
    # An identity without the extender's rights (the energy adapter's): the server's 403.
    store = ConfigMapStore(component_client(kube.plane, "energy-adapter"), NAMESPACE, CONFIG_MAP)
    source = RewardSource(RewardSettings(half_life_s=6 * 3600.0), ClusterState(), store=store)
    assert not source.load()
    error = source.status()["persistence"]["last_error"]
    assert f"reading ConfigMap {NAMESPACE}/{CONFIG_MAP}: HTTP 403" in error
    assert "see manifests/" in error and "extender.yaml" in error and "energy-adapter" in error
    assert source.save() is None  # never writes what it could not read
    assert kube.config_map() is None


def test_the_pod_watch_feeds_the_plugin_and_a_restart_keeps_what_it_learned(
    kube: Kube, kube_api: client.ApiClient, namespace: str
) -> None:
    """End to end: the plugin's background source on the real watch, through the real client.

    The pod is a Deployment's, on a node without a kubelet: the test writes what a kubelet
    would into its status (running, three OOM kills, an eviction), and the ReplicaSet replaces
    it once it is evicted, as in a cluster.
    """
    extender = component_client(kube.plane, EXTENDER)

    def start() -> tuple[ClusterWatcher, Reward, ClusterState]:
        state = ClusterState()
        watcher = ClusterWatcher(
            client.CoreV1Api(extender), state, resync_backoff_s=0.05, watch_timeout_s=2
        )
        plugin = Reward(
            RewardArgs(
                config_map_namespace=NAMESPACE, save_interval_s=3600.0, publish_interval_s=0.05
            )
        )
        context = SourceContext(
            state=state,
            clock=time.time,
            mode="live",
            kube_api=extender,
            registry=CollectorRegistry(),
            pod_watch=watcher,
        )
        (source,) = plugin.background(context)
        watcher.start()
        source.start()
        return watcher, plugin, state

    node = f"{namespace}-a"
    kube.core.create_node({"metadata": {"name": node}, "status": {"allocatable": {"cpu": "8"}}})
    apps = client.AppsV1Api(kube_api)
    try:
        with RequestLog().recording() as sent:
            watcher, plugin, state = start()
            try:
                wait_until(
                    lambda: watcher.healthy and plugin.status()["persistence"]["loaded"], "sync"
                )
                apps.create_namespaced_deployment(namespace, web_deployment(node))
                began_s = time.time() - 60  # the kubelet's timestamps, all in the past
                name = wait_for_pod(kube, namespace)
                wait_until(lambda: plugin.status()["tracked_pods"] == 1, "the bound pod")
                kubelet_writes(kube, namespace, name, lambda p: bound_status(p, node, began_s))
                kubelet_writes(
                    kube, namespace, name, lambda p: pods.running_pod(p, started_at_s=began_s + 1)
                )
                # The kubelet reports three OOM kills, then the node evicts the pod.
                kubelet_writes(
                    kube,
                    namespace,
                    name,
                    lambda p: pods.crash_looping_pod(
                        p,
                        restarts=3,
                        reason="OOMKilled",
                        exit_code=137,
                        finished_at_s=began_s + 30,
                        started_at_s=began_s + 20,
                    ),
                )

                def learned() -> dict[str, int]:
                    return plugin.status()["outcomes"]

                wait_until(lambda: learned() == {"oom_killed": 3}, "the OOM kills")
                kubelet_writes(
                    kube,
                    namespace,
                    name,
                    lambda p: pods.failed_pod(
                        p,
                        started_at_s=began_s + 31,
                        finished_at_s=began_s + 40,
                        reason="Evicted",
                        message="The node was low on resource: memory.",
                        disruption="TerminationByKubelet",
                    ),
                )
                wait_until(lambda: learned() == {"oom_killed": 3, "evicted": 1}, "the eviction")

                def published_bad() -> float:
                    snapshot = state.view(time.time()).signal(REWARD_SIGNAL)
                    if snapshot is None:
                        return -1.0
                    return float(snapshot.node_counts(time.time())[1].sum())

                wait_until(lambda: published_bad() == pytest.approx(4, rel=1e-3), "the snapshot")
            finally:
                watcher.stop()
                plugin.source.stop()  # a last save on the way out
        pod_requests = [
            r
            for r in sent.by(EXTENDER)
            if r.path == "/api/v1/pods" and r.query.get("fieldSelector")
        ]
        assert {r.query["fieldSelector"][0] for r in pod_requests} == {BOUND_POD_FIELD_SELECTOR}
        assert kube.config_map() is not None

        watcher, plugin, state = start()  # the extender restarted
        try:
            wait_until(lambda: plugin.status()["persistence"]["loaded"], "the saved rewards")
            wait_until(lambda: published_bad() == pytest.approx(4, rel=1e-3), "the loaded evidence")
            # The Failed pod is still listed, but it ended before the save: not counted twice.
            # (Its replacement, from the ReplicaSet, is the other pod followed.)
            wait_until(lambda: plugin.status()["tracked_pods"] == 2, "the relisted pods")
            assert plugin.status()["outcomes"] == {}

            # The node is repaired: the operator resets what it taught, by a node annotation.
            annotate(kube, node, "no")
            wait_until(lambda: node in _annotated(state), "the unreadable annotation")
            plugin.source.run_once()
            assert published_bad() == pytest.approx(4, rel=1e-3)  # unreadable: nothing reset
            reset_at = datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            annotate(kube, node, reset_at)
            wait_until(lambda: published_bad() == 0.0, "the reset")
            assert plugin.status()["node_resets_applied"] == 1
            assert node in plugin.status()["node_resets"]
        finally:
            watcher.stop()
            plugin.source.stop()

        watcher, plugin, state = start()  # restarted again, the annotation still on the node
        try:
            wait_until(lambda: plugin.status()["persistence"]["loaded"], "the saved rewards")
            wait_until(lambda: node in _annotated(state), "the node's annotation")
            plugin.source.run_once()
            assert published_bad() == 0.0  # the old evidence did not come back...
            assert plugin.status()["node_resets_applied"] == 0  # ...and nothing was reset twice
        finally:
            watcher.stop()
            plugin.source.stop()
    finally:
        with contextlib.suppress(ApiException):
            apps.delete_namespaced_deployment(namespace, namespace)
        force_delete_pods(kube.core, namespace)
        with contextlib.suppress(ApiException):
            kube.core.delete_node(node)


def web_deployment(node: str) -> dict[str, Any]:
    """Deployment web, its pod placed on `node` directly (no kubelet there: the test is it)."""
    labels = {"app": "web"}
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": pods.CONTAINER, "image": pods.IMAGE}],
                },
            },
        },
    }


def wait_for_pod(kube: Kube, namespace: str) -> str:
    names: list[str] = []

    def created() -> bool:
        names[:] = [p.metadata.name for p in kube.core.list_namespaced_pod(namespace).items]
        return len(names) == 1

    wait_until(created, "the ReplicaSet's pod")
    return names[0]


def read_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    response = kube.core.read_namespaced_pod(name, namespace, _preload_content=False)
    return json.loads(response.data)


def bound_status(pod: dict[str, Any], node: str, at_s: float) -> dict[str, Any]:
    """What the kubelet first writes: Pending, its container being created (the QoS class is
    the API server's, set at creation and immutable)."""
    status = pods.bound_pod(pod["metadata"], node, at_s=at_s)["status"]
    return {**pod, "status": {**status, "qosClass": pod["status"]["qosClass"]}}


def kubelet_writes(kube: Kube, namespace: str, name: str, change: Any) -> None:
    """Read the pod, change its status as a kubelet would, write it (the status subresource)."""
    updated = change(read_pod(kube, namespace, name))
    kube.core.replace_namespaced_pod_status(name, namespace, updated)


def annotate(kube: Kube, node: str, value: str) -> None:
    kube.core.patch_node(node, {"metadata": {"annotations": {REWARD_RESET_AT_ANNOTATION: value}}})


def _annotated(state: ClusterState) -> set[str]:
    return {
        node.name
        for node in state.node_infos()
        if REWARD_RESET_AT_ANNOTATION in (node.annotations or {})
    }
