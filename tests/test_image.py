"""The container image's bookkeeping: the image the rendered manifests deploy is the one
`make image` builds, and the test environment's lock holds the image's versions.

Building and running the image itself is `make image` / `make image-test` (scripts/image-test),
which .ci/run runs after the test suite.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from tests.support.manifests import LARGE_FLEET_OBJECTS, OBJECTS, pod_specs

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def makefile_value(name: str) -> str:
    """A variable's value as make itself evaluates the Makefile."""
    printed = subprocess.run(
        ["make", "--no-print-directory", "-s", "--eval", f"print-value: ; @echo $({name})",
         "print-value"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return printed.stdout.strip()


def locked_pins(lock_file: Path) -> dict[str, str]:
    """name -> version of each `name==version` line of a pip-compile lock."""
    pins = {}
    for line in lock_file.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)", line)
        if match:
            pins[normalized(match[1])] = match[2]
    return pins


def test_the_manifests_deploy_the_image_make_image_builds() -> None:
    image = makefile_value("IMAGE")
    assert image == f"power-aware-scheduler:{PROJECT['version']}"
    deployed = {
        (object_name, container["image"])
        for objects in (OBJECTS, LARGE_FLEET_OBJECTS)
        for object_name, _, pod in pod_specs(objects)
        for container in pod["containers"] + pod.get("initContainers", [])
        if container["image"].split(":")[0].endswith("power-aware-scheduler")
    }
    assert {name for name, _ in deployed} >= {
        "Deployment power-aware-scheduler/power-extender",
        "Deployment power-aware-scheduler/energy-adapter",
        "Deployment power-aware-scheduler/power-node-controller",
        "CronJob power-aware-scheduler/power-model-trainer",
    }
    assert {tag for _, tag in deployed} == {image}, deployed


def test_the_test_environment_runs_the_image_versions() -> None:
    runtime = locked_pins(REPO_ROOT / "requirements.lock")
    dev = locked_pins(REPO_ROOT / "requirements-dev.lock")
    assert {"numpy", "onnxruntime", "fastapi", "kubernetes"} <= runtime.keys()
    assert {"pytest", "ruff", "pip-tools"} <= dev.keys()
    differing = {name: (version, dev.get(name)) for name, version in runtime.items()
                 if dev.get(name) != version}  # fmt: skip
    assert differing == {}, f"requirements-dev.lock differs from requirements.lock: {differing}"


def test_every_dependency_in_pyproject_is_locked() -> None:
    declared = {normalized(Requirement(line).name) for line in PROJECT["dependencies"]}
    dev = {normalized(Requirement(line).name) for line in PROJECT["optional-dependencies"]["dev"]}
    assert not declared - locked_pins(REPO_ROOT / "requirements.lock").keys()
    assert not (declared | dev) - locked_pins(REPO_ROOT / "requirements-dev.lock").keys()
