"""Benchmark accuracy on real servers' power curves (SPECpower_ssj2008), sampled as fleets are.

Each held-out server of a SPECpower sample (`--sample old`, servers of 2007-2016, the default;
`--sample modern`, 2017-2025: the committed splits, `bench.specpower_split`: the shape prior is
learned from the prior sides of both samples, never from these nor their processor models)
becomes a node with a week of contract-1 telemetry from `training.synth`: load spread over time
by `--sampling`, CPU temperatures following it by `--temperature`, fans, ambient swings, BMC
noise, whole-watt or 5 W readings, missing samples and sensor dropouts. Its power at
steady-state temperatures is the measured SPECpower curve: for `levels` the straight lines
between the measured levels it was held at (0, 20, ..., 100 %), so the rows say nothing about
the loads between; otherwise a smooth monotone interpolation (PCHIP) through all 11 points.
The telemetry carries the node facts a cluster would report (contract 1's optional columns:
the server's processor, cores and sockets, the highest power read, a power-supply rating), so
the prior draws on the node's generation, and above its highest load on its cores and sockets;
`--no-facts` leaves them out.

The whole fleet goes through the real pipeline (`training.fit.fit_fleet`: family choice, ONNX,
parity, bundle), then each node's model in the bundle (its own, or the fleet fallback it was
given) predicts power at the scored loads, at steady-state temperatures, and is compared with
SPECpower's measurement there:

| sampling | trained on | scored at |
| --- | --- | --- |
| levels | held around 0, 20, ..., 100 % | 10, 30, 50, 70, 90 % (never seen) |
| even | the whole range | 10, 30, 50, 70, 90 % |
| mostly-idle | idle for hours, short peaks | 10, 30, 50, 70, 90 % |
| lowload | never above 50 % | 60, 70, 80, 90, 100 % (extrapolated) |

Printed per case, over *every* scored server, fallback included: median and p90 MAPE of our
models, the same for the idle-to-max straight line through the node's least and most loaded
training rows (for `lowload` that is the line through idle and the 50 % point, extended), on
how many servers ours beats it, the servers where ours is worse, and which families were
chosen. For `levels` also linear interpolation between the held levels' mean power. For
`levels` and `lowload` (scored at loads the nodes never showed) also the shape prior fed the
*exact* SPECpower watts at the loads the node showed (`prior_from_exact_points`): no telemetry,
no fit, so what the prior alone makes of a perfectly measured curve. Our models cannot be
expected to beat it by much; where they are near it, the prior, not the fit, sets the error.

    python3 -m bench.accuracy_specpower [--sampling levels|even|mostly-idle|lowload|all]
        [--temperature tight|loose|tight,loose] [--hours 168] [--seed 7]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.interpolate import PchipInterpolator

from bench.specpower_split import SAMPLES, read_split, result_id
from livedata.metrics_table import CPU_UTIL, FACT_COLUMNS, NODE, POWER_W
from predictor.bundle import read_bundle
from predictor.curves import ExtrapolationBand
from training.dataset import clean_metrics
from training.export import onnx_predict_w
from training.families import DEFAULT_FAMILIES
from training.fit import FitSettings, fit_fleet, heldout_start_index
from training.fit.cli import setup_logging
from training.node_facts import NodeFacts
from training.report import IdleToMaxLine
from training.shape_prior import GRID_UTIL, SHARE_COLUMNS, ShapePrior
from training.synth import (
    AMBIENT_MEAN_C,
    HELD_LEVELS,
    SAMPLINGS,
    TEMPERATURE_MODES,
    FleetSpec,
    fleet_telemetry,
    servers_spec,
    steady_state_cpu_temps_c,
)

log = logging.getLogger("bench.accuracy_specpower")

DEFAULT_CSV = Path("../shared/data/specpower/ssj2008-sample.csv")
LOAD_COLUMNS = ["watts_idle"] + [f"watts_{pct}" for pct in range(10, 101, 10)]
# What a cluster tells of a server's hardware that SPECpower records too (node_cpu_info's
# cores and packages: `training.node_facts`), in this order.
HARDWARE_COLUMNS = ["cores", "chips"]
SCORED_LOADS_PCT = {
    "levels": (10, 30, 50, 70, 90),
    "even": (10, 30, 50, 70, 90),
    "mostly-idle": (10, 30, 50, 70, 90),
    "lowload": (60, 70, 80, 90, 100),
}
# The grid points (0, 10, ..., 100 %) each sampling shows a node, where it is scored at others.
SHOWN_GRID_POINTS = {
    "levels": tuple(int(i) for i in np.rint(HELD_LEVELS * 10)),
    "lowload": (0, 1, 2, 3, 4, 5),
}


@dataclass
class Servers:
    """The held-out servers as nodes, and the prior learned from the others."""

    names: list[str]
    curves_w: np.ndarray  # [n, 11] measured watts at 0, 10, ..., 100 %
    table: pd.DataFrame  # the shipped shapes table's columns, one row per held-out server
    prior: ShapePrior
    n_prior: int


def prior_side(csv: Path, split_csv: Path, generation: str) -> PriorSide:
    """One sample's prior side: its curves, processor models and generation."""
    sample, split = read_sample(csv, split_csv)
    chosen = (sample["result"].map(split["split"]) == "prior").to_numpy()
    return PriorSide(
        curves_w=sample[LOAD_COLUMNS].to_numpy(np.float64)[chosen],
        models=sample["result"].map(split["processor_model"]).to_numpy()[chosen],
        generations=[generation] * int(chosen.sum()),
        hardware=sample[HARDWARE_COLUMNS].to_numpy(np.float64)[chosen],
    )


@dataclass
class PriorSide:
    curves_w: np.ndarray  # [m, 11]
    models: np.ndarray  # processor model per server
    generations: list[str]
    hardware: np.ndarray  # [m, 2] cores and sockets (HARDWARE_COLUMNS)


def other_prior_sides(csv: Path) -> list[PriorSide]:
    """The prior sides of the samples other than `csv` (both priors learn from every sample's
    prior side), when they are found; the sample at `csv` itself is not among them."""
    sides = []
    for generation, (other_csv, other_split) in SAMPLES.items():
        if other_csv.resolve() != csv.resolve() and other_csv.is_file():
            sides.append(prior_side(other_csv, other_split, generation))
    return sides


def sample_generation(csv: Path) -> str | None:
    """`old` or `modern` for one of `SAMPLES`' files, else None."""
    for generation, (known_csv, _) in SAMPLES.items():
        if known_csv.resolve() == csv.resolve():
            return generation
    return None


def read_sample(csv: Path, split_csv: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The sample and the committed split, row for row (the split indexed by result id);
    exits with a clear error when they do not match."""
    sample = pd.read_csv(csv)
    sample["result"] = sample["disclosure_url"].map(result_id)
    split = read_split(split_csv).set_index("result")
    unknown = sorted(set(sample["result"]) - set(split.index))
    if unknown or len(split) != len(sample):
        raise SystemExit(
            f"error: {csv} does not match the committed split {split_csv} "
            f"({len(sample)} servers vs {len(split)}; not in the split: {unknown[:3]}); "
            "regenerate it with python3 -m bench.specpower_split"
        )
    return sample, split


def shapes_table(sample: pd.DataFrame, curves_w: np.ndarray, chosen: np.ndarray) -> pd.DataFrame:
    """The chosen servers in the shipped shapes table's columns (`training.synth` reads them)."""
    return pd.DataFrame(
        {
            "result": sample["result"][chosen].to_numpy(),
            "processor": sample["processor"][chosen].to_numpy(),
            "chips": sample["chips"][chosen].to_numpy(),
            "cores": sample["cores"][chosen].to_numpy(),
            "watts_max": curves_w[chosen, -1],
            **{
                column: curves_w[chosen, i] / curves_w[chosen, -1]
                for i, column in enumerate(SHARE_COLUMNS)
            },
        }
    )


def load_servers(csv: Path, split_csv: Path) -> Servers:
    """Read the sample, check it against the committed split, learn the prior on its prior
    side and on the prior sides of the other samples (`SAMPLES`), each server marked with its
    generation: no scored server, nor any of its processor model, is in the prior."""
    sample, split = read_sample(csv, split_csv)
    curves_w = sample[LOAD_COLUMNS].to_numpy(np.float64)
    side = sample["result"].map(split["split"]).to_numpy()
    held_out = side == "eval"
    sides = [
        PriorSide(
            curves_w[side == "prior"],
            sample["result"].map(split["processor_model"]).to_numpy()[side == "prior"],
            [sample_generation(csv)] * int(np.sum(side == "prior")),
            sample[HARDWARE_COLUMNS].to_numpy(np.float64)[side == "prior"],
        ),
        *other_prior_sides(csv),
    ]
    scored_models = set(sample["result"].map(split["processor_model"])[held_out])
    keep = [~np.isin(s.models, list(scored_models)) for s in sides]
    return Servers(
        names=[f"spec-{i:03d}" for i in np.flatnonzero(held_out)],
        curves_w=curves_w[held_out],
        table=shapes_table(sample, curves_w, held_out),
        prior=ShapePrior.from_curves(
            np.vstack([s.curves_w[k] for s, k in zip(sides, keep, strict=True)]),
            generations=[
                g
                for s, k in zip(sides, keep, strict=True)
                for g in np.array(s.generations, dtype=object)[k]
            ],
            groups=[m for s, k in zip(sides, keep, strict=True) for m in s.models[k]],
            hardware=np.vstack([s.hardware[k] for s, k in zip(sides, keep, strict=True)]),
        ),
        n_prior=int(sum(k.sum() for k in keep)),
    )


def steady_power(curves_w: np.ndarray, sampling: str):
    """Utilisation [n, T] -> each server's power at steady state, from its measured curve."""
    if sampling == "levels":
        levels = list(SHOWN_GRID_POINTS["levels"])  # grid indices 0, 2, ..., 10

        def between_levels(util: np.ndarray) -> np.ndarray:
            return np.vstack(
                [
                    np.interp(u, GRID_UTIL[levels], c[levels])
                    for u, c in zip(util, curves_w, strict=True)
                ]
            )

        return between_levels
    curves = [PchipInterpolator(GRID_UTIL, c) for c in curves_w]

    def smooth(util: np.ndarray) -> np.ndarray:
        return np.vstack([f(np.clip(u, 0.0, 1.0)) for u, f in zip(util, curves, strict=True)])

    return smooth


def steady_feature_rows(spec: FleetSpec, loads_u: np.ndarray) -> np.ndarray:
    """[nodes, loads, features] model inputs at steady state: each node's mean ambient, its CPU
    temperatures settled at each load (CPU1's on one-socket nodes, the manifest's fill)."""
    n_nodes = len(spec.names)
    util = np.tile(loads_u, (n_nodes, 1))
    ambient_c = AMBIENT_MEAN_C + spec.ambient_offset_c[:, None]
    cpu1_c, cpu2_c = steady_state_cpu_temps_c(spec, util, ambient_c)
    cpu2_c = np.where(spec.sockets[:, None] == 1, cpu1_c, cpu2_c)
    return np.stack([util, np.broadcast_to(ambient_c, util.shape), cpu1_c, cpu2_c], axis=-1).astype(
        np.float32
    )


def server_facts(row: pd.Series) -> NodeFacts:
    """What a cluster would tell of a SPECpower server (a shapes-table row): its processor,
    cores and sockets."""
    return NodeFacts(
        cpu_model=str(row["processor"]),
        cpu_cores=float(row["cores"]),
        cpu_sockets=float(row["chips"]),
    )


def prior_from_exact_points(
    prior: ShapePrior,
    curve_w: np.ndarray,
    sampling: str,
    loads_u: np.ndarray,
    facts: NodeFacts | None = None,
) -> np.ndarray:
    """The prior's prediction at `loads_u` (grid points) from a server's exact watts at the
    grid points `sampling` shows (`SHOWN_GRID_POINTS`), as `training.monoshape`'s pass 3 draws
    it: the conditional shape through those points, scaled by their rise from idle to the
    highest one. A node's fit from telemetry replaces the exact watts with estimated ones."""
    shown = SHOWN_GRID_POINTS[sampling]
    top = max(shown)
    observed = np.zeros(len(GRID_UTIL), dtype=bool)
    observed[list(shown)] = True
    prior = prior.for_generation(facts.generation if facts is not None else None)
    # Between shown points the node's data say nothing: straight lines, as a fit would leave.
    seen_w = np.interp(GRID_UTIL[: top + 1], GRID_UTIL[list(shown)], curve_w[list(shown)])
    shape = np.concatenate(
        [[0.0], np.cumsum(prior.conditional_shape(seen_w, top, observed, facts))]
    )
    shape_w = seen_w[0] + (seen_w[top] - seen_w[0]) * shape / shape[top]
    return np.interp(loads_u, GRID_UTIL, shape_w)


@dataclass
class CaseResult:
    sampling: str
    temperature: str
    ours_pct: np.ndarray
    line_pct: np.ndarray
    interp_pct: np.ndarray | None
    exact_prior_pct: np.ndarray | None
    # scored points above a node's highest trained load, and how many of them the measured
    # watts fell inside its model's band at (`extrapolation_interval`)
    band_points: int
    band_inside: int
    families: dict[str, int]
    fallback: list[dict]
    names: list[str]
    fit_s: float
    rows_per_node: float


def run_case(
    servers: Servers,
    sampling: str,
    temperature: str,
    args: argparse.Namespace,
) -> CaseResult:
    spec = servers_spec(servers.table, args.seed, names=servers.names)
    telemetry = fleet_telemetry(
        spec,
        args.hours,
        args.step,
        args.seed,
        sampling=sampling,
        temperature=temperature,
        steady_power_w=steady_power(servers.curves_w, sampling),
    )
    if not args.facts:
        telemetry = telemetry.drop(columns=[c for c in FACT_COLUMNS if c in telemetry.columns])
    cleaned = clean_metrics(telemetry, source=f"SPECpower held-out servers, {sampling} load")
    settings = FitSettings(
        families=tuple(args.families.split(",")), seed=args.seed, shape_prior=servers.prior
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specpower-") as work:
        out = Path(work) / "bundle"
        run = fit_fleet(
            cleaned, out, settings=settings, jobs=args.jobs or None, progress=not args.quiet
        )
        fit_s = time.perf_counter() - started
        bundle = read_bundle(out)
        loads_pct = SCORED_LOADS_PCT[sampling]
        loads_u = np.array(loads_pct, dtype=float) / 100
        truth_index = np.rint(loads_u * 10).astype(int)
        frame = cleaned.frame
        steady_rows = steady_feature_rows(spec, loads_u)
        ours, line, interp, exact_prior = [], [], [], []
        band_points = band_inside = 0
        for i, name in enumerate(servers.names):
            truth_w = servers.curves_w[i, truth_index]
            entry = bundle.entry_for(name)
            predicted_w = onnx_predict_w(bundle.model_path(entry).read_bytes(), steady_rows[i])
            ours.append(mape_pct(predicted_w, truth_w))
            points, inside = band_coverage(entry.info, loads_u, predicted_w, truth_w)
            band_points, band_inside = band_points + points, band_inside + inside
            node_rows = frame[frame[NODE] == name]
            train = node_rows.iloc[: heldout_start_index(len(node_rows), settings.test_fraction)]
            util, power_w = train[CPU_UTIL].to_numpy(), train[POWER_W].to_numpy()
            baseline = IdleToMaxLine.from_train(util, power_w)
            line.append(mape_pct(baseline.predict_w(loads_u), truth_w))
            if sampling == "levels":
                interp.append(mape_pct(_level_interpolation(util, power_w, loads_u), truth_w))
            if sampling in SHOWN_GRID_POINTS:
                exact_w = prior_from_exact_points(
                    servers.prior,
                    servers.curves_w[i],
                    sampling,
                    loads_u,
                    server_facts(servers.table.iloc[i]) if args.facts else None,
                )
                exact_prior.append(mape_pct(exact_w, truth_w))
    summary = run.report["summary"]
    return CaseResult(
        sampling=sampling,
        temperature=temperature,
        ours_pct=np.array(ours),
        line_pct=np.array(line),
        interp_pct=np.array(interp) if interp else None,
        exact_prior_pct=np.array(exact_prior) if exact_prior else None,
        band_points=band_points,
        band_inside=band_inside,
        families=summary["families_chosen"],
        fallback=summary["nodes_fallback"],
        names=servers.names,
        fit_s=fit_s,
        rows_per_node=len(frame) / len(servers.names),
    )


def band_coverage(
    info: dict, loads_u: np.ndarray, predicted_w: np.ndarray, truth_w: np.ndarray
) -> tuple[int, int]:
    """(scored loads above the node's highest trained load, how many of them the measured watts
    lie inside its model's band at): the band of the bundle's `extrapolation_interval`, applied
    to the model's prediction as the extender's /explain applies it."""
    band = info.get("extrapolation_interval")
    measured = info.get("max_util_measured")
    if not band or measured is None:
        return 0, 0
    ratios = ExtrapolationBand(measured, band["util"], band["low"], band["high"])
    above = loads_u > measured
    inside = 0
    for load, predicted, truth in zip(
        loads_u[above], predicted_w[above], truth_w[above], strict=True
    ):
        low, high = ratios.ratios(float(load))
        inside += int(low * predicted <= truth <= high * predicted)
    return int(above.sum()), inside


def mape_pct(predicted_w: np.ndarray, truth_w: np.ndarray) -> float:
    """Mean absolute percentage error of predicted watts against measured ones."""
    return float(np.mean(np.abs(np.asarray(predicted_w) - truth_w) / truth_w) * 100)


def _level_interpolation(util: np.ndarray, power_w: np.ndarray, loads_u: np.ndarray) -> np.ndarray:
    """Straight lines between the mean power at each held level (the simplest reading)."""
    level_u, level_w = [], []
    for level in HELD_LEVELS:
        near = np.abs(util - level) <= 0.05
        if near.sum() >= 10:
            level_u.append(util[near].mean())
            level_w.append(power_w[near].mean())
    return np.interp(loads_u, level_u, level_w)


def _stats(values: np.ndarray) -> str:
    return f"{np.median(values):5.2f} / {np.percentile(values, 90):5.2f} %"


def print_case(result: CaseResult) -> None:
    loads = ", ".join(map(str, SCORED_LOADS_PCT[result.sampling]))
    line_name = (
        "line through idle and 50 %, extended"
        if result.sampling == "lowload"
        else "idle-to-max line"
    )
    worse = [
        f"{name} ({ours:.2f} vs {line:.2f} %)"
        for name, ours, line in zip(result.names, result.ours_pct, result.line_pct, strict=True)
        if ours >= line
    ]
    print(
        f"\n== sampling {result.sampling}, temperature {result.temperature}: "
        f"{len(result.names)} servers x {result.rows_per_node:.0f} rows, scored at {loads} %"
    )
    print(
        f"fit + export {result.fit_s:.1f} s; families chosen {result.families}; "
        f"on the fleet fallback: {len(result.fallback)}"
        + "".join(f"\n  {f['node']}: {f['reason']}" for f in result.fallback)
    )
    print(f"  MAPE median / p90, all {len(result.names)} servers:")
    print(f"  our models:                             {_stats(result.ours_pct)}")
    print(f"  {line_name + ':':<40} {_stats(result.line_pct)}")
    if result.interp_pct is not None:
        print(f"  {'linear interpolation between levels:':<40} {_stats(result.interp_pct)}")
    if result.exact_prior_pct is not None:
        print(
            f"  {'the prior from the exact watts shown:':<40} {_stats(result.exact_prior_pct)} "
            "(no telemetry, no fit: the prior's own limit)"
        )
    if result.band_points:
        share = result.band_inside / result.band_points * 100
        print(
            f"  measured watts inside the model's band (extrapolation_interval) at "
            f"{result.band_inside} of {result.band_points} scored loads above the highest "
            f"trained ({share:.0f} %)"
        )
    better = int(np.sum(result.ours_pct < result.line_pct))
    print(
        f"  ours better than the {line_name} on {better} of {len(result.names)} servers "
        f"({better / len(result.names) * 100:.0f} %); worse on {len(worse)}"
        + (": " + ", ".join(worse) if worse else "")
    )


def print_table(results: list[CaseResult]) -> None:
    print(
        "\n| sampling | temperature | ours: median / p90 MAPE | straight line: median / p90 | "
        "ours better than the line | on the fallback | the prior from exact watts |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        better = int(np.sum(r.ours_pct < r.line_pct))
        exact = (
            f"{np.median(r.exact_prior_pct):.2f} / {np.percentile(r.exact_prior_pct, 90):.2f} %"
            if r.exact_prior_pct is not None
            else "(loads shown)"
        )
        print(
            f"| {r.sampling} | {r.temperature} | {np.median(r.ours_pct):.2f} / "
            f"{np.percentile(r.ours_pct, 90):.2f} % | {np.median(r.line_pct):.2f} / "
            f"{np.percentile(r.line_pct, 90):.2f} % | {better} of {len(r.names)} | "
            f"{len(r.fallback)} | {exact} |"
        )


def _choices(value: str, known: tuple[str, ...], flag: str) -> list[str]:
    names = list(known) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{flag}: unknown {', '.join(unknown) or 'empty'}; known: {', '.join(known)}, all"
        )
    return names


def add_sample_arguments(parser: argparse.ArgumentParser) -> None:
    """`--sample`, `--csv` and `--split`, as every bench on the SPECpower samples reads them
    (`resolve_sample` fills `--csv` and `--split` from `--sample`)."""
    parser.add_argument(
        "--sample",
        choices=tuple(SAMPLES),
        default="old",
        help="which sample is scored: old (servers of 2007-2016) or modern (2017-2025); the "
        "prior learns from the prior sides of both (default old)",
    )
    parser.add_argument(
        "--csv",
        type=Path,
        help=f"SPECpower CSV, relative to the repo root (default: --sample's, {DEFAULT_CSV} "
        "for old)",
    )
    parser.add_argument(
        "--split",
        type=Path,
        help="which servers the prior learns from and which are scored (default: --sample's "
        "committed split in bench/data/)",
    )


def resolve_sample(args: argparse.Namespace) -> None:
    """Fill `--csv` and `--split` from `--sample` where they were not given."""
    csv, split = SAMPLES[args.sample]
    args.csv = args.csv or csv
    args.split = args.split or split


def sample_found(csv: Path) -> bool:
    """False, with a one-line error on stderr, when the sample is not where it was asked for."""
    if csv.is_file():
        return True
    print(f"error: {csv}: no such file (run from the repo root or pass --csv)", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.accuracy_specpower",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sample_arguments(parser)
    parser.add_argument(
        "--sampling",
        default="levels",
        help=f"comma-separated load patterns, or all: {', '.join(SAMPLINGS)} (default levels)",
    )
    parser.add_argument(
        "--temperature",
        default="tight",
        help="comma-separated: tight (CPU temperature follows load closely) or loose "
        "(default tight)",
    )
    parser.add_argument("--hours", type=float, default=168, help="hours of data (default 168)")
    parser.add_argument("--step", type=float, default=60, help="seconds per sample (default 60)")
    parser.add_argument("--seed", type=int, default=7, help="telemetry seed (default 7)")
    parser.add_argument(
        "--families",
        default=",".join(DEFAULT_FAMILIES),
        help="model families to choose from (default %(default)s)",
    )
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0 = all cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or logs")
    parser.add_argument(
        "--no-facts",
        dest="facts",
        action="store_false",
        help="leave out the nodes' hardware facts (cpu_model, cores, ...): the prior then "
        "cannot tell their generation, nor their cores and sockets",
    )
    args = parser.parse_args(argv)
    try:
        samplings = _choices(args.sampling, SAMPLINGS, "--sampling")
        temperatures = _choices(args.temperature, TEMPERATURE_MODES, "--temperature")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    resolve_sample(args)
    setup_logging(args.quiet)
    logging.getLogger("training.report").setLevel(logging.WARNING)
    logging.getLogger("training.synth").setLevel(logging.WARNING)
    if not sample_found(args.csv):
        return 2

    servers = load_servers(args.csv, args.split)
    print(
        f"servers: {len(servers.names)} scored, held out of {args.csv}; the shape prior is "
        f"learned from {servers.n_prior} servers of every sample's prior side "
        f"({args.split.name} and the other sample's split, by processor model; no scored "
        "processor model among them)"
    )
    results = []
    for sampling in samplings:
        for temperature in temperatures:
            result = run_case(servers, sampling, temperature, args)
            print_case(result)
            results.append(result)
    if len(results) > 1:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
