"""The real Kubernetes control plane, started once per test session for the tests that ask.

`control_plane` runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler (v1.36.2
from ../shared/k8s, or wherever KUBEBUILDER_ASSETS points: envtest.assets) on loopback; it
starts on first use (about 6 s) and stops when the session ends. Without the binaries the
tests that need them fail, saying how to get them: they never skip.

`node_agent` gives a test its own kubelet stand-in (envtest.NodeAgent); the nodes it registers
are deleted when the test ends, so tests do not see each other's nodes. `namespace` gives a
test a namespace of its own, deleted at the end.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from envtest import AssetsMissing, ControlPlane, NodeAgent, find_assets


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    try:
        assets = find_assets()
    except AssetsMissing as error:
        pytest.fail(f"the real control plane cannot start: {error}", pytrace=False)
    with ControlPlane(assets=assets) as plane:
        yield plane


@pytest.fixture
def kube_api(control_plane: ControlPlane) -> kubernetes.client.ApiClient:
    """An admin client of the session's control plane."""
    return control_plane.api_client()


@pytest.fixture
def namespace(kube_api: kubernetes.client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = kubernetes.client.CoreV1Api(kube_api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)


@pytest.fixture
def node_agent(kube_api: kubernetes.client.ApiClient) -> Iterator[NodeAgent]:
    agent = NodeAgent(kube_api, heartbeat_s=1.0).start()
    yield agent
    agent.stop()
    for name in agent.node_names:
        agent.remove_node(name)
