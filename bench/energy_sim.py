"""Energy saved against kube-scheduler's default placement, with the real extender in the loop.

    python -m bench.energy_sim [--nodes 16] [--hours 24] [--load 0.45] [--seed 7]
                               [--trace pods.csv] [--json summary.json]

A discrete-event simulation of a heterogeneous cluster (`bench.sim`):

1. Cluster: `training.synth`'s fleet for (--nodes, --seed): SPECpower_ssj2008 power curves,
   allocatable CPU from the SPEC result's core count, temperatures, fans; some nodes on
   batteries charged by solar (`bench.sim.cluster`).
2. Models, trained honestly: the same nodes' history is synthesised as BMC telemetry
   (`training.synth.synth_fleet`, --history-hours of 60 s samples) and fitted with
   `training.fit.fit_fleet` into a model bundle, cached under --out-dir keyed by the settings.
   The extender predicts from these learned models, never from the simulator's curves.
3. Workload: a generated trace (daily pattern plus bursts, mean requested CPU = --load of the
   cluster) or a CSV trace (--trace; columns in `bench.sim.workload`'s docstring and --help).
4. Every policy places the same trace on the same cluster: `default` (kube-scheduler's
   NodeResourcesFit + LeastAllocated + BalancedAllocation, `bench.sim.kube_default`),
   `random`, `power-aware` (our extender over HTTP: a real uvicorn server on 127.0.0.1 running
   `extender.app.create_app` on a `Runtime` whose clock is the simulated clock),
   `power-aware-battery` (the same, while battery nodes' `energy-status` labels change), and
   `oracle` (the extender's ranking computed from the simulator's true curves and requested
   load: what model error and telemetry lag cost, not a deployable policy; the ceiling line
   below is the bound on every policy). On request (--policies), `cheapest`: the node whose
   true curve adds the fewest watts, with no kube-scheduler scores and no 0..10 rounding (what
   per-pod greedy placement reaches at best); and `rescheduling`: `cheapest` plus free,
   instant moves of running pods to cheaper nodes every --reschedule-every seconds (an
   optimistic estimate of what a descheduler consolidating pods could add).
5. Outputs in --out-dir: `energy_sim_power.png` (cluster power over time per policy),
   `energy_sim_decisions.csv` (every placement decision), and with --json a summary
   `{"policies": {"default": {"energy_kwh": ..., "unplaced_pods": ...}, ...}}`.

What the figures mean: by default every node stays on and pays its idle power (no power-off),
so savings come only from where the dynamic power is spent: on nodes whose curves add fewer
watts per core of work, and on nodes already busy (SPECpower curves are concave at low load).
The table shows total and dynamic (above-idle) energy, and a ceiling line the least energy any
placement of the trace could use with every node on (`bench.sim.ceiling`: a lower bound with
hindsight, fluid load and convex power curves), so a saving can be read against what is
possible at all. Two parts of each policy's energy that the bound leaves out are shown apart:
`fans` (kWh fans added) and `abv env` (kWh drawn above the curves' convex envelopes: nodes
running partly loaded where their curves are concave). `--empty-node-power W` instead lets a
node that runs no pods sleep at W watts with an instant wake-up: an optimistic bound on what
consolidation is worth when empty nodes can be powered down.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.sim.ceiling import ceiling_energy_kwh
from bench.sim.cluster import SimCluster, build_cluster, curve_power_w
from bench.sim.engine import PolicyResult, SimSettings, simulate
from bench.sim.policies import (
    CheapestPolicy,
    DefaultPolicy,
    ExtenderPolicy,
    OraclePolicy,
    Policy,
    RandomPolicy,
    ReschedulingPolicy,
    SimClock,
)
from bench.sim.workload import (
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    Trace,
    TraceError,
    generate_trace,
    load_trace_csv,
)
from bench.support.server import serve_app
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.runtime import Runtime
from extender.state import ClusterState, NodeInfo
from predictor.bundle import BundleError, read_bundle
from training.dataset import clean_metrics
from training.fit import FitError, fit_fleet
from training.synth import synth_fleet

log = logging.getLogger("bench.energy_sim")

POLICIES = (
    "default",
    "random",
    "power-aware",
    "power-aware-battery",
    "oracle",
    "cheapest",
    "rescheduling",
)
REFERENCE_POLICIES = ("oracle", "cheapest", "rescheduling")  # priced on the true curves
DEFAULT_POLICIES = POLICIES[:5]
BUNDLE_RECIPE = "synth-fit-v2"  # change when the history or fit recipe changes (v2: monoshape)
HISTORY_STEP_S = 60.0
DEFAULT_OUT_DIR = Path("out/energy_sim")


@dataclass(frozen=True)
class BenchSettings:
    nodes: int = 16
    hours: float = 24.0
    load: float = 0.45
    seed: int = 7
    history_hours: float = 72.0
    extender_weight: int = 5
    battery_share: float = 0.25
    assumed_window_s: float = 120.0
    reschedule_interval_s: float = 60.0


# ---- the extender's model bundle, trained on the sim nodes' synthetic history ------------------


def bundle_dir_for(settings: BenchSettings, out_dir: Path) -> Path:
    key = json.dumps(
        [BUNDLE_RECIPE, settings.nodes, settings.seed, settings.history_hours, HISTORY_STEP_S]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return out_dir / f"bundle-{settings.nodes}n-seed{settings.seed}-{digest}"


def trained_bundle(settings: BenchSettings, out_dir: Path, *, progress: bool) -> Path:
    """The cached bundle for these settings, fitted from synthetic history if missing."""
    bundle_dir = bundle_dir_for(settings, out_dir)
    if (bundle_dir / "manifest.json").exists():
        try:
            bundle = read_bundle(bundle_dir)
            log.info("reusing bundle %s (version %s)", bundle_dir, bundle.version)
            return bundle_dir
        except BundleError as exc:
            log.warning("cached bundle unusable (%s); fitting again", exc)
    started = time.perf_counter()
    history = synth_fleet(settings.nodes, settings.history_hours, HISTORY_STEP_S, settings.seed)
    cleaned = clean_metrics(history, source=f"training.synth seed {settings.seed}")
    fit_fleet(cleaned, bundle_dir, progress=progress)
    log.info(
        "fitted bundle %s from %d rows in %.1f s",
        bundle_dir,
        len(history),
        time.perf_counter() - started,
    )
    return bundle_dir


# ---- one extender service per extender policy (fresh state, simulated clock) ------------------


@contextlib.contextmanager
def extender_policy(
    name: str, cluster: SimCluster, bundle_dir: Path, settings: BenchSettings
) -> Iterator[ExtenderPolicy]:
    """Serve the extender for one policy run; yields a policy talking to it over HTTP.

    The service is `create_app` on a `Runtime` with its own `ClusterState` (nodes as the Node
    watch would list them) and the simulated clock, under a real uvicorn on 127.0.0.1.
    """
    config = ExtenderConfig(
        bundle_dir=bundle_dir, port=0, assumed_window_s=settings.assumed_window_s
    ).validate()
    state = ClusterState(assumed_window_s=settings.assumed_window_s)
    state.replace_nodes(
        NodeInfo(node, float(cores))
        for node, cores in zip(cluster.names, cluster.cores, strict=True)
    )
    clock = SimClock()
    runtime = Runtime(config, state=state, clock=clock)
    if not runtime.load_bundle():
        refused = runtime.watcher.last_refused
        raise BundleError(
            f"the extender refused the bundle {bundle_dir}: "
            f"{refused.error if refused else 'unknown error'}"
        )
    # No background threads: curves are refreshed synchronously after each telemetry round.
    try:
        with serve_app(create_app(runtime)) as url:
            policy = ExtenderPolicy(
                name,
                url,
                state,
                runtime.refresh_curves,
                clock,
                cluster.names,
                cluster.cores,
                settings.extender_weight,
                np.random.default_rng([settings.seed, 5, POLICIES.index(name)]),
                hears_labels=name == "power-aware-battery",
            )
            try:
                yield policy
            finally:
                policy.close()
    finally:
        runtime.stop()


def run_policy(
    name: str,
    cluster: SimCluster,
    trace: Trace,
    bundle_dir: Path | None,
    settings: BenchSettings,
    sim_settings: SimSettings,
    *,
    progress: bool,
) -> tuple[PolicyResult, dict]:
    """Simulate one policy; returns its result and extender request figures.

    Battery physics runs for every policy (same cluster); only power-aware-battery's
    extender hears the energy-status labels.
    """
    rng = np.random.default_rng([settings.seed, 5, POLICIES.index(name)])
    if name == "default":
        return simulate(cluster, trace, DefaultPolicy(rng), sim_settings, progress=progress), {}
    if name == "random":
        return simulate(cluster, trace, RandomPolicy(rng), sim_settings, progress=progress), {}
    if name in REFERENCE_POLICIES:

        def true_power_w(util: np.ndarray) -> np.ndarray:
            return curve_power_w(cluster, util)  # fans left out, as the ceiling does

        reference: Policy
        if name == "oracle":
            reference = OraclePolicy(true_power_w, cluster.cores, settings.extender_weight, rng)
        elif name == "cheapest":
            reference = CheapestPolicy(true_power_w, cluster.cores)
        else:
            reference = ReschedulingPolicy(
                true_power_w, cluster.cores, settings.reschedule_interval_s
            )
        return simulate(cluster, trace, reference, sim_settings, progress=progress), {}
    if bundle_dir is None:
        raise ValueError(f"policy {name} needs a model bundle")
    with extender_policy(name, cluster, bundle_dir, settings) as policy:
        result = simulate(cluster, trace, policy, sim_settings, progress=progress)
        figures = {
            "extender_requests": policy.requests,
            "extender_mean_ms": round(1000.0 * policy.request_s / max(1, policy.requests), 3),
        }
    return result, figures


# ---- outputs ------------------------------------------------------------------------------------


def write_decisions(path: Path, results: Sequence[PolicyResult]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["policy", "time_s", "pod", "node", "predicted_increase_w", "score", "attempt", "note"]
        )
        for result in results:
            for d in result.decisions:
                writer.writerow(
                    [
                        result.policy,
                        f"{d.time_s:.3f}",
                        d.pod,
                        d.node,
                        ""
                        if math.isnan(d.predicted_increase_w)
                        else f"{d.predicted_increase_w:.3f}",
                        "" if math.isnan(d.score) else f"{d.score:g}",
                        d.attempt,
                        d.note,
                    ]
                )
                rows += 1
    return rows


def plot_power(path: Path, results: Sequence[PolicyResult]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    for result in results:
        ax.plot(
            result.power_times_s / 3600.0,
            result.power_w / 1000.0,
            label=f"{result.policy} ({result.energy_kwh:.1f} kWh)",
            linewidth=1.0,
        )
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("cluster power (kW, 1-min mean)")
    ax.set_title("Cluster power over time per placement policy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(
    results: Sequence[PolicyResult], extras: dict[str, dict], ceiling_kwh: float | None = None
) -> dict:
    baseline = next((r for r in results if r.policy == "default"), None)
    policies: dict[str, dict] = {}
    for result in results:
        entry: dict = result.summary()
        entry.update(extras.get(result.policy, {}))
        if baseline is not None and baseline.energy_kwh > 0:
            entry["energy_vs_default"] = round(result.energy_kwh / baseline.energy_kwh, 4)
            entry["dynamic_energy_vs_default"] = round(
                result.dynamic_energy_kwh / baseline.dynamic_energy_kwh, 4
            )
            entry["mean_power_vs_default"] = round(result.mean_power_w / baseline.mean_power_w, 4)
            entry["peak_power_vs_default"] = round(result.peak_power_w / baseline.peak_power_w, 4)
        policies[result.policy] = entry
    report: dict = {"policies": policies}
    if ceiling_kwh is not None:
        report["ceiling"] = {"energy_kwh": round(ceiling_kwh, 4)}
        if baseline is not None and baseline.energy_kwh > 0:
            report["ceiling"]["energy_vs_default"] = round(ceiling_kwh / baseline.energy_kwh, 4)
    return report


def print_table(results: Sequence[PolicyResult], report: dict) -> None:
    header = (
        f"{'policy':<20} {'kWh':>8} {'vs def':>7} {'dyn kWh':>8} {'vs def':>7} "
        f"{'fans':>6} {'abv env':>7} {'mean W':>8} "
        f"{'peak W':>8} {'unplaced':>8} {'moved':>6} "
        f"{'slowdown':>8} {'p95 slow':>8} {'ovc n-h':>8} {'pwrless n-h':>11}"
    )
    print(header)
    for result in results:
        entry = report["policies"][result.policy]
        print(
            f"{result.policy:<20} {result.energy_kwh:8.2f} "
            f"{entry.get('energy_vs_default', math.nan):7.3f} {result.dynamic_energy_kwh:8.2f} "
            f"{entry.get('dynamic_energy_vs_default', math.nan):7.3f} "
            f"{result.fan_energy_kwh:6.2f} {result.above_envelope_energy_kwh:7.2f} "
            f"{result.mean_power_w:8.0f} "
            f"{result.peak_power_w:8.0f} {result.unplaced_pods:8d} {result.moved_pods:6d} "
            f"{result.mean_slowdown:8.3f} "
            f"{result.p95_slowdown:8.3f} {result.overcommitted_node_hours:8.2f} "
            f"{result.powerless_node_hours:11.2f}"
        )


# ---- CLI ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    d, s = BenchSettings(), SimSettings()
    parser = argparse.ArgumentParser(
        prog="python -m bench.energy_sim",
        description=(
            "Simulate a heterogeneous cluster and compare the energy of placement policies "
            f"({', '.join(POLICIES)}) on the same pod trace; the power-aware policies call the "
            "real extender over HTTP. Prints a table and ratios against the default scheduler. "
            "Policies: default = kube-scheduler's NodeResourcesFit + LeastAllocated + "
            "BalancedAllocation; random = any node that fits; power-aware = default plugins + "
            "our extender (/filter, /prioritize) at --extender-weight; power-aware-battery = "
            "the same while battery nodes' energy-status labels change; oracle = the "
            "extender's ranking from the simulator's true curves (a reference, not deployable); "
            "cheapest (not run by default) = the node whose true curve adds the fewest watts, "
            "no kube-scheduler scores (the best per-pod greedy placement); rescheduling (not "
            "run by default) = cheapest plus free moves of running pods to cheaper nodes every "
            "--reschedule-every seconds (an optimistic estimate of what a descheduler adds)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=(
            "Trace CSV (--trace): one row per pod, header required. Required columns: "
            f"{', '.join(REQUIRED_COLUMNS)}; optional: {', '.join(OPTIONAL_COLUMNS)}. "
            "arrival_s: seconds since the start (>= 0); cpu_request: cores or a Kubernetes "
            "quantity (0.5, 500m); duration_s: seconds of work at full speed (> 0); name: "
            "unique pod name; memory_mib: MiB requested (default 0); usage_ratio: CPU used / "
            "requested (default 1, > 1 for burstable pods). A bad row stops the run with the "
            "file, line and field."
        ),
    )
    cluster = parser.add_argument_group("cluster and models")
    cluster.add_argument("--nodes", metavar="N", type=int, default=d.nodes, help="simulated nodes")
    cluster.add_argument(
        "--seed",
        metavar="SEED",
        type=int,
        default=d.seed,
        help="seed of the fleet, trace and tie breaks",
    )
    cluster.add_argument(
        "--history-hours",
        metavar="HOURS",
        type=float,
        default=d.history_hours,
        help="hours of synthetic telemetry per node the extender's models are fitted on",
    )
    cluster.add_argument(
        "--battery-share",
        metavar="FRACTION",
        type=float,
        default=d.battery_share,
        help="share of nodes (0..1) on battery + solar; their energy-status labels change",
    )
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--hours",
        metavar="HOURS",
        type=float,
        default=d.hours,
        help="hours of generated pod arrivals",
    )
    workload.add_argument(
        "--load",
        metavar="FRACTION",
        type=float,
        default=d.load,
        help="mean requested CPU of the generated trace, as a share (0..1) of allocatable CPU",
    )
    workload.add_argument(
        "--trace",
        metavar="CSV",
        type=Path,
        default=None,
        help="CSV pod trace instead of a generated one",
    )
    sim = parser.add_argument_group("simulation")
    sim.add_argument(
        "--tick", metavar="SECONDS", type=float, default=s.tick_s, help="physics step, seconds"
    )
    sim.add_argument(
        "--scrape-interval",
        metavar="SECONDS",
        type=float,
        default=s.scrape_interval_s,
        help="seconds between telemetry updates sent to the extender",
    )
    sim.add_argument(
        "--telemetry-lag",
        metavar="SECONDS",
        type=float,
        default=s.telemetry_lag_s,
        help="seconds by which telemetry trails the load (scrape + rate window)",
    )
    sim.add_argument(
        "--assumed-window",
        metavar="SECONDS",
        type=float,
        default=d.assumed_window_s,
        help="extender --assumed-window: seconds a bound pod's CPU counts as assumed load",
    )
    sim.add_argument(
        "--extender-weight",
        metavar="WEIGHT",
        type=int,
        default=d.extender_weight,
        help="extender weight in KubeSchedulerConfiguration (manifests/scheduler.yaml uses 5)",
    )
    sim.add_argument(
        "--reschedule-every",
        metavar="SECONDS",
        type=float,
        default=d.reschedule_interval_s,
        help="seconds between the rescheduling reference's rounds of free pod moves",
    )
    sim.add_argument(
        "--max-pending",
        metavar="SECONDS",
        type=float,
        default=s.max_pending_s,
        help="seconds a pod may wait for a node before it counts as unplaced",
    )
    sim.add_argument(
        "--empty-node-power",
        type=float,
        default=None,
        metavar="WATTS",
        help="if set, a node running no pods sleeps at this power (instant wake-up, "
        "optimistic); by default every node stays on and pays its idle power",
    )
    sim.add_argument(
        "--policies",
        metavar="LIST",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated policies to run, from {', '.join(POLICIES)}",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--out-dir",
        metavar="DIR",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="directory for the bundle cache, the PNG and the decisions CSV",
    )
    out.add_argument(
        "--json", metavar="FILE", type=Path, default=None, help="write the summary JSON here"
    )
    out.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")
    return parser


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # The extender logs a line per bundle install and warnings we expect here; keep them quiet.
    for noisy in ("extender", "predictor", "training", "uvicorn", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        return fail(f"--policies: unknown {', '.join(unknown) or '(none)'}; pick from {POLICIES}")
    if args.nodes < 1:
        return fail(f"--nodes must be at least 1, got {args.nodes}")
    if not 0 <= args.battery_share <= 1:
        return fail(f"--battery-share must be 0..1, got {args.battery_share}")
    if args.trace is None and not 0 < args.load < 1:
        return fail(f"--load must be between 0 and 1, got {args.load}")
    for flag, value in (
        ("--tick", args.tick),
        ("--scrape-interval", args.scrape_interval),
        ("--reschedule-every", args.reschedule_every),
    ):
        if not value > 0:
            return fail(f"{flag} must be positive, got {value}")
    settings = BenchSettings(
        nodes=args.nodes,
        hours=args.hours,
        load=args.load,
        seed=args.seed,
        history_hours=args.history_hours,
        extender_weight=args.extender_weight,
        battery_share=args.battery_share,
        assumed_window_s=args.assumed_window,
        reschedule_interval_s=args.reschedule_every,
    )
    sim_settings = SimSettings(
        tick_s=args.tick,
        scrape_interval_s=args.scrape_interval,
        telemetry_lag_s=args.telemetry_lag,
        max_pending_s=args.max_pending,
        empty_node_power_w=args.empty_node_power,
    )
    progress = not args.quiet
    cluster = build_cluster(settings.nodes, settings.seed, battery_share=settings.battery_share)
    try:
        if args.trace is not None:
            trace = load_trace_csv(args.trace)
        else:
            trace = generate_trace(
                float(cluster.cores.sum()), settings.hours, settings.load, settings.seed
            )
    except TraceError as exc:
        return fail(str(exc))
    log.info(
        "cluster: %d nodes, %.0f cores, %d on battery; trace: %d pods over %.1f h",
        len(cluster),
        cluster.cores.sum(),
        int(cluster.on_battery.sum()),
        len(trace),
        trace.end_s / 3600.0,
    )
    bundle_dir = None
    if any(p.startswith("power-aware") for p in policies):
        try:
            bundle_dir = trained_bundle(settings, args.out_dir, progress=progress)
        except FitError as exc:
            return fail(f"fitting the extender's models failed: {exc}")

    results: list[PolicyResult] = []
    extras: dict[str, dict] = {}
    for name in policies:
        started = time.perf_counter()
        try:
            result, figures = run_policy(
                name, cluster, trace, bundle_dir, settings, sim_settings, progress=progress
            )
        except BundleError as exc:
            return fail(f"{exc} (try another --seed or --history-hours)")
        figures["wall_s"] = round(time.perf_counter() - started, 1)
        results.append(result)
        extras[name] = figures
        log.info(
            "%s: %.3f kWh, %d unplaced (%s)", name, result.energy_kwh, result.unplaced_pods, figures
        )

    ceiling_kwh = None
    if sim_settings.empty_node_power_w is None:  # the bound assumes every node stays on
        # The same horizon and step as the runs: trace end + tail, in physics ticks.
        ceiling_kwh = ceiling_energy_kwh(cluster, trace, results[0].duration_s, sim_settings.tick_s)
    report = summary(results, extras, ceiling_kwh)
    report["settings"] = {
        **asdict(settings),
        **asdict(sim_settings),
        "trace": str(args.trace or "generated"),
    }
    report["cluster"] = {
        "nodes": len(cluster),
        "cores": float(cluster.cores.sum()),
        "battery_nodes": int(cluster.on_battery.sum()),
        "idle_power_w": float((cluster.spec.idle_share * cluster.spec.max_power_w).sum()),
        "max_power_w": float(cluster.spec.max_power_w.sum()),
    }
    png = args.out_dir / "energy_sim_power.png"
    decisions_csv = args.out_dir / "energy_sim_decisions.csv"
    plot_power(png, results)
    rows = write_decisions(decisions_csv, results)
    print_table(results, report)
    cl = report["cluster"]
    print(
        f"cluster: {cl['nodes']} nodes, {cl['cores']:.0f} cores, idle {cl['idle_power_w']:.0f} W, "
        f"max {cl['max_power_w']:.0f} W; trace: {len(trace)} pods; requested CPU share "
        f"{results[0].mean_requested_share:.2f} (time mean)"
    )
    ceiling = report.get("ceiling")
    if ceiling is not None:
        versus = (
            f" ({1.0 - ceiling['energy_vs_default']:.1%} less than default)"
            if "energy_vs_default" in ceiling
            else ""
        )
        print(
            f"ceiling: no placement of this trace with every node on uses less than "
            f"{ceiling['energy_kwh']:.2f} kWh{versus} (bench.sim.ceiling: hindsight, fluid "
            "load, convex envelopes of the true curves)"
        )
    print(f"plot: {png}\ndecisions: {decisions_csv} ({rows} rows)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"summary: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
