"""The service starts without the trainer's libraries: no pandas, pyarrow, sklearn, scipy, training.

They cost start-up time and memory in every extender pod, and `extender` importing `training`
would tie the service to the trainer's dependencies. Each mode is started in a fresh
interpreter the way `python -m extender` starts it (configuration, runtime, live sources, one
telemetry poll, the app), then its `sys.modules` is listed.

The runtime image installs only requirements.lock: each of its processes answers --help, and
every module of its packages imports, with everything else made unimportable.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.prometheus import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
# scipy too: importing scipy.stats for one binomial quantile once cost every extender 60 MiB.
TRAINING_ONLY = ("pandas", "pyarrow", "scipy", "sklearn", "training")

# What `python -m extender` runs before it serves, plus one Prometheus poll in live mode (the
# Prometheus URL is a closed port: the poll fails, is counted, and must not raise).
START_SERVICE = """
import json, sys
from extender.__main__ import prepare
from extender.app import create_app
from extender.config import parse_config

runtime = prepare(parse_config(sys.argv[1:]))
create_app(runtime)
for source in runtime.live_sources:
    if hasattr(source, "poll_once"):
        assert source.poll_once() is False
print(json.dumps({
    "mode": runtime.mode,
    "live_sources": len(runtime.live_sources),
    "packages": sorted({name.split(".")[0] for name in sys.modules}),
}))
"""


def _start(args: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", START_SERVICE, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _live_args(tmp_path: Path) -> list[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    collect_config = tmp_path / "collect.yaml"
    collect_config.write_text("node_from: label\ncpu_rate_window: 1m\n")
    return [
        "--prometheus",
        f"http://127.0.0.1:{free_port()}",
        "--kubeconfig",
        str(kubeconfig),
        "--collect-config",
        str(collect_config),
        "--prometheus-timeout",
        "2",
    ]


@pytest.mark.parametrize("mode", ["demo", "snapshot", "live"])
def test_the_service_starts_without_training_libraries(mode: str, tmp_path: Path) -> None:
    args = {
        "demo": [],
        "snapshot": ["--cluster", str(REPO_ROOT / "extender" / "sources" / "demo_cluster.json")],
        "live": _live_args(tmp_path),
    }[mode]
    started = _start(args)
    assert started["mode"] == mode
    if mode == "live":
        assert started["live_sources"] == 2  # Kubernetes watches and the Prometheus poller
    assert sorted(set(TRAINING_ONLY) & set(started["packages"])) == []


# ---------------------------------------------------------------------------------------------
# The runtime image: its processes import with only what it installs

RUNTIME_PACKAGES = ("extender", "predictor", "livedata", "controllers")
RUNTIME_ENTRY_POINTS = ("extender", "controllers.energy_adapter", "controllers.node_power")

# Runs in a fresh interpreter: makes every top-level name in argv[1] (JSON) unimportable, then
# either runs `python -m MODULE --help` (argv[2] "run") or imports every module of the packages
# (argv[2] "walk"), and prints what it loaded of the blocked names.
UNDER_BLOCKER = """
import importlib, importlib.abc, json, pkgutil, runpy, sys

blocked = set(json.loads(sys.argv[1]))
loaded_before = set(sys.modules)


class NotInTheRuntimeImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"{name} is not in the runtime image", name=name)
        return None


sys.meta_path.insert(0, NotInTheRuntimeImage())
mode, targets = sys.argv[2], sys.argv[3:]
if mode == "run":
    sys.argv = [targets[0], "--help"]
    try:
        runpy.run_module(targets[0], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        assert stop.code in (0, None), stop.code
else:
    for package_name in targets:
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            if not info.name.endswith(".__main__"):
                importlib.import_module(info.name)
new = {name.partition(".")[0] for name in set(sys.modules) - loaded_before}
print(json.dumps(sorted(new & blocked)))
"""


def _not_in_the_runtime_image() -> set[str]:
    """The top-level import names of every installed distribution that the runtime image does
    not hold: not in requirements.lock (the train extra, the test tools, what they pull in), or
    uninstalled by scripts/trim-venv; and our trainer and benches."""
    from tests.test_image import locked_pins, normalized

    in_image = set(locked_pins(REPO_ROOT / "requirements.lock")) | {"power-aware-scheduler"}
    trim = (REPO_ROOT / "scripts" / "trim-venv").read_text().replace("\\\n", " ")
    for uninstalled in re.findall(r"pip uninstall --quiet --yes ([^\n]+)", trim):
        in_image -= {normalized(name) for name in uninstalled.split()}
    blocked = {"training", "bench", "tests"}
    for top_level, distributions in importlib.metadata.packages_distributions().items():
        if not any(normalized(name) in in_image for name in distributions):
            blocked.add(top_level)
    return blocked


def _under_blocker(mode: str, targets: tuple[str, ...]) -> subprocess.CompletedProcess:
    blocked = _not_in_the_runtime_image()
    # The blocker is real: the names the trainer imports are in it.
    assert {"pandas", "pyarrow", "scipy", "sklearn", "matplotlib", "training"} <= blocked
    return subprocess.run(
        [sys.executable, "-c", UNDER_BLOCKER, json.dumps(sorted(blocked)), mode, *targets],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("entry_point", RUNTIME_ENTRY_POINTS)
def test_the_runtime_image_s_processes_start_without_the_train_extra(entry_point: str) -> None:
    done = _under_blocker("run", (entry_point,))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_every_module_of_the_runtime_packages_imports_without_the_train_extra() -> None:
    done = _under_blocker("walk", RUNTIME_PACKAGES)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []
