"""manifests/large-fleet/: the overlay whose trainer fits on a Dask cluster of its own.

Its objects are checked against the official client's API models, like the base manifests'
(tests/test_manifests.py); the trainer's script against the CLI parsers and the objects it
scales and connects to; the added Role against least privilege.
"""

from __future__ import annotations

import importlib
import re
import shlex
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.manifests import MANIFESTS, find_object
from tests.test_manifests import CLI_MODULES, MODELS

OVERLAY = MANIFESTS / "large-fleet"
NAMESPACE = "power-aware-scheduler"
DASK_OBJECTS = [d for d in yaml.safe_load_all((OVERLAY / "dask.yaml").read_text()) if d]
PATCH = yaml.safe_load((OVERLAY / "trainer-dask.yaml").read_text())


def _dask_object(kind: str, name: str) -> dict:
    (found,) = [o for o in DASK_OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _script() -> str:
    (container,) = PATCH["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container["args"][0]


def test_overlay_builds_on_the_base_and_patches_the_trainer() -> None:
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../", "dask.yaml"]
    assert [p["path"] for p in kustomization["patches"]] == ["trainer-dask.yaml"]
    base = find_object("CronJob", "power-model-trainer", NAMESPACE)
    assert (PATCH["kind"], PATCH["metadata"]["name"]) == (base["kind"], base["metadata"]["name"])
    (container,) = PATCH["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    (base_container,) = base["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == base_container["name"]  # merged into it, not added


@pytest.mark.parametrize("obj", DASK_OBJECTS, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_object_matches_the_kubernetes_api_model(obj: dict) -> None:
    model = MODELS[(obj["apiVersion"], obj["kind"])].model_validate(obj)
    assert model.metadata.namespace == NAMESPACE


@pytest.mark.parametrize("name", ["power-model-dask-scheduler", "power-model-dask-workers"])
def test_dask_pods_are_locked_down_bounded_and_idle_until_a_run(name: str) -> None:
    deployment = _dask_object("Deployment", name)
    assert deployment["spec"]["replicas"] == 0  # the CronJob scales them for a run
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
        assert context["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind])


def test_the_trainer_scales_connects_to_and_may_scale_only_its_dask_cluster() -> None:
    script = _script()
    assert script.lstrip().startswith("set -eu") and "trap 'scale 0' EXIT" in script
    commands = [
        shlex.split(line.strip())
        for line in script.replace("\\\n", " ").splitlines()
        if line.strip().startswith("python -m ")
    ]
    assert [c[2] for c in commands] == ["training.fit", "training.publish"]
    fit = importlib.import_module(CLI_MODULES["training.fit"]).build_parser()
    args = fit.parse_args(commands[0][3:])
    publish = importlib.import_module("training.publish").build_parser()
    assert publish.parse_args(commands[1][3:]).bundle == args.out
    # --dask names the scheduler's Service and port
    address = urlsplit(args.dask)
    service = _dask_object("Service", "power-model-dask-scheduler")
    assert address.hostname == service["metadata"]["name"]
    assert address.port == service["spec"]["ports"][0]["port"]
    workers = _dask_object("Deployment", "power-model-dask-workers")
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    assert f"tcp://{address.hostname}:{address.port}" in worker["command"]
    # the Deployments the script scales are exactly the ones the Role lets it scale
    scaled = set(re.findall(r'"(power-model-dask-[a-z]+)"', script))
    (rule,) = _dask_object("Role", "power-model-trainer-dask")["rules"]
    assert rule["resources"] == ["deployments/scale"] and set(rule["verbs"]) == {"get", "patch"}
    assert (
        scaled
        == set(rule["resourceNames"])
        == {o["metadata"]["name"] for o in DASK_OBJECTS if o["kind"] == "Deployment"}
    )
    binding = _dask_object("RoleBinding", "power-model-trainer-dask")
    assert binding["subjects"][0]["name"] == "power-model-trainer"
