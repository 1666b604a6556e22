"""The deployment manifests (manifests/, kustomize) checked against what they must agree with.

Every object is validated against the official client's API models, which reject unknown
fields (a typo such as `readinessprobe` would otherwise be silently dropped by a lenient
parser and only noticed in the cluster). The scheduler's extender settings are checked against
the Service, the extender container and the service's own command-line parser; security
settings, probes and resources against every container; RBAC against wildcards and dangling
references.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import ssl
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes.client as k8s
import pytest
import yaml

from envtest.assets import assets_dir
from envtest.ports import free_port
from tests.support.manifests import (
    ALL_OBJECTS,
    BASE,
    DASHBOARD,
    EXAMPLE_OBJECTS,
    MANIFESTS,
    OBJECTS,
    REPO,
    SCHEDULER_NAME,
    Sourced,
    dashboard,
    find_object,
    kustomization,
    kustomization_dirs,
    load_kustomization,
    object_id,
    pod_specs,
)

# (apiVersion, kind) -> the official client's model class for that object.
MODELS: dict[tuple[str, str], type] = {
    ("v1", "Namespace"): k8s.V1Namespace,
    ("v1", "ServiceAccount"): k8s.V1ServiceAccount,
    ("v1", "ConfigMap"): k8s.V1ConfigMap,
    ("v1", "Service"): k8s.V1Service,
    ("apps/v1", "Deployment"): k8s.V1Deployment,
    ("batch/v1", "CronJob"): k8s.V1CronJob,
    ("policy/v1", "PodDisruptionBudget"): k8s.V1PodDisruptionBudget,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.V1ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.V1ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.V1Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.V1RoleBinding,
}

# Roles the cluster itself defines, which our bindings may reference.
BUILT_IN_CLUSTER_ROLES = {"system:kube-scheduler", "system:volume-scheduler"}
BUILT_IN_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}

MODEL_SHARD_PREFIX = "power-models-"
# kube-scheduler checks and writes its configuration, and serves its probes, without an API
# server; it only needs one named, and nothing listens here.
NO_API_SERVER = "http://127.0.0.1:1"
# `python -m NAME` of a package runs its CLI module, which holds `build_parser`.
CLI_MODULES = {
    "training.collect": "training.collect.cli",
    "training.fit": "training.fit.cli",
    "controllers.node_power": "controllers.node_power.cli",
    "controllers.energy_adapter": "controllers.energy_adapter.cli",
}

# ---------------------------------------------------------------------------------------------
# Helpers


def _built_on() -> set[Path]:
    """Kustomization directories that another one lists among its resources (bases)."""
    return {
        (directory / entry).resolve()
        for directory in kustomization_dirs()
        for entry in kustomization(directory).get("resources", [])
        if (directory / entry).is_dir()
    }


def _deployable_dirs() -> list[Path]:
    """The kustomizations a user applies: neither a base of another nor a component."""
    bases = _built_on()
    return [
        d
        for d in kustomization_dirs()
        if d.resolve() not in bases and kustomization(d).get("kind") != "Component"
    ]


def _deployed() -> list[Sourced]:
    """Every object any deployable kustomization builds, once per distinct content (the
    large-fleet overlay's trainer differs from the base's; its other base objects do not)."""
    seen: set[str] = set()
    unique = []
    for directory in _deployable_dirs():
        for source, obj in load_kustomization(directory):
            key = json.dumps(obj, sort_keys=True)
            if key not in seen:
                seen.add(key)
                unique.append((source, obj))
    return unique


def _containers() -> Iterator[tuple[str, dict, dict, dict]]:
    """(id, owner, pod spec, container) of every container of every deployable kustomization."""
    for source, obj in _deployed():
        for ident, owner, pod in pod_specs([(source, obj)]):
            for container in pod.get("initContainers", []) + pod["containers"]:
                yield f"{source}:{ident} container {container['name']}", owner, pod, container


def _embedded_yaml(configmap: dict, key: str) -> dict:
    return yaml.safe_load(configmap["data"][key])


def _config_text() -> str:
    configmap = find_object("ConfigMap", "power-aware-scheduler-config", SCHEDULER_NAME)
    return configmap["data"]["config.yaml"]


def _scheduler_config() -> dict:
    return yaml.safe_load(_config_text())


def _container(deployment: str, container: str) -> dict:
    pod = find_object("Deployment", deployment, SCHEDULER_NAME)["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == container)


def _expand_args(container: dict, env: dict[str, str]) -> list[str]:
    """The container's args with $(VAR) expanded as kubelet does."""
    return [
        re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
        for arg in container.get("args", [])
    ]


# ---------------------------------------------------------------------------------------------
# Files and API models


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: str(d.relative_to(REPO)))
def test_kustomization_renders_with_kustomize(directory: Path) -> None:
    # Every kustomization under manifests/, found by walking, so a new overlay is covered.
    objects = load_kustomization(directory)  # raises with kustomize's error
    if kustomization(directory).get("kind") == "Component":
        return  # included by the others; builds nothing on its own
    assert objects, f"{directory.relative_to(REPO)} builds no objects"
    if directory.resolve() not in _built_on():
        # What a user applies pins every image with a tag: none is left to float on `latest`.
        images = {c["image"] for _, _, pod in pod_specs(objects) for c in pod["containers"]}
        assert all(":" in image for image in images), images


def test_every_kustomization_the_docs_apply_is_found() -> None:
    found = {str(d.relative_to(REPO)) for d in kustomization_dirs()}
    applied = {"manifests", "manifests/examples", "manifests/large-fleet"}
    assert applied <= found
    assert {str(d.relative_to(REPO)) for d in _deployable_dirs()} == applied


@pytest.mark.parametrize("directory", kustomization_dirs(), ids=lambda d: str(d.relative_to(REPO)))
def test_kustomization_lists_every_manifest_file(directory: Path) -> None:
    config = kustomization(directory)
    listed = {r for r in config.get("resources", []) if (directory / r).is_file()}
    listed |= {p["path"] for p in config.get("patches", []) if "path" in p}
    on_disk = {p.name for p in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk, (
        f"listed but missing: {listed - on_disk}; unlisted: {on_disk - listed}"
    )


@pytest.mark.parametrize(
    ("source", "obj"), _deployed(), ids=[f"{s}:{object_id(o)}" for s, o in _deployed()]
)
def test_object_matches_the_kubernetes_api_model(source: str, obj: dict) -> None:
    key = (obj.get("apiVersion"), obj.get("kind"))
    assert key in MODELS, f"{source}: unexpected object type {key}"
    # The models forbid unknown fields and check types (quantities must be strings, ...).
    model = MODELS[key].model_validate(obj)
    assert model.metadata.name == obj["metadata"]["name"]


def test_object_names_are_unique() -> None:
    idents = [object_id(obj) for _, obj in ALL_OBJECTS]
    assert len(idents) == len(set(idents)), sorted(i for i in idents if idents.count(i) > 1)


def test_every_namespace_used_exists_or_is_standard() -> None:
    defined = {obj["metadata"]["name"] for _, obj in OBJECTS if obj["kind"] == "Namespace"}
    for _, obj in ALL_OBJECTS:
        namespace = obj["metadata"].get("namespace")
        if namespace is not None:
            assert namespace in defined | {"default", "kube-system"}, object_id(obj)


def test_applying_the_manifests_deploys_no_workload_outside_our_namespace() -> None:
    # `kubectl apply -k manifests/` must not start a demo in the user's `default`: the example
    # lives in manifests/examples/ and is applied on its own.
    for ident, owner, _pod in pod_specs(OBJECTS):
        assert owner["metadata"].get("namespace") == SCHEDULER_NAME, ident
    ours = (None, SCHEDULER_NAME, "kube-system")
    for _, obj in OBJECTS:
        assert obj["metadata"].get("namespace") in ours, object_id(obj)
    assert {object_id(o) for _, o in EXAMPLE_OBJECTS} == {
        "Deployment default/power-demo",
        "PodDisruptionBudget default/power-demo",
    }


def test_images_tied_to_the_cluster_version_say_so() -> None:
    # kube-scheduler and the descheduler are built per Kubernetes minor version: each image
    # line carries the advice to match the cluster's version and names the version pinned,
    # and the two are pinned for the same minor (kube-scheduler v1.X, descheduler v0.X).
    minors = []
    for path, image in (
        (BASE / "scheduler.yaml", "registry.k8s.io/kube-scheduler:"),
        (BASE / "descheduler.yaml", "registry.k8s.io/descheduler/descheduler:"),
    ):
        lines = path.read_text().splitlines()
        (at,) = [i for i, line in enumerate(lines) if f"image: {image}" in line]
        comment = " ".join(line.strip() for line in lines[max(0, at - 4) : at])
        assert "Match the cluster's minor version" in comment, (path.name, comment)
        tag = lines[at].split(image)[1].strip()
        assert tag in comment, (path.name, tag, comment)
        minors.append(tag.split(".")[1])
    assert minors[0] == minors[1], minors


def test_dashboard_is_provisioned_for_the_grafana_sidecar() -> None:
    configmap = find_object(
        "ConfigMap", "power-aware-scheduler-dashboard", SCHEDULER_NAME, objects=OBJECTS
    )
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = configmap["data"]
    assert key == DASHBOARD.name and key.endswith(".json")
    assert json.loads(configmap["data"][key]) == dashboard()


def test_metrics_are_scrapeable_where_the_dashboard_expects_them() -> None:
    # The dashboard reads the extender's, the energy adapter's and the node power controller's
    # /metrics: their pods say where.
    for name in ("power-extender", "energy-adapter", "power-node-controller"):
        deployment = find_object("Deployment", name, SCHEDULER_NAME)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        ports = [
            port["containerPort"]
            for container in deployment["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
        ]
        assert int(annotations["prometheus.io/port"]) in ports


# ---------------------------------------------------------------------------------------------
# The scheduler, the Service and the extender agree


def _kube_scheduler() -> Path:
    """The kube-scheduler binary of the test assets (the version the manifests ship)."""
    path = assets_dir() / "kube-scheduler"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path}: missing; run scripts/ensure-kube-assets", pytrace=False)
    return path


def _scheduler_container() -> dict:
    return _container(SCHEDULER_NAME, "kube-scheduler")


def _write_config_to(config_text: str, directory: Path) -> subprocess.CompletedProcess:
    """Run kube-scheduler --write-config-to on a configuration: it decodes the file strictly
    (an unknown or misspelt field fails), validates it, writes it back with its defaults and
    exits, all before it would contact an API server (--master names one nobody serves)."""
    config = directory / "config.yaml"
    config.write_text(config_text)
    return subprocess.run(
        [
            str(_kube_scheduler()),
            f"--config={config}",
            f"--master={NO_API_SERVER}",
            f"--write-config-to={directory / 'written.yaml'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_scheduler_image_is_the_kube_scheduler_the_tests_run() -> None:
    # The configuration and probe checks below run .kube-assets/kube-scheduler: they hold for
    # the shipped image only if it is the same version.
    result = subprocess.run(
        [str(_kube_scheduler()), "--version"], capture_output=True, text=True, check=True
    )
    version = result.stdout.split()[-1]
    assert _scheduler_container()["image"] == f"registry.k8s.io/kube-scheduler:{version}"


def test_scheduler_config_is_valid_for_the_shipped_kube_scheduler(tmp_path: Path) -> None:
    text = _config_text()
    result = _write_config_to(text, tmp_path)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]
    written = yaml.safe_load((tmp_path / "written.yaml").read_text())
    assert [p["schedulerName"] for p in written["profiles"]] == [SCHEDULER_NAME]
    (extender,) = written["extenders"]
    assert extender["nodeCacheCapable"] is True and extender["ignorable"] is True
    assert written["leaderElection"]["resourceName"] == SCHEDULER_NAME
    # The check does fail on a bad configuration: a misspelt field is refused.
    misspelt = text.replace("nodeCacheCapable:", "nodeCacheCapabel:")
    assert misspelt != text
    refused = _write_config_to(misspelt, tmp_path)
    assert refused.returncode != 0 and "unknown field" in refused.stderr


def _https_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET on a server with a self-signed certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_scheduler_probes_hit_endpoints_the_kube_scheduler_serves(tmp_path: Path) -> None:
    container = _scheduler_container()
    # It serves its default secure port, the one the probes' named port stands for.
    assert not any(arg.startswith("--secure-port") for arg in container["command"])
    usage = subprocess.run(
        [str(_kube_scheduler()), "--help"], capture_output=True, text=True, check=False
    ).stdout
    default_port = re.search(r"--secure-port int .*?\(default (\d+)\)", usage)
    assert default_port, "kube-scheduler --help names no --secure-port default"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = [
        container[p] for p in ("livenessProbe", "readinessProbe", "startupProbe") if p in container
    ]
    assert {p["httpGet"]["path"] for p in probes} >= {"/healthz", "/readyz"}
    for probe in probes:
        assert probe["httpGet"]["scheme"] == "HTTPS"
        assert ports[probe["httpGet"]["port"]] == int(default_port.group(1))
    # The shipped configuration, served on a free port; no API server is needed to answer.
    config = tmp_path / "config.yaml"
    config.write_text(_config_text())
    port = free_port()
    process = subprocess.Popen(
        [
            str(_kube_scheduler()),
            f"--config={config}",
            f"--master={NO_API_SERVER}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline_s = time.monotonic() + 30
        while True:
            try:
                _https_get(f"https://127.0.0.1:{port}/livez")
                break
            except OSError:
                assert process.poll() is None, "kube-scheduler exited"
                assert time.monotonic() < deadline_s, "kube-scheduler never served"
                time.sleep(0.2)
        for probe in probes:
            path = probe["httpGet"]["path"]
            status, body = _https_get(f"https://127.0.0.1:{port}{path}?verbose")
            # A health endpoint lists its checks (/readyz fails until its informers sync,
            # which they never do here); any other path is refused (403) or unknown (404).
            name = path.strip("/")
            assert f"{name} check passed" in body or f"{name} check failed" in body, (
                path,
                status,
                body,
            )
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_scheduler_profile_lock_and_extender_settings() -> None:
    config = _scheduler_config()
    assert [p["schedulerName"] for p in config["profiles"]] == [SCHEDULER_NAME]
    election = config["leaderElection"]
    assert election["leaderElect"] is True
    # Its own lock: sharing kube-scheduler's would make the two schedulers take turns.
    assert election["resourceName"] not in ("", "kube-scheduler")
    (extender,) = config["extenders"]
    assert extender["nodeCacheCapable"] is True  # kubernetes#141781 and throughput
    assert extender["ignorable"] is True
    assert extender["filterVerb"] and extender["prioritizeVerb"]
    assert 1 <= extender["weight"] <= 100
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", extender["httpTimeout"])
    assert match, extender["httpTimeout"]
    timeout_s = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    assert 0 < timeout_s < 5, "shorter than kube-scheduler's 5 s default"


def test_scheduler_can_take_its_own_lease() -> None:
    election = _scheduler_config()["leaderElection"]
    namespace = election["resourceNamespace"]
    binding = find_object("RoleBinding", "power-aware-scheduler-lease", namespace)
    role = find_object("Role", binding["roleRef"]["name"], namespace)
    granted = {
        verb
        for rule in role["rules"]
        if "leases" in rule["resources"] and "coordination.k8s.io" in rule["apiGroups"]
        if not rule.get("resourceNames") or election["resourceName"] in rule["resourceNames"]
        for verb in rule["verbs"]
    }
    assert {"create", "get", "update"} <= granted
    deployment = find_object("Deployment", SCHEDULER_NAME, SCHEDULER_NAME)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"kind": "ServiceAccount", "name": account, "namespace": SCHEDULER_NAME} in binding[
        "subjects"
    ]


def test_extender_url_reaches_the_service_and_the_container_port() -> None:
    (extender,) = _scheduler_config()["extenders"]
    url = urlsplit(extender["urlPrefix"])
    assert url.scheme == ("https" if extender.get("enableHTTPS") else "http")
    service_name, namespace, *rest = url.hostname.split(".")
    assert rest in (["svc"], ["svc", "cluster", "local"]), url.hostname
    service = find_object("Service", service_name, namespace)
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    # The Service selects the extender's pods and forwards to its named container port.
    deployment = next(
        obj
        for _, obj in OBJECTS
        if obj["kind"] == "Deployment"
        and obj["metadata"].get("namespace") == namespace
        and service["spec"]["selector"].items()
        <= obj["spec"]["template"]["metadata"]["labels"].items()
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (container_port,) = [
        p
        for p in container["ports"]
        if p["name"] == port["targetPort"] or p["containerPort"] == port["targetPort"]
    ]
    # The extender's own parser reads the container's arguments and must bind that port on
    # all interfaces.
    config_module = pytest.importorskip("extender.config")
    args = _expand_args(container, {"PROMETHEUS_URL": "http://prometheus.monitoring.svc:9090"})
    assert container["command"] == ["python", "-m", "extender"]
    config = config_module.parse_config(args)
    assert config.port == container_port["containerPort"]
    assert config.host == "0.0.0.0"
    assert config.mode == "live"
    assert config.in_cluster
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts.get(str(config.bundle_dir)) == "models"


def _app_route_paths() -> set[str]:
    """Paths the extender's FastAPI app serves (built on the demo config, nothing started)."""
    app_module = pytest.importorskip("extender.app")
    runtime_module = pytest.importorskip("extender.runtime")
    config_module = pytest.importorskip("extender.config")
    runtime = runtime_module.Runtime(config_module.parse_config([]))
    app = app_module.create_app(runtime)
    return {getattr(route, "path", "") for route in app.routes}


def test_extender_verbs_and_probes_are_routes_of_the_app() -> None:
    (extender,) = _scheduler_config()["extenders"]
    paths = _app_route_paths()
    for verb in (extender["filterVerb"], extender["prioritizeVerb"]):
        assert f"/{verb}" in paths
    container = _container("power-extender", "extender")
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["path"] in paths


# ---------------------------------------------------------------------------------------------
# Containers: security, resources, probes


@pytest.mark.parametrize(
    ("ident", "pod", "container"),
    [(i, p, c) for i, _, p, c in _containers()],
    ids=[i for i, _, _, _ in _containers()],
)
def test_container_is_locked_down_and_bounded(ident: str, pod: dict, container: dict) -> None:
    pod_security = pod.get("securityContext", {})
    security = container.get("securityContext", {})

    def setting(key: str) -> Any:
        return security.get(key, pod_security.get(key))

    assert setting("runAsNonRoot") is True, ident
    user = setting("runAsUser")
    assert user is None or user > 0, f"{ident}: runAsUser {user}"
    assert security.get("readOnlyRootFilesystem") is True, ident
    assert security.get("allowPrivilegeEscalation") is False, ident
    assert security.get("privileged", False) is False, ident
    assert security.get("capabilities", {}).get("drop") == ["ALL"], ident
    assert not security.get("capabilities", {}).get("add"), ident
    assert (setting("seccompProfile") or {}).get("type") == "RuntimeDefault", ident
    resources = container.get("resources", {})
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources.get(bound, {})), f"{ident}: {bound}"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    assert all("hostPath" not in volume for volume in pod.get("volumes", [])), ident
    # No image is left to float: every one has a tag (ours from manifests/image/).
    assert ":" in container["image"], ident


def test_every_long_running_container_has_probes() -> None:
    for ident, owner, _pod, container in _containers():
        if owner["kind"] == "Deployment":
            assert "livenessProbe" in container, ident
            assert "readinessProbe" in container, ident


def test_controller_probes_are_paths_their_probe_server_answers() -> None:
    # The controllers serve their probes with controllers.probes: each probe path must be one
    # it answers (a healthy controller's 200), not its 404.
    probes_module = importlib.import_module("controllers.probes")
    registry_module = importlib.import_module("prometheus_client")
    server = probes_module.serve_probes(
        health=lambda: (True, True, "ok"),
        registry=registry_module.CollectorRegistry(),
        host="127.0.0.1",
        port=0,
        name="manifest-probes",
    )
    checked = set()
    try:
        for ident, _owner, _pod, container in _containers():
            command = container.get("command", [])
            if command[:2] != ["python", "-m"] or not command[2].startswith("controllers."):
                continue
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                if kind in container:
                    path = container[kind]["httpGet"]["path"]
                    url = f"http://127.0.0.1:{server.server_port}{path}"
                    with urllib.request.urlopen(url, timeout=5) as response:
                        assert response.status == 200, (ident, kind, path)
                    checked.add(command[2])
    finally:
        server.shutdown()
        server.server_close()
    assert checked == {"controllers.energy_adapter", "controllers.node_power"}


def test_jobs_are_bounded_in_time_and_never_overlap() -> None:
    for _, obj in OBJECTS:
        if obj["kind"] == "CronJob":
            assert obj["spec"]["concurrencyPolicy"] == "Forbid", object_id(obj)
            assert obj["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] > 0, object_id(obj)


def test_extender_probes_health_and_readiness() -> None:
    container = _container("power-extender", "extender")
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_pods_run_as_their_own_service_accounts() -> None:
    for ident, owner, pod in pod_specs():
        namespace = owner["metadata"].get("namespace")
        if owner["metadata"]["name"] == "power-demo":
            continue  # the example workload needs no API access
        account = pod.get("serviceAccountName")
        assert account, f"{ident} runs as the namespace's default service account"
        find_object("ServiceAccount", account, namespace)


# ---------------------------------------------------------------------------------------------
# RBAC


def _rules() -> Iterator[tuple[str, dict]]:
    for _, obj in OBJECTS:
        if obj["kind"] in ("Role", "ClusterRole"):
            for rule in obj.get("rules", []):
                yield object_id(obj), rule


def test_rbac_has_no_wildcards_and_no_secrets() -> None:
    for ident, rule in _rules():
        for field in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
            assert not any("*" in value for value in rule.get(field, [])), f"{ident} {field}"
        assert "secrets" not in rule.get("resources", []), ident
        assert "escalate" not in rule["verbs"] and "bind" not in rule["verbs"], ident


def test_bindings_reference_defined_roles_and_service_accounts() -> None:
    for _, obj in OBJECTS:
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = obj["roleRef"]
        namespace = obj["metadata"].get("namespace")
        if ref["kind"] == "ClusterRole":
            if ref["name"] not in BUILT_IN_CLUSTER_ROLES:
                find_object("ClusterRole", ref["name"])
        elif (namespace, ref["name"]) not in BUILT_IN_ROLES:
            find_object("Role", ref["name"], namespace)
        for subject in obj["subjects"]:
            assert subject["kind"] == "ServiceAccount", object_id(obj)
            find_object("ServiceAccount", subject["name"], subject["namespace"])


def _granted(account: str, namespace: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) granted to a service account by our own roles."""
    granted: set[tuple[str, str, str]] = set()
    for _, binding in OBJECTS:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace")
        if ref["name"] in BUILT_IN_CLUSTER_ROLES or (scope, ref["name"]) in BUILT_IN_ROLES:
            continue
        role = find_object(ref["kind"], ref["name"], scope)
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
    return granted


def test_extender_only_reads_nodes_and_pods() -> None:
    # ... and keeps the Reward plugin's learned rewards in one ConfigMap of its own
    # (tests/test_least_privilege.py checks that ConfigMap is named).
    granted = _granted("power-extender", SCHEDULER_NAME)
    assert granted == {
        ("", resource, verb) for resource in ("nodes", "pods") for verb in ("get", "list", "watch")
    } | {("", "configmaps", verb) for verb in ("create", "get", "update")}


def test_energy_adapter_only_reads_and_patches_nodes() -> None:
    granted = _granted("energy-adapter", SCHEDULER_NAME)
    assert granted == {("", "nodes", verb) for verb in ("get", "list", "patch")}


def test_descheduler_evicts_through_the_eviction_api_only() -> None:
    granted = _granted("power-descheduler", SCHEDULER_NAME)
    assert ("", "pods/eviction", "create") in granted
    # No delete: a deletion would bypass PodDisruptionBudgets.
    assert not {g for g in granted if g[1] == "pods" and g[2] in ("delete", "deletecollection")}
    assert not {g for g in granted if g[2] in ("update", "patch") and g[1] != "events"}


# ---------------------------------------------------------------------------------------------
# The model bundle: publisher, volume and trainer rights agree


def _model_shard_sources() -> list[dict]:
    pod = find_object("Deployment", "power-extender", SCHEDULER_NAME)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "models"]
    return [source["configMap"] for source in volume["projected"]["sources"]]


def test_model_volume_mounts_consecutive_shards_first_required() -> None:
    sources = _model_shard_sources()
    assert [s["name"] for s in sources] == [f"{MODEL_SHARD_PREFIX}{i}" for i in range(len(sources))]
    assert not sources[0].get("optional", False), "shard 0 holds manifest.json"
    assert all(s.get("optional") is True for s in sources[1:])


def test_trainer_may_write_exactly_the_mounted_shards() -> None:
    role = find_object("Role", "power-model-trainer", SCHEDULER_NAME)
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    shard_names = [s["name"] for s in _model_shard_sources()]
    for rule in named:
        assert rule["resources"] == ["configmaps"]
        assert rule["resourceNames"] == shard_names
    unnamed = {
        verb for rule in role["rules"] if not rule.get("resourceNames") for verb in rule["verbs"]
    }
    # Only what cannot be limited by name is granted without names.
    assert unnamed == {"create", "list"}
    assert all(rule["resources"] == ["configmaps"] for rule in role["rules"])


def _trainer_steps() -> list[list[str]]:
    """The `python -m MODULE ARGS` commands of the trainer's script, shell-split."""
    cronjob = find_object("CronJob", "power-model-trainer", SCHEDULER_NAME)
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["/bin/sh", "-c"]
    script = container["args"][0].replace("\\\n", " ")
    assert script.lstrip().startswith("set -eu"), "a failed step must stop the job"
    env = {"PROMETHEUS_URL": "http://prometheus.monitoring.svc:9090"}
    steps = []
    for line in script.splitlines():
        words = shlex.split(line.strip())
        if words[:2] == ["python", "-m"]:
            steps.append([w.replace("$PROMETHEUS_URL", env["PROMETHEUS_URL"]) for w in words])
    return steps


def test_trainer_steps_parse_with_each_tools_own_parser() -> None:
    steps = _trainer_steps()
    assert [step[2] for step in steps] == ["training.collect", "training.fit", "training.publish"]
    parsed = {}
    for step in steps:
        module = importlib.import_module(CLI_MODULES.get(step[2], step[2]))
        parsed[step[2]] = module.build_parser().parse_args(step[3:])
    # Each step reads what the one before wrote.
    assert parsed["training.fit"].input == parsed["training.collect"].out
    assert parsed["training.publish"].bundle == parsed["training.fit"].out
    mounts = {
        m["mountPath"]
        for m in find_object("CronJob", "power-model-trainer", SCHEDULER_NAME)["spec"][
            "jobTemplate"
        ]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    for path in (parsed["training.collect"].out, parsed["training.fit"].out):
        assert any(str(path).startswith(m + "/") for m in mounts), f"{path} is not writable"
    publish = parsed["training.publish"]
    assert publish.in_cluster
    assert f"{publish.name}-0" == _model_shard_sources()[0]["name"]
    assert publish.namespace == SCHEDULER_NAME
    # The shards publish would write are the ones the volume mounts and the Role allows.
    publish_module = importlib.import_module("training.publish")
    names = publish_module.shard_names(publish.name, len(_model_shard_sources()))
    assert names == [s["name"] for s in _model_shard_sources()]


# ---------------------------------------------------------------------------------------------
# Offloading and the example workload


def _descheduler_policy() -> dict:
    configmap = find_object("ConfigMap", "power-descheduler-policy", SCHEDULER_NAME)
    return _embedded_yaml(configmap, "policy.yaml")


def test_descheduler_policy_evicts_only_for_the_powerless_taint() -> None:
    policy = _descheduler_policy()
    assert policy["apiVersion"] == "descheduler/v1alpha2"
    assert policy["kind"] == "DeschedulerPolicy"
    (profile,) = policy["profiles"]
    enabled = {
        plugin for point in profile["plugins"].values() for plugin in point.get("enabled", [])
    }
    assert enabled == {"RemovePodsViolatingNodeTaints"}
    configs = {c["name"]: c.get("args", {}) for c in profile["pluginConfig"]}
    evictor = configs["DefaultEvictor"]
    assert evictor["nodeFit"] is True
    # Only local scratch is given up; system-critical pods stay, and so do pods with claims.
    # The booleans every descheduler since v0.26 reads, not podProtections (v0.34 and newer,
    # unknown to the releases older clusters run), and never both: one source per setting.
    assert evictor.get("evictSystemCriticalPods", False) is False
    assert evictor["evictLocalStoragePods"] is True and evictor["ignorePvcPods"] is True
    assert "podProtections" not in evictor
    assert configs["RemovePodsViolatingNodeTaints"]["includedTaints"] == [
        "power-aware-scheduler/powerless"
    ]
    cronjob = find_object("CronJob", "power-descheduler", SCHEDULER_NAME)
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policy")
    assert f"--policy-config-file={mount['mountPath']}/policy.yaml" in container["args"]


def test_example_workload_opts_in_and_has_a_disruption_budget() -> None:
    deployment = find_object("Deployment", "power-demo", "default")
    template = deployment["spec"]["template"]
    assert template["spec"]["schedulerName"] == SCHEDULER_NAME
    profiles = [p["schedulerName"] for p in _scheduler_config()["profiles"]]
    assert template["spec"]["schedulerName"] in profiles
    budget = find_object("PodDisruptionBudget", "power-demo", "default")
    assert (
        budget["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
    for container in template["spec"]["containers"]:
        assert container["resources"]["requests"]["cpu"], "power follows CPU requests"


# ---------------------------------------------------------------------------------------------
# The image


def test_dockerfile_runs_as_a_numeric_non_root_user_and_ships_the_models() -> None:
    lines = [
        line.strip()
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    # Every stage on the Debian base with Debian's Python (the image tests build it here), or on
    # an earlier stage; the last one (the default target) is the runtime image.
    stages = [line.split() for line in lines if line.startswith("FROM ")]
    names = [stage[3] for stage in stages if len(stage) == 4 and stage[2].upper() == "AS"]
    assert len(names) == len(stages), stages
    for index, stage in enumerate(stages):
        assert stage[1] == "debian:bookworm-slim" or stage[1] in names[:index], stage
    assert names[-1] == "runtime" and "trainer" in names, names
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "no USER line"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, users[-1]
    ours = {image["newName"] for image in kustomization(MANIFESTS / "image")["images"]}
    assert len(ours) == 2, ours  # the runtime image and the trainer's
    pod_users = {
        (pod.get("securityContext") or {}).get("runAsUser")
        for _, owner, pod in pod_specs(_deployed())
        if any(c["image"].rpartition(":")[0] in ours for c in pod["containers"])
    }
    assert pod_users == {int(uid)}
    # The shipped bundle is package data of the wheel the image installs, and the build
    # context lets its package in.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]["extender"]
    assert "models/default/*" in package_data
    assert (REPO / "extender" / "models" / "default" / "manifest.json").is_file()
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for needed in (
        "extender/",
        "requirements.lock",
        "requirements-train.lock",
        "pyproject.toml",
        "scripts/trim-venv",
        "scripts/install-project",
    ):
        assert f"!{needed}" in ignore, f".dockerignore leaves out {needed}"


# ---------------------------------------------------------------------------------------------
# The operations guide


def _guide_commands() -> list[list[str]]:
    """Every `python -m <our module> ...` command in docs/operations.md's shell blocks."""
    text = (REPO / "docs" / "operations.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.strip().startswith("python -m "):
                continue
            words = shlex.split(line.split("|")[0].split("#")[0])
            if words[2].split(".")[0] in ("training", "extender", "controllers"):
                commands.append(words)
    return commands


def test_the_operations_guide_commands_parse() -> None:
    commands = _guide_commands()
    modules = {words[2] for words in commands}
    assert {"training.collect", "training.fit", "training.publish"} <= modules
    assert "controllers.node_power" in modules
    for words in commands:
        module = importlib.import_module(CLI_MODULES.get(words[2], words[2]))
        module.build_parser().parse_args(words[3:])  # exits (fails the test) on a bad flag
        if words[2] == "training.publish":
            args = module.build_parser().parse_args(words[3:])
            assert f"{args.name}-0" == _model_shard_sources()[0]["name"]
            assert args.namespace == SCHEDULER_NAME


# ---------------------------------------------------------------------------------------------
# The node power controller


def _node_power_container() -> tuple[dict, dict, list[str]]:
    deployment = find_object("Deployment", "power-node-controller", SCHEDULER_NAME)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {"POD_NAME": "power-node-controller-abc12"}
    return deployment, container, _expand_args(container, env)


def test_node_power_controller_flags_parse_and_ship_in_dry_run() -> None:
    cli = importlib.import_module("controllers.node_power.cli")
    deployment, container, args = _node_power_container()
    assert container["command"] == ["python", "-m", "controllers.node_power"]
    parsed = cli.build_parser().parse_args(args)
    settings = cli.settings_from_args(parsed)
    assert not settings.apply, "shipped in dry run: --apply is the operator's decision"
    assert parsed.in_cluster and parsed.leader_elect
    assert parsed.identity == "power-node-controller-abc12"
    # The kill switch and the Lease live in the namespace it runs in.
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert deployment["metadata"]["namespace"] == SCHEDULER_NAME
    # Two replicas, leader-elected; the probes are the controller's own endpoints.
    assert deployment["spec"]["replicas"] == 2
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (port,) = container["ports"]
    assert port["containerPort"] == parsed.listen_port


def test_node_power_controller_mounts_the_bundle_and_the_bmc_secret() -> None:
    deployment, container, args = _node_power_container()
    cli = importlib.import_module("controllers.node_power.cli")
    parsed = cli.build_parser().parse_args(args)
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    models = volumes[mounts[str(parsed.bundle)]["name"]]
    # The same shards as the extender, so both rank nodes by the same models.
    shards = [s["configMap"]["name"] for s in models["projected"]["sources"]]
    assert shards == [s["name"] for s in _model_shard_sources()]
    bmc = volumes[mounts[str(parsed.bmc_secret_dir)]["name"]]
    assert bmc["secret"]["secretName"] == "power-node-bmc"
    assert bmc["secret"]["optional"] is True  # dry run needs no credentials
    # Readable by the controller's group only, never world-readable.
    assert bmc["secret"]["defaultMode"] & 0o007 == 0
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] != "/tmp")


def test_node_power_controller_can_take_its_own_lease() -> None:
    _deployment, _container, args = _node_power_container()
    cli = importlib.import_module("controllers.node_power.cli")
    parsed = cli.build_parser().parse_args(args)
    role = find_object("Role", "power-node-controller-lease", SCHEDULER_NAME)
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert [r["resourceNames"] for r in named] == [[parsed.leader_elect_resource_name]]
    # Nothing about Secrets: the BMC credentials are a volume.
    granted = _granted("power-node-controller", SCHEDULER_NAME)
    assert not {g for g in granted if g[1] == "secrets"}
    assert not {g for g in granted if g[1] == "pods" and g[2] in ("delete", "deletecollection")}
