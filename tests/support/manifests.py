"""The deployment manifests (manifests/, as the kustomization lists them), loaded for tests.

`OBJECTS` holds every object with the file it came from; `find_object` looks one up by kind,
name and namespace, and `pod_specs` walks the pod spec of every workload. Shared by the
manifest checks and the least-privilege allow-list.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"

SCHEDULER_NAME = "power-aware-scheduler"


def kustomization() -> dict:
    return yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())


def _load_objects() -> list[tuple[str, dict]]:
    objects: list[tuple[str, dict]] = []
    for name in kustomization()["resources"]:
        for document in yaml.safe_load_all((MANIFESTS / name).read_text()):
            if document is not None:
                objects.append((name, document))
    return objects


OBJECTS = _load_objects()


def object_id(obj: dict) -> str:
    """`Kind namespace/name`; the namespace is empty for cluster-scoped objects."""
    meta = obj["metadata"]
    return f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"


def find_object(kind: str, name: str, namespace: str | None = None) -> dict:
    for _, obj in OBJECTS:
        meta = obj["metadata"]
        if obj["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return obj
    raise AssertionError(f"no {kind} {namespace}/{name} in manifests/")


def pod_specs() -> Iterator[tuple[str, dict, dict]]:
    """(object id, owning object, pod spec) for every workload."""
    for _, obj in OBJECTS:
        if obj["kind"] == "Deployment":
            yield object_id(obj), obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "CronJob":
            yield object_id(obj), obj, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
