"""The power-management bound (`bench.sim.bound`): hand figures, never above a simulated
policy, limits that bind, and a programme of reasonable size."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench.energy_sim import BenchSettings, bound_summary
from bench.sim.bound import (
    COARSE_MAX_SEGMENTS,
    DEFAULT_WINDOW_S,
    PowerLimits,
    coarse_segments,
    limits_for,
    power_bound,
)
from bench.sim.ceiling import (
    ceiling_energy_kwh,
    constrained_ceiling_energy_kwh,
    envelope_segments,
)
from bench.sim.cluster import build_cluster
from bench.sim.engine import PolicyResult, SimSettings, simulate
from bench.sim.policies import DefaultPolicy
from bench.sim.scenario import Scenario
from bench.sim.workload import Trace, generate_trace
from controllers.node_power.policy import PolicySettings
from extender.config import DEFAULT_BUNDLE_DIR
from tests.support.sim import power_managed_extender, sim_cluster

LINEAR = np.linspace(0.5, 1.0, 11)  # 100 W idle, 200 W at 4 cores: 25 W per core


def _one_node() -> object:
    return sim_cluster([LINEAR], [200.0], [4.0])


def _two_busy_hours(gap_s: float) -> tuple[Trace, float]:
    """One core busy for an hour, `gap_s` of nothing, one core for an hour; and the horizon."""
    trace = Trace(
        names=["a", "b"],
        arrival_s=np.array([0.0, 3600.0 + gap_s]),
        cpu_m=np.array([1000, 1000]),
        memory_bytes=np.zeros(2, dtype=np.int64),
        duration_s=np.array([3600.0, 3600.0]),
        usage_ratio=np.ones(2),
    )
    return trace, 7200.0 + gap_s


def _hand_kwh(gap_s: float, limits: PowerLimits) -> tuple[float, float]:
    """(staying on through the gap, powering off for it): two busy hours at 125 W, and the gap
    either at 100 W idle, or shut down (idle), off (10 W) and booting (idle + share x 100 W)."""
    busy_j = 2 * 3600.0 * 125.0
    stay_j = gap_s * 100.0
    boot_w = 100.0 + limits.boot_power_share * 100.0
    off_s = gap_s - limits.shutdown_s - limits.boot_s
    cycle_j = limits.shutdown_s * 100.0 + off_s * limits.off_power_w + limits.boot_s * boot_w
    return (busy_j + stay_j) / 3.6e6, (busy_j + cycle_j) / 3.6e6


def test_a_long_gap_pays_for_a_power_cycle_and_the_bound_is_its_energy() -> None:
    limits = PowerLimits()  # 300 s boots at 150 W, 60 s shutdowns, 10 W off, 1800 s cool-down
    trace, horizon_s = _two_busy_hours(7200.0)
    stay_kwh, cycle_kwh = _hand_kwh(7200.0, limits)
    assert cycle_kwh < stay_kwh  # 119.4 kJ against 720 kJ for the two hours
    bound = power_bound(_one_node(), trace, horizon_s, 5.0, limits)
    assert bound.value == pytest.approx(cycle_kwh, rel=1e-6)
    assert bound.power_offs == pytest.approx(1.0) and bound.boots == pytest.approx(1.0)


def test_a_short_gap_does_not_and_the_bound_stays_on() -> None:
    # Booting at peak power: 600 s off would cost 68.4 kJ against 60 kJ of idle.
    limits = PowerLimits(boot_power_share=1.0)
    trace, horizon_s = _two_busy_hours(600.0)
    stay_kwh, cycle_kwh = _hand_kwh(600.0, limits)
    assert stay_kwh < cycle_kwh
    bound = power_bound(_one_node(), trace, horizon_s, 5.0, limits)
    assert bound.value == pytest.approx(stay_kwh, rel=1e-6)
    assert bound.power_offs == pytest.approx(0.0, abs=1e-9)


def test_the_cycle_limit_and_the_boot_time_bind() -> None:
    trace, horizon_s = _two_busy_hours(7200.0)
    stay_kwh, _ = _hand_kwh(7200.0, PowerLimits())
    no_cycles = power_bound(
        _one_node(), trace, horizon_s, 5.0, PowerLimits(max_cycles_per_node_day=0)
    )
    assert no_cycles.value == pytest.approx(stay_kwh, rel=1e-6)
    # A boot longer than the gap leaves no room for a cycle at all.
    no_room = power_bound(_one_node(), trace, horizon_s, 5.0, PowerLimits(boot_s=7200.0))
    assert no_room.value == pytest.approx(stay_kwh, rel=1e-6)


def test_nothing_goes_off_within_the_cool_down_of_the_start() -> None:
    # Busy for the first 10 minutes only, then idle to 1 h: with a 1 h cool-down nothing may go
    # off, so the bound is every node on (the ceiling); with none it goes off (no cycle limit:
    # 6 a day would allow a quarter of one in this hour).
    trace = Trace(
        names=["a"],
        arrival_s=np.zeros(1),
        cpu_m=np.array([1000]),
        memory_bytes=np.zeros(1, dtype=np.int64),
        duration_s=np.array([600.0]),
        usage_ratio=np.ones(1),
    )
    cluster = _one_node()
    held = power_bound(
        cluster, trace, 3600.0, 5.0, PowerLimits(cooldown_s=3600.0, max_cycles_per_node_day=None)
    )
    assert held.value == pytest.approx(ceiling_energy_kwh(cluster, trace, 3600.0, 5.0), rel=1e-6)
    free = power_bound(
        cluster, trace, 3600.0, 5.0, PowerLimits(cooldown_s=0.0, max_cycles_per_node_day=None)
    )
    assert free.value < held.value and free.power_offs == pytest.approx(1.0)


def test_with_no_cycles_the_bound_is_the_ceiling_over_the_same_windows() -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=2.0, load=0.4, seed=3)
    horizon_s = 9000.0
    on = power_bound(cluster, trace, horizon_s, 5.0, PowerLimits(max_cycles_per_node_day=0))
    windowed = constrained_ceiling_energy_kwh(
        cluster, trace, horizon_s, 5.0, lambda _: None, window_s=DEFAULT_WINDOW_S
    )
    # Only the coarsened envelopes differ (each within 0.05 W of the fine one).
    assert windowed - 6 * 0.05 * horizon_s / 3.6e6 <= on.value <= windowed * (1 + 1e-9)
    assert on.power_offs == pytest.approx(0.0, abs=1e-9)


def test_tightening_any_limit_never_lowers_the_bound() -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=6.0, load=0.3, seed=3)
    horizon_s = 6.5 * 3600.0
    loose = PowerLimits(boot_s=60.0, shutdown_s=30.0, cooldown_s=600.0)
    values = {}
    for name, limits in {
        "loose": loose,
        "boot": dataclasses.replace(loose, boot_s=900.0),
        "power": dataclasses.replace(loose, boot_power_share=1.0),
        "cooldown": dataclasses.replace(loose, cooldown_s=7200.0),
        "cycles": dataclasses.replace(loose, max_cycles_per_node_day=1.0),
        "none": dataclasses.replace(loose, max_cycles_per_node_day=0.0),
    }.items():
        values[name] = power_bound(cluster, trace, horizon_s, 5.0, limits, window_s=300.0).value
    assert all(values[name] >= values["loose"] * (1 - 1e-9) for name in values)
    # Each binds on this trace: it costs energy.
    assert values["boot"] > values["loose"] and values["cooldown"] > values["loose"]
    assert values["loose"] < values["cycles"] < values["none"]
    assert values["none"] == pytest.approx(
        power_bound(
            cluster,
            trace,
            horizon_s,
            5.0,
            dataclasses.replace(loose, max_cycles_per_node_day=0.0),
            window_s=300.0,
        ).value
    )


def test_under_one_intensity_the_co2_bound_is_the_energy_bound_times_it() -> None:
    cluster = build_cluster(6, seed=3)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.0, load=0.4, seed=3)
    energy = power_bound(cluster, trace, 4000.0, 5.0, PowerLimits(), window_s=300.0)
    co2 = power_bound(
        cluster,
        trace,
        4000.0,
        5.0,
        PowerLimits(),
        window_s=300.0,
        node_g_per_kwh=lambda _: np.full(len(cluster), 250.0),
    )
    assert co2.value == pytest.approx(energy.value * 250.0 / 1000.0, rel=1e-6)


def test_coarse_envelopes_stay_below_the_fine_one_with_few_segments() -> None:
    cluster = build_cluster(16, seed=7)
    for lengths, slopes in envelope_segments(cluster):
        coarse_lengths, coarse_slopes = coarse_segments(lengths, slopes, COARSE_MAX_SEGMENTS, 0.05)
        assert coarse_slopes.size <= COARSE_MAX_SEGMENTS
        assert np.all(np.diff(coarse_slopes) >= 0)  # still convex
        assert coarse_lengths.sum() == pytest.approx(lengths.sum())
        x = np.linspace(0.0, lengths.sum(), 501)
        fine = np.interp(x, np.cumsum([0, *lengths]), np.cumsum([0, *(lengths * slopes)]))
        coarse = np.interp(
            x, np.cumsum([0, *coarse_lengths]), np.cumsum([0, *(coarse_lengths * coarse_slopes)])
        )
        assert np.all(coarse <= fine + 1e-9)
        assert coarse[-1] == pytest.approx(fine[-1])


def test_the_programme_stays_small() -> None:
    # Per node and window: on, two ups, two downs and at most 12 segment fills; one overflow.
    cluster = build_cluster(16, seed=7)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.0, load=0.45, seed=7)
    bound = power_bound(cluster, trace, 7200.0, 5.0, PowerLimits())
    windows = round(7200 / DEFAULT_WINDOW_S)
    assert bound.variables <= windows * (16 * (5 + COARSE_MAX_SEGMENTS) + 1)
    assert bound.constraints <= windows * (16 * (4 + COARSE_MAX_SEGMENTS) + 3) + 1
    fitting = power_bound(cluster, trace, 7200.0, 5.0, PowerLimits(), fit_requests=True)
    assert fitting.constraints == bound.constraints + 3 * windows
    assert fitting.value >= bound.value * (1 - 1e-9)  # requests only add to what must be on


# ---- never above a simulated policy ------------------------------------------------------------


@pytest.fixture(scope="module")
def simulated() -> tuple[Scenario, list[PolicyResult]]:
    """The default scheduler and our power management on the shipped bundle's 12 nodes."""
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.5, load=0.2, seed=1)
    settings = BenchSettings(nodes=12, seed=7, power_cooldown_s=900.0)
    sim_settings = SimSettings(tail_s=1800.0, boot_s=120.0)
    scenario = Scenario(settings, sim_settings, cluster, trace, DEFAULT_BUNDLE_DIR)
    default = simulate(cluster, trace, DefaultPolicy(np.random.default_rng(0)), sim_settings)
    with power_managed_extender(
        cluster, settings, sim_settings, PolicySettings(boot_s=120.0, cooldown_s=900.0)
    ) as (policy, _):
        managed = simulate(cluster, trace, policy, sim_settings)
    return scenario, [default, managed]


def test_no_simulated_policy_uses_less_than_the_bound(simulated) -> None:  # type: ignore[no-untyped-def]
    scenario, (default, managed) = simulated
    assert managed.power_cycles > 0 and managed.unplaced_pods == 0
    assert limits_for(scenario).cooldown_s == 900.0 and limits_for(scenario).boot_s == 120.0
    # Six cycles a node-day are a daily goal: in two hours the controller powers off more.
    limits = dataclasses.replace(limits_for(scenario), max_cycles_per_node_day=None)
    bound = power_bound(
        scenario.cluster, scenario.trace, managed.duration_s, scenario.sim_settings.tick_s, limits
    )
    ceiling = ceiling_energy_kwh(
        scenario.cluster, scenario.trace, managed.duration_s, scenario.sim_settings.tick_s
    )
    assert bound.value < managed.energy_kwh < default.energy_kwh
    assert bound.value < ceiling  # powering off beats every node on here
    summary = bound_summary([default, managed], bound, limits)
    share = summary["saving_share"]["power-aware+power-management"]
    assert 0 < share < 1
    assert share == pytest.approx(
        (default.energy_kwh - managed.energy_kwh) / (default.energy_kwh - bound.value), abs=1e-4
    )
