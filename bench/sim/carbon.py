"""The multizone preset: nodes in grid zones of different carbon intensity, and the carbon policy.

`python -m bench.energy_sim --preset multizone` places one trace on a cluster whose nodes sit
in `--zones` grid zones (nodes dealt to zones at random, so every zone has a mix of servers),
each with an hourly carbon intensity series (`bench.sim.carbon_series`: generated, or real
series from `--carbon-csv`). Every policy's grams of CO2 are counted the same way
(`CarbonMeter`): each tick, each node's power times its zone's intensity that hour. Contract 5's
`co2_kg` is filled for every policy, with these figures in the summary beside it:

- `mean_intensity_g_per_kwh`: grams per kWh drawn, over the run (energy-weighted);
- `co2_above_idle_kg`: CO2 beyond what the nodes emit idle (every node stays on and pays its
  idle power in its zone whatever runs on it: placement decides only the rest);
- with deferrable pods: how many there were, how long they waited (`deferrable_wait_*_s`),
  and the latest any was placed after its deadline (`deferrable_late_max_s`).

After the runs the preset prints the least CO2 any placement with every node on could emit
(`co2_ceiling`, `bench.sim.ceiling.ceiling_co2_kg`), and the least any power management could
emit (`co2_bound`, `bench.sim.bound.power_bound` weighed by the zones' intensities), into the
summary's `preset` block.

`power-aware+carbon` is the extender with the Carbon plugin (`extender.plugins.carbon`)
scoring beside PowerIncrease and EnergyLevel and filtering (deferral). The simulation plays
its background source: every simulated hour `CarbonExtenderPolicy` publishes a carbon snapshot
into the extender's state (`livedata.carbon_source.build_snapshot`, the function the live
source uses) holding each zone's value for the hour and a 24-hour forecast whose error grows
with lead time (`FORECAST_ERROR` at a day ahead: day-ahead carbon forecasts are published
with errors of about 10 %). Nodes carry their zone in `topology.kubernetes.io/region`, as
kube-scheduler's Node objects would.

`power-aware+carbon+power-management` runs the same profile plus Consolidation, with the node
power controller's policy powering nodes off and on (`bench.sim.power_policies`): a node off
emits only its off power. The controller's choices stay carbon-blind (worst idle watts per
core off first); which nodes empty is left to the scores. `co2_above_idle_kg` counts against
every node's idle power, so it goes negative for policies that power nodes off.
`power-aware+carbon+power-management-grams` is the same with the controller ranking by grams
(`--rank-by grams`, `PolicySettings.rank_by`): it reads each node's intensity from the same
hourly snapshot with `livedata.carbon_source.node_g_per_kwh`, as the controller does, at the
controller's horizon (`--carbon-horizon`, `BenchSettings.carbon_horizon_s`: the zone's mean
forecast intensity over the next hours; 0 the present hour's), and powers off the most grams
per idle core first and wakes the fewest grams per core.

Deferrable pods (`--deferrable-share` of the trace, drawn from the seed) carry
`power-aware-scheduler/defer-until: <--defer-hours>h` and a creationTimestamp at their
arrival; they may wait until then plus `--max-pending` before counting as unplaced. A pod the
extender holds is unschedulable to kube-scheduler: in a busy cluster some event moves it back
within its backoff (at most `HELD_EVENT_DELAY_S`), and with none it is flushed back after
`HELD_RETRY_S` (podMaxInUnschedulablePodsDuration). The extender answers it the same until the
intensities it holds are next published (every hour here) or the pod's deadline passes, so the
simulation asks it again then, plus that backoff, or at the flush, whichever is first: a pod is
released within seconds of the window opening, as in a cluster, without thousands of
identical /filter calls. (What the hold leaves out: a change of the candidates alone, which
moves their mean intensity a little, is not re-asked before then.) Policies without the Carbon
plugin ignore the annotation.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import yaml

from bench.sim.bound import limits_for, power_bound
from bench.sim.carbon_series import (
    HOUR_S,
    ZoneSeries,
    generate_zone_series,
    load_zone_series_csv,
)
from bench.sim.ceiling import Co2Ceiling, ceiling_co2_kg
from bench.sim.cluster import SimCluster
from bench.sim.engine import PolicyResult
from bench.sim.kube_default import NodeLedger, PodRequest
from bench.sim.policies import Decision, ExtenderPolicy
from bench.sim.power import PowerAwareExtenderPolicy
from bench.sim.power_policies import POWER_MANAGEMENT_PROFILE, power_management_for
from bench.sim.runner import PolicySpec, extender_policy, register_policy
from bench.sim.scenario import Preset, Scenario, register_preset
from controllers.node_power.policy import RANK_BY_GRAMS
from extender.plugins.carbon import CARBON_SIGNAL
from extender.state import NodeInfo
from livedata.carbon import AVERAGE, IntensityPoint, IntensityReading
from livedata.carbon_source import CarbonSnapshot, build_snapshot, node_g_per_kwh
from livedata.labels import CARBON_HOLD_REASON, DEFER_UNTIL_ANNOTATION, REGION_LABEL

log = logging.getLogger("bench.sim.carbon")

FORECAST_HOURS = 24
FORECAST_ERROR = 0.10  # log-normal sd of the forecast at a day ahead; grows with sqrt(lead)
HELD_RETRY_S = 300.0
# kube-scheduler's longest backoff (podMaxBackoffSeconds, 10 s): how soon after the extender's
# answer may change a busy cluster's events have tried a held pod again.
HELD_EVENT_DELAY_S = 10.0
WORLD_KEY = "carbon"
SOURCE_NAME = "simulated-grid"


def carbon_profile(
    power_weight: float, carbon_weight: float, defer_margin: float = 0.2
) -> dict[str, object]:
    """The extender profile of power-aware+carbon: Carbon beside the defaults, and filtering.

    PowerIncrease and Carbon at the weights given (`--carbon-weights`; 0.4 and 0.2 by default,
    the operations guide's example: on this bench the most CO2 saved for at most 3 % more
    energy than power-aware; README, Results), EnergyLevel at its default 0.4.
    """
    return {
        "apiVersion": "power-aware-scheduler/v1alpha1",
        "kind": "ExtenderConfiguration",
        "plugins": {
            "filter": {"enabled": [{"name": "Carbon"}]},
            "score": {
                "enabled": [
                    {"name": "PowerIncrease", "weight": power_weight},
                    {"name": "EnergyLevel", "weight": 0.4},
                    {"name": "Carbon", "weight": carbon_weight},
                ]
            },
        },
        "pluginConfig": [
            {"name": "Carbon", "args": {"signal": AVERAGE, "deferMargin": defer_margin}}
        ],
    }


@dataclass
class CarbonWorld:
    """The multizone preset's world: zone series, each node's zone, the deferrable pods."""

    series: ZoneSeries
    node_zone: np.ndarray  # zone index per node
    arrival_s: Mapping[str, float]  # pod uid -> arrival (its creationTimestamp)
    deadline_s: Mapping[str, float]  # deferrable pod uid -> its defer-until deadline
    defer_hours: float
    seed: int
    _forecasts: dict[int, tuple[tuple[IntensityPoint, ...], ...]] = field(
        default_factory=dict, repr=False
    )

    def zone_of(self, node: int) -> str:
        return self.series.zones[int(self.node_zone[node])]

    def nodes_g_per_kwh(self, t_s: float) -> np.ndarray:
        """Each node's grid intensity (g/kWh) at `t_s`: its zone's value in that hour."""
        return self.series.at(t_s)[self.node_zone]

    def forecast(self, hour: int) -> tuple[tuple[IntensityPoint, ...], ...]:
        """The forecast issued at the start of `hour`: per zone, hourly points from that hour.

        Each lead of k hours is off by a log-normal factor of sd FORECAST_ERROR * sqrt(k / 24);
        the hour in progress (k = 0) is the published value.
        """
        cached = self._forecasts.get(hour)
        if cached is not None:
            return cached
        rng = np.random.default_rng([self.seed, 19, hour])
        last = self.series.hours
        leads = np.arange(0, min(FORECAST_HOURS, last - hour))
        noise = rng.normal(0.0, 1.0, (len(self.series.zones), leads.size))
        factor = np.exp(noise * FORECAST_ERROR * np.sqrt(leads / 24.0))
        forecast = tuple(
            tuple(
                IntensityPoint(
                    (hour + k) * HOUR_S,
                    (hour + k + 1) * HOUR_S,
                    float(self.series.g_per_kwh[z, hour + k] * factor[z, i]),
                )
                for i, k in enumerate(leads.tolist())
            )
            for z in range(len(self.series.zones))
        )
        self._forecasts = {hour: forecast}  # runs go forward in time: keep the latest only
        return forecast

    def readings(self, hour: int) -> list[IntensityReading]:
        """What a live source would have read at the start of `hour`."""
        forecast = self.forecast(hour)
        return [
            IntensityReading(
                zone,
                AVERAGE,
                SOURCE_NAME,
                float(self.series.g_per_kwh[z, hour]),
                hour * HOUR_S,
                forecast[z],
                hour * HOUR_S,
            )
            for z, zone in enumerate(self.series.zones)
        ]


def carbon_world(scenario: Scenario) -> CarbonWorld:
    world = scenario.world.get(WORLD_KEY)
    if not isinstance(world, CarbonWorld):
        raise ValueError(f"preset {scenario.settings.preset} has no carbon zones (use multizone)")
    return world


# ---- the preset -----------------------------------------------------------------------------


def prepare_multizone(scenario: Scenario) -> None:
    """Zones, their series, each node's zone and the deferrable pods, into the scenario.

    With deferrable pods the run's tail is stretched to at least `--defer-hours` + 1 h, so that a
    pod deferred near the end of the trace runs before the simulation stops (compare runs with
    and without deferral at the same `--tail-hours`).
    """
    settings, sim_settings = scenario.settings, scenario.sim_settings
    trace = scenario.trace
    defer_s = settings.defer_hours * HOUR_S
    if settings.deferrable_share > 0 and sim_settings.tail_s < defer_s + HOUR_S:
        log.info(
            "deferrable pods: the run's tail grows from %.1f h to %.1f h",
            sim_settings.tail_s / HOUR_S,
            defer_s / HOUR_S + 1,
        )
        sim_settings = scenario.sim_settings = replace(sim_settings, tail_s=defer_s + HOUR_S)
    run_hours = math.ceil((trace.end_s + sim_settings.tail_s) / HOUR_S) + 1
    hours = run_hours + FORECAST_HOURS
    if settings.carbon_csv:
        series = load_zone_series_csv(Path(settings.carbon_csv), hours)
    else:
        series = generate_zone_series(
            settings.zones,
            hours,
            settings.seed,
            low=settings.zone_low_g_per_kwh,
            high=settings.zone_high_g_per_kwh,
        )
    rng = np.random.default_rng([settings.seed, 23])
    node_zone = rng.permutation(len(scenario.cluster)) % len(series.zones)
    deferrable = rng.random(len(trace)) < settings.deferrable_share
    arrival = {name: float(t) for name, t in zip(trace.names, trace.arrival_s, strict=True)}
    deadline = {
        name: arrival[name] + defer_s
        for name, flag in zip(trace.names, deferrable.tolist(), strict=True)
        if flag
    }
    if deadline:
        max_wait_s = np.where(
            deferrable, defer_s + sim_settings.max_pending_s, sim_settings.max_pending_s
        )
        scenario.trace = replace(trace, max_wait_s=max_wait_s)
    world = CarbonWorld(series, node_zone, arrival, deadline, settings.defer_hours, settings.seed)
    scenario.world[WORLD_KEY] = world
    scenario.meters.append(lambda: CarbonMeter(world, scenario.cluster))


def co2_ceiling(scenario: Scenario, horizon_s: float) -> Co2Ceiling:
    """The least CO2 any placement of the scenario's trace could emit over `horizon_s` with
    every node on, its nodes weighed by their zones' hourly intensities."""
    world = carbon_world(scenario)
    return ceiling_co2_kg(
        scenario.cluster,
        scenario.trace,
        horizon_s,
        scenario.sim_settings.tick_s,
        world.nodes_g_per_kwh,
    )


def co2_bound_kg(scenario: Scenario, horizon_s: float) -> float:
    """The least CO2 (kg) any power management of the scenario's trace could emit over
    `horizon_s` (`bench.sim.bound`: the run's power states and the controller's limits), each
    node's watts weighed by its zone's hourly intensity."""
    world = carbon_world(scenario)
    return power_bound(
        scenario.cluster,
        scenario.trace,
        horizon_s,
        scenario.sim_settings.tick_s,
        limits_for(scenario),
        node_g_per_kwh=world.nodes_g_per_kwh,
    ).value


def report_multizone(
    scenario: Scenario, results: Sequence[PolicyResult]
) -> dict[str, float] | None:
    """The least CO2 any placement of the trace could emit with every node on (`co2_ceiling`),
    beside the default's and what idle power alone emits. It bounds where pods run, not
    when: deferral moves work in time, outside the bound."""
    if scenario.sim_settings.empty_node_power_w is not None or not results:
        return None  # the bound assumes every node stays on
    ceiling_kg, idle_kg = co2_ceiling(scenario, results[0].duration_s)
    figures = {"co2_ceiling_kg": round(ceiling_kg, 4), "co2_idle_kg": round(idle_kg, 4)}
    default = next((r for r in results if r.policy == "default"), None)
    versus = ""
    if default is not None and default.co2_kg:
        figures["co2_ceiling_vs_default"] = round(ceiling_kg / default.co2_kg, 4)
        versus = f" ({1 - ceiling_kg / default.co2_kg:.1%} less than default)"
    print(
        f"CO2 ceiling: no placement of this trace with every node on, each pod run from its "
        f"arrival, emits less than {ceiling_kg:.2f} kg{versus}; idle power alone emits "
        f"{idle_kg:.2f} kg (bench.sim.ceiling: hindsight, fluid load, convex envelopes weighed "
        "by each hour's intensity)"
    )
    bound_kg = co2_bound_kg(scenario, results[0].duration_s)
    figures["co2_bound_kg"] = round(bound_kg, 4)
    versus = ""
    if default is not None and default.co2_kg:
        figures["co2_bound_vs_default"] = round(bound_kg / default.co2_kg, 4)
        versus = f" ({1 - bound_kg / default.co2_kg:.1%} less than default)"
    print(
        f"CO2 bound: no power management of this trace emits less than {bound_kg:.2f} kg{versus} "
        "(bench.sim.bound: the same power states, the controller's cool-down, <= 6 power "
        "cycles per node-day, watts weighed by each hour's intensity)"
    )
    for result in results:
        if "power-management" in result.policy and default is not None and default.co2_kg:
            share = (default.co2_kg - result.co2_kg) / (default.co2_kg - bound_kg)
            figures[f"co2_saving_share:{result.policy}"] = round(share, 4)
            print(f"  {result.policy}: our CO2 saving is {share:.1%} of the bound's")
    return figures


register_preset(
    Preset(
        name="multizone",
        description=(
            "the 16 nodes dealt over 4 grid zones whose hourly carbon intensity averages 50 to "
            "700 g/kWh (solar dip, evening peak, wind-driven walk), no batteries; CO2 counted "
            "for every policy"
        ),
        policies=("default", "power-aware", "power-aware+carbon"),
        defaults={"battery_share": 0.0},
        prepare=prepare_multizone,
        report=report_multizone,
    )
)


# ---- CO2 accounting -----------------------------------------------------------------------------


class CarbonMeter:
    """Grams of CO2 of one run: each tick, each node's power times its zone's intensity."""

    def __init__(self, world: CarbonWorld, cluster: SimCluster) -> None:
        self.world = world
        self.idle_w = cluster.spec.idle_share * cluster.spec.max_power_w
        self.co2_g = 0.0
        self.idle_co2_g = 0.0
        self.energy_kwh = 0.0

    def tick(self, t0_s: float, tick_s: float, node_power_w: np.ndarray) -> None:
        intensity = self.world.nodes_g_per_kwh(t0_s)
        hours = tick_s / HOUR_S
        self.co2_g += float(node_power_w @ intensity) * hours / 1000.0
        self.idle_co2_g += float(self.idle_w @ intensity) * hours / 1000.0
        self.energy_kwh += float(node_power_w.sum()) * hours / 1000.0

    def finish(self, result: PolicyResult) -> None:
        result.co2_kg = self.co2_g / 1000.0
        kpis: dict[str, float] = {
            "mean_intensity_g_per_kwh": round(self.co2_g / self.energy_kwh, 2)
            if self.energy_kwh > 0
            else 0.0,
            "co2_above_idle_kg": round((self.co2_g - self.idle_co2_g) / 1000.0, 4),
        }
        kpis.update(self.deferral_figures(result))
        result.kpis.update(kpis)

    def deferral_figures(self, result: PolicyResult) -> dict[str, float]:
        """How long the deferrable pods waited, and how late after their deadline any was."""
        deadlines = self.world.deadline_s
        if not deadlines:
            return {}
        placed_s: dict[str, float] = {}
        for decision in result.decisions:
            if decision.node and decision.pod in deadlines and decision.attempt > 0:
                placed_s[decision.pod] = decision.time_s
        waits = np.array([placed_s[p] - self.world.arrival_s[p] for p in placed_s])
        late = np.array([placed_s[p] - deadlines[p] for p in placed_s])
        if waits.size == 0:
            waits = late = np.zeros(1)
        return {
            "deferrable_pods": len(deadlines),
            "deferrable_placed": len(placed_s),
            "deferrable_wait_mean_s": round(float(waits.mean()), 1),
            "deferrable_wait_p50_s": round(float(np.percentile(waits, 50)), 1),
            "deferrable_wait_p95_s": round(float(np.percentile(waits, 95)), 1),
            "deferrable_wait_max_s": round(float(waits.max()), 1),
            "deferrable_late_max_s": round(max(0.0, float(late.max())), 1),
        }


# ---- the carbon policy: the extender with the Carbon plugin, its source played by the sim ------


def _rfc3339(t_s: float) -> str:
    return datetime.fromtimestamp(t_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CarbonExtenderPolicy(ExtenderPolicy):
    """`ExtenderPolicy` that also plays the carbon source and the pods' defer-until annotations.

    Call `attach(world)` before the run: it labels the nodes with their zones (the Node
    watch's view) and publishes the first snapshot.
    """

    world: CarbonWorld
    published_hour = -1

    def attach(self, world: CarbonWorld) -> None:
        self.world = world
        self.held_until_s: dict[str, tuple[float, str]] = {}
        for node, name in enumerate(self.node_names):
            self.state.upsert_node(NodeInfo(name, float(self.node_cores[node]), self._labels(node)))
        self._publish(0.0)

    def _labels(self, node: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return {**(extra or {}), REGION_LABEL: self.world.zone_of(node)}

    def _publish(self, now_s: float) -> None:
        hour = self.world.series.hour_of(now_s)
        if hour == self.published_hour:
            return
        self.published_hour = hour
        snapshot = build_snapshot(
            self.world.readings(hour),
            (),
            published_at_s=now_s,
            max_age_s=2 * HOUR_S,
            forecast_max_age_s=2 * HOUR_S,
        )
        self.state.set_signal(CARBON_SIGNAL, snapshot)

    def telemetry(self, readings: Sequence[tuple[str, Mapping[str, float], float]]) -> None:
        super().telemetry(readings)
        self._publish(self.clock.now_s)

    def labels_changed(self, node: int, labels: Mapping[str, str]) -> None:
        if self.hears_labels:
            name = self.node_names[node]
            self.state.upsert_node(
                NodeInfo(name, float(self.node_cores[node]), self._labels(node, labels))
            )

    def pod_object(self, uid: str, pod: PodRequest) -> dict:
        body = super().pod_object(uid, pod)
        metadata = body["metadata"]
        arrival_s = self.world.arrival_s.get(uid)
        if arrival_s is not None:
            metadata["creationTimestamp"] = _rfc3339(arrival_s)
        if uid in self.world.deadline_s:
            metadata["annotations"] = {DEFER_UNTIL_ANNOTATION: f"{self.world.defer_hours:g}h"}
        return body

    def place(self, uid: str, pod: PodRequest, ledger: NodeLedger, now_s: float) -> Decision:
        held = self.held_until_s.get(uid)
        if held is not None and now_s < held[0]:
            # still in kube-scheduler's unschedulable pool
            return Decision(None, reason=held[1], retry_at_s=held[0])
        self.clock.now_s = max(self.clock.now_s, now_s)
        self._publish(now_s)
        decision = super().place(uid, pod, ledger, now_s)
        if decision.node is None and CARBON_HOLD_REASON in decision.reason:
            retry_s = self._held_retry_s(uid, now_s)
            self.held_until_s[uid] = (retry_s, decision.reason)
            return replace(decision, retry_at_s=retry_s)
        self.held_until_s.pop(uid, None)
        return decision

    def _held_retry_s(self, uid: str, now_s: float) -> float:
        """When kube-scheduler asks again about a pod held at `now_s` (module docstring): just
        after the next publication of intensities or the pod's deadline, or at the flush."""
        next_publish_s = (math.floor(now_s / HOUR_S) + 1) * HOUR_S
        if next_publish_s >= self.world.series.hours * HOUR_S:
            next_publish_s = math.inf  # the series' last hour: nothing new is published
        answer_may_change_s = min(next_publish_s, self.world.deadline_s.get(uid, math.inf))
        return min(now_s + HELD_RETRY_S, max(answer_may_change_s, now_s) + HELD_EVENT_DELAY_S)


@contextlib.contextmanager
def _carbon_extender(
    scenario: Scenario,
    rng: np.random.Generator,
    name: str,
    policy_class: type[CarbonExtenderPolicy],
    extra_profile: Path | None = None,
) -> Iterator[CarbonExtenderPolicy]:
    """The extender with the carbon profile (plus `extra_profile`'s score plugins and their
    arguments), its carbon source played by the world."""
    world = carbon_world(scenario)
    assert scenario.bundle_dir is not None
    with tempfile.TemporaryDirectory(prefix="carbon-profile-") as directory:
        config = Path(directory) / "profile.yaml"
        settings = scenario.settings
        profile = carbon_profile(
            settings.carbon_power_weight, settings.carbon_weight, settings.defer_margin
        )
        if extra_profile is not None:
            extra = yaml.safe_load(extra_profile.read_text())
            profile["plugins"]["score"]["enabled"] += extra["plugins"]["score"]["enabled"]
            profile["pluginConfig"] += extra.get("pluginConfig", [])
        config.write_text(yaml.safe_dump(profile, sort_keys=False))
        with extender_policy(
            name,
            scenario.cluster,
            scenario.bundle_dir,
            scenario.settings,
            hears_labels=False,
            config_file=config,
            rng=rng,
            policy_class=policy_class,
        ) as policy:
            assert isinstance(policy, CarbonExtenderPolicy)
            policy.attach(world)
            yield policy


@contextlib.contextmanager
def _carbon_policy(scenario: Scenario, rng: np.random.Generator) -> Iterator[CarbonExtenderPolicy]:
    with _carbon_extender(scenario, rng, "power-aware+carbon", CarbonExtenderPolicy) as policy:
        yield policy


class CarbonPowerExtenderPolicy(CarbonExtenderPolicy, PowerAwareExtenderPolicy):
    """The carbon policy on nodes the node power controller powers off and on: the Node watch
    shows both a node's zone label and its power-state annotation."""

    def node_labels(self, node: int) -> dict[str, str]:
        return self._labels(node)


@contextlib.contextmanager
def _carbon_power_policy(
    scenario: Scenario, rng: np.random.Generator
) -> Iterator[CarbonExtenderPolicy]:
    # power-aware+power-management's additions (Consolidation, its busyShare) on top.
    with _carbon_extender(
        scenario,
        rng,
        "power-aware+carbon+power-management",
        CarbonPowerExtenderPolicy,
        extra_profile=POWER_MANAGEMENT_PROFILE,
    ) as policy:
        assert isinstance(policy, CarbonPowerExtenderPolicy)
        policy.power = power_management_for(scenario, policy)
        yield policy


@contextlib.contextmanager
def _carbon_grams_power_policy(
    scenario: Scenario, rng: np.random.Generator
) -> Iterator[CarbonExtenderPolicy]:
    world = carbon_world(scenario)
    with _carbon_extender(
        scenario,
        rng,
        "power-aware+carbon+power-management-grams",
        CarbonPowerExtenderPolicy,
        extra_profile=POWER_MANAGEMENT_PROFILE,
    ) as policy:
        assert isinstance(policy, CarbonPowerExtenderPolicy)
        manager = power_management_for(scenario, policy)
        horizon_s = scenario.settings.carbon_horizon_s
        manager.policy_settings = replace(
            manager.policy_settings, rank_by=RANK_BY_GRAMS, carbon_horizon_s=horizon_s
        )
        manager.g_per_kwh = _snapshot_reader(world, scenario.cluster.names, horizon_s)
        policy.power = manager
        yield policy


def _snapshot_reader(
    world: CarbonWorld, node_names: Sequence[str], horizon_s: float
) -> Callable[[str, float], float]:
    """A node's intensity as the controller reads it: from the hour's snapshot (what its
    carbon source would hold, forecast included), through `node_g_per_kwh` with the
    controller's horizon (the zone's mean over the next `horizon_s`)."""
    zone_of = {name: world.zone_of(node) for node, name in enumerate(node_names)}
    published: list[tuple[int, CarbonSnapshot]] = []

    def g_per_kwh(node: str, now_s: float) -> float:
        hour = world.series.hour_of(now_s)
        if not published or published[0][0] != hour:
            snapshot = build_snapshot(
                world.readings(hour),
                (),
                published_at_s=hour * HOUR_S,
                max_age_s=2 * HOUR_S,
                forecast_max_age_s=2 * HOUR_S,
            )
            published[:] = [(hour, snapshot)]
        return node_g_per_kwh(
            published[0][1], node, zone_of.get(node), AVERAGE, now_s, horizon_s=horizon_s
        )

    return g_per_kwh


register_policy(
    PolicySpec(
        "power-aware+carbon+power-management-grams",
        "power-aware+carbon+power-management with the controller ranking nodes by grams "
        "(--rank-by grams: the most g CO2/h per idle core off first, the fewest per core woken)",
        _carbon_grams_power_policy,
        needs_bundle=True,
    )
)


register_policy(
    PolicySpec(
        "power-aware+carbon",
        "power-aware with the Carbon plugin: fewest predicted g CO2/h (watts x zone intensity), "
        "deferrable pods held for cleaner forecast windows",
        _carbon_policy,
        needs_bundle=True,
    )
)
register_policy(
    PolicySpec(
        "power-aware+carbon+power-management",
        "power-aware+carbon with the Consolidation score and the node power controller's policy "
        "(as power-aware+power-management; the controller's choices stay carbon-blind)",
        _carbon_power_policy,
        needs_bundle=True,
    )
)
