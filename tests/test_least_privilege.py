"""Least privilege: every component is granted exactly the API rights it uses, nothing more.

``tests/test_manifests.py`` already checks each container's lock-down (non-root, read-only root
filesystem, no privilege escalation, all capabilities dropped) and RBAC rules for wildcards and
secrets. This file adds the allow-list: per service account, the (scope, API group, resource,
verb, resource names) it needs and why, compared both ways with what the manifests grant:
a right granted but not listed fails (a write the component does not need is an attack
surface), and a right listed but not granted fails too (the component would break in the
cluster). Built-in roles are allowed only where listed.
"""

from __future__ import annotations

from collections.abc import Iterator

from tests.support.manifests import OBJECTS, SCHEDULER_NAME, find_object, pod_specs

CLUSTER = "cluster"
NAMESPACE = "namespace"
READ = ("get", "list", "watch")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
MODEL_SHARDS = tuple(f"power-models-{i}" for i in range(8))

Right = tuple[str, str, str, str, tuple[str, ...]]  # scope, group, resource, verb, names


def _rights(
    scope: str, group: str, resources: tuple[str, ...], verbs: tuple[str, ...], names=()
) -> set[Right]:
    return {(scope, group, r, v, tuple(names)) for r in resources for v in verbs}


# What each component does with the API (the code that does it in parentheses).
NEEDED: dict[str, set[Right]] = {
    # Node and Pod list+watch: node view and recently bound pods (extender.sources.kube_watch);
    # the Reward plugin's learned rewards in its own ConfigMap (extender.rewards.store): create
    # it once, get and replace it by name.
    "power-extender": _rights(CLUSTER, "", ("nodes", "pods"), READ)
    | _rights(NAMESPACE, "", ("configmaps",), ("create",))
    | _rights(NAMESPACE, "", ("configmaps",), ("get", "update"), ("power-extender-rewards",)),
    # Reads nodes, patches the energy-status label and powerless taint (controllers.energy_adapter).
    "energy-adapter": _rights(CLUSTER, "", ("nodes",), ("get", "list", "patch")),
    # Publishes the bundle as ConfigMaps (training.publish): create new shards, list to find
    # stale ones; get/update/delete only the shards the extender mounts, by name.
    "power-model-trainer": _rights(NAMESPACE, "", ("configmaps",), ("create", "list"))
    | _rights(NAMESPACE, "", ("configmaps",), ("get", "update", "delete"), MODEL_SHARDS),
    # Its own leader-election lease; the rest comes from the built-in scheduler roles.
    "power-aware-scheduler": _rights(NAMESPACE, "coordination.k8s.io", ("leases",), ("create",))
    | _rights(
        NAMESPACE, "coordination.k8s.io", ("leases",), ("get", "update"), ("power-aware-scheduler",)
    ),
    # Reads what its strategies look at, evicts through the Eviction API (PDBs respected),
    # records events.
    "power-descheduler": _rights(CLUSTER, "", ("nodes", "namespaces", "pods"), READ)
    | _rights(CLUSTER, "scheduling.k8s.io", ("priorityclasses",), READ)
    | _rights(CLUSTER, "", ("pods/eviction",), ("create",))
    | _rights(CLUSTER, "", ("events",), ("create", "update"))
    | _rights(CLUSTER, "events.k8s.io", ("events",), ("create", "update")),
    # List+watch caches of nodes, pods and budgets; patches nodes (power-state annotations,
    # cordon); evicts through the Eviction API; reads its namespace's kill switch; its own
    # leader-election Lease (controllers.node_power). BMC credentials are a mounted Secret.
    "power-node-controller": _rights(CLUSTER, "", ("nodes",), ("list", "watch", "patch"))
    | _rights(CLUSTER, "", ("pods",), ("list", "watch"))
    | _rights(CLUSTER, "", ("pods/eviction",), ("create",))
    | _rights(CLUSTER, "policy", ("poddisruptionbudgets",), ("list", "watch"))
    | _rights(CLUSTER, "", ("namespaces",), ("get",), ("power-aware-scheduler",))
    # Kubelets' Events about pods on a node: when its last pod ended (views.unneeded_evidence_s).
    | _rights(CLUSTER, "", ("events",), ("list",))
    | _rights(NAMESPACE, "coordination.k8s.io", ("leases",), ("create",))
    | _rights(
        NAMESPACE, "coordination.k8s.io", ("leases",), ("get", "update"), ("power-node-controller",)
    ),
}
# Built-in roles (cluster-defined, versioned with the cluster) each account may be bound to.
BUILT_IN_ALLOWED: dict[str, set[str]] = {
    "power-aware-scheduler": {
        "ClusterRole/system:kube-scheduler",
        "ClusterRole/system:volume-scheduler",
        "Role/kube-system/extension-apiserver-authentication-reader",
    },
}
BUILT_IN_PREFIXES = ("system:", "extension-apiserver-")


def _bindings_of(account: str, namespace: str) -> Iterator[dict]:
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    for _, obj in OBJECTS:
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding") and subject in obj["subjects"]:
            yield obj


def _is_built_in(binding: dict) -> bool:
    name = binding["roleRef"]["name"]
    return name.startswith(BUILT_IN_PREFIXES)


def granted(account: str, namespace: str) -> tuple[set[Right], set[str]]:
    """(rights from our own roles, built-in roles referenced) of one service account."""
    rights: set[Right] = set()
    built_ins: set[str] = set()
    for binding in _bindings_of(account, namespace):
        ref = binding["roleRef"]
        binding_namespace = binding["metadata"].get("namespace")
        if _is_built_in(binding):
            where = f"{binding_namespace}/" if ref["kind"] == "Role" else ""
            built_ins.add(f"{ref['kind']}/{where}{ref['name']}")
            continue
        role = find_object(ref["kind"], ref["name"], binding_namespace)
        # A ClusterRole bound by a RoleBinding only applies in that namespace.
        scope = CLUSTER if binding["kind"] == "ClusterRoleBinding" else NAMESPACE
        for rule in role["rules"]:
            names = tuple(rule.get("resourceNames", ()))
            for group in rule["apiGroups"]:
                rights |= _rights(
                    scope, group, tuple(rule["resources"]), tuple(rule["verbs"]), names
                )
    return rights, built_ins


def _service_accounts() -> list[tuple[str, str]]:
    return [
        (obj["metadata"]["name"], obj["metadata"].get("namespace", SCHEDULER_NAME))
        for _, obj in OBJECTS
        if obj["kind"] == "ServiceAccount"
    ]


def test_every_service_account_has_an_entry_in_the_allow_list() -> None:
    accounts = {name for name, _ in _service_accounts()}
    assert accounts == set(NEEDED), "add the new component's needs to NEEDED (with why)"


def test_each_component_is_granted_exactly_what_it_needs() -> None:
    for account, namespace in _service_accounts():
        rights, built_ins = granted(account, namespace)
        extra = rights - NEEDED[account]
        missing = NEEDED[account] - rights
        assert not extra, f"{account} is granted rights it does not use: {sorted(extra)}"
        assert not missing, f"{account} lacks rights it uses: {sorted(missing)}"
        assert built_ins <= BUILT_IN_ALLOWED.get(account, set()), f"{account}: {built_ins}"


def test_no_write_verb_without_a_named_reason() -> None:
    # Restates the write half of NEEDED so that a widened allow-list shows up in review.
    writes = {
        account: sorted({(r[2], r[3]) for r in rights if r[3] in WRITE_VERBS})
        for account, rights in NEEDED.items()
    }
    assert writes == {
        "power-extender": [("configmaps", "create"), ("configmaps", "update")],
        "energy-adapter": [("nodes", "patch")],
        "power-model-trainer": [
            ("configmaps", "create"),
            ("configmaps", "delete"),
            ("configmaps", "update"),
        ],
        "power-aware-scheduler": [("leases", "create"), ("leases", "update")],
        "power-descheduler": [
            ("events", "create"),
            ("events", "update"),
            ("pods/eviction", "create"),
        ],
        "power-node-controller": [
            ("leases", "create"),
            ("leases", "update"),
            ("nodes", "patch"),
            ("pods/eviction", "create"),
        ],
    }
    # Updates and deletes of existing objects are limited by name wherever the name is known.
    for account in (
        "power-extender",
        "power-model-trainer",
        "power-aware-scheduler",
        "power-node-controller",
    ):
        for right in NEEDED[account]:
            if right[3] in ("update", "delete", "get") and right[2] not in ("nodes", "pods"):
                assert right[4], f"{account}: {right} should be limited by resourceNames"


def test_no_role_grants_wildcards_or_cluster_wide_writes_to_namespaced_objects() -> None:
    for _, obj in OBJECTS:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            for field in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in "".join(rule.get(field, [])), f"{obj['metadata']['name']}"
            if obj["kind"] == "ClusterRole" and WRITE_VERBS & set(rule["verbs"]):
                # Cluster-wide writes only to what has no namespace of ours to confine it.
                assert set(rule["resources"]) <= {"nodes", "pods/eviction", "events"}, rule


def test_pods_without_api_needs_do_not_mount_a_token() -> None:
    for ident, _owner, pod in pod_specs():
        account = pod.get("serviceAccountName")
        if account in NEEDED:
            continue
        assert pod.get("automountServiceAccountToken") is False, (
            f"{ident} uses no API but would get the {account or 'default'} account's token"
        )
