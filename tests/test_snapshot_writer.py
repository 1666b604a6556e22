"""`python -m extender.sources.snapshot`: cluster snapshot files written from a metrics table or
from a live cluster, which `python -m extender --cluster` then serves.

From a table: each node's newest complete reading, checked against the same parser the
service uses. From a live cluster: the command's `--kubeconfig` reads the real API server's
(envtest) Nodes, as ServiceAccount power-extender (reading nodes is all it needs), and a real
Prometheus scraping tiny exporters, read with the collect settings (the same path as live mode).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from envtest import ControlPlane
from extender.sources.snapshot import SnapshotError, nodes_from_metrics, read_snapshot
from livedata.collect_config import load_collect_config
from livedata.instant import read_instant
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.exporters import FakeHost, serve, wait_until
from tests.support.fault_proxy import FaultProxy
from tests.support.kube_api import component_kubeconfig, kubeconfig_via
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


@contextlib.contextmanager
def nodes_of_our_own(core: client.CoreV1Api, bodies: list[dict]) -> Iterator[list[str]]:
    names = []
    try:
        for body in bodies:
            core.create_node(body)
            names.append(body["metadata"]["name"])
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                core.delete_node(name)


@pytest.mark.prometheus
def test_from_a_live_cluster_nodes_from_the_api_telemetry_from_prometheus(
    tmp_path: Path, control_plane: ControlPlane, namespace: str
) -> None:
    a, b, c = (f"{namespace}-{x}" for x in "abc")  # the control plane is shared
    node_a = serve(
        FakeHost(
            cpu_util=0.25,
            temperatures_c={"Inlet Temp": 22.0, "CPU1 Temp": 55.0, "CPU2 Temp": 53.0},
            power_w=310.0,
            nodename=a,  # mapped by node_uname_info
        )
    )
    # No uname: mapped by instance (the collect settings), one socket.
    node_b = serve(
        FakeHost(cpu_util=0.6, temperatures_c={"Ambient": 24.0, "CPU1 Temp": 61.0}, power_w=150.0)
    )
    core = client.CoreV1Api(control_plane.api_client())
    bodies = [
        {
            "metadata": {
                "name": a,
                "labels": {"energy-status": "vulnerable", "kubernetes.io/os": "linux"},
                "annotations": {
                    "power-aware-scheduler/max-power-w": "450",
                    "node.alpha.kubernetes.io/ttl": "0",  # not ours: left out
                },
            },
            "status": {"allocatable": {"cpu": "7500m"}},
        },
        {"metadata": {"name": b}, "status": {"allocatable": {"cpu": "4"}}},
        {"metadata": {"name": c}, "status": {"allocatable": {"cpu": "8"}}},
    ]
    settings = {"cpu_rate_window": "5s", "instance_nodes": {node_b.target: b}}
    collect_file = tmp_path / "collect.yaml"
    collect_file.write_text(yaml.safe_dump(settings))
    out = tmp_path / "live.json"
    try:
        prometheus = start_prometheus(tmp_path, scrape_targets=[node_a.target, node_b.target])
        with prometheus, nodes_of_our_own(core, bodies):
            prometheus.wait_for('rate(node_cpu_seconds_total{mode="idle"}[5s])')
            collect = load_collect_config(collect_file, url=prometheus.url)

            def settled() -> bool:  # the first rate windows still hold the exporters' start
                utils = {r.node: r.values.get("cpu_util", -1.0) for r in read_instant(collect)}
                return (
                    abs(utils.get(a, -1.0) - 0.25) < 0.02 and abs(utils.get(b, -1.0) - 0.6) < 0.02
                )

            wait_until(settled, "the nodes' CPU rates to settle at the exporters' 25 % and 60 %")
            wait_until(  # the cluster's own label, below
                lambda: "beta.kubernetes.io/os" in (core.read_node(a).metadata.labels or {}),
                "the node lifecycle controller to label the node",
            )
            kubeconfig = component_kubeconfig(control_plane, "power-extender")
            done = write_snapshot_cli(
                "--prometheus",
                prometheus.url,
                "--collect-config",
                str(collect_file),
                "--kubeconfig",
                str(kubeconfig),
                "--out",
                str(out),
            )
    finally:
        node_a.stop()
        node_b.stop()
    assert done.returncode == 0, done.stderr
    assert "with telemetry) from" in done.stdout
    # The service's own parser reads it back; nodes of other tests are none of ours.
    nodes = {n.info.name: n for n in read_snapshot(out) if n.info.name.startswith(namespace)}
    assert set(nodes) == {a, b, c}
    written = json.loads(out.read_text())["nodes"]
    assert [n["name"] for n in written if n["name"].startswith(namespace)] == [a, b, c]
    node = nodes[a]
    assert node.info.allocatable_cpu == 7.5
    # Every label the Node has: ours, and what the cluster added (the node lifecycle
    # controller copies kubernetes.io/os to its beta label).
    assert dict(node.info.labels) == {
        "energy-status": "vulnerable",
        "kubernetes.io/os": "linux",
        "beta.kubernetes.io/os": "linux",
    }
    assert dict(node.info.annotations) == {"power-aware-scheduler/max-power-w": "450"}
    assert nodes[b].telemetry["cpu_util"] == pytest.approx(0.6, abs=0.02)
    assert node.telemetry["cpu_util"] == pytest.approx(0.25, abs=0.02)
    assert node.telemetry["power_w"] == 310.0
    assert (node.telemetry["ambient_temp_c"], node.telemetry["cpu1_temp_c"]) == (22.0, 55.0)
    assert nodes[b].telemetry["power_w"] == 150.0
    assert "cpu2_temp_c" not in nodes[b].telemetry  # one socket
    assert nodes[c].telemetry == {}  # no exporter: no telemetry, still a node


@pytest.mark.prometheus
def test_from_a_live_cluster_a_refusal_or_no_answer_of_the_api_is_one_line(
    tmp_path: Path, control_plane: ControlPlane
) -> None:
    # An identity that may not list nodes (the model trainer's): the server's 403, in words;
    # and no answer at all (a proxy resetting every connection): unreachable, in words.
    kubeconfig = component_kubeconfig(control_plane, "power-model-trainer")
    extender = component_kubeconfig(control_plane, "power-extender")
    with (
        start_prometheus(tmp_path) as prometheus,
        FaultProxy("127.0.0.1", control_plane.apiserver_port) as proxy,
    ):
        proxy.refuse()
        runs = [
            write_snapshot_cli(
                "--prometheus",
                prometheus.url,
                "--kubeconfig",
                str(config),
                "--out",
                str(tmp_path / "c.json"),
            )
            for config in (kubeconfig, kubeconfig_via(extender, proxy.url))
        ]
    expected = [
        ("listing nodes: HTTP 403", "cannot list resource"),
        ("listing nodes: Kubernetes API unreachable", "Connection reset by peer"),
    ]
    for done, words in zip(runs, expected, strict=True):
        assert done.returncode == 2
        assert "Traceback" not in done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert all(w in line for w in words), line
    assert not (tmp_path / "c.json").exists()


def test_from_metrics_without_pandas_says_where_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runtime image has no pandas: the command says so instead of a bare ImportError.
    table = tmp_path / "fleet.csv"
    table.write_text("node,timestamp,cpu_util\nnode-01,0,0.5\n")
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(SnapshotError, match=r"train extra .*trainer image"):
        nodes_from_metrics(table, allocatable_cpu=4)
