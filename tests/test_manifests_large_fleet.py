"""manifests/large-fleet/: the overlay whose trainer fits on a Dask cluster of its own.

Checked on what real kustomize builds from it (`kubectl kustomize manifests/large-fleet/`):
its objects against the official client's API models and every container's lock-down with the
base manifests' (tests/test_manifests.py); here, that it patches the base's trainer rather than
adding one, the Dask pods' probes against a real Dask scheduler and worker, and the trainer's
script against the CLI parsers and the objects it scales and connects to.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from envtest.ports import free_port
from tests.support.manifests import (
    LARGE_FLEET,
    LARGE_FLEET_OBJECTS,
    OBJECTS,
    find_object,
    kustomization,
    object_id,
)
from tests.test_manifests import CLI_MODULES

NAMESPACE = "power-aware-scheduler"
BASE_IDS = {object_id(obj) for _, obj in OBJECTS}
# What the overlay adds to what `kubectl apply -k manifests/` deploys.
DASK_OBJECTS = [obj for _, obj in LARGE_FLEET_OBJECTS if object_id(obj) not in BASE_IDS]
DASK_DEPLOYMENTS = ["power-model-dask-scheduler", "power-model-dask-workers"]


def _dask_object(kind: str, name: str) -> dict:
    (found,) = [o for o in DASK_OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _trainer(objects) -> dict:
    cronjob = find_object("CronJob", "power-model-trainer", NAMESPACE, objects=objects)
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def _script() -> str:
    return _trainer(LARGE_FLEET_OBJECTS)["args"][0]


def test_overlay_builds_on_the_base_and_patches_the_trainer() -> None:
    config = kustomization(LARGE_FLEET)
    assert config["resources"] == ["../base", "dask.yaml"]
    assert [p["path"] for p in config["patches"]] == ["trainer-dask.yaml"]
    # Everything the base deploys, plus the Dask cluster and the trainer's right to scale it.
    assert {object_id(obj) for _, obj in LARGE_FLEET_OBJECTS} >= BASE_IDS
    assert sorted(object_id(o) for o in DASK_OBJECTS) == sorted(
        f"{kind} {NAMESPACE}/{name}"
        for kind, name in [
            ("Service", "power-model-dask-scheduler"),
            ("Deployment", "power-model-dask-scheduler"),
            ("Deployment", "power-model-dask-workers"),
            ("Role", "power-model-trainer-dask"),
            ("RoleBinding", "power-model-trainer-dask"),
        ]
    )
    # The patch is merged into the base's trainer container (one container, not two): its
    # script and resources replaced, the base's mounts and security kept.
    base, patched = _trainer(OBJECTS), _trainer(LARGE_FLEET_OBJECTS)
    assert "--dask=" in patched["args"][0] and "--dask=" not in base["args"][0]
    assert patched["volumeMounts"] == base["volumeMounts"]
    assert patched["securityContext"] == base["securityContext"]
    env = {e["name"] for e in patched["env"]}
    assert {"PROMETHEUS_URL", "DASK_WORKERS"} <= env


@pytest.mark.parametrize("name", DASK_DEPLOYMENTS)
def test_dask_pods_run_no_api_token_and_idle_until_a_run(name: str) -> None:
    deployment = _dask_object("Deployment", name)
    assert deployment["spec"]["replicas"] == 0  # the CronJob scales them for a run
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def _local_command(container: dict, ports: dict[int, int], tmp_path: Path) -> list[str]:
    """The container's `dask ...` command run here: its ports moved to free ones, the
    scheduler's Service name to localhost, /tmp to a test directory."""
    words = []
    for word in container["command"]:
        word = word.replace("power-model-dask-scheduler", "127.0.0.1").replace(
            "/tmp", str(tmp_path)
        )
        for port, free in ports.items():
            word = re.sub(rf"(?<=[:=]){port}\b", str(free), word)
        words.append(word)
    assert words[0] == "dask"
    return [str(Path(sys.executable).parent / "dask"), *words[1:]]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_dask_probes_hit_endpoints_a_real_dask_cluster_serves(tmp_path: Path) -> None:
    containers = [
        c
        for name in DASK_DEPLOYMENTS
        for c in _dask_object("Deployment", name)["spec"]["template"]["spec"]["containers"]
    ]
    ports = {p["containerPort"]: free_port() for c in containers for p in c["ports"]}
    processes = [
        subprocess.Popen(
            _local_command(container, ports, tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the worker's nanny starts a child: stop them together
        )
        for container in containers
    ]
    try:
        for container in containers:
            named = {p["name"]: p["containerPort"] for p in container["ports"]}
            for kind in ("readinessProbe", "livenessProbe"):
                probe = container[kind]["httpGet"]
                url = f"http://127.0.0.1:{ports[named[probe['port']]]}{probe['path']}"
                deadline_s = time.monotonic() + 60
                while True:  # a worker answers once it has joined its scheduler
                    try:
                        answer: tuple[int, str] | None = _get(url)
                    except OSError:
                        answer = None
                    if answer == (200, "ok"):
                        break
                    assert all(p.poll() is None for p in processes), "a dask process exited"
                    assert time.monotonic() < deadline_s, (container["name"], url, answer)
                    time.sleep(0.3)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


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
