"""What one bench run simulates: the settings, the preset, the cluster, the trace, the models.

A *preset* names a kind of cluster and workload (contract 5: `default`, `multizone`, `edge`,
`faults`; more may come): its description, the policies it runs unless `--policies` says
otherwise, the settings it changes from `BenchSettings`' defaults, and an optional `prepare`
step that adds its own world to the scenario (carbon intensity series, an RTT matrix, faulty
nodes...) under `Scenario.world`. Presets register themselves with `register_preset`;
`bench.sim.presets` imports every preset module, so `PRESETS` is complete once it is imported.

The extender's models are trained honestly: the simulated nodes' history is synthesised as BMC
telemetry (`training.synth.fleet_telemetry` of the fleet's nodes) and fitted with
`training.fit.fit_fleet` into a bundle cached under the output directory, keyed by what it
depends on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from bench.sim.cluster import DEFAULT_FLEET, SimCluster, build_cluster, fleet_node_spec
from bench.sim.engine import Meter, PolicyResult, SimSettings
from bench.sim.workload import Trace, generate_trace, load_trace_csv
from predictor.bundle import BundleError, read_bundle
from training.dataset import clean_metrics
from training.fit import fit_fleet
from training.synth import fleet_telemetry

log = logging.getLogger("bench.sim.scenario")

BUNDLE_RECIPE = "synth-fit-v5"  # change when the history or fit recipe changes (v5: leaf 1)
HISTORY_STEP_S = 60.0


@dataclass(frozen=True)
class BenchSettings:
    """The bench's own settings (the simulator's physics are `SimSettings`)."""

    preset: str = "default"
    # Whose servers the nodes are (`bench.sim.cluster.FLEETS`: old, mixed, modern) and the
    # pods each node admits (kubelet --max-pods; None: the fleet's, 110 or 250 per node).
    fleet: str = DEFAULT_FLEET
    max_pods: int | None = None
    nodes: int = 16
    hours: float = 24.0
    load: float = 0.45
    seed: int = 7
    history_hours: float = 72.0
    extender_weight: int = 5
    battery_share: float = 0.25
    assumed_window_s: float = 120.0
    reschedule_interval_s: float = 60.0
    delay_share: float = 0.4  # edge preset: share of pods with a delay_<node> limit
    cloud_weight: float = 0.3  # edge preset: CloudPreference's weight in power-aware+delay+cloud
    # The multizone preset (bench.sim.carbon): grid zones, their intensity, deferrable pods.
    zones: int = 4
    zone_low_g_per_kwh: float = 50.0
    zone_high_g_per_kwh: float = 700.0
    carbon_csv: str | None = None
    deferrable_share: float = 0.0
    defer_hours: float = 6.0
    defer_margin: float = 0.2  # the Carbon plugin's deferMargin in power-aware+carbon
    # power-aware+carbon's profile: PowerIncrease and Carbon weights (EnergyLevel keeps 0.4).
    carbon_power_weight: float = 0.4
    carbon_weight: float = 0.2
    # power-aware+carbon+power-management-grams: the controller ranks each node by its zone's
    # mean intensity over the next this many seconds (its --carbon-horizon; 0: the hour's).
    carbon_horizon_s: float = 4 * 3600.0
    # power-aware+power-management: the extender's profile ("": bench/sim/profiles'
    # power-management.yaml), the controller's cool-down (None: PolicySettings' default)...
    power_management_profile: str = ""
    power_cooldown_s: float | None = None
    # ...its margin between waking and powering off, its standing reserve of free CPU and its
    # headroom factor (None: PolicySettings' defaults)...
    off_margin_sd: float | None = None
    min_headroom_cores: float | None = None
    headroom_factor: float | None = None
    # ...its target for pods' p99 wait, seconds (None or 0: none; a learned headroom with one)...
    target_wait_p99_s: float | None = None
    # ...and the windows of its arrival-rate meter (empty: ArrivalRateMeter's default).
    arrival_windows_s: tuple[float, ...] = ()


@dataclass
class Scenario:
    """Everything the policies of one bench run share: they all place the same trace."""

    settings: BenchSettings
    sim_settings: SimSettings
    cluster: SimCluster
    trace: Trace
    bundle_dir: Path | None = None  # the extender's models; None until a policy needs them
    # A preset's own world (e.g. "carbon": intensity series per zone), by name.
    world: dict[str, object] = field(default_factory=dict)
    # A preset's own accounting, one fresh `bench.sim.engine.Meter` per policy run.
    meters: list[Callable[[], Meter]] = field(default_factory=list)


@dataclass(frozen=True)
class Preset:
    """A named kind of cluster and workload; see the module docstring."""

    name: str
    description: str
    policies: tuple[str, ...]
    # BenchSettings / SimSettings fields this preset sets (flags given explicitly still win).
    defaults: Mapping[str, object] = field(default_factory=dict)
    prepare: Callable[[Scenario], None] | None = None
    # After each policy's run: fill its preset-specific figures (delay_violations, kpis...).
    evaluate: Callable[[Scenario, PolicyResult], None] | None = None
    # After the table: print what the preset's figures mean, policy by policy; may return
    # figures of the whole run for the JSON summary (its `preset` block).
    report: Callable[[Scenario, Sequence[PolicyResult]], Mapping[str, object] | None] | None = None


PRESETS: dict[str, Preset] = {}
# Where a preset's description names its cluster's cores: they depend on the fleet, the nodes
# and the seed, so `describe_preset` fills them in for the chosen ones.
CORES = "{cores}"


def describe_preset(preset: Preset, settings: BenchSettings) -> str:
    """The preset's description for `settings` (its cores counted on the cluster they build)."""
    if CORES not in preset.description:
        return preset.description
    cluster = build_cluster(settings.nodes, settings.seed, fleet=settings.fleet)
    return preset.description.replace(CORES, f"{cluster.cores.sum():,.0f}")


def register_preset(preset: Preset) -> Preset:
    if preset.name in PRESETS:
        raise ValueError(f"preset {preset.name!r} is registered twice")
    unknown = set(preset.defaults) - _setting_names()
    if unknown:
        raise ValueError(f"preset {preset.name}: unknown settings {sorted(unknown)}")
    PRESETS[preset.name] = preset
    return preset


def _setting_names() -> set[str]:
    return {f.name for f in fields(BenchSettings)} | {f.name for f in fields(SimSettings)}


def apply_preset_defaults(
    preset: Preset, settings: BenchSettings, sim_settings: SimSettings, explicit: set[str]
) -> tuple[BenchSettings, SimSettings]:
    """The preset's settings, except those the user set explicitly (`explicit` field names)."""
    bench_fields = {f.name for f in fields(BenchSettings)}
    chosen = {k: v for k, v in preset.defaults.items() if k not in explicit}
    settings = replace(settings, **{k: v for k, v in chosen.items() if k in bench_fields})
    sim_settings = replace(
        sim_settings, **{k: v for k, v in chosen.items() if k not in bench_fields}
    )
    return settings, sim_settings


def build_scenario(
    settings: BenchSettings, sim_settings: SimSettings, *, trace_csv: Path | None = None
) -> Scenario:
    """The cluster and trace of `settings` (a CSV trace when given), and the preset's world.

    Raises `bench.sim.workload.TraceError` on a bad CSV trace.
    """
    preset = PRESETS[settings.preset]
    cluster = build_cluster(
        settings.nodes,
        settings.seed,
        battery_share=settings.battery_share,
        fleet=settings.fleet,
        max_pods=settings.max_pods,
    )
    if trace_csv is not None:
        trace = load_trace_csv(trace_csv)
    else:
        trace = generate_trace(
            float(cluster.cores.sum()), settings.hours, settings.load, settings.seed
        )
    scenario = Scenario(settings, sim_settings, cluster, trace)
    if preset.prepare is not None:
        preset.prepare(scenario)
    return scenario


# ---- the extender's model bundle, trained on the sim nodes' synthetic history ----------------


def bundle_dir_for(settings: BenchSettings, out_dir: Path) -> Path:
    parts: list[object] = [
        BUNDLE_RECIPE,
        settings.nodes,
        settings.seed,
        settings.history_hours,
        HISTORY_STEP_S,
    ]
    # The old fleet's key is what it always was, so bundles cached before fleets existed stay.
    fleet = "" if settings.fleet == DEFAULT_FLEET else f"-{settings.fleet}"
    if fleet:
        parts.append(settings.fleet)
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:10]
    return out_dir / f"bundle-{settings.nodes}n{fleet}-seed{settings.seed}-{digest}"


def trained_bundle(settings: BenchSettings, out_dir: Path, *, progress: bool) -> Path:
    """The cached bundle for these settings, fitted from synthetic history if missing.

    Raises `training.fit.FitError` when fitting fails.
    """
    bundle_dir = bundle_dir_for(settings, out_dir)
    if (bundle_dir / "manifest.json").exists():
        try:
            bundle = read_bundle(bundle_dir)
            log.info("reusing bundle %s (version %s)", bundle_dir, bundle.version)
            return bundle_dir
        except BundleError as exc:
            log.warning("cached bundle unusable (%s); fitting again", exc)
    started = time.perf_counter()
    # The simulated nodes' own history (for the old fleet, `synth_fleet(nodes, ..., seed)`).
    spec = fleet_node_spec(settings.fleet, settings.nodes, settings.seed)
    history = fleet_telemetry(spec, settings.history_hours, HISTORY_STEP_S, settings.seed)
    cleaned = clean_metrics(history, source=f"training.synth seed {settings.seed}")
    fit_fleet(cleaned, bundle_dir, progress=progress)
    log.info(
        "fitted bundle %s from %d rows in %.1f s",
        bundle_dir,
        len(history),
        time.perf_counter() - started,
    )
    return bundle_dir
