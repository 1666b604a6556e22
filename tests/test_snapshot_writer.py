"""`python -m extender.sources.snapshot`: cluster snapshot files written from a metrics table or
from a live cluster, which `python -m extender --cluster` then serves.

From a table: each node's newest complete reading, checked against the same parser the
service uses. From a live cluster: the fake Kubernetes API's Nodes and a real Prometheus
scraping tiny exporters, read with the collect settings (the same path as live mode).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes import client

from extender.sources.snapshot import nodes_from_cluster, read_snapshot
from livedata.collect_config import load_collect_config
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import two_nodes, wait_until
from tests.support.fake_kube import FakeKube
from tests.support.prometheus import start_prometheus
from tests.support.server import REPO_ROOT, extender_service

HEADER = "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,cpu2_temp_c,power_w\n"


def write_snapshot_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "extender.sources.snapshot", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_from_metrics_takes_each_nodes_newest_complete_reading(tmp_path: Path) -> None:
    table = tmp_path / "metrics.csv"
    table.write_text(
        HEADER
        + "node-a,2026-01-05T00:00:00Z,0.20,21,40,41,150\n"
        + "node-a,2026-01-05T00:02:00Z,0.35,22,45,46,171\n"  # newest complete: this one
        + "node-a,2026-01-05T00:03:00Z,0.90,,,,300\n"  # a sensor dropout: not usable
        + "node-b,1767571260,0.50,24,55,,210\n"  # Unix seconds; one socket
        + "node-b,1767571200,0.10,23,44,,120\n"  # older, though later in the file
        + "node-c,2026-01-05T00:00:00Z,1.70,23,44,,120\n"  # utilisation out of range only
    )
    out = tmp_path / "cluster.json"
    done = write_snapshot_cli("--from-metrics", str(table), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 2 nodes (2 with telemetry)" in done.stdout
    assert "python -m extender --bundle DIR --cluster" in done.stdout
    nodes = {node.info.name: node for node in read_snapshot(out)}  # the service's own parser
    assert set(nodes) == {"node-a", "node-b"}
    assert dict(nodes["node-a"].telemetry) == {
        "cpu_util": 0.35,
        "ambient_temp_c": 22.0,
        "cpu1_temp_c": 45.0,
        "cpu2_temp_c": 46.0,
        "power_w": 171.0,
    }
    assert dict(nodes["node-b"].telemetry) == {
        "cpu_util": 0.5,
        "ambient_temp_c": 24.0,
        "cpu1_temp_c": 55.0,
        "power_w": 210.0,
    }
    assert nodes["node-a"].info.allocatable_cpu == 32.0  # the default; --allocatable-cpu
    assert dict(nodes["node-a"].info.labels) == {}  # grid power until the file says otherwise


def test_a_reading_the_source_lacks_is_written_as_null(tmp_path: Path) -> None:
    # A fleet whose BMCs report no inlet temperature: the table has no ambient_temp_c column.
    table = tmp_path / "metrics.csv"
    table.write_text(
        "node,timestamp,cpu_util,cpu1_temp_c,power_w\nnode-a,2026-01-05T00:00:00Z,0.3,50,160\n"
    )
    out = tmp_path / "cluster.json"
    done = write_snapshot_cli("--from-metrics", str(table), "--out", str(out))
    assert done.returncode == 0, done.stderr
    (written,) = json.loads(out.read_text())["nodes"]
    assert written["telemetry"]["ambient_temp_c"] is None  # missing, and said so
    (node,) = read_snapshot(out)  # what --cluster accepts
    assert dict(node.telemetry) == {"cpu_util": 0.3, "cpu1_temp_c": 50.0, "power_w": 160.0}


def test_a_written_snapshot_serves_a_bundle_of_ones_own(tmp_path: Path) -> None:
    # What the README's "try your own bundle locally" does: metrics -> snapshot -> serve.
    table = tmp_path / "fleet.csv"
    table.write_text(
        HEADER
        + "node-a,2026-01-05T00:00:00Z,0.30,22,50,49,160\n"
        + "node-b,2026-01-05T00:00:00Z,0.30,22,50,49,250\n"
    )
    out = tmp_path / "cluster.yaml"
    done = write_snapshot_cli(
        "--from-metrics", str(table), "--out", str(out), "--allocatable-cpu", "16"
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(out.read_text())["nodes"][0]["allocatable_cpu"] == 16.0
    curves = {"node-a": PowerCurveSpec(100.0, 200.0), "node-b": PowerCurveSpec(100.0, 500.0)}
    bundle = make_bundle(tmp_path / "bundle", curves)
    body = {
        "Pod": {
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
        },
        "Nodes": None,
        "NodeNames": ["node-a", "node-b"],
    }
    with (
        extender_service(bundle.directory, out) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as http,
    ):
        assert http.get("/readyz").status_code == 200
        scores = {e["Host"]: e["Score"] for e in http.post("/prioritize", json=body).json()}
        metrics = http.get("/metrics").text
    assert scores["node-a"] > scores["node-b"]  # the flatter curve adds fewer watts
    assert 'power_aware_extender_node_measured_power_watts{node="node-b"} 250.0' in metrics


@pytest.mark.parametrize(
    ("rows", "args", "message"),
    [
        ("node-a,2026-01-05T00:00:00Z,35,22,50,49,160\n", [], "--cpu-util-percent"),
        ("node-a,2026-01-05T00:00:00Z,0.3,,,,160\n", [], "no row has a node, a time"),
        (None, [], "no such file or directory"),
        ("node-a,2026-01-05T00:00:00Z,0.3,22,50,49,160\n", ["--allocatable-cpu", "0"], "> 0"),
        ("node-a,2026-01-05T00:00:00Z,0.3,22,50,49,160\n", ["--in-cluster"], "need --prometheus"),
    ],
    ids=["percent", "no-usable-row", "missing-file", "zero-cpu", "live-flag-alone"],
)
def test_bad_input_is_a_one_line_error(
    tmp_path: Path, rows: str | None, args: list[str], message: str
) -> None:
    table = tmp_path / "metrics.csv"
    if rows is not None:
        table.write_text(HEADER + rows)
    done = write_snapshot_cli(
        "--from-metrics", str(table), "--out", str(tmp_path / "c.json"), *args
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert message in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "c.json").exists()


@pytest.mark.prometheus
def test_from_a_live_cluster_nodes_from_the_api_telemetry_from_prometheus(tmp_path: Path) -> None:
    with two_nodes() as (node_a, node_b), FakeKube() as kube:
        prometheus = start_prometheus(tmp_path, scrape_targets=[node_a.target, node_b.target])
        with prometheus:
            prometheus.wait_for('rate(node_cpu_seconds_total{mode="idle"}[5s])')
            kube.create(
                "nodes",
                {
                    "metadata": {
                        "name": "node-a",
                        "labels": {"energy-status": "vulnerable", "kubernetes.io/os": "linux"},
                        "annotations": {
                            "power-aware-scheduler/max-power-w": "450",
                            "node.alpha.kubernetes.io/ttl": "0",  # not ours: left out
                        },
                    },
                    "status": {"allocatable": {"cpu": "7500m"}},
                },
            )
            kube.create(
                "nodes", {"metadata": {"name": "node-b"}, "status": {"allocatable": {"cpu": "4"}}}
            )
            kube.create(
                "nodes", {"metadata": {"name": "node-c"}, "status": {"allocatable": {"cpu": "8"}}}
            )
            collect = load_collect_config(
                None,
                url=prometheus.url,
                cpu_rate_window="5s",
                instance_nodes={node_b.target: "node-b"},
            )
            api = client.CoreV1Api(kube.api_client())
            nodes: dict = {}

            def settled() -> bool:  # the first rate windows still hold the exporters' start
                nodes.clear()
                nodes.update((n.info.name, n) for n in nodes_from_cluster(collect, api))
                return (
                    abs(nodes["node-a"].telemetry.get("cpu_util", -1.0) - 0.25) < 0.02
                    and abs(nodes["node-b"].telemetry.get("cpu_util", -1.0) - 0.6) < 0.02
                )

            wait_until(settled, "the nodes' CPU rates to settle at the exporters' 25 % and 60 %")
    assert set(nodes) == {"node-a", "node-b", "node-c"}
    a = nodes["node-a"]
    assert a.info.allocatable_cpu == 7.5
    assert dict(a.info.labels) == {"energy-status": "vulnerable", "kubernetes.io/os": "linux"}
    assert dict(a.info.annotations) == {"power-aware-scheduler/max-power-w": "450"}
    assert nodes["node-b"].telemetry["cpu_util"] == pytest.approx(0.6, abs=0.02)
    assert a.telemetry["power_w"] == 310.0
    assert (a.telemetry["ambient_temp_c"], a.telemetry["cpu1_temp_c"]) == (22.0, 55.0)
    assert nodes["node-b"].telemetry["power_w"] == 150.0
    assert "cpu2_temp_c" not in nodes["node-b"].telemetry  # one socket
    assert nodes["node-c"].telemetry == {}  # no exporter: no telemetry, still a node
    # ... and the document round-trips through the service's parser.
    from extender.sources.snapshot import write_snapshot_file

    out = tmp_path / "live.json"
    write_snapshot_file(out, list(nodes.values()))
    assert json.loads(out.read_text())["nodes"][0]["name"] == "node-a"
    assert len(read_snapshot(out)) == 3
