"""The energy bench's edge preset: its world, its Goldpinger measurements, and a short run of
the default scheduler and of `power-aware+delay` through a real extender server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench.energy_sim import main
from bench.sim import presets  # noqa: F401  (registers the edge preset and its policies)
from bench.sim.cluster import build_cluster
from bench.sim.edge import (
    GOLDPINGER_BUCKETS_S,
    WORLD_KEY,
    EdgeWorld,
    GoldpingerModel,
    build_world,
    prepare,
)
from bench.sim.engine import PolicyResult, SimSettings
from bench.sim.runner import PolicyNotApplicable, run_policy
from bench.sim.scenario import BenchSettings, Scenario
from bench.sim.workload import generate_trace
from extender.config import DEFAULT_BUNDLE_DIR
from extender.plugins.delay import DelayArgs
from extender.rtt import RTT_SIGNAL


def world(nodes: int = 16, seed: int = 7) -> EdgeWorld:
    cluster = build_cluster(nodes, seed)
    trace = generate_trace(float(cluster.cores.sum()), hours=2.0, load=0.45, seed=seed)
    return build_world(cluster.names, cluster.cores, trace.names, seed)


def test_the_world_has_sites_of_three_and_a_cloud_of_the_largest_nodes() -> None:
    edge = world()
    cores = build_cluster(16, 7).cores
    assert int(edge.cloud.sum()) == 4 and edge.site_count == 4
    assert cores[edge.cloud].min() >= cores[~edge.cloud].max()
    assert np.bincount(edge.site[~edge.cloud]).tolist() == [3, 3, 3, 3]
    typical = edge.typical_ms
    assert np.array_equal(typical, typical.T) and np.all(np.diag(typical) == 0.0)
    same_site = (edge.site[:, None] == edge.site[None, :]) & ~np.eye(16, dtype=bool)
    elsewhere = ~same_site & ~np.eye(16, dtype=bool)
    assert typical[same_site].max() < 2.5 and typical[elsewhere].min() > 8.0
    labels = edge.labels_of(next(iter(edge.constraints)))
    ((key, value),) = labels.items()
    assert key.startswith("delay_node-") and value in {"5", "20", "50"}
    assert world().constraints == edge.constraints  # deterministic for a seed


def test_about_the_share_of_pods_carry_a_constraint() -> None:
    cluster = build_cluster(16, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=6.0, load=0.45, seed=7)
    edge = build_world(cluster.names, cluster.cores, trace.names, 7, constrained_share=0.4)
    assert len(edge.constraints) / len(trace) == pytest.approx(0.4, abs=0.05)
    none = build_world(cluster.names, cluster.cores, trace.names, 7, constrained_share=0.0)
    assert none.constraints == {}


def test_goldpinger_measurements_are_bucket_bounds_at_or_above_the_typical_call() -> None:
    edge = world()
    model = GoldpingerModel(edge)
    matrix = model.signals(0.0)[RTT_SIGNAL]
    assert model.signals(10.0) == {}  # the next refresh is 30 s later
    bounds_ms = set((1000.0 * GOLDPINGER_BUCKETS_S[:-1]).round(6).tolist())
    off_diagonal = ~np.eye(16, dtype=bool)
    measured = matrix.rtt_ms[off_diagonal]
    assert set(measured.round(6).tolist()) <= bounds_ms
    # Typical calls well inside a bucket (not within jitter of its bound) read that bucket's
    # upper bound: within a site 1-2 ms -> 5 ms.
    same_site = (edge.site[:, None] == edge.site[None, :]) & off_diagonal & ~edge.cloud[:, None]
    assert np.all(matrix.rtt_ms[same_site] == 5.0)
    assert matrix.summary(0.0)["pairs_known"] == 16 * 15 // 2
    again = GoldpingerModel(edge).signals(0.0)[RTT_SIGNAL]
    assert np.array_equal(again.rtt_ms, matrix.rtt_ms)  # every policy sees the same calls
    p90 = GoldpingerModel(edge, DelayArgs(quantile=0.9)).signals(0.0)[RTT_SIGNAL]
    assert np.all(p90.rtt_ms >= matrix.rtt_ms)


def edge_scenario(hours: float = 0.5) -> Scenario:
    # The shipped bundle was fitted on build_cluster(12, 7)'s nodes.
    settings = BenchSettings(preset="edge", nodes=12, seed=7, battery_share=0.0)
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=hours, load=0.45, seed=3)
    scenario = Scenario(settings, SimSettings(tail_s=600.0), cluster, trace, DEFAULT_BUNDLE_DIR)
    prepare(scenario)
    return scenario


def assert_no_tight_limit_broken(edge: EdgeWorld, result: PolicyResult) -> dict[str, str]:
    """Limits of 5 and 20 ms are far from any link's jitter: none may be broken. (A 50 ms limit
    can meet a link whose typical call is within noise of 50 ms: the bench counts those.)
    Returns where each placed pod went."""
    placed = {d.pod: d.node for d in result.decisions if d.node}
    for uid, (origin, limit_ms) in edge.constraints.items():
        if uid in placed and limit_ms < 50:
            assert not edge.violates(uid, placed[uid]), (uid, edge.nodes[origin], placed[uid])
    return placed


def test_our_policy_honours_the_limits_the_default_scheduler_ignores() -> None:
    scenario = edge_scenario()
    edge = scenario.world[WORLD_KEY]
    assert isinstance(edge, EdgeWorld)
    default, _ = run_policy("default", scenario, progress=False)
    ours, figures = run_policy("power-aware+delay", scenario, progress=False)
    constrained = default.kpis["delay_constrained_pods"]
    assert constrained == ours.kpis["delay_constrained_pods"] >= 10
    assert default.delay_violations > 0
    assert ours.unplaced_pods == 0 and figures["extender_requests"] > 0
    placed = assert_no_tight_limit_broken(edge, ours)
    assert ours.delay_violations == sum(1 for uid in placed if edge.violates(uid, placed[uid]))


def test_cloud_preference_sends_the_unconstrained_pods_to_the_cloud_and_keeps_the_limits() -> None:
    scenario = edge_scenario()
    edge = scenario.world[WORLD_KEY]
    assert isinstance(edge, EdgeWorld)
    plain, _ = run_policy("power-aware+delay", scenario, progress=False)
    cloud, _ = run_policy("power-aware+delay+cloud", scenario, progress=False)
    assert cloud.unplaced_pods == 0
    share = "unconstrained_on_cloud_share"
    assert cloud.kpis[share] > plain.kpis[share] and cloud.kpis[share] > 0.9
    assert_no_tight_limit_broken(edge, cloud)


def test_the_cloud_weight_is_the_runs_setting_and_a_negative_one_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--preset", "edge", "--cloud-weight", "-1", "--quiet"]) == 2
    assert "--cloud-weight must be a finite weight >= 0, got -1" in capsys.readouterr().err
    shares = {}
    for weight in (0.0, 0.3):
        scenario = edge_scenario()
        scenario.settings = dataclasses.replace(scenario.settings, cloud_weight=weight)
        result, _ = run_policy("power-aware+delay+cloud", scenario, progress=False)
        shares[weight] = result.kpis["unconstrained_on_cloud_share"]
    assert shares[0.0] < shares[0.3]  # weight 0: the power score alone decides


def test_delay_policies_need_the_edge_world() -> None:
    scenario = edge_scenario(hours=0.05)
    del scenario.world[WORLD_KEY]
    scenario.settings = BenchSettings(nodes=12, seed=7)  # the default preset
    with pytest.raises(PolicyNotApplicable, match="--preset edge"):
        run_policy("power-aware+delay", scenario, progress=False)


def test_the_edge_bench_reports_the_least_energy_within_the_limits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "summary.json"
    args = ["--preset", "edge", "--nodes", "12", "--hours", "0.25", "--tail-hours", "0.25"]
    args += ["--policies", "default,cheapest+delay", "--quiet", "--out-dir", str(tmp_path)]
    assert main([*args, "--json", str(summary)]) == 0
    assert "ceiling within the delay limits: no placement" in capsys.readouterr().out
    report = json.loads(summary.read_text())
    within_kwh = report["preset"]["delay_ceiling_energy_kwh"]
    assert within_kwh >= report["ceiling"]["energy_kwh"]
    assert report["preset"]["delay_ceiling_vs_ceiling"] >= 1.0
    # A placement that keeps every pod within its true limit never beats the bound.
    assert report["policies"]["cheapest+delay"]["energy_kwh"] >= within_kwh
