"""The multizone preset's parts: zone series (generator, CSV loader), the CO2 meter, and
power-aware+carbon through a real extender: pods go to the clean zone, a deferrable pod waits for
the cleaner hour and never past its deadline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.carbon_order import order_changes
from bench.energy_sim import BenchSettings, main
from bench.sim.carbon import (
    HELD_EVENT_DELAY_S,
    HELD_RETRY_S,
    CarbonMeter,
    CarbonWorld,
    prepare_multizone,
)
from bench.sim.carbon_series import (
    SeriesError,
    ZoneSeries,
    generate_zone_series,
    load_zone_series_csv,
)
from bench.sim.cluster import build_cluster
from bench.sim.engine import SimSettings
from bench.sim.runner import run_policy
from bench.sim.scenario import Scenario
from bench.sim.workload import Trace, generate_trace
from controllers.node_power.carbon import CarbonSettings
from extender.config import DEFAULT_BUNDLE_DIR

HOUR = 3600.0


def test_generated_zones_have_their_means_a_solar_dip_and_weather() -> None:
    series = generate_zone_series(4, 24 * 14, seed=3, low=50.0, high=700.0)
    assert series.zones == ("zone-a", "zone-b", "zone-c", "zone-d")
    # Long-run means spread geometrically from the cleanest to the dirtiest.
    np.testing.assert_allclose(series.means(), [50.0, 120.5, 290.4, 700.0], rtol=0.005)
    # Every zone has some solar: over a year, the wind's walk averages out and midday is cleaner.
    year = generate_zone_series(4, 24 * 365, seed=3, low=50.0, high=700.0)
    hour_of_day = np.arange(year.hours) % 24
    midday = year.g_per_kwh[:, (hour_of_day >= 11) & (hour_of_day <= 14)].mean(axis=1)
    night = year.g_per_kwh[:, (hour_of_day <= 3)].mean(axis=1)
    assert np.all(midday < night)
    # A day-to-day walk, not one repeated day.
    days = series.g_per_kwh[:, : 24 * 14].reshape(4, 14, 24).mean(axis=2)
    assert np.all(days.std(axis=1) / days.mean(axis=1) > 0.03)
    again = generate_zone_series(4, 24 * 14, seed=3, low=50.0, high=700.0)
    np.testing.assert_array_equal(series.g_per_kwh, again.g_per_kwh)
    assert series.at(25 * HOUR + 10).tolist() == series.g_per_kwh[:, 25].tolist()


def test_a_csv_of_real_series_is_averaged_into_hours_from_the_first_midnight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "grid.csv"
    rows = ["timestamp,zone,carbon_intensity_g_per_kwh"]
    rows += ["2024-04-30T23:30:00Z,SE,99"]  # before the first midnight: not used
    for hour in range(6):
        rows += [
            f"2024-05-01T{hour:02d}:00:00Z,SE,{40 + hour}",
            f"2024-05-01T{hour:02d}:30:00Z,SE,{42 + hour}",
            f"2024-05-01T{hour:02d}:15:00+00:00,PL,{700 - hour}",
        ]
    path.write_text("\n".join(rows) + "\n")
    series = load_zone_series_csv(path, 6)
    assert series.zones == ("PL", "SE")
    assert series.g_per_kwh[1].tolist() == [41.0, 42.0, 43.0, 44.0, 45.0, 46.0]
    assert series.g_per_kwh[0].tolist() == [700.0, 699.0, 698.0, 697.0, 696.0, 695.0]
    # Up to three missing hours are filled with the hour before; more is an error.
    assert load_zone_series_csv(path, 9).g_per_kwh[0, 6:].tolist() == [695.0] * 3
    with pytest.raises(SeriesError, match=r"zone PL has no value for hour 9 of the run"):
        load_zone_series_csv(path, 10)
    path.write_text("timestamp,zone,carbon_intensity_g_per_kwh\n2024-05-01T00:00:00Z,SE,low\n")
    with pytest.raises(SeriesError, match=r"grid\.csv, line 2, field carbon_intensity_g_per_kwh"):
        load_zone_series_csv(path, 1)
    path.write_text("time,zone,value\n")
    with pytest.raises(SeriesError, match="missing column"):
        load_zone_series_csv(path, 1)


def world_for(
    series: ZoneSeries,
    node_zone: list[int],
    deadlines: dict[str, float] | None = None,
    trace: Trace | None = None,
) -> CarbonWorld:
    arrivals = {}
    if trace is not None:
        arrivals = {n: float(t) for n, t in zip(trace.names, trace.arrival_s, strict=True)}
    return CarbonWorld(series, np.array(node_zone), arrivals, deadlines or {}, 2.0, 7)


def test_the_meter_counts_each_nodes_power_at_its_zones_intensity() -> None:
    cluster = build_cluster(4, 7)
    series = ZoneSeries(("a", "b"), np.array([[100.0, 200.0], [300.0, 600.0]]), "test")
    meter = CarbonMeter(world_for(series, [0, 0, 1, 1]), cluster)
    power_w = np.array([100.0, 200.0, 300.0, 400.0])
    meter.tick(0.0, 1800.0, power_w)  # hour 0: a 100, b 300
    meter.tick(HOUR, 1800.0, power_w)  # hour 1: a 200, b 600
    # 0.5 h: (300 W x 100 + 700 W x 300) / 1000, then (300 x 200 + 700 x 600) / 1000 g.
    expected_g = 0.5 * (300 * 100 + 700 * 300) / 1000 + 0.5 * (300 * 200 + 700 * 600) / 1000
    assert meter.co2_g == pytest.approx(expected_g)
    assert meter.energy_kwh == pytest.approx(1.0)


def small_scenario(
    series: ZoneSeries,
    node_zone: list[int],
    trace: Trace,
    deadlines: dict[str, float] | None = None,
    tail_s: float = 1800.0,
) -> Scenario:
    # The shipped bundle was fitted on training.synth's 12-node fleet, seed 7: these nodes.
    cluster = build_cluster(12, 7)
    settings = BenchSettings(preset="multizone", nodes=12, seed=7, battery_share=0.0)
    scenario = Scenario(settings, SimSettings(tail_s=tail_s), cluster, trace, DEFAULT_BUNDLE_DIR)
    world = world_for(series, node_zone, deadlines, trace)
    scenario.world["carbon"] = world
    scenario.meters.append(lambda: CarbonMeter(world, cluster))
    return scenario


def clean_and_dirty(load: float) -> tuple[Scenario, list[int]]:
    """A quarter hour at `load` on 12 nodes dealt alternately to a 60 and a 600 g/kWh zone."""
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=0.25, load=load, seed=1)
    series = ZoneSeries(("clean", "dirty"), np.array([[60.0] * 4, [600.0] * 4]), "test")
    node_zone = [0, 1] * 6
    return small_scenario(series, node_zone, trace), node_zone


def test_power_aware_carbon_sends_pods_to_the_clean_zone() -> None:
    scenario, node_zone = clean_and_dirty(load=0.15)
    cluster, trace = scenario.cluster, scenario.trace
    carbon, _ = run_policy("power-aware+carbon", scenario, progress=False)
    default, _ = run_policy("default", scenario, progress=False)
    clean = {cluster.names[i] for i in range(12) if node_zone[i] == 0}
    placed = [d.node for d in carbon.decisions if d.node]
    assert carbon.placed_pods == len(trace) and len(trace) > 5
    assert sum(node in clean for node in placed) / len(placed) > 0.9
    assert carbon.co2_kg < default.co2_kg
    assert carbon.kpis["mean_intensity_g_per_kwh"] < default.kpis["mean_intensity_g_per_kwh"]


def test_a_deferrable_pod_waits_for_the_cleaner_hour_and_never_past_its_deadline() -> None:
    # One pod at t = 60 s that may start until 2 h after; zone a turns clean at hour 1.
    trace = Trace(
        ["batch"],
        np.array([60.0]),
        np.array([1000]),
        np.array([0]),
        np.array([600.0]),
        np.array([1.0]),
        max_wait_s=np.array([2 * HOUR + 600]),
    )
    series = ZoneSeries(("a", "b"), np.array([[400.0, 50.0, 400.0, 400.0], [300.0] * 4]), "test")
    node_zone = [0, 1] * 6
    scenario = small_scenario(series, node_zone, trace, {"batch": 60.0 + 2 * HOUR}, 3 * HOUR)
    result, _ = run_policy("power-aware+carbon", scenario, progress=False)
    (placement,) = [d for d in result.decisions if d.node]
    holds = [d for d in result.decisions if not d.node]
    assert holds and all("power-aware-scheduler/carbon-hold" in d.note for d in holds)
    assert "cleanest zone then a at" in holds[0].note  # the forecast, within its error
    # Released as soon as kube-scheduler asks again once the clean hour is published (within
    # its backoff, not at the next 5-minute flush), in the clean zone; asked about every flush
    # before that, not on every tick.
    assert HOUR < placement.time_s <= HOUR + HELD_EVENT_DELAY_S
    assert len(holds) <= math.ceil((HOUR - 60.0) / HELD_RETRY_S) + 1
    assert node_zone[scenario.cluster.names.index(placement.node)] == 0
    assert result.kpis["deferrable_late_max_s"] == 0.0
    assert result.kpis["deferrable_wait_max_s"] == pytest.approx(placement.time_s - 60.0)

    # The clean hour after the deadline: never held past it (the next retry places it).
    late = ZoneSeries(("a", "b"), np.array([[400.0, 400.0, 400.0, 50.0], [300.0] * 4]), "t")
    scenario = small_scenario(late, node_zone, trace, {"batch": 60.0 + 2 * HOUR}, 3 * HOUR)
    result, _ = run_policy("power-aware+carbon", scenario, progress=False)
    (placement,) = [d for d in result.decisions if d.node]
    assert placement.time_s <= 60.0 + 30  # nothing cleaner in time: placed at once


def test_carbon_with_power_management_powers_nodes_off_and_keeps_placing_by_zone() -> None:
    # A light quarter hour: the controller's policy empties and powers off nodes, while the
    # extender still sees every node's zone (its Node view carries labels and power states).
    scenario, node_zone = clean_and_dirty(load=0.15)
    cluster, trace = scenario.cluster, scenario.trace
    both, _ = run_policy("power-aware+carbon+power-management", scenario, progress=False)
    managed, _ = run_policy("power-aware+power-management", scenario, progress=False)
    clean = {cluster.names[i] for i in range(12) if node_zone[i] == 0}
    placed = [d.node for d in both.decisions if d.node and d.attempt > 0]
    assert both.unplaced_pods == 0 and both.placed_pods >= len(trace)  # evicted: placed again
    assert both.kpis["mean_nodes_off"] > 0 and both.power_cycles > 0
    assert sum(node in clean for node in placed) / len(placed) > 0.9
    assert both.co2_kg < managed.co2_kg  # the zones still weigh with nodes powered off


def test_the_cli_fills_co2_for_every_policy_of_the_multizone_preset(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    args = [
        "--preset",
        "multizone",
        "--nodes",
        "12",
        "--hours",
        "0.25",
        "--tail-hours",
        "0.25",
        "--policies",
        "default,random",
        "--quiet",
        "--out-dir",
        str(tmp_path),
        "--deferrable-share",
        "0.2",
        "--json",
        str(summary),
    ]
    assert main(args) == 0
    report = json.loads(summary.read_text())
    assert report["settings"]["deferrable_share"] == 0.2
    for entry in report["policies"].values():
        assert entry["co2_kg"] > 0
        assert 50 <= entry["mean_intensity_g_per_kwh"] <= 700
        assert entry["deferrable_pods"] > 0
    # the CO2 bound: under every policy, above what idle power alone emits
    bound = report["preset"]
    assert bound["co2_idle_kg"] < bound["co2_ceiling_kg"]
    assert bound["co2_ceiling_kg"] < min(e["co2_kg"] for e in report["policies"].values())
    default_kg = report["policies"]["default"]["co2_kg"]
    assert bound["co2_ceiling_vs_default"] == pytest.approx(
        bound["co2_ceiling_kg"] / default_kg, 1e-3
    )
    # and the bound on any power management, below the ceiling (every node on is one of them)
    assert 0 < bound["co2_bound_kg"] <= bound["co2_ceiling_kg"]
    assert bound["co2_bound_vs_default"] == pytest.approx(bound["co2_bound_kg"] / default_kg, 1e-3)
    assert main([*args[:-2], "--carbon-csv", str(tmp_path / "missing.csv")]) == 2


def test_prepare_gives_deferrable_pods_their_patience() -> None:
    cluster = build_cluster(12, 7)
    trace = generate_trace(float(cluster.cores.sum()), hours=1.0, load=0.3, seed=1)
    settings = BenchSettings(preset="multizone", nodes=12, deferrable_share=0.5, defer_hours=3.0)
    scenario = Scenario(settings, SimSettings(), cluster, trace)
    prepare_multizone(scenario)
    world = scenario.world["carbon"]
    assert 0.3 < len(world.deadline_s) / len(trace) < 0.7
    patience = dict(zip(trace.names, scenario.trace.max_wait_s.tolist(), strict=True))
    for name in trace.names:
        expected = 3 * HOUR + 600.0 if name in world.deadline_s else 600.0
        assert patience[name] == expected


def test_the_sweep_meters_each_policy_once_per_spread(tmp_path: Path) -> None:
    from bench.carbon_sweep import sweep

    settings = BenchSettings(
        preset="multizone", nodes=4, hours=0.25, history_hours=12.0, battery_share=0.0
    )
    rows = sweep(
        [(300.0, 300.0), (50.0, 700.0)],
        settings,
        SimSettings(tail_s=600.0),
        tmp_path,
        progress=False,
    )
    energy = [row["energy_kwh"] for row in rows]
    # Carbon-blind placement does not depend on the zones: one run, the same energy per spread.
    assert energy[0]["default"] == energy[1]["default"]
    assert energy[0]["power-aware"] == energy[1]["power-aware"]
    for row in rows:
        # Every policy's energy is one run's: nothing metered twice.
        assert 0.8 < row["energy_kwh"]["power-aware"] / row["energy_kwh"]["default"] < 1.2
        assert 0.8 < row["energy_kwh"]["power-aware+carbon"] / row["energy_kwh"]["default"] < 1.2
        mean = row["co2_kg"]["power-aware+carbon"] * 1000 / row["energy_kwh"]["power-aware+carbon"]
        assert mean == pytest.approx(row["kpis"]["mean_intensity_g_per_kwh"], rel=2e-3)
        # each spread's bound is under every policy's CO2 in that spread
        assert row["co2_ceiling_kg"] < min(row["co2_kg"].values())
    # Equal zones: every policy emits the same per kWh.
    flat = rows[0]
    assert flat["co2_kg"]["default"] / flat["energy_kwh"]["default"] == pytest.approx(
        flat["co2_kg"]["power-aware+carbon"] / flat["energy_kwh"]["power-aware+carbon"], rel=0.02
    )


def test_the_controller_ranking_by_grams_powers_off_the_dirty_zone_first() -> None:
    # A quarter hour at 30 % load, so that the headroom keeps some nodes on: ranked by watts
    # the controller powers off the worst idle watts per core wherever they are; ranked by
    # grams (reading the zones' intensities as the live controller does), the dirty zone's
    # nodes go first and more of the clean zone's stay on.
    scenario, _ = clean_and_dirty(load=0.3)
    by_watts, _ = run_policy("power-aware+carbon+power-management", scenario, progress=False)
    by_grams, _ = run_policy("power-aware+carbon+power-management-grams", scenario, progress=False)
    assert by_grams.unplaced_pods == 0
    assert by_grams.kpis["mean_nodes_off"] == by_watts.kpis["mean_nodes_off"] > 0
    assert by_grams.kpis["mean_intensity_g_per_kwh"] < by_watts.kpis["mean_intensity_g_per_kwh"]
    assert by_grams.co2_kg < by_watts.co2_kg


def test_order_changes_counts_pairs_the_horizon_reorders_across_groups_only() -> None:
    now = np.array([100.0, 400.0, 300.0])
    ahead = np.array([700.0, 50.0, 300.0])  # 0 and 1 swap; 0-2 and 1-2 swap too
    assert order_changes(now, ahead) == (3, 3)
    assert order_changes(now, now) == (0, 3)
    # Nodes 0 and 1 share a zone: only the pairs with node 2 count.
    assert order_changes(now, ahead, np.array([0, 0, 1])) == (2, 2)


def test_the_carbon_horizon_flag_is_hours_and_not_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--preset", "multizone", "--out-dir", str(tmp_path), "--quiet"]
    assert main([*args, "--carbon-horizon", "-1", "--policies", "default"]) == 2
    assert "--carbon-horizon must be >= 0 hours" in capsys.readouterr().err
    # The bench's controller looks as far ahead as the shipped controller does.
    assert BenchSettings().carbon_horizon_s == CarbonSettings().horizon_s
