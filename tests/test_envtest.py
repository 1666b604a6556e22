"""The test suite's control plane and kubelet stand-in (envtest/), checked on themselves.

What the other Kubernetes tests rely on: the binaries are found as envtest finds them and a
clear error says how to get them; RBAC is on and the manifests' identities exist; a Deployment's
pods are created by the real controllers, bound by the real scheduler and run by the agent;
graceful deletion finishes; a node whose BMC says off goes NotReady and unreachable through the
real node lifecycle controller, and comes back Ready after its boot time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from envtest import AssetsMissing, ControlPlane, NodeAgent, find_assets
from tests.support.exporters import wait_until


def test_missing_binaries_say_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kube-apiserver").write_text("")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    with pytest.raises(AssetsMissing) as caught:
        find_assets()
    message = str(caught.value)
    assert str(tmp_path) in message
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert name in message  # kube-apiserver is there but not executable
    assert "scripts/ensure-kube-assets" in message and "setup-envtest" in message


def test_rbac_is_enforced_and_the_manifests_identities_exist(control_plane: ControlPlane) -> None:
    extender = control_plane.service_account_kubeconfig("power-aware-scheduler", "power-extender")
    core = kubernetes.client.CoreV1Api(control_plane.api_client(extender))
    core.list_node()  # granted by the manifests
    with pytest.raises(ApiException) as denied:
        core.list_namespaced_secret("kube-system")
    assert denied.value.status == 403


def test_deployment_pods_are_scheduled_and_run(
    control_plane: ControlPlane, node_agent: NodeAgent, namespace: str
) -> None:
    apps = kubernetes.client.AppsV1Api(control_plane.api_client())
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    node_agent.add_node(f"{namespace}-a", cpu=4)
    node_agent.add_node(f"{namespace}-b", cpu=4)
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 4,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {"name": "c", "image": "web", "resources": {"requests": {"cpu": "1"}}}
                        ]
                    },
                },
            },
        },
    )

    def running() -> list[Any]:
        pods = core.list_namespaced_pod(namespace).items
        ok = [p for p in pods if p.status.phase == "Running" and p.status.pod_ip]
        return ok if len(ok) == 4 else []

    pods = wait_until(running, "4 Running pods")
    assert {p.spec.node_name for p in pods} <= {f"{namespace}-a", f"{namespace}-b"}
    assert len({p.status.pod_ip for p in pods}) == 4
    ready = {c.type: c.status for c in pods[0].status.conditions}
    assert ready["Ready"] == "True"

    # Graceful deletion finishes as a kubelet finishes it; the ReplicaSet replaces the pod.
    victim = pods[0]
    core.delete_namespaced_pod(victim.metadata.name, namespace)
    wait_until(
        lambda: victim.metadata.uid not in {p.metadata.uid for p in running()},
        "the deleted pod gone and replaced",
    )


def test_node_follows_its_bmc_power(control_plane: ControlPlane) -> None:
    api = control_plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    power = {"bmc-node": "on"}
    agent = NodeAgent(api, power_of=power.__getitem__, heartbeat_s=0.5).start()
    try:
        agent.add_node("bmc-node", cpu=8, boot_s=2.0)

        def ready_status() -> tuple[str, list[str]]:
            node = core.read_node("bmc-node")
            (ready,) = [c.status for c in node.status.conditions if c.type == "Ready"]
            return ready, sorted({t.key for t in node.spec.taints or []})

        wait_until(lambda: ready_status() == ("True", []), "Ready, untainted")
        power["bmc-node"] = "off"
        # The lifecycle controller writes the Unknown condition and the unreachable taint in two
        # separate updates, so the test waits for both rather than reading between them.
        wait_until(
            lambda: ready_status() == ("Unknown", ["node.kubernetes.io/unreachable"]),
            "the node lifecycle controller marking it Unknown and tainting it unreachable",
            timeout_s=control_plane.node_monitor_grace_s + 20,
        )
        power["bmc-node"] = "on"
        started = time.monotonic()
        wait_until(lambda: ready_status() == ("True", []), "Ready again after its boot")
        assert time.monotonic() - started >= 2.0  # not before its boot time
    finally:
        agent.stop()
        agent.remove_node("bmc-node")
