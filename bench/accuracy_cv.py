"""Cross-validate `monoshape` settings on the shape prior's own servers, never on the scored ones.

`bench.accuracy_specpower` scores on the held-out side of the committed split
(`bench/data/specpower_split.csv`); choosing a setting by that score would tune to it. This
bench does what the scored bench does, but on the *prior* side: each of its servers becomes a
node with a week of telemetry (`training.synth`, the same sampling and temperature modes), and
is fitted against a prior learned from the other prior-side servers *of other processor models*
(leave-one-processor-model-out, so near-twins never judge each other). The fit is called
directly (`training.monoshape.fit_monotone_curve` on the older rows, as `training.fit` does),
without the ONNX and bundle steps, so a case takes seconds. Printed per case: median and p90
MAPE at the scored loads and how many servers beat the straight line (idle to max, or for
`lowload` through idle and the 50 % point, extended); for `levels` and `lowload` also what the
prior makes of each server's exact watts at the loads it showed (no telemetry: the prior's own
limit, `bench.accuracy_specpower.prior_from_exact_points`).

    python3 -m bench.accuracy_cv [--sampling all|levels,lowload] [--temperature tight,loose]
        [--side prior|eval] [--seed 7]

`--side eval` fits the held-out servers against the full prior side's prior, the scored bench
without its pipeline: a quick check only; `bench.accuracy_specpower` is the measurement.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.accuracy_specpower import (
    HARDWARE_COLUMNS,
    LOAD_COLUMNS,
    SCORED_LOADS_PCT,
    SHOWN_GRID_POINTS,
    _choices,
    add_sample_arguments,
    load_servers,
    mape_pct,
    other_prior_sides,
    prior_from_exact_points,
    read_sample,
    resolve_sample,
    sample_found,
    sample_generation,
    server_facts,
    shapes_table,
    steady_feature_rows,
    steady_power,
)
from livedata.metrics_table import CPU_UTIL, FEATURES
from training.dataset import clean_metrics
from training.fit import FitSettings, heldout_start_index
from training.fit.node import iter_node_rows, unfillable_rows
from training.fit.settings import FEATURE_FILL
from training.monoshape import fit_monotone_curve
from training.node_facts import NodeFacts
from training.report import IdleToMaxLine
from training.shape_prior import ShapePrior
from training.synth import SAMPLINGS, TEMPERATURE_MODES, fleet_telemetry, servers_spec


@dataclass
class Side:
    names: list[str]
    curves_w: np.ndarray  # [n, 11]
    table: pd.DataFrame
    models: np.ndarray  # processor model per server
    priors: list[ShapePrior]  # the prior each server is fitted against
    facts: list[NodeFacts]  # what the cluster would tell about each (its processor, cores)


def load_side(csv: Path, split_csv: Path, side: str) -> Side:
    sample, split = read_sample(csv, split_csv)
    others = other_prior_sides(csv)
    curves_w = sample[LOAD_COLUMNS].to_numpy(np.float64)
    sides = sample["result"].map(split["split"]).to_numpy()
    models = sample["result"].map(split["processor_model"]).to_numpy()
    prior_side = sides == "prior"
    chosen = sides == side
    table = shapes_table(sample, curves_w, chosen)
    if side == "eval":
        full = load_servers(csv, split_csv).prior
        priors = [full] * int(chosen.sum())
    else:
        # this sample's prior side and the other samples', each server with its generation
        bank_w = np.vstack([curves_w[prior_side], *(s.curves_w for s in others)])
        bank_models = np.concatenate([models[prior_side], *(s.models for s in others)])
        bank_generations = [sample_generation(csv)] * int(prior_side.sum()) + [
            g for s in others for g in s.generations
        ]
        bank_hardware = np.vstack(
            [
                sample[HARDWARE_COLUMNS].to_numpy(np.float64)[prior_side],
                *(s.hardware for s in others),
            ]
        )
        by_model: dict[str, ShapePrior] = {}
        for model in np.unique(models[prior_side]):
            keep = bank_models != model
            by_model[model] = ShapePrior.from_curves(
                bank_w[keep],
                generations=[g for g, k in zip(bank_generations, keep, strict=True) if k],
                groups=list(bank_models[keep]),
                hardware=bank_hardware[keep],
            )
        priors = [by_model[m] for m in models[chosen]]
    return Side(
        names=[f"spec-{i:03d}" for i in np.flatnonzero(chosen)],
        curves_w=curves_w[chosen],
        table=table,
        models=models[chosen],
        priors=priors,
        facts=[server_facts(row) for _, row in table.iterrows()],
    )


@dataclass
class NodeData:
    features: np.ndarray
    power_w: np.ndarray


def node_data(side: Side, sampling: str, temperature: str, seed: int, hours: float):
    """A week (`hours`) of telemetry per server as `bench.accuracy_specpower` makes it; each
    node's older rows (those `training.fit` would train on)."""
    spec = servers_spec(side.table, seed, names=side.names)
    telemetry = fleet_telemetry(
        spec,
        hours,
        60.0,
        seed,
        sampling=sampling,
        temperature=temperature,
        steady_power_w=steady_power(side.curves_w, sampling),
    )
    frame = clean_metrics(telemetry, source="cv").frame
    frame = frame[~unfillable_rows(frame, FEATURE_FILL)]
    test_fraction = FitSettings().test_fraction
    data = {}
    for rows in iter_node_rows(frame, FEATURE_FILL):
        train = rows.take(slice(0, heldout_start_index(len(rows), test_fraction)))
        data[rows.node] = NodeData(train.features.astype(np.float64), train.power_w)
    return spec, data


def score(side: Side, spec, data: dict[str, NodeData], sampling: str, facts: bool = True):
    """Each server's MAPE at the scored loads: ours, the straight line's, and (for the
    samplings scored at loads never shown, else None) the prior's from the exact watts."""
    loads_u = np.array(SCORED_LOADS_PCT[sampling], dtype=float) / 100
    truth_index = np.rint(loads_u * 10).astype(int)
    steady_rows = steady_feature_rows(spec, loads_u).astype(np.float64)
    ours, line, exact = [], [], []
    for i, name in enumerate(side.names):
        truth_w = side.curves_w[i, truth_index]
        node = data[name]
        node_facts = side.facts[i] if facts else None
        curve, _ = fit_monotone_curve(node.features, node.power_w, side.priors[i], node_facts)
        ours.append(mape_pct(curve.predict_w(steady_rows[i]), truth_w))
        util = node.features[:, FEATURES.index(CPU_UTIL)]
        line.append(
            mape_pct(IdleToMaxLine.from_train(util, node.power_w).predict_w(loads_u), truth_w)
        )
        if sampling in SHOWN_GRID_POINTS:
            exact_w = prior_from_exact_points(
                side.priors[i],
                side.curves_w[i],
                sampling,
                loads_u,
                node_facts,
            )
            exact.append(mape_pct(exact_w, truth_w))
    return np.array(ours), np.array(line), (np.array(exact) if exact else None)


def summary(ours: np.ndarray, line: np.ndarray, exact: np.ndarray | None = None) -> str:
    better = int(np.sum(ours < line))
    return (
        f"{np.median(ours):5.2f} / {np.percentile(ours, 90):5.2f} %  "
        f"(line {np.median(line):5.2f} / {np.percentile(line, 90):5.2f} %)  "
        f"better {better}/{len(ours)} ({better / len(ours) * 100:.0f} %)"
        + (
            f"  [prior from exact watts {np.median(exact):5.2f} / "
            f"{np.percentile(exact, 90):5.2f} %]"
            if exact is not None
            else ""
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.accuracy_cv", description=__doc__)
    add_sample_arguments(parser)
    parser.add_argument("--side", choices=("prior", "eval"), default="prior")
    parser.add_argument("--sampling", default="all")
    parser.add_argument("--temperature", default="tight,loose")
    parser.add_argument("--hours", type=float, default=168)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-facts",
        dest="facts",
        action="store_false",
        help="fit without the servers' processor and cores (the prior cannot tell generations)",
    )
    args = parser.parse_args(argv)
    resolve_sample(args)
    logging.getLogger("training").setLevel(logging.ERROR)
    if not sample_found(args.csv):
        return 2
    side = load_side(args.csv, args.split, args.side)
    print(
        f"{args.side} side: {len(side.names)} servers, {len(set(side.models))} processor models; "
        + (
            "each fitted against a prior learned without its processor model"
            if args.side == "prior"
            else "fitted against the prior learned from the whole prior side"
        )
    )
    print("sampling     temp.  MAPE median / p90, the straight line's, ours better than it")
    for sampling in _choices(args.sampling, SAMPLINGS, "--sampling"):
        for temperature in _choices(args.temperature, TEMPERATURE_MODES, "--temperature"):
            spec, data = node_data(side, sampling, temperature, args.seed, args.hours)
            ours, line, exact = score(side, spec, data, sampling, args.facts)
            print(f"{sampling:12s} {temperature:6s} {summary(ours, line, exact)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
