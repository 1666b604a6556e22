"""Learned rewards against the fake Kubernetes API: the pod watch feeds them, a ConfigMap keeps
them over a restart, deleting it resets them, and an API outage never overwrites them.

Waits are bounded polling loops (never assertions on how fast something happened).
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from bench.support import pods
from extender.plugins.base import SourceContext
from extender.plugins.reward import Reward, RewardArgs
from extender.rewards.source import REWARD_SIGNAL, RewardSettings, RewardSource
from extender.rewards.store import DATA_KEY, ConfigMapStore, SaveResult
from extender.sources.kube_watch import BOUND_POD_FIELD_SELECTOR, ClusterWatcher
from extender.state import ClusterState
from livedata.labels import REWARD_RESET_AT_ANNOTATION
from tests.support.fake_kube import FakeKube

NAMESPACE = "power-aware-scheduler"
CONFIG_MAP = "power-extender-rewards"
WAIT_S = 20.0
HASH = "6f8b9c7d54"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s:.0f} s waiting for: {what}")
        time.sleep(0.02)


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube(namespaces=("default", "shop", NAMESPACE)) as server:
        yield server


def new_source(kube: FakeKube, state: ClusterState | None = None) -> RewardSource:
    store = ConfigMapStore(kube.api_client(), NAMESPACE, CONFIG_MAP)
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


def test_learned_rewards_survive_a_restart(kube: FakeKube) -> None:
    first = new_source(kube)
    assert first.load()  # no ConfigMap yet: nothing to merge, and saving is allowed
    feed_crashes(first, "node-a", "web", restarts=5)
    feed_crashes(first, "node-b", "api", restarts=2)
    assert first.save() is SaveResult.SAVED
    saved = kube.get("configmaps", CONFIG_MAP, NAMESPACE)
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
    assert (
        kube.get("configmaps", CONFIG_MAP, NAMESPACE)["metadata"]["uid"] == saved["metadata"]["uid"]
    )


def test_deleting_the_configmap_resets_what_was_learned(kube: FakeKube) -> None:
    source = new_source(kube)
    source.load()
    feed_crashes(source, "node-a", "web", restarts=5)
    assert source.save() is SaveResult.SAVED
    kube.delete("configmaps", CONFIG_MAP, NAMESPACE)  # the operator's reset

    assert source.save() is SaveResult.RESET
    assert source.model.nodes == 0 and source.status()["persistence"]["resets"] == 1
    assert kube.get("configmaps", CONFIG_MAP, NAMESPACE) is None  # nothing old written back
    feed_crashes(source, "node-c", "web", restarts=1)
    assert source.save() is SaveResult.SAVED  # a fresh start, saved anew
    fresh = new_source(kube)
    fresh.load()
    assert set(fresh.publish().node_rows) == {"node-c"}


def test_an_api_outage_at_start_never_overwrites_saved_rewards(kube: FakeKube) -> None:
    first = new_source(kube)
    first.load()
    feed_crashes(first, "node-a", "web", restarts=4)
    first.save()

    kube.failing = True
    second = new_source(kube)
    assert not second.load()  # learns from scratch meanwhile...
    feed_crashes(second, "node-b", "web", restarts=1)
    assert second.save() is None  # ... but saves nothing while it could not read
    assert "HTTP 500" in second.status()["persistence"]["last_error"]
    kube.failing = False
    assert second.save() is SaveResult.SAVED  # read, merged, written
    third = new_source(kube)
    third.load()
    assert evidence(third, "shop/Deployment/web", "node-a")[1] == pytest.approx(4.0, rel=1e-3)
    assert evidence(third, "shop/Deployment/web", "node-b")[1] == pytest.approx(1.0, rel=1e-3)


def test_the_pod_watch_feeds_the_plugin_and_a_restart_keeps_what_it_learned(
    kube: FakeKube,
) -> None:
    """End to end: the plugin's background source on the real watch, through the real client."""

    def start() -> tuple[ClusterWatcher, Reward, ClusterState]:
        state = ClusterState()
        api = kube.core_v1()
        watcher = ClusterWatcher(api, state, resync_backoff_s=0.05, watch_timeout_s=2)
        plugin = Reward(
            RewardArgs(
                config_map_namespace=NAMESPACE, save_interval_s=3600.0, publish_interval_s=0.05
            )
        )
        context = SourceContext(
            state=state,
            clock=time.time,
            mode="live",
            kube_api=kube.api_client(),
            registry=CollectorRegistry(),
            pod_watch=watcher,
        )
        (source,) = plugin.background(context)
        watcher.start()
        source.start()
        return watcher, plugin, state

    kube.create("nodes", {"metadata": {"name": "node-a"}, "status": {"allocatable": {"cpu": "8"}}})
    watcher, plugin, state = start()
    try:
        wait_until(lambda: watcher.healthy and plugin.status()["persistence"]["loaded"], "sync")
        began_s = time.time() - 60  # the kubelet's timestamps, all in the past
        metadata = pods.deployment_pod_metadata(f"web-{HASH}-q2x7k", "ignored", "web", HASH, "shop")
        created = kube.create("pods", pods.bound_pod(metadata, "node-a", at_s=began_s))
        name = created["metadata"]["name"]
        wait_until(lambda: plugin.status()["tracked_pods"] == 1, "the bound pod")
        running = pods.running_pod(created, started_at_s=began_s + 1)
        kube.replace("pods", name, running, "shop", subresource="status")
        # The kubelet reports three OOM kills, then the node evicts the pod.
        looping = pods.crash_looping_pod(
            kube.get("pods", name, "shop"),
            restarts=3,
            reason="OOMKilled",
            exit_code=137,
            finished_at_s=began_s + 30,
            started_at_s=began_s + 20,
        )
        kube.replace("pods", name, looping, "shop", subresource="status")

        def learned() -> dict[str, int]:
            return plugin.status()["outcomes"]

        wait_until(lambda: learned() == {"oom_killed": 3}, "the OOM kills")
        evicted = pods.failed_pod(
            kube.get("pods", name, "shop"),
            started_at_s=began_s + 31,
            finished_at_s=began_s + 40,
            reason="Evicted",
            message="The node was low on resource: memory.",
            disruption="TerminationByKubelet",
        )
        kube.replace("pods", name, evicted, "shop", subresource="status")
        wait_until(lambda: learned() == {"oom_killed": 3, "evicted": 1}, "the eviction")

        def published_bad() -> float:
            snapshot = state.view(time.time()).signal(REWARD_SIGNAL)
            return -1.0 if snapshot is None else float(snapshot.node_counts(time.time())[1].sum())

        wait_until(lambda: published_bad() == pytest.approx(4, rel=1e-3), "the snapshot")
        pod_requests = [
            r for r in kube.requests if r.path == "/api/v1/pods" and r.query.get("fieldSelector")
        ]
        assert {r.query["fieldSelector"][0] for r in pod_requests} == {BOUND_POD_FIELD_SELECTOR}
    finally:
        watcher.stop()
        plugin.source.stop()  # a last save on the way out
    assert kube.get("configmaps", CONFIG_MAP, NAMESPACE) is not None

    watcher, plugin, state = start()  # the extender restarted
    try:
        wait_until(lambda: plugin.status()["persistence"]["loaded"], "the saved rewards")
        wait_until(lambda: published_bad() == pytest.approx(4, rel=1e-3), "the loaded evidence")
        # The Failed pod is still listed, but it ended before the save: not counted twice.
        wait_until(lambda: plugin.status()["tracked_pods"] == 1, "the relisted pod")
        assert plugin.status()["outcomes"] == {}

        # The node is repaired: the operator resets what it taught, by a node annotation.
        kube.patch(
            "nodes", "node-a", {"metadata": {"annotations": {REWARD_RESET_AT_ANNOTATION: "no"}}}
        )
        wait_until(lambda: "node-a" in _annotated(state), "the unreadable annotation")
        plugin.source.run_once()
        assert published_bad() == pytest.approx(4, rel=1e-3)  # unreadable: nothing reset
        reset_at = datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        kube.patch(
            "nodes", "node-a", {"metadata": {"annotations": {REWARD_RESET_AT_ANNOTATION: reset_at}}}
        )
        wait_until(lambda: published_bad() == 0.0, "the reset")
        assert plugin.status()["node_resets_applied"] == 1
        assert "node-a" in plugin.status()["node_resets"]
    finally:
        watcher.stop()
        plugin.source.stop()

    watcher, plugin, state = start()  # restarted again, the annotation still on the node
    try:
        wait_until(lambda: plugin.status()["persistence"]["loaded"], "the saved rewards")
        wait_until(lambda: "node-a" in _annotated(state), "the node's annotation")
        plugin.source.run_once()
        assert published_bad() == 0.0  # the old evidence did not come back...
        assert plugin.status()["node_resets_applied"] == 0  # ...and nothing was reset twice
    finally:
        watcher.stop()
        plugin.source.stop()


def _annotated(state: ClusterState) -> set[str]:
    return {
        node.name
        for node in state.node_infos()
        if REWARD_RESET_AT_ANNOTATION in (node.annotations or {})
    }
