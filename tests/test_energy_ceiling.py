"""The energy bench's ceiling (`bench.sim.ceiling`): a true lower bound, computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.carbon import CarbonMeter, CarbonWorld
from bench.sim.carbon_series import ZoneSeries
from bench.sim.ceiling import (
    ceiling_co2_kg,
    ceiling_energy_kwh,
    cheapest_dynamic_power_w,
    constrained_ceiling_energy_kwh,
    lower_convex_envelope,
    used_cores_series,
)
from bench.sim.cluster import build_cluster, node_power_w
from bench.sim.engine import SimSettings, simulate
from bench.sim.kube_default import fits
from bench.sim.policies import Decision, DefaultPolicy, RandomPolicy
from bench.sim.workload import Trace, generate_trace
from tests.support.sim import sim_cluster

LINEAR = np.linspace(0.5, 1.0, 11)  # idle half of max, linear to max
CONCAVE = 0.5 + 0.5 * np.sqrt(np.linspace(0.0, 1.0, 11))  # steep first, flat later


def test_lower_convex_envelope_drops_points_above_the_chords() -> None:
    x = np.array([0.0, 1.0, 2.0, 3.0])
    y = np.array([0.0, 3.0, 4.0, 9.0])
    vx, vy = lower_convex_envelope(x, y)
    # (1, 3) lies above the chord from (0, 0) to (2, 4), which passes through (1, 2).
    assert vx.tolist() == [0.0, 2.0, 3.0]
    assert vy.tolist() == [0.0, 4.0, 9.0]


def test_cheapest_power_fills_the_flattest_node_first() -> None:
    # Node 0: 4 cores, 100 -> 200 W linear (25 W/core). Node 1: 2 cores, 100 -> 200 W concave:
    # its envelope is the chord, 50 W/core.
    cluster = sim_cluster([LINEAR, CONCAVE], [200.0, 200.0], [4.0, 2.0])
    bound_w = cheapest_dynamic_power_w(cluster, np.array([0.0, 1.0, 4.0, 5.0, 6.0]))
    np.testing.assert_allclose(bound_w, [0.0, 25.0, 100.0, 150.0, 200.0], atol=1e-9)


def test_bound_is_never_above_the_best_split_of_the_real_curves() -> None:
    cluster = build_cluster(2, seed=11)
    no_fans_c = np.zeros(2)
    idle_w = node_power_w(cluster, np.zeros(2), no_fans_c)
    total_cores = float(cluster.cores.sum())
    for load in np.linspace(0.0, total_cores, 9):
        # Every split of `load` over the two nodes that fits, on a fine grid.
        on_first = np.linspace(max(0.0, load - cluster.cores[1]), min(load, cluster.cores[0]), 401)
        utils = np.stack([on_first / cluster.cores[0], (load - on_first) / cluster.cores[1]])
        dynamic_w = [
            (node_power_w(cluster, utils[:, k], no_fans_c) - idle_w).sum()
            for k in range(on_first.size)
        ]
        bound_w = cheapest_dynamic_power_w(cluster, np.array([load]))[0]
        # The envelope is of curves sampled at 2001 points: good to well under 0.01 %.
        assert bound_w <= min(dynamic_w) * (1 + 1e-4)


def test_used_cores_follow_arrivals_durations_and_usage() -> None:
    trace = Trace(
        names=["a", "b"],
        arrival_s=np.array([0.0, 60.0]),
        cpu_m=np.array([2000, 1000]),
        memory_bytes=np.zeros(2, dtype=np.int64),
        duration_s=np.array([120.0, 120.0]),
        usage_ratio=np.array([0.5, 1.0]),
    )
    used = used_cores_series(trace, np.arange(0.0, 300.0, 60.0))
    # a uses 1 core over [0, 120), b 1 core over [60, 180).
    np.testing.assert_allclose(used, [1.0, 2.0, 1.0, 0.0, 0.0])


@pytest.mark.parametrize("policy", [DefaultPolicy, RandomPolicy])
def test_no_simulated_policy_beats_the_ceiling(policy: type) -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=3.0, load=0.4, seed=3)
    settings = SimSettings(tail_s=1800.0)
    result = simulate(cluster, trace, policy(np.random.default_rng(0)), settings)
    ceiling_kwh = ceiling_energy_kwh(cluster, trace, result.duration_s, settings.tick_s)
    assert result.idle_energy_kwh < ceiling_kwh < result.energy_kwh


def test_pods_pinned_to_the_steep_node_cost_what_it_costs_there() -> None:
    # The same two nodes: 25 W/core on node 0, 50 W/core on node 1. Pod a (1 core) may run only
    # on node 1; pod b (1 core) anywhere: b takes the flat node, a pays the steep one.
    cluster = sim_cluster([LINEAR, CONCAVE], [200.0, 200.0], [4.0, 2.0])
    trace = _hour_long(a=1000, b=1000)
    only_node_1 = np.array([False, True])
    pinned = constrained_ceiling_energy_kwh(
        cluster, trace, 3600.0, 60.0, lambda uid: only_node_1 if uid == "a" else None
    )
    free = constrained_ceiling_energy_kwh(cluster, trace, 3600.0, 60.0, lambda uid: None)
    idle_kwh = 200.0 / 1000.0  # both nodes idle at 100 W for the hour
    assert free == pytest.approx(idle_kwh + 0.050, rel=1e-6)  # 2 cores x 25 W
    assert pinned == pytest.approx(idle_kwh + 0.075, rel=1e-6)  # 25 W + 50 W
    assert free == pytest.approx(ceiling_energy_kwh(cluster, trace, 3600.0, 60.0), rel=1e-6)
    # Pinned beyond what node 1 holds (3 cores on 2): the rest is priced at the steepest slope.
    over = constrained_ceiling_energy_kwh(
        cluster, _hour_long(a=3000), 3600.0, 60.0, lambda _: only_node_1
    )
    assert over == pytest.approx(idle_kwh + 0.150, rel=1e-6)


def _hour_long(**cpu_m: int) -> Trace:
    """Pods (name=millicores) arriving at 0 and using their whole request for an hour."""
    count = len(cpu_m)
    return Trace(
        names=list(cpu_m),
        arrival_s=np.zeros(count),
        cpu_m=np.array(list(cpu_m.values())),
        memory_bytes=np.zeros(count, dtype=np.int64),
        duration_s=np.full(count, 3600.0),
        usage_ratio=np.ones(count),
    )


def test_no_simulated_placement_within_the_limits_beats_the_constrained_ceiling() -> None:
    # Any placement that keeps each pod on its allowed nodes, simulated: at least the bound,
    # and the bound at least the unconstrained one.
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=2.0, load=0.4, seed=3)
    rng = np.random.default_rng(5)
    allowed = {uid: rng.random(len(cluster)) < 0.5 for uid in trace.names[::3]}
    for mask in allowed.values():
        mask[rng.integers(len(cluster))] = True
    settings = SimSettings(tail_s=1800.0)
    result = simulate(cluster, trace, _WithinLimits(allowed), settings)
    horizon_s = result.duration_s
    within = constrained_ceiling_energy_kwh(cluster, trace, horizon_s, settings.tick_s, allowed.get)
    ceiling = ceiling_energy_kwh(cluster, trace, horizon_s, settings.tick_s)
    assert ceiling * (1 - 1e-9) <= within < result.energy_kwh


class _WithinLimits(RandomPolicy):
    """Random placement among the pod's allowed nodes with room."""

    def __init__(self, allowed: dict[str, np.ndarray]) -> None:
        super().__init__(np.random.default_rng(0))
        self.allowed = allowed

    def place(self, uid, pod, ledger, now_s):  # type: ignore[no-untyped-def]
        feasible = np.flatnonzero(fits(ledger, pod))
        mask = self.allowed.get(uid)
        if mask is not None:
            feasible = feasible[mask[feasible]]
        if feasible.size == 0:
            return Decision(None, reason="no allowed node has room")
        return Decision(int(self.rng.choice(feasible)))


def test_co2_ceiling_fills_the_fewest_grams_per_core_each_hour() -> None:
    # Node 0: 25 W/core; node 1: 50 W/core (both idle at 100 W). The first half hour node 0's
    # grid emits 400 g/kWh and node 1's 100: 50 W x 100 g beats 25 W x 400 g, so the core runs
    # on node 1; then both grids emit 100 and it runs on node 0.
    cluster = sim_cluster([LINEAR, CONCAVE], [200.0, 200.0], [4.0, 2.0])
    trace = _hour_long(a=1000)

    def g_per_kwh(t_s: float) -> np.ndarray:
        return np.array([400.0, 100.0]) if t_s < 1800.0 else np.array([100.0, 100.0])

    bound = ceiling_co2_kg(cluster, trace, 3600.0, 60.0, g_per_kwh)
    idle_g = 0.05 * 400 + 0.05 * 100 + 0.05 * 100 + 0.05 * 100  # 100 W per node, half hours
    work_g = 0.025 * 100 + 0.0125 * 100  # 50 W then 25 W, half an hour each
    assert bound.idle_co2_kg == pytest.approx(idle_g / 1000, rel=1e-6)
    assert bound.co2_kg == pytest.approx((idle_g + work_g) / 1000, rel=1e-6)


def test_co2_ceiling_under_one_intensity_is_the_energy_ceiling_times_it() -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.0, load=0.4, seed=3)
    flat = ceiling_co2_kg(cluster, trace, 4000.0, 5.0, lambda _: np.full(len(cluster), 250.0))
    energy_kwh = ceiling_energy_kwh(cluster, trace, 4000.0, 5.0)
    assert flat.co2_kg == pytest.approx(energy_kwh * 250.0 / 1000.0, rel=1e-9)


@pytest.mark.parametrize("policy", [DefaultPolicy, RandomPolicy])
def test_no_simulated_policy_emits_less_than_the_co2_ceiling(policy: type) -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=3.0, load=0.4, seed=3)
    # one grid zone per node, each with its own hourly intensities, counted by the preset's meter
    hourly = np.random.default_rng(9).uniform(50.0, 700.0, size=(len(cluster), 8))
    series = ZoneSeries(zones=tuple(cluster.names), g_per_kwh=hourly, origin="test")
    world = CarbonWorld(series, np.arange(len(cluster)), {}, {}, defer_hours=0.0, seed=0)
    settings = SimSettings(tail_s=1800.0)
    meter = CarbonMeter(world, cluster)
    result = simulate(cluster, trace, policy(np.random.default_rng(0)), settings, meters=[meter])
    bound = ceiling_co2_kg(cluster, trace, result.duration_s, settings.tick_s, series.at)
    assert bound.idle_co2_kg < bound.co2_kg < result.co2_kg
