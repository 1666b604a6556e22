"""The service starts without the trainer's libraries: no pandas, pyarrow, sklearn, scipy, training.

They cost start-up time and memory in every extender pod, and `extender` importing `training`
would tie the service to the trainer's dependencies. Each mode is started in a fresh
interpreter the way `python -m extender` starts it (configuration, runtime, live sources, one
telemetry poll, the app), then its `sys.modules` is listed.
"""

from __future__ import annotations

import json
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
