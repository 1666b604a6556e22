"""Energy saved against kube-scheduler's default placement, with the real extender in the loop.

    python -m bench.energy_sim [--preset default] [--policies a,b,...] [--fleet old] [--nodes 16]
                               [--hours 24] [--load 0.45] [--seed 7] [--trace pods.csv]
                               [--json summary.json]

A discrete-event simulation of a heterogeneous cluster (`bench.sim`):

1. Cluster: `training.synth`'s fleet for (--nodes, --seed): SPECpower_ssj2008 power curves,
   allocatable CPU from the SPEC result's core count, temperatures, fans; some nodes on
   batteries charged by solar (`bench.sim.cluster`). --fleet chooses the servers: `old`
   (2007-2016, the default), `modern` (2017-2025) or `mixed` (every other node of each); the
   generated workload is the same share of the fleet's cores, and each node admits the pods
   its kubelet's --max-pods allows (110 on 2007-2016 servers, 250 on 2017-2025 ones).
2. Models, trained honestly: the same nodes' history is synthesised as BMC telemetry
   (`training.synth.synth_fleet`, --history-hours of 60 s samples) and fitted with
   `training.fit.fit_fleet` into a model bundle, cached under --out-dir keyed by the settings.
   The extender predicts from these learned models, never from the simulator's curves.
3. Workload: a generated trace (daily pattern plus bursts, mean requested CPU = --load of the
   cluster) or a CSV trace (--trace; columns in `bench.sim.workload`'s docstring and --help).
4. Every policy places the same trace on the same cluster: `default` (kube-scheduler v1.36's
   default plugins, NodeResourcesFit + LeastAllocated + BalancedAllocation + PodTopologySpread,
   `bench.sim.kube_default`; `--kube-version 1.28` for v1.28's, in every policy that runs
   them; the tables and the JSON settings name the version),
   `random`, `power-aware` (our extender over HTTP: a real uvicorn server on 127.0.0.1 running
   `extender.app.create_app` on a `Runtime` whose clock is the simulated clock),
   `power-aware+battery` (the same, while battery nodes' `energy-status` labels change), and
   `oracle` (the extender's ranking computed from the simulator's true curves and requested
   load: what model error and telemetry lag cost, not a deployable policy; the ceiling line
   below is the bound on every policy). On request (--policies), `cheapest`: the node whose
   true curve adds the fewest watts, with no kube-scheduler scores and no 0..10 rounding (what
   per-pod greedy placement reaches at best); and `rescheduling`: `cheapest` plus free,
   instant moves of running pods to cheaper nodes every --reschedule-every seconds (an
   optimistic estimate of what a descheduler consolidating pods could add).
5. Outputs in --out-dir: `energy_sim_power.png` (cluster power over time per policy; the run
   goes on --tail-hours after the last arrival so that running pods finish),
   `energy_sim_decisions.csv` (every placement decision), and with --json the summary of
   contract 5: `{"settings": {"preset": ..., "seed": ..., "hours": ...}, "policies":
   {"default": {"energy_kwh": ..., "unplaced_pods": ..., "pod_wait_s": {"p50", "p99",
   "max"}, "power_cycles_per_node_day": ..., "co2_kg": ..., "delay_violations": ...,
   "failed_pod_starts": ...}, ...}}`: every policy reports every key (0 where it does not
   apply), plus more figures (`pods_waiting_over_30_s`, the energy's parts, below).

Presets (--preset, `bench.sim.presets`) name the kind of cluster and workload and the policies
run by default; policies are registered by name in `bench.sim.runner`. `multizone`
(`bench.sim.carbon`) deals the nodes over grid zones with hourly carbon intensity series and
counts every policy's CO2 (`co2_kg`, and `mean_intensity_g_per_kwh`, `co2_above_idle_kg` and,
with `--deferrable-share`, the deferrable pods' waits, printed under the table);
`power-aware+carbon` runs the extender with the Carbon plugin there. `edge`
(`bench.sim.edge`) places the nodes in sites with measured round trips and gives pods
`delay_<node>` limits (`delay_violations`). `faults`
(`bench.sim.faults`) hides node faults that fail some workloads' pods and adds
`power-aware+rewards` (the extender's Reward plugin learning where pods fail); its figures
(failed pod starts, restarts, energy wasted on failing pods, the repaired node's reuse) are
printed under the table ("preset figures") and written to the summary.

What the figures mean: by default every node stays on and pays its idle power (no power-off),
so savings come only from where the dynamic power is spent: on nodes whose curves add fewer
watts per core of work, and on nodes already busy (SPECpower curves are concave at low load).
The table shows total and dynamic (above-idle) energy, and a ceiling line the least energy any
placement of the trace could use with every node on (`bench.sim.ceiling`: a lower bound with
hindsight, fluid load and convex power curves), so a saving can be read against what is
possible at all. Two parts of each policy's energy that the bound leaves out are shown apart:
`fans` (kWh fans added) and `above envelope` (kWh drawn above the curves' convex envelopes:
nodes running partly loaded where their curves are concave). When a policy powers nodes off,
a bound line gives the least energy any power management of the trace could use
(`bench.sim.bound`: the same power states, the controller's cool-down, at most 6 power cycles
per node-day, in hindsight with fluid load; again with the pods' requests to fit on the nodes
on), and the saving against the default of each policy run by the node power controller as a
share of the bound's (the JSON's `bound` block). `--empty-node-power W` instead lets a
node that runs no pods sleep at W watts with an instant wake-up: an optimistic bound on what
consolidation is worth when empty nodes can be powered down.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path

from bench.sim import presets as _presets  # noqa: F401  (registers every preset)
from bench.sim.bound import DEFAULT_WINDOW_S, PowerBound, PowerLimits, limits_for, power_bound
from bench.sim.carbon_series import SeriesError
from bench.sim.ceiling import ceiling_energy_kwh
from bench.sim.cluster import FLEET_DESCRIPTIONS, FLEETS, MAX_PODS_BY_PERIOD
from bench.sim.engine import PolicyResult, SimSettings
from bench.sim.kube_default import DEFAULT_KUBE_VERSION, KUBE_VERSIONS
from bench.sim.runner import (
    POLICIES,
    PolicyNotApplicable,
    extender_policy,
    run_policy,
    setup_logging,
)
from bench.sim.scenario import (
    PRESETS,
    BenchSettings,
    apply_preset_defaults,
    build_scenario,
    describe_preset,
    trained_bundle,
)
from bench.sim.workload import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, TraceError
from extender.profile import DEFAULT_SCORES
from predictor.bundle import BundleError
from training.fit import FitError

log = logging.getLogger("bench.energy_sim")

DEFAULT_OUT_DIR = Path("out/energy_sim")
__all__ = ["BenchSettings", "extender_policy", "main"]  # what tests and scripts import here


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


def plot_power(path: Path, results: Sequence[PolicyResult], last_arrival_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    managed = [r for r in results if r.nodes_on is not None]
    if managed:  # policies with power management: how many nodes were on, below the power
        fig, (ax, nodes_ax) = plt.subplots(
            2, 1, figsize=(14, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]}
        )
    else:
        fig, ax = plt.subplots(figsize=(14, 5))
    colours = {}
    for result in results:
        (line,) = ax.plot(
            result.power_times_s / 3600.0,
            result.power_w / 1000.0,
            label=f"{result.policy} ({result.energy_kwh:.1f} kWh)",
            linewidth=1.0,
        )
        colours[result.policy] = line.get_color()
    if managed:
        for result in managed:
            nodes_on = result.nodes_on
            nodes_ax.plot(
                result.power_times_s[: nodes_on.size] / 3600.0,
                nodes_on,
                color=colours[result.policy],
                linewidth=1.0,
                label=result.policy,
            )
        nodes_ax.set_ylabel("nodes on")
        nodes_ax.set_xlabel("simulated time (h)")
        nodes_ax.set_ylim(0, max(r.nodes for r in results) + 0.5)
        nodes_ax.grid(alpha=0.3)
        nodes_ax.legend(fontsize=8, loc="lower right")
    # The run goes on after the last arrival until running pods finish (--tail-hours).
    ax.axvline(last_arrival_s / 3600.0, color="grey", linestyle=":", linewidth=1.0)
    ax.annotate(
        "last arrival; the tail lets running pods finish",
        (last_arrival_s / 3600.0, 0.98),
        xycoords=("data", "axes fraction"),
        ha="right",
        va="top",
        fontsize=8,
        color="grey",
    )
    if not managed:
        ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("cluster power (kW, 1-min mean)")
    ax.set_title("Cluster power over time per placement policy")
    ax.grid(alpha=0.3)
    # Beside the plot, not on it: with nine policies any spot inside covers a burst.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(
    results: Sequence[PolicyResult], extras: dict[str, dict], ceiling_kwh: float | None = None
) -> dict:
    """Contract 5's `policies` block (and the ceiling): every key for every policy."""
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


def bound_summary(
    results: Sequence[PolicyResult],
    bound: PowerBound,
    limits: PowerLimits,
    fitting_requests: PowerBound | None = None,
) -> dict:
    """The power-management bound's block of the summary: its energy, its relaxed schedule,
    and the saving of each policy run by the node power controller as a share of the bound's
    (saving = default's energy - energy). The bound holds for policies within its limits:
    cluster-autoscaler's rule powers nodes off 10 minutes after a scale-up, inside the
    controller's cool-down, so it is left out. `fitting_requests`: the same bound when the
    nodes on must also hold the pods' requests (`power_bound(fit_requests=True)`)."""
    entry: dict = {
        "energy_kwh": round(bound.value, 4),
        "power_offs_per_node_day": round(
            bound.power_offs / (results[0].nodes * results[0].duration_s / 86_400.0), 3
        ),
        "mean_nodes_off": round(bound.mean_nodes_off, 3),
        "window_s": DEFAULT_WINDOW_S,
        "cooldown_s": limits.cooldown_s,
        "cycle_limit_per_node_day": limits.max_cycles_per_node_day,
        "lp_variables": bound.variables,
        "lp_constraints": bound.constraints,
    }
    if fitting_requests is not None:
        entry["fitting_requests_kwh"] = round(fitting_requests.value, 4)
    baseline = next((r for r in results if r.policy == "default"), None)
    if baseline is not None and baseline.energy_kwh > 0:
        entry["energy_vs_default"] = round(bound.value / baseline.energy_kwh, 4)
        bound_saving_kwh = baseline.energy_kwh - bound.value
        if bound_saving_kwh > 0:
            entry["saving_share"] = {
                r.policy: round((baseline.energy_kwh - r.energy_kwh) / bound_saving_kwh, 4)
                for r in results
                if r.nodes_on is not None and "power-management" in r.policy
            }
        if fitting_requests is not None and baseline.energy_kwh > fitting_requests.value:
            entry["saving_share_fitting_requests"] = {
                policy: round(
                    (
                        baseline.energy_kwh
                        - next(r for r in results if r.policy == policy).energy_kwh
                    )
                    / (baseline.energy_kwh - fitting_requests.value),
                    4,
                )
                for policy in entry.get("saving_share", {})
            }
    return entry


def print_bound(report: dict) -> None:
    """The bound's line, and each power-managed policy's distance to it."""
    bound = report["bound"]
    versus = (
        f" ({1.0 - bound['energy_vs_default']:.1%} less than default)"
        if "energy_vs_default" in bound
        else ""
    )
    limit = bound["cycle_limit_per_node_day"]
    print(
        f"bound: no power management of this trace uses less than {bound['energy_kwh']:.2f} kWh"
        f"{versus}, with the same boots, shutdowns and off power, a {bound['cooldown_s']:.0f} s "
        f"cool-down{'' if limit is None else f' and <= {limit:g} power cycles per node-day'} "
        f"(bench.sim.bound: hindsight, fluid load, convex envelopes, on/off fractional; its "
        f"relaxed schedule keeps {bound['mean_nodes_off']:.1f} nodes off on average, "
        f"{bound['power_offs_per_node_day']:.2f} power-offs per node-day)"
    )
    baseline = report["policies"].get("default")
    if "fitting_requests_kwh" in bound:
        fitting = bound["fitting_requests_kwh"]
        versus = (
            f" ({1.0 - fitting / baseline['energy_kwh']:.1%} less than default)"
            if baseline and baseline["energy_kwh"] > 0
            else ""
        )
        print(
            f"  the same bound with the pods' CPU requests (and DaemonSets') fitting on the "
            f"nodes on, as kube-scheduler places: {fitting:.2f} kWh{versus}"
        )
    for policy, share in bound.get("saving_share", {}).items():
        saving = baseline["energy_kwh"] - report["policies"][policy]["energy_kwh"]
        cycles = report["policies"][policy]["power_cycles_per_node_day"]
        beyond = (
            f"; it cycles {cycles:.2f} times per node-day, beyond the bound's limit"
            if limit is not None and cycles > limit
            else ""
        )
        fitting_share = bound.get("saving_share_fitting_requests", {}).get(policy)
        also = (
            f"; {fitting_share:.1%} of the requests-fitting bound's"
            if fitting_share is not None
            else ""
        )
        print(
            f"  {policy}: our saving is {share:.1%} of the bound's saving "
            f"({saving:.2f} of {baseline['energy_kwh'] - bound['energy_kwh']:.2f} kWh{beyond})"
            f"{also}"
        )


# The table's columns: (header, width, what it is). The legend under the table prints the third.
COLUMNS: tuple[tuple[str, int, str], ...] = (
    ("energy kWh", 10, "energy the cluster drew"),
    ("vs default", 10, "energy / the default scheduler's"),
    ("above idle kWh", 14, "energy above the nodes' idle power: what placement can change"),
    ("fans kWh", 8, "what fans added (CPUs above 50 C)"),
    ("above envelope kWh", 18, "drawn above the curves' convex envelopes (partly loaded nodes)"),
    ("unplaced", 8, "pods never placed within --max-pending"),
    ("wait p99 s", 10, "99th percentile of arrival-to-placement time"),
    ("waits > 30 s", 12, "placements more than 30 s after arrival (or eviction)"),
    ("wait max s", 10, "longest arrival-to-placement time"),
    ("moved", 5, "running pods moved by a rescheduling policy"),
    ("slowdown", 8, "mean (run time / work): > 1 when nodes are overcommitted"),
    ("overcommit node-h", 17, "node-hours with more CPU wanted than the node has"),
    ("powerless node-h", 16, "node-hours battery nodes spent powerless (0-15 % charge)"),
    ("cycles/node-day", 15, "power-offs per node per day"),
)


def policy_label(policy: str, report: dict) -> str:
    """A policy's name in the tables; the default scheduler's names its kube-scheduler."""
    if policy.startswith("default"):
        version = report.get("settings", {}).get("kube_version", DEFAULT_KUBE_VERSION)
        return f"{policy} (kube-scheduler v{version})"
    return policy


def print_table(results: Sequence[PolicyResult], report: dict) -> None:
    width = max(20, *(len(policy_label(r.policy, report)) for r in results))
    print(f"{'policy':<{width}} " + " ".join(f"{h:>{w}}" for h, w, _ in COLUMNS))
    for result in results:
        entry = report["policies"][result.policy]
        values = (
            f"{result.energy_kwh:.2f}",
            # "-" when the run has no default policy to compare with
            f"{entry['energy_vs_default']:.3f}" if "energy_vs_default" in entry else "-",
            f"{result.dynamic_energy_kwh:.2f}",
            f"{result.fan_energy_kwh:.2f}",
            f"{result.above_envelope_energy_kwh:.2f}",
            f"{result.unplaced_pods:d}",
            f"{entry['pod_wait_s']['p99']:.0f}",
            f"{result.pods_waiting_over_30_s:d}",
            f"{entry['pod_wait_s']['max']:.0f}",
            f"{result.moved_pods:d}",
            f"{result.mean_slowdown:.3f}",
            f"{result.overcommitted_node_hours:.2f}",
            f"{result.powerless_node_hours:.2f}",
            f"{result.power_cycles_per_node_day:.2f}",
        )
        print(
            f"{policy_label(result.policy, report):<{width}} "
            + " ".join(f"{v:>{w}}" for v, (_, w, _) in zip(values, COLUMNS, strict=True))
        )
    print("columns:")
    for header, _, meaning in COLUMNS:
        print(f"  {header:<19} {meaning}")


def print_preset_figures(results: Sequence[PolicyResult], report: dict) -> None:
    """The preset's own figures, for the presets that have any: CO2 when the preset counts it
    (multizone), failed pod starts (faults) and each `PolicyResult.kpis` (power states...)."""
    counts_co2 = any(r.co2_kg > 0 for r in results)
    counts_failures = any(r.failed_pod_starts for r in results)
    keys = sorted({key for r in results for key in r.kpis})
    headers = (["co2 kg", "vs default"] if counts_co2 else []) + (
        ["failed_pod_starts"] if counts_failures else []
    )
    if not headers + keys:
        return
    baseline = report["policies"].get("default")
    width = max(20, *(len(policy_label(r.policy, report)) for r in results))
    widths = [max(10, len(h)) for h in headers + keys]
    print("preset figures:")
    print(
        f"{'policy':<{width}} "
        + " ".join(f"{h:>{w}}" for h, w in zip(headers + keys, widths, strict=True))
    )
    for result in results:
        values: list[str] = []
        if counts_co2:
            values.append(f"{result.co2_kg:.3f}")
            values.append(
                f"{result.co2_kg / baseline['co2_kg']:.3f}"
                if baseline and baseline["co2_kg"] > 0
                else "-"
            )
        if counts_failures:
            values.append(f"{result.failed_pod_starts:d}")
        values += [f"{result.kpis[key]:g}" if key in result.kpis else "-" for key in keys]
        print(
            f"{policy_label(result.policy, report):<{width}} "
            + " ".join(f"{v:>{w}}" for v, w in zip(values, widths, strict=True))
        )


# ---- CLI ------------------------------------------------------------------------------------


def chosen_cluster(argv: Sequence[str] | None) -> BenchSettings:
    """The fleet, nodes and seed `argv` asks for (defaults where it names none or names them
    wrongly: the full parser reports that), so --help can say what that cluster has."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--fleet", choices=list(FLEETS), default=None)
    early.add_argument("--nodes", type=int, default=None)
    early.add_argument("--seed", type=int, default=None)
    early.add_argument("--preset", choices=sorted(PRESETS), default=None)
    try:
        known, _ = early.parse_known_args(argv)
    except SystemExit:  # a bad value: the real parse says so
        return BenchSettings()
    preset = PRESETS[known.preset or BenchSettings.preset]
    given = {k: v for k, v in vars(known).items() if v is not None and k != "preset"}
    settings, _ = apply_preset_defaults(preset, BenchSettings(), SimSettings(), set(given))
    settings = replace(settings, **given)
    return settings if settings.nodes >= 1 else BenchSettings()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The bench's parser; `argv` (when given) chooses the cluster the presets' help describes."""
    d, s = BenchSettings(), SimSettings()
    policy_lines = "; ".join(
        f"{spec.name} = {spec.description}{' [reference]' if spec.reference else ''}"
        for spec in POLICIES.values()
    )
    chosen = chosen_cluster([] if argv is None else argv)
    preset_lines = "; ".join(
        f"{p.name} = {describe_preset(p, replace(chosen, preset=p.name))} "
        f"(runs {', '.join(p.policies)})"
        for p in PRESETS.values()
    )
    parser = argparse.ArgumentParser(
        prog="python -m bench.energy_sim",
        description=(
            "Simulate a heterogeneous cluster and compare the energy of placement policies on "
            "the same pod trace; the power-aware policies call the real extender over HTTP. "
            "Prints a table and ratios against the default scheduler. "
            f"Presets: {preset_lines}. Policies: {policy_lines}. [reference] policies are priced "
            "on the simulator's true curves: they show what is possible, they are not deployable."
        ),
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
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=d.preset,
        help="kind of cluster and workload, and the policies run unless --policies is given",
    )
    parser.add_argument(
        "--policies",
        metavar="LIST",
        default=None,
        help=f"comma-separated policies to run, from {', '.join(POLICIES)} (default: the preset's)",
    )
    cluster = parser.add_argument_group("cluster and models")
    cluster.add_argument(
        "--fleet",
        choices=list(FLEETS),
        default=None,
        help="whose servers the nodes are, each with its real core count: "
        + "; ".join(f"{name} = {text}" for name, text in FLEET_DESCRIPTIONS.items())
        + f" (default {d.fleet}); the generated workload scales with the fleet's cores",
    )
    cluster.add_argument(
        "--max-pods",
        metavar="N",
        type=int,
        default=None,
        help="pods a node admits, DaemonSet pods included (the kubelet's --max-pods; default: "
        + ", ".join(f"{MAX_PODS_BY_PERIOD[p]} on {p} servers" for p in MAX_PODS_BY_PERIOD)
        + ")",
    )
    cluster.add_argument(
        "--nodes",
        metavar="N",
        type=int,
        default=None,
        help=f"simulated nodes (default {d.nodes}, or the preset's)",
    )
    cluster.add_argument(
        "--seed",
        metavar="SEED",
        type=int,
        default=None,
        help=f"seed of the fleet, trace and tie breaks (default {d.seed})",
    )
    cluster.add_argument(
        "--history-hours",
        metavar="HOURS",
        type=float,
        default=None,
        help="hours of synthetic telemetry per node the extender's models are fitted on "
        f"(default {d.history_hours:g})",
    )
    cluster.add_argument(
        "--battery-share",
        metavar="FRACTION",
        type=float,
        default=None,
        help="share of nodes (0..1) on battery + solar; their energy-status labels change "
        f"(default {d.battery_share:g})",
    )
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--hours",
        metavar="HOURS",
        type=float,
        default=None,
        help=f"hours of generated pod arrivals (default {d.hours:g})",
    )
    workload.add_argument(
        "--load",
        metavar="FRACTION",
        type=float,
        default=None,
        help="mean requested CPU of the generated trace, as a share (0..1) of allocatable CPU "
        f"(default {d.load:g})",
    )
    workload.add_argument(
        "--trace",
        metavar="CSV",
        type=Path,
        default=None,
        help="CSV pod trace instead of a generated one",
    )
    workload.add_argument(
        "--delay-share",
        metavar="FRACTION",
        type=float,
        default=None,
        help="edge preset: share of pods (0..1) carrying a delay_<node> limit "
        f"(default {d.delay_share:g})",
    )
    workload.add_argument(
        "--cloud-weight",
        metavar="WEIGHT",
        type=float,
        default=None,
        help="edge preset: CloudPreference's weight in power-aware+delay+cloud, beside "
        + " and ".join(f"{name} {weight:g}" for name, weight in DEFAULT_SCORES)
        + f" (default {d.cloud_weight:g})",
    )
    sim = parser.add_argument_group("simulation")
    sim.add_argument(
        "--kube-version",
        choices=KUBE_VERSIONS,
        default=None,
        help="whose default plugins and scores the simulated kube-scheduler gives, in every "
        "policy that runs them (default "
        f"{s.kube_version}; 1.28 scores BalancedAllocation on the balance after placement)",
    )
    sim.add_argument(
        "--tick",
        metavar="SECONDS",
        type=float,
        default=None,
        help=f"physics step, seconds (default {s.tick_s:g})",
    )
    sim.add_argument(
        "--scrape-interval",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds between telemetry updates sent to the extender "
        f"(default {s.scrape_interval_s:g})",
    )
    sim.add_argument(
        "--telemetry-lag",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds by which telemetry trails the load (scrape + rate window; "
        f"default {s.telemetry_lag_s:g})",
    )
    sim.add_argument(
        "--assumed-window",
        metavar="SECONDS",
        type=float,
        default=None,
        help="extender --assumed-window: seconds a bound pod's CPU counts as assumed load "
        f"(default {d.assumed_window_s:g})",
    )
    sim.add_argument(
        "--extender-weight",
        metavar="WEIGHT",
        type=int,
        default=None,
        help="extender weight in KubeSchedulerConfiguration (manifests/base/scheduler.yaml uses 5; "
        f"default {d.extender_weight})",
    )
    sim.add_argument(
        "--reschedule-every",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds between the rescheduling reference's rounds of free pod moves "
        f"(default {d.reschedule_interval_s:g})",
    )
    sim.add_argument(
        "--max-pending",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds a pod may wait for a node before it counts as unplaced "
        f"(default {s.max_pending_s:g})",
    )
    sim.add_argument(
        "--tail-hours",
        metavar="HOURS",
        type=float,
        default=None,
        help="simulated hours after the last arrival, so that running pods finish and their "
        f"energy counts (default {s.tail_s / 3600.0:g}); the plot runs this much longer",
    )
    sim.add_argument(
        "--empty-node-power",
        type=float,
        default=None,
        metavar="WATTS",
        help="if set, a node running no pods sleeps at this power (instant wake-up, "
        "optimistic); by default every node stays on and pays its idle power",
    )
    carbon = parser.add_argument_group("carbon (the multizone preset)")
    carbon.add_argument(
        "--zones",
        metavar="N",
        type=int,
        default=None,
        help=f"grid zones the nodes are dealt over (default {d.zones})",
    )
    carbon.add_argument(
        "--zone-intensity",
        metavar="LOW,HIGH",
        type=_intensity_range,
        default=None,
        help="long-run mean carbon intensity of the cleanest and the dirtiest zone, g/kWh; the "
        f"others are spread geometrically between (default {d.zone_low_g_per_kwh:g},"
        f"{d.zone_high_g_per_kwh:g})",
    )
    carbon.add_argument(
        "--carbon-csv",
        metavar="CSV",
        default=None,
        help="real hourly series instead of generated ones: columns timestamp, zone, "
        "carbon_intensity_g_per_kwh (bench.sim.carbon_series)",
    )
    carbon.add_argument(
        "--deferrable-share",
        metavar="FRACTION",
        type=float,
        default=None,
        help="share of pods (0..1) annotated power-aware-scheduler/defer-until "
        f"(default {d.deferrable_share:g})",
    )
    carbon.add_argument(
        "--defer-hours",
        metavar="HOURS",
        type=float,
        default=None,
        help=f"how long after creation a deferrable pod may start (default {d.defer_hours:g})",
    )
    carbon.add_argument(
        "--defer-margin",
        metavar="FRACTION",
        type=float,
        default=None,
        help="the Carbon plugin's deferMargin in power-aware+carbon: how much cleaner (0..1) "
        f"a window must be for a deferrable pod to wait (default {d.defer_margin:g})",
    )
    carbon.add_argument(
        "--carbon-weights",
        metavar="POWER,CARBON",
        type=_weights,
        default=None,
        help="PowerIncrease and Carbon weights in power-aware+carbon's profile, EnergyLevel "
        f"keeping 0.4 (default {d.carbon_power_weight:g},{d.carbon_weight:g})",
    )
    carbon.add_argument(
        "--carbon-horizon",
        metavar="HOURS",
        type=float,
        default=None,
        help="power-aware+carbon+power-management-grams: the controller ranks nodes by their "
        "zone's mean forecast intensity over the next HOURS (its --carbon-horizon); 0: the "
        f"present hour's (default {d.carbon_horizon_s / 3600.0:g})",
    )
    power = parser.add_argument_group(
        "power states (policies with power management: default+autoscaler, "
        "power-aware+power-management; bench.sim.power cites the figures)"
    )
    power.add_argument(
        "--boot-time",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds from power-on to a Ready node that takes pods "
        f"(default {s.boot_s:g}: published figures span 8 s to 15+ min)",
    )
    power.add_argument(
        "--boot-power-share",
        metavar="FRACTION",
        type=float,
        default=None,
        help="power while booting, between idle (0) and peak (1) "
        f"(default {s.boot_power_share:g}: an assumption)",
    )
    power.add_argument(
        "--shutdown-time",
        metavar="SECONDS",
        type=float,
        default=None,
        help=f"seconds a node draws idle power shutting down (default {s.shutdown_s:g})",
    )
    power.add_argument(
        "--off-power",
        metavar="WATTS",
        type=float,
        default=None,
        help=f"watts a node draws while off, its BMC on standby (default {s.off_power_w:g}: "
        "an assumption, 5-15 W)",
    )
    power.add_argument(
        "--power-interval",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds between the power managers' rounds (cluster-autoscaler's --scan-interval; "
        f"default {s.power_interval_s:g})",
    )
    power.add_argument(
        "--power-management-profile",
        metavar="FILE",
        default=None,
        help="the extender's profile in power-aware+power-management (default "
        "bench/sim/profiles/power-management.yaml: the default profile + Consolidation)",
    )
    power.add_argument(
        "--cooldown",
        metavar="SECONDS",
        type=float,
        default=None,
        help="the node power controller's cool-down: a node powered on less than this long ago "
        "stays on (default: controllers.node_power.policy's, 1800)",
    )
    power.add_argument(
        "--off-margin-sd",
        metavar="SD",
        type=float,
        default=None,
        help="the node power controller's margin between waking and powering off, in standard "
        "deviations of a boot time's arrivals (default: controllers.node_power.policy's, 2)",
    )
    power.add_argument(
        "--min-headroom-cores",
        metavar="CORES",
        type=float,
        default=None,
        help="the node power controller's standing reserve: free CPU it keeps on whatever the "
        "arrival rate (its --min-headroom-cores; default: controllers.node_power.policy's, 0)",
    )
    power.add_argument(
        "--headroom-factor",
        metavar="FACTOR",
        type=float,
        default=None,
        help="the node power controller's headroom as a multiple of what arrives at the recent "
        "rate during a boot (its --headroom-factor; default: controllers.node_power.policy's, 1)",
    )
    power.add_argument(
        "--target-wait-p99-s",
        metavar="SECONDS",
        type=float,
        default=None,
        help="the node power controller's target for pods' p99 wait: it learns a headroom from "
        "the demand growth within a boot time by hour of day, at a quantile the observed waits "
        "adapt (its --target-wait-p99-s; default: none)",
    )
    power.add_argument(
        "--arrival-windows",
        metavar="S1,S2",
        type=_seconds_list,
        default=None,
        help="windows (seconds) of the controller's arrival-rate meter, whose highest rate sets "
        "the headroom (default: one boot time and six, ArrivalRateMeter.for_boot_time)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--out-dir",
        metavar="DIR",
        type=Path,
        default=DEFAULT_OUT_DIR,
        help="directory for the bundle cache, the PNG and the decisions CSV "
        f"(default {DEFAULT_OUT_DIR})",
    )
    out.add_argument(
        "--json", metavar="FILE", type=Path, default=None, help="write the summary JSON here"
    )
    out.add_argument("--quiet", action="store_true", help="no progress bars, warnings only")
    return parser


# flag dest -> settings field (BenchSettings or SimSettings), with a conversion
FLAG_FIELDS: dict[str, tuple[str, float]] = {
    "nodes": ("nodes", 1),
    "fleet": ("fleet", 1),
    "max_pods": ("max_pods", 1),
    "seed": ("seed", 1),
    "history_hours": ("history_hours", 1),
    "battery_share": ("battery_share", 1),
    "hours": ("hours", 1),
    "load": ("load", 1),
    "tick": ("tick_s", 1),
    "scrape_interval": ("scrape_interval_s", 1),
    "telemetry_lag": ("telemetry_lag_s", 1),
    "assumed_window": ("assumed_window_s", 1),
    "extender_weight": ("extender_weight", 1),
    "reschedule_every": ("reschedule_interval_s", 1),
    "delay_share": ("delay_share", 1),
    "cloud_weight": ("cloud_weight", 1),
    "max_pending": ("max_pending_s", 1),
    "tail_hours": ("tail_s", 3600.0),
    "empty_node_power": ("empty_node_power_w", 1),
    "zones": ("zones", 1),
    "carbon_csv": ("carbon_csv", 1),
    "deferrable_share": ("deferrable_share", 1),
    "defer_hours": ("defer_hours", 1),
    "defer_margin": ("defer_margin", 1),
    "carbon_horizon": ("carbon_horizon_s", 3600.0),
    "boot_time": ("boot_s", 1),
    "boot_power_share": ("boot_power_share", 1),
    "shutdown_time": ("shutdown_s", 1),
    "off_power": ("off_power_w", 1),
    "power_interval": ("power_interval_s", 1),
    "power_management_profile": ("power_management_profile", 1),
    "cooldown": ("power_cooldown_s", 1),
    "off_margin_sd": ("off_margin_sd", 1),
    "min_headroom_cores": ("min_headroom_cores", 1),
    "headroom_factor": ("headroom_factor", 1),
    "target_wait_p99_s": ("target_wait_p99_s", 1),
    "arrival_windows": ("arrival_windows_s", 1),
    "kube_version": ("kube_version", 1),
}


def _seconds_list(text: str) -> tuple[float, ...]:
    """'60,600' -> (60.0, 600.0): positive seconds, for --arrival-windows."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r}") from None
    if not values or not all(v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"windows must be positive seconds, got {text!r}")
    return values


def _weights(text: str) -> tuple[float, float]:
    """`POWER,CARBON` weights for --carbon-weights."""
    try:
        power, carbon = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected POWER,CARBON weights, got {text!r}") from None
    if power < 0 or carbon < 0:
        raise argparse.ArgumentTypeError(f"weights must be >= 0, got {text!r}")
    return power, carbon


def _intensity_range(text: str) -> tuple[float, float]:
    """`LOW,HIGH` g/kWh for --zone-intensity."""
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH in g/kWh, got {text!r}") from None
    if not 0 < low <= high:
        raise argparse.ArgumentTypeError(f"need 0 < LOW <= HIGH, got {text!r}")
    return low, high


def settings_from_args(args: argparse.Namespace) -> tuple[BenchSettings, SimSettings]:
    """Defaults, then the preset's settings, then the flags given explicitly."""
    given = {
        field: (value * scale if scale != 1 else value)
        for flag, (field, scale) in FLAG_FIELDS.items()
        if (value := getattr(args, flag)) is not None
    }
    if args.zone_intensity is not None:
        given["zone_low_g_per_kwh"], given["zone_high_g_per_kwh"] = args.zone_intensity
    if args.carbon_weights is not None:
        given["carbon_power_weight"], given["carbon_weight"] = args.carbon_weights
    settings, sim_settings = apply_preset_defaults(
        PRESETS[args.preset], BenchSettings(preset=args.preset), SimSettings(), set(given)
    )
    bench_fields = {f.name for f in fields(BenchSettings)}
    settings = replace(settings, **{k: v for k, v in given.items() if k in bench_fields})
    sim_settings = replace(
        sim_settings, **{k: v for k, v in given.items() if k not in bench_fields}
    )
    return settings, sim_settings


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def check_settings(settings: BenchSettings, sim: SimSettings, trace: Path | None) -> str | None:
    """What is wrong with the settings, in the flag's words; None when all is well."""
    if settings.nodes < 1:
        return f"--nodes must be at least 1, got {settings.nodes}"
    if settings.max_pods is not None and settings.max_pods < 1:
        return f"--max-pods must be at least 1, got {settings.max_pods}"
    if not 0 <= settings.battery_share <= 1:
        return f"--battery-share must be 0..1, got {settings.battery_share}"
    if not 0 <= settings.delay_share <= 1:
        return f"--delay-share must be 0..1, got {settings.delay_share}"
    if not (math.isfinite(settings.cloud_weight) and settings.cloud_weight >= 0):
        return f"--cloud-weight must be a finite weight >= 0, got {settings.cloud_weight}"
    if trace is None and not 0 < settings.load < 1:
        return f"--load must be between 0 and 1, got {settings.load}"
    for flag, value in (
        ("--tick", sim.tick_s),
        ("--scrape-interval", sim.scrape_interval_s),
        ("--reschedule-every", settings.reschedule_interval_s),
    ):
        if not value > 0:
            return f"{flag} must be positive, got {value}"
    if settings.zones < 1:
        return f"--zones must be at least 1, got {settings.zones}"
    if not 0 <= settings.deferrable_share <= 1:
        return f"--deferrable-share must be 0..1, got {settings.deferrable_share}"
    if not 0 <= settings.defer_margin < 1:
        return f"--defer-margin must be 0..1, got {settings.defer_margin}"
    if not settings.defer_hours > 0:
        return f"--defer-hours must be positive, got {settings.defer_hours}"
    if not (settings.carbon_horizon_s >= 0 and math.isfinite(settings.carbon_horizon_s)):
        return f"--carbon-horizon must be >= 0 hours, got {settings.carbon_horizon_s / 3600.0}"
    if sim.tail_s < 0:
        return f"--tail-hours must be >= 0, got {sim.tail_s / 3600.0}"
    for flag, value in (
        ("--boot-time", sim.boot_s),
        ("--shutdown-time", sim.shutdown_s),
        ("--off-power", sim.off_power_w),
    ):
        if not value >= 0:
            return f"{flag} must be >= 0, got {value}"
    if not 0 <= sim.boot_power_share <= 1:
        return f"--boot-power-share must be 0..1, got {sim.boot_power_share}"
    if settings.power_cooldown_s is not None and not settings.power_cooldown_s >= 0:
        return f"--cooldown must be >= 0, got {settings.power_cooldown_s}"
    if settings.off_margin_sd is not None and not settings.off_margin_sd >= 0:
        return f"--off-margin-sd must be >= 0, got {settings.off_margin_sd}"
    for flag, value in (
        ("--min-headroom-cores", settings.min_headroom_cores),
        ("--headroom-factor", settings.headroom_factor),
        ("--target-wait-p99-s", settings.target_wait_p99_s),
    ):
        if value is not None and not value >= 0:
            return f"{flag} must be >= 0, got {value}"
    profile = settings.power_management_profile
    if profile and not Path(profile).is_file():
        return f"--power-management-profile: no such file {profile}"
    if not sim.power_interval_s > 0:
        return f"--power-interval must be positive, got {sim.power_interval_s}"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    setup_logging(args.quiet)
    preset = PRESETS[args.preset]
    if args.policies is None:
        policies = list(preset.policies)
    else:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        return fail(
            f"--policies: unknown {', '.join(unknown) or '(none)'}; pick from {', '.join(POLICIES)}"
        )
    settings, sim_settings = settings_from_args(args)
    problem = check_settings(settings, sim_settings, args.trace)
    if problem is not None:
        return fail(problem)
    progress = not args.quiet
    try:
        scenario = build_scenario(settings, sim_settings, trace_csv=args.trace)
    except (TraceError, SeriesError) as exc:
        return fail(str(exc))
    cluster, trace = scenario.cluster, scenario.trace
    log.info(
        "preset %s: %d nodes, %.0f cores, %d on battery; trace: %d pods over %.1f h",
        settings.preset,
        len(cluster),
        cluster.cores.sum(),
        int(cluster.on_battery.sum()),
        len(trace),
        trace.end_s / 3600.0,
    )
    if any(POLICIES[p].needs_bundle for p in policies):
        try:
            scenario.bundle_dir = trained_bundle(settings, args.out_dir, progress=progress)
        except FitError as exc:
            return fail(f"fitting the extender's models failed: {exc}")

    results: list[PolicyResult] = []
    extras: dict[str, dict] = {}
    for name in policies:
        started = time.perf_counter()
        try:
            result, figures = run_policy(name, scenario, progress=progress)
        except BundleError as exc:
            return fail(f"{exc} (try another --seed or --history-hours)")
        except PolicyNotApplicable as exc:
            return fail(str(exc))
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
    bound_entry = None
    if sim_settings.empty_node_power_w is None and any(r.nodes_on is not None for r in results):
        # The bound on any power management, beside the policies that power nodes off.
        limits = limits_for(scenario)
        horizon_s, tick_s = results[0].duration_s, sim_settings.tick_s
        bound = power_bound(cluster, trace, horizon_s, tick_s, limits)
        fitting = power_bound(cluster, trace, horizon_s, tick_s, limits, fit_requests=True)
        bound_entry = bound_summary(results, bound, limits, fitting)
    report = {
        "settings": {
            **asdict(settings),
            **asdict(sim_settings),
            "trace": str(args.trace or "generated"),
        },
        **summary(results, extras, ceiling_kwh),
        **({"bound": bound_entry} if bound_entry is not None else {}),
        "cluster": {
            "nodes": len(cluster),
            "cores": float(cluster.cores.sum()),
            "battery_nodes": int(cluster.on_battery.sum()),
            "idle_power_w": float((cluster.spec.idle_share * cluster.spec.max_power_w).sum()),
            "max_power_w": float(cluster.spec.max_power_w.sum()),
        },
    }
    png = args.out_dir / "energy_sim_power.png"
    decisions_csv = args.out_dir / "energy_sim_decisions.csv"
    plot_power(png, results, float(trace.end_s))
    rows = write_decisions(decisions_csv, results)
    print_table(results, report)
    if preset.report is not None:
        figures = preset.report(scenario, results)
        if figures:
            report["preset"] = dict(figures)
    print_preset_figures(results, report)
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
    if "bound" in report:
        print_bound(report)
    print(f"plot: {png}\ndecisions: {decisions_csv} ({rows} rows)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"summary: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
