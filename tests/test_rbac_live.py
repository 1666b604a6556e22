"""Least privilege on a real API server: the shipped RBAC, asked of the real authorizer.

`tests/test_least_privilege.py` compares the manifests' roles with an allow-list (`NEEDED`: per
ServiceAccount, every right its component uses, and why). Here the same allow-list is asked of
the real RBAC authorizer with the manifests applied (the control plane applies their roles and
bindings at start): every needed right is allowed (SubjectAccessReview), and a representative set
of what each component must not do is denied, both as a review and, for one action each, as a
real request made with the ServiceAccount's own token, which gets 403.
The ported component tests run each component as its ServiceAccount, which shows that the
granted rights are enough for its whole job.
"""

from __future__ import annotations

from collections.abc import Callable

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from envtest import ControlPlane
from tests.test_least_privilege import CLUSTER, NEEDED

NAMESPACE = "power-aware-scheduler"

# (verb, group, resource, subresource, namespace or None for cluster-wide) each must NOT do.
Denied = tuple[str, str, str, str, str | None]
MUST_NOT: dict[str, list[Denied]] = {
    "power-extender": [
        ("patch", "", "nodes", "", None),
        ("create", "", "pods", "eviction", "default"),
        ("get", "", "secrets", "", NAMESPACE),
        ("delete", "", "configmaps", "", NAMESPACE),
    ],
    "energy-adapter": [
        ("create", "", "pods", "eviction", "default"),
        ("delete", "", "nodes", "", None),
        ("list", "", "secrets", "", "kube-system"),
    ],
    "power-model-trainer": [
        ("list", "", "nodes", "", None),
        ("delete", "", "configmaps", "", "kube-system"),
        ("get", "", "secrets", "", NAMESPACE),
    ],
    "power-node-controller": [
        ("get", "", "secrets", "", "kube-system"),
        ("list", "", "secrets", "", None),
        ("delete", "", "nodes", "", None),
        ("delete", "", "pods", "", "default"),
        ("update", "coordination.k8s.io", "leases", "", "kube-system"),
    ],
    "power-aware-scheduler": [
        ("get", "", "secrets", "", "kube-system"),
        ("patch", "", "nodes", "", None),
    ],
    "power-descheduler": [
        ("delete", "", "pods", "", "default"),
        ("patch", "", "nodes", "", None),
        ("get", "", "secrets", "", NAMESPACE),
    ],
}


def _allowed(
    auth: kubernetes.client.AuthorizationV1Api,
    account: str,
    verb: str,
    group: str,
    resource: str,
    namespace: str | None,
    *,
    subresource: str = "",
    name: str = "",
) -> bool:
    review = auth.create_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{NAMESPACE}:{account}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace or "",
                    "name": name,
                },
            },
        }
    )
    return bool(review.status.allowed)


def test_the_allow_list_covers_the_same_accounts() -> None:
    assert set(MUST_NOT) == set(NEEDED)


@pytest.mark.parametrize("account", sorted(NEEDED))
def test_every_needed_right_is_allowed_by_the_real_authorizer(
    control_plane: ControlPlane, account: str
) -> None:
    auth = kubernetes.client.AuthorizationV1Api(control_plane.api_client())
    refused = []
    for scope, group, resource, verb, names in sorted(NEEDED[account]):
        resource, _, subresource = resource.partition("/")
        namespace = NAMESPACE if scope != CLUSTER else None
        for name in names or ("",):
            if not _allowed(
                auth, account, verb, group, resource, namespace, subresource=subresource, name=name
            ):
                refused.append((verb, group, resource, subresource, namespace, name))
    assert not refused, f"{account} is refused rights it needs: {refused}"


@pytest.mark.parametrize("account", sorted(MUST_NOT))
def test_what_a_component_must_not_do_is_denied(control_plane: ControlPlane, account: str) -> None:
    auth = kubernetes.client.AuthorizationV1Api(control_plane.api_client())
    allowed = [
        (verb, group, resource, subresource, namespace)
        for verb, group, resource, subresource, namespace in MUST_NOT[account]
        if _allowed(auth, account, verb, group, resource, namespace, subresource=subresource)
    ]
    assert not allowed, f"{account} may do what it must not: {allowed}"


# One real request each, with the ServiceAccount's own token: the API server answers 403.
RealRequest = Callable[[kubernetes.client.ApiClient], object]
REAL_REQUESTS: dict[str, RealRequest] = {
    "power-extender": lambda api: kubernetes.client.CoreV1Api(api).patch_node(
        "no-such-node", {"metadata": {"labels": {"x": "y"}}}
    ),
    "energy-adapter": lambda api: kubernetes.client.CoreV1Api(api).create_namespaced_pod_eviction(
        "no-such-pod", "default", {"metadata": {"name": "no-such-pod", "namespace": "default"}}
    ),
    "power-node-controller": lambda api: kubernetes.client.CoreV1Api(api).list_namespaced_secret(
        "kube-system"
    ),
    "power-model-trainer": lambda api: kubernetes.client.CoreV1Api(api).list_node(),
    "power-aware-scheduler": lambda api: kubernetes.client.CoreV1Api(api).read_namespaced_secret(
        "any", "kube-system"
    ),
    "power-descheduler": lambda api: kubernetes.client.CoreV1Api(api).delete_namespaced_pod(
        "no-such-pod", "default"
    ),
}


@pytest.mark.parametrize("account", sorted(REAL_REQUESTS))
def test_a_forbidden_request_with_the_accounts_token_gets_403(
    control_plane: ControlPlane, account: str
) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(NAMESPACE, account)
    with pytest.raises(ApiException) as refused:
        REAL_REQUESTS[account](control_plane.api_client(kubeconfig))
    assert refused.value.status == 403, refused.value.body
