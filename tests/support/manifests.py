"""The deployment manifests (manifests/, as the kustomizations list them), loaded for tests.

`OBJECTS` holds every object `kubectl apply -k manifests/` deploys, with the file it came from:
the listed resources plus the ConfigMaps of `configMapGenerator` (the Grafana dashboard), built
as kustomize builds them. `EXAMPLE_OBJECTS` holds the example workload (`manifests/examples/`,
applied on its own); `ALL_OBJECTS` both. `find_object` looks one up by kind, name and
namespace, and `pod_specs` walks the pod spec of every workload. Shared by the manifest checks,
the least-privilege allow-list and the dashboard checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
EXAMPLES = MANIFESTS / "examples"
DASHBOARD = MANIFESTS / "dashboards" / "power-aware-scheduler.json"

SCHEDULER_NAME = "power-aware-scheduler"

Sourced = tuple[str, dict]  # (file it came from, relative to its kustomization; object)


def kustomization(directory: Path = MANIFESTS) -> dict:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def _generated_configmap(directory: Path, generator: dict) -> Sourced:
    """A `configMapGenerator` entry as kustomize renders it (files only; no name hash)."""
    options = generator.get("options") or {}
    assert options.get("disableNameSuffixHash"), "generated names must not change per content"
    data = {}
    for file in generator.get("files", []):
        key, _, path = file.rpartition("=") if "=" in file else (Path(file).name, "", file)
        data[key] = (directory / path).read_text()
    metadata: dict = {"name": generator["name"]}
    if "namespace" in generator:
        metadata["namespace"] = generator["namespace"]
    for field in ("labels", "annotations"):
        if options.get(field):
            metadata[field] = dict(options[field])
    source = ",".join(generator.get("files", []))
    return source, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def load_kustomization(directory: Path) -> list[Sourced]:
    """Every object a kustomization directory builds: its resources, then its generators."""
    config = kustomization(directory)
    objects: list[Sourced] = []
    for name in config.get("resources", []):
        for document in yaml.safe_load_all((directory / name).read_text()):
            if document is not None:
                objects.append((name, document))
    for generator in config.get("configMapGenerator", []):
        objects.append(_generated_configmap(directory, generator))
    return objects


OBJECTS = load_kustomization(MANIFESTS)
EXAMPLE_OBJECTS = load_kustomization(EXAMPLES)
ALL_OBJECTS = OBJECTS + EXAMPLE_OBJECTS


def object_id(obj: dict) -> str:
    """`Kind namespace/name`; the namespace is empty for cluster-scoped objects."""
    meta = obj["metadata"]
    return f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"


def find_object(
    kind: str, name: str, namespace: str | None = None, objects: Sequence[Sourced] = ALL_OBJECTS
) -> dict:
    for _, obj in objects:
        meta = obj["metadata"]
        if obj["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return obj
    raise AssertionError(f"no {kind} {namespace}/{name} in manifests/")


def pod_specs(objects: Sequence[Sourced] = ALL_OBJECTS) -> Iterator[tuple[str, dict, dict]]:
    """(object id, owning object, pod spec) for every workload."""
    for _, obj in objects:
        if obj["kind"] == "Deployment":
            yield object_id(obj), obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "CronJob":
            yield object_id(obj), obj, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def dashboard() -> dict:
    """The Grafana dashboard JSON the kustomization ships."""
    return json.loads(DASHBOARD.read_text())
