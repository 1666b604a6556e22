"""The container images' bookkeeping: the images the rendered manifests deploy are the ones
`make image` (runtime) and `make image-trainer` build, and the locks agree: the trainer's holds
the runtime's versions, the test environment's holds both.

Building and running the images themselves is `make image` / `make image-test` and
`make image-trainer` / `make image-trainer-test` (scripts/image-test), which .ci/run runs after
the test suite.
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


def declared(requirements: list[str]) -> set[str]:
    """The normalized names of pyproject.toml requirement lines."""
    return {normalized(Requirement(line).name) for line in requirements}


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


# The workloads that run each of our images, in manifests/ and manifests/large-fleet/.
RUNTIME_WORKLOADS = {
    "Deployment power-aware-scheduler/power-extender",
    "Deployment power-aware-scheduler/energy-adapter",
    "Deployment power-aware-scheduler/power-node-controller",
}
TRAINER_WORKLOADS = {
    "CronJob power-aware-scheduler/power-model-trainer",
    "Deployment power-aware-scheduler/power-model-dask-scheduler",
    "Deployment power-aware-scheduler/power-model-dask-workers",
}


def test_the_manifests_deploy_the_images_make_builds() -> None:
    runtime_image = makefile_value("IMAGE")
    trainer_image = makefile_value("TRAINER_IMAGE")
    assert runtime_image == f"power-aware-scheduler:{PROJECT['version']}"
    assert trainer_image == f"power-aware-scheduler-trainer:{PROJECT['version']}"
    deployed: dict[str, set[str]] = {}
    for objects in (OBJECTS, LARGE_FLEET_OBJECTS):
        for object_name, _, pod in pod_specs(objects):
            for container in pod["containers"] + pod.get("initContainers", []):
                name = container["image"].split(":")[0].split("/")[-1]
                if name.startswith("power-aware-scheduler"):
                    deployed.setdefault(object_name, set()).add(container["image"])
    assert deployed.keys() == RUNTIME_WORKLOADS | TRAINER_WORKLOADS, deployed
    for name in RUNTIME_WORKLOADS:
        assert deployed[name] == {runtime_image}, (name, deployed[name])
    for name in TRAINER_WORKLOADS:
        assert deployed[name] == {trainer_image}, (name, deployed[name])


def test_the_locks_hold_each_other_s_versions() -> None:
    """The trainer image runs the runtime image's versions of what both have, and the test
    environment runs both images' versions."""
    runtime = locked_pins(REPO_ROOT / "requirements.lock")
    train = locked_pins(REPO_ROOT / "requirements-train.lock")
    dev = locked_pins(REPO_ROOT / "requirements-dev.lock")
    assert {"numpy", "onnxruntime", "fastapi", "kubernetes"} <= runtime.keys()
    assert {"pandas", "pyarrow", "scikit-learn", "matplotlib"} <= train.keys()
    assert {"pytest", "ruff", "pip-tools"} <= dev.keys()
    for lock_name, lock, held_to in (
        ("requirements-train.lock", train, runtime),
        ("requirements-dev.lock", dev, train),
    ):
        differing = {name: (version, lock.get(name)) for name, version in held_to.items()
                     if lock.get(name) != version}  # fmt: skip
        assert differing == {}, f"{lock_name} differs from the lock it is held to: {differing}"


def test_the_runtime_lock_has_none_of_the_trainer_s_libraries() -> None:
    train = declared(PROJECT["optional-dependencies"]["train"])
    runtime = locked_pins(REPO_ROOT / "requirements.lock")
    assert train & runtime.keys() == set()
    # Nor what only they pull in (the runtime image's size is mostly what it installs).
    assert {"scipy", "pandas", "pyarrow", "matplotlib", "fonttools"} & runtime.keys() == set()


def test_every_dependency_in_pyproject_is_locked() -> None:
    extras = PROJECT["optional-dependencies"]
    runtime = declared(PROJECT["dependencies"])
    train, dev = declared(extras["train"]), declared(extras["dev"])
    assert not runtime - locked_pins(REPO_ROOT / "requirements.lock").keys()
    assert not (runtime | train) - locked_pins(REPO_ROOT / "requirements-train.lock").keys()
    assert not (runtime | train | dev) - locked_pins(REPO_ROOT / "requirements-dev.lock").keys()
