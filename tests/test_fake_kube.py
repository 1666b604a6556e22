"""The fake API server answers the official `kubernetes` client as a real kube-apiserver does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client, watch
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from tests.support.fake_kube import FakeKube


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    with FakeKube() as server:
        yield server


@pytest.fixture
def core(kube: FakeKube) -> client.CoreV1Api:
    return kube.core_v1()


def status_of(error: ApiException) -> dict[str, Any]:
    return json.loads(error.body)


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
    }


def test_create_get_and_409_already_exists(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", config_map("models", a="1"))
    assert created.metadata.uid
    assert created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    assert core.read_namespaced_config_map("models", "default").data == {"a": "1"}

    with pytest.raises(ApiException) as raised:
        core.create_namespaced_config_map("default", config_map("models", a="2"))
    assert raised.value.status == 409
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "models" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "models", "kind": "configmaps"},
        "code": 409,
    }


def test_missing_object_and_namespace_answer_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as raised:
        core.read_namespaced_config_map("absent", "default")
    assert raised.value.status == 404
    assert status_of(raised.value)["reason"] == "NotFound"
    assert status_of(raised.value)["message"] == 'configmaps "absent" not found'

    with pytest.raises(ApiException) as raised:
        core.create_namespaced_config_map("no-such-ns", config_map("x"))
    assert status_of(raised.value)["message"] == 'namespaces "no-such-ns" not found'


def test_replace_bumps_version_and_stale_version_conflicts(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_config_map("default", config_map("models", a="1"))
    body = config_map("models", a="2")
    body["metadata"]["resourceVersion"] = first.metadata.resource_version
    second = core.replace_namespaced_config_map("models", "default", body)
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert second.metadata.uid == first.metadata.uid
    assert second.data == {"a": "2"}

    # Same stale resourceVersion again: the object has moved on.
    with pytest.raises(ApiException) as raised:
        core.replace_namespaced_config_map("models", "default", body)
    assert raised.value.status == 409
    assert status_of(raised.value)["reason"] == "Conflict"
    assert "the object has been modified" in status_of(raised.value)["message"]


def test_patch_merges_labels_and_deletes_with_null(core: client.CoreV1Api) -> None:
    core.create_node(node("node-a", {"keep": "yes", "energy-status": "vulnerable"}))
    patched = core.patch_node(
        "node-a", {"metadata": {"labels": {"energy-status": "powerless", "keep": None}}}
    )
    assert patched.metadata.labels == {"energy-status": "powerless"}
    assert patched.status.allocatable == {"cpu": "4", "memory": "8Gi"}


def test_patch_content_types(kube: FakeKube, core: client.CoreV1Api) -> None:
    core.create_node(node("node-a", {"a": "1"}))
    core.patch_node("node-a", {"metadata": {"labels": {"b": "2"}}})
    core.patch_node(
        "node-a", [{"op": "add", "path": "/metadata/labels/c", "value": "3"}]
    )  # a list goes out as JSON patch
    assert core.read_node("node-a").metadata.labels == {"a": "1", "b": "2", "c": "3"}
    patch_types = [r.headers.get("Content-Type") for r in kube.requests if r.method == "PATCH"]
    assert patch_types == [
        "application/strategic-merge-patch+json",
        "application/json-patch+json",
    ]


def test_noop_patch_keeps_resource_version(core: client.CoreV1Api) -> None:
    created = core.create_node(node("node-a", {"a": "1"}))
    same = core.patch_node("node-a", {"metadata": {"labels": {"a": "1"}}})
    assert same.metadata.resource_version == created.metadata.resource_version


def test_delete_and_list_with_selectors(kube: FakeKube, core: client.CoreV1Api) -> None:
    core.create_node(node("node-a", {"zone": "x"}))
    core.create_node(node("node-b", {"zone": "y"}))
    for name, node_name in (("p1", "node-a"), ("p2", "node-b"), ("p3", None)):
        core.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name},
                "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]},
            },
        )
    listed = core.list_node(label_selector="zone in (x,z)")
    assert [n.metadata.name for n in listed.items] == ["node-a"]
    assert int(listed.metadata.resource_version) == kube.resource_version
    on_b = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-b")
    assert [p.metadata.name for p in on_b.items] == ["p2"]
    unbound = core.list_namespaced_pod("default", field_selector="spec.nodeName=")
    assert [p.metadata.name for p in unbound.items] == ["p3"]
    assert core.list_namespaced_pod("default").items[0].status.phase == "Pending"

    with pytest.raises(ApiException) as raised:
        core.list_node(field_selector="spec.nodeName=x")
    assert raised.value.status == 400

    deleted = core.delete_namespaced_pod("p1", "default")
    assert deleted.metadata.name == "p1"
    status = core.delete_node("node-b")
    assert status["status"] == "Success"  # the client hands back the raw Status
    assert [n.metadata.name for n in core.list_node().items] == ["node-a"]


def test_eviction_deletes_the_pod(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    core.create_namespaced_pod_eviction(
        "p",
        "default",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}},
    )
    assert core.list_namespaced_pod("default").items == []


def test_watch_streams_changes_after_resource_version(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    core.create_node(node("node-a"))
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
            if event["type"] == "DELETED":
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    ready.wait()
    core.create_node(node("node-b"))
    core.patch_node("node-a", {"metadata": {"labels": {"energy-status": "powerless"}}})
    kube.delete("nodes", "node-b")  # a Python-side write notifies watches too
    consumer.join(timeout=10)
    assert seen == [
        ("ADDED", "node-b", {}),
        ("MODIFIED", "node-a", {"energy-status": "powerless"}),
        ("DELETED", "node-b", {}),
    ]


def test_watch_chunked_lines_and_timeout(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("node-a"))
    response = core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert response.headers["Transfer-Encoding"] == "chunked"
    lines = response.data.decode().splitlines()  # returns once the timeout ends the stream
    assert [json.loads(line)["type"] for line in lines] == ["ADDED"]
    assert json.loads(lines[0])["object"]["kind"] == "Node"


def test_watch_with_selector_reports_leaving_as_deleted(core: client.CoreV1Api) -> None:
    core.create_node(node("node-a", {"pool": "green"}))
    rv = core.list_node().metadata.resource_version
    core.patch_node("node-a", {"metadata": {"labels": {"pool": "brown"}}})
    response = core.list_node(
        watch=True,
        label_selector="pool=green",
        resource_version=rv,
        timeout_seconds=1,
        _preload_content=False,
    )
    events = [json.loads(line) for line in response.data.decode().splitlines()]
    # kube-apiserver's watch cache sends the object as it was before it left the selection,
    # at the resourceVersion of the change (cacheWatcher.convertToWatchEvent).
    assert [(e["type"], e["object"]["metadata"]["labels"]) for e in events] == [
        ("DELETED", {"pool": "green"})
    ]
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(int(rv) + 1)


def test_watch_from_expired_version_is_410_gone(kube: FakeKube, core: client.CoreV1Api) -> None:
    core.create_node(node("node-a"))
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


def test_fault_injection_and_request_log(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.fail_next(2)
    for _ in range(2):
        with pytest.raises(ApiException) as raised:
            core.list_node()
        assert raised.value.status == 500
        assert status_of(raised.value)["reason"] == "InternalError"
    assert core.list_node().items == []
    assert [(r.method, r.path) for r in kube.requests] == [("GET", "/api/v1/nodes")] * 3
    core.create_node(node("node-a"))
    assert kube.requests[-1].json()["metadata"]["name"] == "node-a"


def test_dropped_watch_breaks_the_stream(kube: FakeKube, core: client.CoreV1Api) -> None:
    rv = core.list_node().metadata.resource_version
    errors: list[BaseException] = []
    started = threading.Event()

    def consume() -> None:
        try:
            started.set()
            for _ in watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=30):
                pass
        except Exception as error:  # the broken stream surfaces as a client-side error
            errors.append(error)

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait()
    # Wait until the watch request reached the server before cutting it.
    for _ in range(200):
        if any(r.query.get("watch") for r in kube.requests):
            break
        threading.Event().wait(0.02)
    kube.drop_watches()
    consumer.join(timeout=10)
    assert not consumer.is_alive()
    assert errors, "a cut stream must not look like a clean end"


def test_binding_assigns_the_node_once(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"containers": []}})
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-a"}}
    response = core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert response.status == 201
    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "node-a"
    assert [c.type for c in bound.status.conditions] == ["PodScheduled"]
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert raised.value.status == 409
    assert "already assigned to node" in status_of(raised.value)["message"]


def test_kubeconfig_points_the_client_at_the_fake(kube: FakeKube, tmp_path: Path) -> None:
    kube.create("nodes", node("node-a"))
    configuration = client.Configuration()
    kube_config.load_kube_config(
        config_file=str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
        client_configuration=configuration,
    )
    with client.ApiClient(configuration) as api_client:
        names = [n.metadata.name for n in client.CoreV1Api(api_client).list_node().items]
    assert names == ["node-a"]
    assert kube.requests[-1].headers["Authorization"] == "Bearer fake-token"


# ---- what the node power controller uses: evictions under budgets, Leases -------------------


def running_pod(name: str, labels: dict[str, str], *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": "node-a"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def budget(name: str, labels: dict[str, str], allowed: int, **status: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}},
        "status": {
            "observedGeneration": 1,
            "disruptionsAllowed": allowed,
            "currentHealthy": status.get("current", 2),
            "desiredHealthy": status.get("desired", 2),
            "expectedPods": 2,
        },
    }


def evict(core: client.CoreV1Api, name: str) -> None:
    core.create_namespaced_pod_eviction(
        name,
        "default",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}},
        _preload_content=False,
    )


def test_eviction_refused_by_a_budget_is_429_with_the_real_status(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    kube.create("pods", running_pod("web-1", {"app": "web"}), "default")
    kube.create("poddisruptionbudgets", budget("web-pdb", {"app": "web"}, 0), "default")
    with pytest.raises(ApiException) as raised:
        evict(core, "web-1")
    assert raised.value.status == 429
    assert status_of(raised.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "reason": "TooManyRequests",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 "
                    "currently",
                }
            ]
        },
        "code": 429,
    }
    assert kube.get("pods", "web-1", "default") is not None


def test_an_allowed_eviction_takes_one_disruption_from_the_budget(
    kube: FakeKube, core: client.CoreV1Api
) -> None:
    for name in ("web-1", "web-2"):
        kube.create("pods", running_pod(name, {"app": "web"}), "default")
    kube.create("poddisruptionbudgets", budget("web-pdb", {"app": "web"}, 1), "default")
    evict(core, "web-1")
    assert kube.get("pods", "web-1", "default") is None
    status = kube.get("poddisruptionbudgets", "web-pdb", "default")["status"]
    assert status["disruptionsAllowed"] == 0
    assert set(status["disruptedPods"]) == {"web-1"}
    with pytest.raises(ApiException) as raised:
        evict(core, "web-2")
    assert raised.value.status == 429


def test_eviction_budget_rules_of_the_registry(kube: FakeKube, core: client.CoreV1Api) -> None:
    kube.create("poddisruptionbudgets", budget("strict", {"app": "web"}, 0), "default")
    # Pending pods go without a budget check; an unready pod costs nothing while the budget holds.
    pending = running_pod("starting", {"app": "web"})
    pending["status"]["phase"] = "Pending"
    kube.create("pods", pending, "default")
    kube.create("pods", running_pod("sick", {"app": "web"}, ready=False), "default")
    evict(core, "starting")
    evict(core, "sick")
    # A budget whose status predates its spec refuses, asking to come back in 10 s.
    kube.create("pods", running_pod("db-0", {"app": "db"}), "default")
    stale = budget("db-pdb", {"app": "db"}, 1)
    stale["status"]["observedGeneration"] = 0
    kube.create("poddisruptionbudgets", stale, "default")
    with pytest.raises(ApiException) as raised:
        evict(core, "db-0")
    details = status_of(raised.value)["details"]
    assert details["retryAfterSeconds"] == 10
    assert "still being processed" in details["causes"][0]["message"]
    # Two budgets over one pod: the eviction API does not support it.
    kube.create("poddisruptionbudgets", budget("db-pdb-2", {"app": "db"}, 1), "default")
    with pytest.raises(ApiException) as raised:
        evict(core, "db-0")
    assert raised.value.status == 500
    assert "more than one PodDisruptionBudget" in status_of(raised.value)["message"]
    # The URL and the body must name the same pod.
    with pytest.raises(ApiException) as raised:
        core.create_namespaced_pod_eviction(
            "db-0", "default", {"metadata": {"name": "other"}}, _preload_content=False
        )
    assert raised.value.status == 400


def test_budgets_list_across_namespaces_under_the_policy_group(kube: FakeKube) -> None:
    kube.create("poddisruptionbudgets", budget("a", {"app": "a"}, 1), "default")
    kube.create("poddisruptionbudgets", budget("b", {"app": "b"}, 1), "kube-system")
    policy = client.PolicyV1Api(kube.api_client())
    listed = policy.list_pod_disruption_budget_for_all_namespaces()
    assert sorted(p.metadata.name for p in listed.items) == ["a", "b"]
    assert listed.items[0].metadata.generation == 1
    assert listed.items[0].status.disruptions_allowed == 1
    # The core group does not serve it.
    assert requests.get(f"{kube.url}/api/v1/poddisruptionbudgets", timeout=5).status_code == 404


def lease_body(holder: str, renew: str = "2026-01-01T00:00:00.123456Z") -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lock"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": renew},
    }


def test_lease_optimistic_concurrency(kube: FakeKube) -> None:
    coordination = client.CoordinationV1Api(kube.api_client())
    created = coordination.create_namespaced_lease("default", lease_body("a"))
    assert created.api_version == "coordination.k8s.io/v1"
    with pytest.raises(ApiException) as raised:
        coordination.create_namespaced_lease("default", lease_body("b"))
    assert raised.value.status == 409
    assert status_of(raised.value)["message"] == (
        'leases.coordination.k8s.io "lock" already exists'
    )
    assert status_of(raised.value)["details"] == {
        "name": "lock",
        "group": "coordination.k8s.io",
        "kind": "leases",
    }
    # Two writers read the same version; the second replace is a Conflict.
    first, second = lease_body("a", renew="2026-01-01T00:00:02.000001Z"), lease_body("b")
    for body in (first, second):
        body["metadata"]["resourceVersion"] = created.metadata.resource_version
    coordination.replace_namespaced_lease("lock", "default", first)
    with pytest.raises(ApiException) as raised:
        coordination.replace_namespaced_lease("lock", "default", second)
    assert raised.value.status == 409
    assert status_of(raised.value)["reason"] == "Conflict"
    assert coordination.read_namespaced_lease("lock", "default").spec.holder_identity == "a"


def test_lease_times_must_be_microtimes(kube: FakeKube) -> None:
    # The official client turns times into datetimes and writes them back with isoformat(),
    # which drops a zero fraction: the server's MicroTime parser refuses that.
    coordination = client.CoordinationV1Api(kube.api_client())
    with pytest.raises(ApiException) as raised:
        coordination.create_namespaced_lease(
            "default", lease_body("a", renew="2026-01-01T00:00:00.000000Z")
        )
    assert raised.value.status == 400
    assert 'as "2006-01-02T15:04:05.000000Z07:00"' in status_of(raised.value)["message"]
