"""The energy bench's fleets (old, mixed, modern) and the kubelet's --max-pods in the simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.energy_sim import BenchSettings, build_parser, extender_policy
from bench.sim.autoscaler import _fit_into
from bench.sim.cluster import (
    FLEETS,
    MAX_PODS_BY_PERIOD,
    build_cluster,
    fleet_node_spec,
    node_periods,
)
from bench.sim.engine import PolicyResult, SimSettings, simulate
from bench.sim.kube_default import DEFAULT_MAX_PODS, NodeLedger, PodRequest, default_schedule
from bench.sim.policies import DefaultPolicy
from bench.sim.presets import DEFAULT
from bench.sim.scenario import bundle_dir_for, describe_preset
from bench.sim.workload import Trace
from extender.config import DEFAULT_BUNDLE_DIR
from training.synth import fleet_spec, fleet_telemetry, load_shapes, synth_fleet

GIB = 1024**3
# SPECpower result ids carry their publication date; the first sample ends in June 2016.
FIRST_MODERN_PUBLICATION = "20160701"


def published(results: np.ndarray) -> list[str]:
    """power_ssj2008-YYYYMMDD-NNNNN -> YYYYMMDD."""
    return [str(result).split("-")[1] for result in results]


@pytest.mark.parametrize("fleet", list(FLEETS))
def test_each_node_draws_from_its_periods_sample(fleet: str) -> None:
    cluster = build_cluster(16, 7, fleet=fleet)
    periods = node_periods(fleet, 16)
    old = set(load_shapes(("old",))["result"])
    modern = set(load_shapes(("modern",))["result"])
    for result, period, date in zip(
        cluster.spec.shape_result, periods, published(cluster.spec.shape_result), strict=True
    ):
        if period == "old":
            assert result in old and date < FIRST_MODERN_PUBLICATION
        else:
            assert result in modern and date >= FIRST_MODERN_PUBLICATION
    # Each node's cores are its own server's.
    shapes = load_shapes(FLEETS[fleet]).drop_duplicates("result").set_index("result")
    np.testing.assert_array_equal(cluster.cores, shapes.loc[cluster.spec.shape_result, "cores"])


def test_the_mixed_fleet_holds_both_generations_half_and_half() -> None:
    cluster = build_cluster(16, 7, fleet="mixed")
    modern = set(load_shapes(("modern",))["result"])
    is_modern = np.array([r in modern for r in cluster.spec.shape_result])
    assert is_modern.sum() == 8
    assert is_modern.tolist() == [i % 2 == 1 for i in range(16)]
    # Each half is its own generation's fleet, dealt in turn, with its own kubelet limit.
    old_half = fleet_spec(8, 7, periods=("old",))
    np.testing.assert_array_equal(cluster.spec.shape_result[0::2], old_half.shape_result)
    np.testing.assert_array_equal(cluster.spec.max_power_w[0::2], old_half.max_power_w)
    assert cluster.max_pods is not None
    assert set(cluster.max_pods[0::2]) == {MAX_PODS_BY_PERIOD["old"]}
    assert set(cluster.max_pods[1::2]) == {MAX_PODS_BY_PERIOD["modern"]}
    # Every per-node parameter is dealt, not only the curves.
    assert len(cluster.spec.cpu_model) == len(cluster.spec.names) == 16
    assert cluster.spec.cpu_model.dtype == object


def test_the_old_fleet_is_the_cluster_the_bench_always_built() -> None:
    # The construction before fleets: training.synth's fleet_spec(n, seed) of 2007-2016
    # servers, cores from the same table, 110 pods per node; and its synthetic history.
    before = fleet_spec(16, 7)
    cores = load_shapes().drop_duplicates("result").set_index("result")
    for cluster in (build_cluster(16, 7, battery_share=0.25), build_cluster(16, 7, fleet="old")):
        for field in dataclasses.fields(before):
            np.testing.assert_array_equal(
                getattr(cluster.spec, field.name), getattr(before, field.name)
            )
        np.testing.assert_array_equal(cluster.cores, cores.loc[before.shape_result, "cores"])
        assert cluster.max_pods is not None
        assert set(cluster.max_pods) == {DEFAULT_MAX_PODS}
    pd.testing.assert_frame_equal(
        fleet_telemetry(fleet_node_spec("old", 3, 5), 2, 300, 5), synth_fleet(3, 2, 300, seed=5)
    )
    # The old fleet's cached bundles keep their names; other fleets get their own.
    out = Path("out")
    assert bundle_dir_for(BenchSettings(), out).name.startswith("bundle-16n-seed7-")
    others = {bundle_dir_for(BenchSettings(fleet=f), out) for f in FLEETS}
    assert len(others) == len(FLEETS)


def test_the_presets_help_counts_the_chosen_fleets_cores() -> None:
    for fleet in FLEETS:
        cores = build_cluster(16, 7, fleet=fleet).cores.sum()
        text = describe_preset(DEFAULT, BenchSettings(fleet=fleet))
        assert f"{cores:,.0f} cores" in text
    modern_cores = build_cluster(16, 7, fleet="modern").cores.sum()
    help_text = " ".join(build_parser(["--fleet", "modern"]).format_help().split())
    assert f"{modern_cores:,.0f} cores" in help_text
    assert f"{modern_cores:,.0f} cores" not in " ".join(build_parser([]).format_help().split())


def test_the_default_scheduler_gives_a_node_at_its_pod_limit_no_more_pods() -> None:
    # Node 0 is far emptier (LeastAllocated prefers it) but holds its 3 pods already.
    ledger = NodeLedger(np.array([64000, 4000]), np.array([64 * GIB, 64 * GIB]), max_pods=[3, 110])
    rng = np.random.default_rng(1)
    pod = PodRequest(100, 0)
    assert default_schedule(ledger, pod, rng) == 0
    for _ in range(3):
        ledger.add(0, PodRequest(0, 0))
    assert {default_schedule(ledger, pod, rng) for _ in range(20)} == {1}


def burst_trace(pods: int, duration_s: float) -> Trace:
    """`pods` small pods arriving together, each running `duration_s`."""
    return Trace(
        names=[f"pod-{i}" for i in range(pods)],
        arrival_s=np.zeros(pods),
        cpu_m=np.full(pods, 100),
        memory_bytes=np.zeros(pods, dtype=np.int64),
        duration_s=np.full(pods, duration_s),
        usage_ratio=np.ones(pods),
    )


def most_pods_at_once(result: PolicyResult, duration_s: float) -> tuple[int, int]:
    """The most pods placed on one node within the first pods' lifetime, and how many waited
    past it (placed later, or never)."""
    early = [d for d in result.decisions if d.node and d.time_s < duration_s]
    counts = pd.Series([d.node for d in early]).value_counts()
    return int(counts.max()), result.pods - len({d.pod for d in early})


LIMIT = 5  # three DaemonSet pods and two workload pods per node


def test_the_simulated_default_scheduler_respects_max_pods() -> None:
    cluster = build_cluster(4, 7, max_pods=LIMIT)
    trace = burst_trace(20, 900.0)
    result = simulate(cluster, trace, DefaultPolicy(np.random.default_rng(1)), SimSettings())
    most, waited = most_pods_at_once(result, 900.0)
    assert most == LIMIT - len(cluster.daemon_pods)
    assert waited == 20 - 4 * (LIMIT - len(cluster.daemon_pods))


def test_the_power_aware_path_respects_max_pods() -> None:
    # The shipped bundle was fitted on build_cluster(12, 7)'s nodes. Without the limit the
    # extender packs the burst onto its cheapest nodes (tens of pods on one node).
    unlimited = build_cluster(12, 7)
    settings = BenchSettings(nodes=12, seed=7)
    trace = burst_trace(40, 900.0)
    with extender_policy("power-aware", unlimited, DEFAULT_BUNDLE_DIR, settings) as policy:
        free = simulate(unlimited, trace, policy, SimSettings())
    assert most_pods_at_once(free, 900.0)[0] > LIMIT
    limited = build_cluster(12, 7, max_pods=LIMIT)
    with extender_policy("power-aware", limited, DEFAULT_BUNDLE_DIR, settings) as policy:
        result = simulate(limited, trace, policy, SimSettings())
    most, waited = most_pods_at_once(result, 900.0)
    assert most == LIMIT - len(limited.daemon_pods)
    assert waited == 40 - 12 * (LIMIT - len(limited.daemon_pods))


def test_the_autoscalers_simulation_counts_pod_slots() -> None:
    # One node with CPU to spare but no pod slot left: the pod fits nowhere.
    room = {0: [8000, 8 * GIB, 0], 1: [50, 8 * GIB, 10]}
    assert not _fit_into(room, PodRequest(100, 0))
    room[1][0] = 1000
    assert _fit_into(room, PodRequest(100, 0))
    assert room[1] == [900, 8 * GIB, 9]


def test_fleet_curves_prints_one_row_per_fleet(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.fleet_curves import main

    assert main(["--nodes", "4", "--seed", "3"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == list(FLEETS)
    cores = [float(row.split()[1]) for row in rows]
    assert cores == [build_cluster(4, 3, fleet=f).cores.sum() for f in FLEETS]
