"""bench.cluster_emulation runs end to end at a tiny scale: the same trace on the real control
plane (nodes behind a Redfish emulator, the extender live, the node power controller acting)
and through the simulator, both reported row by row.

A benchmark, not a timed test: nothing here asserts a figure, only that each side did what the
comparison needs (every pod placed, nodes powered off for real, both sides' rows written).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.cluster_emulation import Deployments, EmulationSettings, emulation_trace, main
from bench.sim.cluster import build_cluster
from bench.sim.workload import NO_OWNER, Trace


@pytest.mark.slow
def test_a_tiny_run_places_every_pod_on_both_sides_and_powers_nodes_off_for_real(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "emulation.json"
    argv = [
        *("--nodes", "4", "--hours", "0.5", "--compression", "15"),
        # Nodes unneeded for 2 min (of trace) go off: a few power-offs within half an hour.
        *("--unneeded-time", "120", "--cooldown", "300"),
        *("--out-dir", str(tmp_path / "out"), "--json", str(out), "--quiet"),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    real, sim = result["real"], result["sim"]
    assert set(real) == set(sim) == {row["row"] for row in result["rows"]}
    for side in (real, sim):
        assert side["pods waiting at the end"] == 0  # every pod created was placed
        assert side["energy (kWh)"] > 0
        assert 0 < side["mean nodes on"] <= 4
    # The simulator places every trace pod (evicted ones once more); the real cluster binds a
    # pod for every replica the trace asked for, as long as it lived long enough to be made.
    assert sim["pods placed"] >= result["pods"]
    assert real["pods placed"] > 0
    # Nodes really went off: the controller recorded it and the BMC was asked.
    assert real["nodes powered off"] >= 1
    assert real["power cycles (power-offs)"] >= real["nodes powered off"]
    assert [e for e in result["events"]["real"] if e[1] == "off"]
    for row in result["rows"]:
        assert row["real"] == real[row["row"]] and row["sim"] == sim[row["row"]]
    printed = capsys.readouterr().out
    assert "real vs sim" in printed and "energy (kWh)" in printed


def test_the_trace_gives_every_pod_a_deployment_of_one_request_and_a_burst_where_asked() -> None:
    cluster = build_cluster(6, 7)
    quiet = emulation_trace(cluster, EmulationSettings(nodes=6, burst_s=()))
    burst = emulation_trace(cluster, EmulationSettings(nodes=6, burst_s=(1200.0,)))
    for trace in (quiet, burst):
        assert (trace.owners != NO_OWNER).all()
        assert (trace.usage_ratio == 1.0).all()
        for owner in np.unique(trace.owners):
            mine = trace.owners == owner
            assert len(set(trace.cpu_m[mine])) == len(set(trace.memory_bytes[mine])) == 1

    # The burst adds arrivals in its window and nowhere else.
    def arrivals(trace: Trace, start_s: float, end_s: float) -> int:
        return int(((trace.arrival_s >= start_s) & (trace.arrival_s < end_s)).sum())

    assert arrivals(burst, 1200.0, 1800.0) > arrivals(quiet, 1200.0, 1800.0)
    assert arrivals(burst, 0.0, 1200.0) == arrivals(quiet, 0.0, 1200.0)
    # Replicas follow the trace: every pod alive at a time is one replica of its Deployment.
    deployments = Deployments.of(burst)
    for t_s in (0.0, 900.0, 1500.0, 3000.0):
        alive = (burst.arrival_s <= t_s) & (t_s < burst.arrival_s + burst.duration_s)
        assert sum(deployments.replicas_at(t_s)) == int(alive.sum())
