"""The deployment manifests (manifests/, kustomize), rendered by real kustomize for tests.

Each kustomization directory is built with `kubectl kustomize DIR` (the kubectl of the test
assets, `KUBEBUILDER_ASSETS`, default `.kube-assets/`; its kustomize is the one `kubectl apply
-k` runs), once per directory. `OBJECTS` holds every object `kubectl apply -k manifests/`
deploys, `EXAMPLE_OBJECTS` the example workload (`manifests/examples/`, applied on its own),
`ALL_OBJECTS` both; `LARGE_FLEET_OBJECTS` what `kubectl apply -k manifests/large-fleet/`
deploys. Each object comes with the kustomization directory that built it. `find_object` looks
one up by kind, name and namespace, and `pod_specs` walks the pod spec of every workload.
Shared by the manifest checks, the least-privilege allow-list and the dashboard checks.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from envtest.assets import assets_dir

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
BASE = MANIFESTS / "base"
EXAMPLES = MANIFESTS / "examples"
LARGE_FLEET = MANIFESTS / "large-fleet"
DASHBOARD = BASE / "dashboards" / "power-aware-scheduler.json"
KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

SCHEDULER_NAME = "power-aware-scheduler"

Sourced = tuple[str, dict]  # (kustomization directory that built it, relative to REPO; object)


class KustomizeError(AssertionError):
    """A kustomization that kustomize cannot build."""


def kubectl() -> Path:
    path = assets_dir() / "kubectl"
    if not os.access(path, os.X_OK):
        # Expected on a fresh checkout: one line saying what to do, no traceback.
        pytest.fail(
            f"{path}: no kubectl to render manifests/ with; run scripts/ensure-kube-assets "
            "(or set KUBEBUILDER_ASSETS to a directory holding kubectl)",
            pytrace=False,
        )
    return path


def kustomization_file(directory: Path) -> Path | None:
    return next((directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()), None)


def kustomization(directory: Path = MANIFESTS) -> dict:
    path = kustomization_file(directory)
    if path is None:
        raise KustomizeError(f"{directory}: no kustomization file")
    return yaml.safe_load(path.read_text())


def kustomization_dirs() -> list[Path]:
    """Every directory under manifests/ with a kustomization, manifests/ itself first."""
    return sorted(
        {p.parent for name in KUSTOMIZATION_FILES for p in MANIFESTS.rglob(name)},
        key=lambda d: (d != MANIFESTS, str(d)),
    )


@functools.cache
def load_kustomization(directory: Path) -> list[Sourced]:
    """Every object `kubectl kustomize DIRECTORY` builds, in its output order."""
    label = str(directory.relative_to(REPO))
    result = subprocess.run(
        [str(kubectl()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise KustomizeError(f"kubectl kustomize {label}: {result.stderr.strip()}")
    return [(label, doc) for doc in yaml.safe_load_all(result.stdout) if doc is not None]


OBJECTS = load_kustomization(MANIFESTS)
EXAMPLE_OBJECTS = load_kustomization(EXAMPLES)
ALL_OBJECTS = OBJECTS + EXAMPLE_OBJECTS
LARGE_FLEET_OBJECTS = load_kustomization(LARGE_FLEET)


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
    where = sorted({source for source, _ in objects}) or ["(no objects)"]
    raise AssertionError(f"no {kind} {namespace}/{name} in {', '.join(where)}")


def pod_spec(obj: dict) -> dict | None:
    """The pod spec of a Deployment or CronJob; None for other kinds."""
    if obj["kind"] == "Deployment":
        return obj["spec"]["template"]["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return None


def pod_specs(objects: Sequence[Sourced] = ALL_OBJECTS) -> Iterator[tuple[str, dict, dict]]:
    """(object id, owning object, pod spec) for every workload."""
    for _, obj in objects:
        pod = pod_spec(obj)
        if pod is not None:
            yield object_id(obj), obj, pod


def dashboard() -> dict:
    """The Grafana dashboard JSON the kustomization ships."""
    return json.loads(DASHBOARD.read_text())
