"""The fake API server answers the official `kubernetes` client as a real kube-apiserver does,
for what it serves: reads, lists, watches and merge patches, and the faults it exists for."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support.fake_kube import FakeKube


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


@pytest.fixture
def core(kube: FakeKube) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client())


def status_of(error: ApiException) -> dict[str, Any]:
    return json.loads(error.body)


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
    }


def pod(name: str, node_name: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]},
    }


def test_objects_read_back_as_the_server_stored_them(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.create("nodes", node("node-a", {"a": "1"}))
    read = core.read_node("node-a")
    assert read.metadata.uid and read.metadata.resource_version
    assert read.metadata.creation_timestamp is not None
    assert read.metadata.labels == {"a": "1"}
    kube.create("pods", pod("p1", "node-a"), "default")
    assert core.read_namespaced_pod("p1", "default").status.phase == "Pending"


def test_missing_object_and_namespace_answer_404(kube: FakeKube, core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core.read_namespaced_pod("absent", "default")
    assert raised.value.status == 404
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "absent" not found',
        "reason": "NotFound",
        "details": {"name": "absent", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(ApiException) as raised:
        client.PolicyV1Api(kube.api_client()).read_namespaced_pod_disruption_budget(
            "absent", "default"
        )
    assert status_of(raised.value)["message"] == ('poddisruptionbudgets.policy "absent" not found')
    # Resources it does not serve are not there at all.
    with pytest.raises(ApiException) as raised:
        core.list_event_for_all_namespaces()
    assert raised.value.status == 404


def test_patch_merges_labels_and_deletes_with_null(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("node-a", {"keep": "yes", "energy-status": "vulnerable"}))
    patched = core.patch_node(  # the client sends a strategic merge patch
        "node-a", {"metadata": {"labels": {"energy-status": "powerless", "keep": None}}}
    )
    assert patched.metadata.labels == {"energy-status": "powerless"}
    assert patched.status.allocatable == {"cpu": "4", "memory": "8Gi"}
    assert kube.get("nodes", "node-a")["metadata"]["labels"] == {"energy-status": "powerless"}


def test_noop_patch_keeps_resource_version(kube: FakeKube, core: client.CoreV1Api) -> None:
    created = kube.create("nodes", node("node-a", {"a": "1"}))
    same = core.patch_node("node-a", {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == created["metadata"]["resourceVersion"]


def test_lists_across_namespaces_and_in_one(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("pods", pod("p1"), "default")
    kube.create("pods", pod("p2"), "kube-system")
    listed = core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in listed.items] == ["p1", "p2"]
    assert listed.metadata.resource_version == "4"  # two namespaces, two pods
    assert [p.metadata.name for p in core.list_namespaced_pod("kube-system").items] == ["p2"]
    kube.create("poddisruptionbudgets", {"metadata": {"name": "b"}, "spec": {}}, "default")
    budgets = client.PolicyV1Api(kube.api_client())
    (budget,) = budgets.list_pod_disruption_budget_for_all_namespaces().items
    assert budget.metadata.generation == 1


def test_watch_streams_changes_after_resource_version(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.create("nodes", node("node-a"))
    start_rv = core.list_node().metadata.resource_version
    seen: list[tuple[str, str, dict[str, str]]] = []
    ready = threading.Event()

    def consume() -> None:
        ready.set()
        for event in watch.Watch().stream(
            core.list_node, resource_version=start_rv, timeout_seconds=3
        ):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, obj.metadata.labels or {}))
            if len(seen) == 2:
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    ready.wait()
    kube.create("nodes", node("node-b"))  # a Python-side write notifies watches too
    core.patch_node("node-a", {"metadata": {"labels": {"energy-status": "powerless"}}})
    consumer.join(timeout=10)
    assert seen == [
        ("ADDED", "node-b", {}),
        ("MODIFIED", "node-a", {"energy-status": "powerless"}),
    ]


def test_watch_chunked_lines_and_timeout(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("node-a"))
    response = core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert response.headers["Transfer-Encoding"] == "chunked"
    lines = response.data.decode().splitlines()  # returns once the timeout ends the stream
    assert [json.loads(line)["type"] for line in lines] == ["ADDED"]
    assert json.loads(lines[0])["object"]["kind"] == "Node"


def test_watch_from_expired_version_is_410_gone(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("node-a"))
    old_rv = core.list_node().metadata.resource_version
    kube.expire_watches()
    response = core.list_node(
        watch=True, resource_version=old_rv, timeout_seconds=1, _preload_content=False
    )
    (line,) = response.data.decode().splitlines()
    event = json.loads(line)
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith(f"too old resource version: {old_rv} (")

    # The official Watch turns it into ApiException(410); a fresh list can watch again.
    with pytest.raises(ApiException) as raised:
        list(watch.Watch().stream(core.list_node, resource_version=old_rv, timeout_seconds=1))
    assert raised.value.status == 410
    fresh_rv = core.list_node().metadata.resource_version
    assert (
        list(watch.Watch().stream(core.list_node, resource_version=fresh_rv, timeout_seconds=1))
        == []
    )


def test_a_failing_server_answers_500_to_every_call(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("node-a"))
    kube.failing = True
    for call in (core.list_node, lambda: core.read_node("node-a")):
        with pytest.raises(ApiException) as raised:
            call()
        assert raised.value.status == 500
        assert status_of(raised.value)["reason"] == "InternalError"
    kube.failing = False
    assert [n.metadata.name for n in core.list_node().items] == ["node-a"]


def test_dropped_watch_breaks_the_stream(kube: FakeKube, core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    errors: list[BaseException] = []
    streaming = threading.Event()

    def consume() -> None:
        try:
            for event in watch.Watch().stream(
                core.list_node, resource_version=rv, timeout_seconds=30
            ):
                if event["object"].metadata.name == "node-a":
                    streaming.set()
        except Exception as error:  # the broken stream surfaces as a client-side error
            errors.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    # The stream is open once an event comes through it.
    kube.create("nodes", node("node-a"))
    assert streaming.wait(10)
    kube.drop_watches()
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    assert errors, "a cut stream must not look like a clean end"
