"""Cluster snapshot files (contract 3) and the built-in demo cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from extender.sources.snapshot import SnapshotError, demo_snapshot, load_into, read_snapshot
from extender.state import ClusterState
from livedata.labels import ENERGY_LABEL


def write(tmp_path: Path, document: object, name: str = "cluster.json") -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


TELEMETRY = {"cpu_util": 0.35, "ambient_temp_c": 23.0, "cpu1_temp_c": 51.0}


def node(**fields: object) -> dict[str, object]:
    return {"name": "node-a", "allocatable_cpu": 8, **fields}


def without(mapping: dict[str, float], key: str) -> dict[str, float]:
    return {k: v for k, v in mapping.items() if k != key}


def test_contract_example_loads_into_the_state(tmp_path: Path) -> None:
    telemetry = {"cpu_util": 0.35, "ambient_temp_c": 23.0, "cpu1_temp_c": 51.0, "cpu2_temp_c": None}
    path = write(
        tmp_path,
        {"nodes": [node(labels={ENERGY_LABEL: "well-powered"}, telemetry=telemetry)]},
    )
    nodes = read_snapshot(path)
    assert nodes[0].info.allocatable_cpu == 8.0
    assert nodes[0].telemetry == {"cpu_util": 0.35, "ambient_temp_c": 23.0, "cpu1_temp_c": 51.0}
    state = ClusterState()
    load_into(state, nodes, observed_at_s=100.0)
    view = state.view(100.0)
    assert view.names == ("node-a",)
    assert view.cpu_util[0] == 0.35 and view.observed_at_s[0] == 100.0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"nodes": "all"}, '"nodes" list'),
        ([], '"nodes" list'),
        ({"nodes": [node(), node()]}, "node 'node-a' appears twice"),
        ({"nodes": [node(allocatable_cpu="lots")]}, 'nodes[0] (node node-a): "allocatable_cpu"'),
        ({"nodes": [node(allocatable_cpu=0)]}, "> 0 cores"),
        ({"nodes": [{"name": "node-a"}]}, '"allocatable_cpu" (cores) is missing'),
        ({"nodes": [node(telemetry={"cpu_util": 1.5})]}, "fraction 0..1"),
        ({"nodes": [node(telemetry={"cpu1_temp_c": "hot"})]}, '"telemetry.cpu1_temp_c"'),
        ({"nodes": [node(labels={"energy-status": 3})]}, '"labels"'),
        ({"nodes": [node(gpu=1)]}, "unknown field(s) ['gpu']"),
        ({"nodes": [node(name="")]}, '"name" must be a non-empty string'),
        (
            {"nodes": [node(telemetry={**TELEMETRY, "cpu_utl": 0.3})]},
            '"telemetry.cpu_utl" is not a telemetry key (did you mean "cpu_util"?)',
        ),
        (
            {"nodes": [node(telemetry={**TELEMETRY, "gpu_util": 0.3})]},
            "cpu_util, ambient_temp_c, cpu1_temp_c, cpu2_temp_c, power_w",
        ),
        (
            {"nodes": [node(telemetry=without(TELEMETRY, "ambient_temp_c"))]},
            '"telemetry.ambient_temp_c" is missing',
        ),
        (
            {"nodes": [node(telemetry=without(TELEMETRY, "cpu_util"))]},
            '"telemetry.cpu_util" is missing',
        ),
    ],
)
def test_errors_name_the_file_node_and_field(tmp_path: Path, document, message) -> None:
    path = write(tmp_path, document)
    with pytest.raises(SnapshotError) as error:
        read_snapshot(path)
    assert str(path) in str(error.value)
    assert message in str(error.value)


def test_yaml_and_unreadable_files(tmp_path: Path) -> None:
    yaml_path = write(tmp_path, "nodes:\n- name: node-y\n  allocatable_cpu: 7500m\n", "c.yaml")
    assert read_snapshot(yaml_path)[0].info.allocatable_cpu == 7.5
    broken = write(tmp_path, "nodes: [", "broken.yml")
    with pytest.raises(SnapshotError, match="not valid YAML"):
        read_snapshot(broken)
    with pytest.raises(SnapshotError, match="not valid JSON"):
        read_snapshot(write(tmp_path, "{", "broken.json"))
    with pytest.raises(SnapshotError, match="cannot read"):
        read_snapshot(tmp_path / "missing.json")


def test_demo_cluster_has_the_shipped_nodes_and_every_energy_level() -> None:
    nodes = demo_snapshot()
    assert [n.info.name for n in nodes] == [f"node-{i:02d}" for i in range(1, 13)]
    levels = [n.info.labels.get(ENERGY_LABEL) for n in nodes]
    assert levels.count("powerless") == 1
    assert levels.count(None) >= 2  # grid-powered nodes carry no label
    assert {"well-powered", "vulnerable", "low-powered"} <= set(levels)
    assert len({n.info.allocatable_cpu for n in nodes}) >= 5
    assert all(0 <= n.telemetry["cpu_util"] <= 1 for n in nodes)
    assert any("cpu2_temp_c" not in n.telemetry for n in nodes)  # one-socket nodes


@pytest.mark.parametrize(
    "telemetry",
    [
        TELEMETRY,  # a one-socket node: the bundle fills cpu2_temp_c from cpu1_temp_c
        {**TELEMETRY, "cpu2_temp_c": 49.5, "power_w": 210.0},
        {**TELEMETRY, "ambient_temp_c": None},  # a reading missing, said on purpose
        {},  # no telemetry, as when the key is absent
    ],
    ids=["one-socket", "all-keys", "explicit-null", "empty"],
)
def test_telemetry_that_is_accepted(tmp_path: Path, telemetry: dict[str, float | None]) -> None:
    (read,) = read_snapshot(write(tmp_path, {"nodes": [node(telemetry=telemetry)]}))
    assert read.telemetry == {k: v for k, v in telemetry.items() if v is not None}
