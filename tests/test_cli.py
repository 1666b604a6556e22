"""``python -m extender`` as an operator runs it: a subprocess on a port the OS picks."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from extender.config import DEFAULT_BUNDLE_DIR
from tests.support.bundles import (
    PowerCurveSpec,
    corrupt_model_bytes,
    make_bundle,
    truncate_model,
)
from tests.support.server import REPO_ROOT, run_extender

DEMO_NODES = [f"node-{i:02d}" for i in range(1, 13)]


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    curves = {
        name: PowerCurveSpec(idle_w=70.0 + 8 * i, max_w=220.0 + 20 * i, exponent=1 + i % 3)
        for i, name in enumerate(DEMO_NODES)
    }
    return make_bundle(tmp_path_factory.mktemp("cli") / "bundle", curves).directory


def logged_curl_body(log_lines: list[str]) -> tuple[str, bytes]:
    """The URL and body of the curl line the service logs for newcomers."""
    entry = next(json.loads(line) for line in log_lines if '"try it"' in line)
    words = shlex.split(entry["curl"])
    return words[words.index("POST") + 1], words[words.index("-d") + 1].encode()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extender", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_demo_served(url: str, log_lines: list[str]) -> None:
    post_url, body = logged_curl_body(log_lines)
    assert post_url == f"{url}/prioritize"
    with httpx.Client(timeout=10) as client:
        answer = client.post(post_url, content=body)
        assert answer.status_code == 200
        scores = answer.json()
        assert [entry["Host"] for entry in scores] == DEMO_NODES
        assert all(type(entry["Score"]) is int and 0 <= entry["Score"] <= 10 for entry in scores)
        assert len({entry["Score"] for entry in scores}) > 1  # the demo nodes differ
        filtered = client.post(f"{url}/filter", content=body).json()
        assert "node-06" in filtered["FailedNodes"]  # the demo's powerless node
        assert client.get(f"{url}/readyz").status_code == 200


def test_serves_the_demo_cluster(demo_bundle: Path) -> None:
    with run_extender(["--bundle", str(demo_bundle)]) as service:
        assert_demo_served(service.url, service.log_lines)
        status = httpx.get(f"{service.url}/status", timeout=10).json()
        assert status["mode"] == "demo"
        assert status["nodes"]["known"] == 12
    steps = [json.loads(line).get("msg") for line in service.log_lines if line.startswith("{")]
    for step in ("starting", "cluster loaded", "bundle installed", "listening", "try it"):
        assert step in steps


def test_no_arguments_serve_the_shipped_bundle_on_the_demo_cluster() -> None:
    with run_extender([]) as service:
        assert_demo_served(service.url, service.log_lines)
        manifest = json.loads((DEFAULT_BUNDLE_DIR / "manifest.json").read_text())
        status = httpx.get(f"{service.url}/status", timeout=10).json()
        assert status["bundle_version"] == manifest["version"]


def test_yaml_snapshot_and_environment_settings(demo_bundle: Path, tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {
                        "name": "node-01",
                        "allocatable_cpu": "16",
                        "labels": {"energy-status": "vulnerable"},
                        "telemetry": {"cpu_util": 0.3, "ambient_temp_c": 21, "cpu1_temp_c": 50},
                    },
                    {"name": "node-02", "allocatable_cpu": 8},
                ]
            }
        )
    )
    env = {"PAS_ENERGY_WEIGHT": "0", "PAS_ASSUMED_WINDOW": "30"}
    with run_extender(["--bundle", str(demo_bundle), "--cluster", str(snapshot)], env) as service:
        status = httpx.get(f"{service.url}/status", timeout=10).json()
    assert status["mode"] == "snapshot"
    assert status["nodes"] == {
        "known": 2,
        "with_fresh_telemetry": 1,
        "without_telemetry": 1,
        "assumed_pods": 0,
    }
    assert status["scoring"]["weights"]["EnergyLevel"] == 0.0
    assert status["scoring"]["assumed_window_s"] == 30.0


def test_help_explains_every_flag() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for flag in ("--bundle", "--cluster", "--port", "--host", "--prometheus", "--kubeconfig"):
        assert flag in result.stdout
    assert "PAS_" in result.stdout and "SECONDS" in result.stdout


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda tmp, bundle: ["--bundle", str(tmp / "nowhere")], "nowhere"),
        (
            lambda tmp, bundle: ["--bundle", str(bundle), "--cluster", str(tmp / "bad.json")],
            "node-x",
        ),
        (
            lambda tmp, bundle: ["--bundle", str(bundle), "--cluster", str(tmp / "gone.json")],
            "gone.json",
        ),
        (lambda tmp, bundle: ["--kubeconfig", str(tmp / "kc")], "--prometheus"),
        (
            lambda tmp, bundle: [
                "--telemetry-ttl",
                "-1",
                "--prometheus",
                "http://x",
                "--in-cluster",
            ],
            "--telemetry-ttl",
        ),
    ],
)
def test_bad_input_is_a_one_line_error(
    demo_bundle: Path, tmp_path: Path, make_args, message
) -> None:
    bad = {"nodes": [{"name": "node-x", "allocatable_cpu": "lots", "telemetry": {}}]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    result = run_cli(*make_args(tmp_path, demo_bundle), "--port", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m extender: error:")
    assert message in last


def test_a_file_given_as_bundle_is_called_a_file(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# a file, not a bundle\n")
    result = run_cli("--bundle", str(readme), "--port", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"{readme}: is a file, not a bundle directory" in last
    assert "missing" not in last


def test_a_telemetry_key_typo_is_refused_naming_file_node_key_and_the_right_key(
    demo_bundle: Path, tmp_path: Path
) -> None:
    telemetry = {"cpu_utl": 0.3, "ambient_temp_c": 21.0, "cpu1_temp_c": 50.0}
    snapshot = tmp_path / "cluster.json"
    snapshot.write_text(
        json.dumps({"nodes": [{"name": "node-07", "allocatable_cpu": 8, "telemetry": telemetry}]})
    )
    result = run_cli("--bundle", str(demo_bundle), "--cluster", str(snapshot), "--port", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]  # after the "starting" log line
    assert line.startswith(f"python -m extender: error: {snapshot}: nodes[0] (node node-07): ")
    assert '"telemetry.cpu_utl"' in line and 'did you mean "cpu_util"?' in line


@pytest.mark.parametrize(
    ("damage", "what"),
    [
        (lambda bundle: (bundle / "manifest.json").write_text('{"format": '), "not valid JSON"),
        (lambda bundle: truncate_model(bundle, "node-01"), "onnxruntime cannot load the model"),
        (lambda bundle: corrupt_model_bytes(bundle, "node-01"), "does not match the manifest"),
    ],
    ids=["manifest", "truncated-onnx", "bad-sha256"],
)
def test_a_corrupt_bundle_at_start_up_is_said_once_for_a_person(
    demo_bundle: Path, tmp_path: Path, damage, what: str
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(demo_bundle, bundle)
    damage(bundle)
    result = run_cli("--bundle", str(bundle), "--port", "0", "--log-format", "text")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if what in line]
    assert len(lines) == 1, result.stderr  # said once: no log line repeating the exit message
    (line,) = lines
    assert line.startswith(f"python -m extender: error: the model bundle in {bundle}")
    assert "None" not in line and "keeping" not in line
    # A whole sentence and what to do about it, not a fragment cut mid-phrase.
    assert line.endswith("or rebuild the shipped one with `make models`")
    assert "Point --bundle at a directory that `python -m training.fit --out DIR` wrote" in line
