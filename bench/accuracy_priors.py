"""What shape priors make of a server's *exact* watts at the loads it showed: no telemetry, no fit.

`bench.accuracy_specpower` and `bench.accuracy_cv` measure the whole pipeline on a week of
telemetry, and print beside it what the shipped prior makes of SPECpower's exact watts at the
loads a node showed. This bench asks the question before that one: from perfect measurements
at those loads, how well can *any* of a few priors predict the others? It compares, per
sampling scored at loads never shown (`levels`: 0, 20, ..., 100 % shown, 10, 30, ..., 90 %
scored; `lowload`: 0-50 % shown, 60-100 % scored):

- `line`: straight lines between the shown points; above the highest, the line through idle
  and it, extended (the baseline the issue names);
- `mean shape`: the bank's mean normalised shape, scaled through idle and the highest shown
  point;
- `nearest k`: the mean shape of the k bank servers most alike at the shown points (each
  normalised by its rise from idle to the highest shown point), scaled the same way;
- `shipped prior`: `training.shape_prior.ShapePrior.conditional_shape`, as the model's pass 3
  draws it (`bench.accuracy_specpower.prior_from_exact_points`), told what a cluster tells of
  the node (`training.node_facts`): its CPU model (so its generation), cores and sockets; above
  the highest shown point it then extrapolates with its facts forest;
- `shipped prior, generation only`: the same, told the CPU model alone (a cluster without
  `node_cpu_info`'s cores and packages): the ridge regressions and kernel above that point.

Each is judged three ways, over the servers of `--sample` (old: servers of 2007-2016; modern:
2017-2025), with the other sample's prior side always in the bank (the shipped prior knows
every server's generation, and draws on the judged server's own when it has enough):

- `by processor`: every server against a bank of the others *without its processor model*
  (the sample's near-twins, the same processor in another chassis, never judge each other);
- `leave one out`: against all the others, near-twins included. This flatters every prior
  that looks for similar servers; for the shipped prior it is what a node whose processor
  model the bank holds gets (half its rise above the highest shown point from those servers:
  `ShapePrior.same_processor`);
- `scored side`: the committed split's held-out servers against its prior side (what
  `bench.accuracy_specpower` scores on).

Printed: MAPE median / p90 at the scored loads, and the share of servers each beats `line` on.
Then a reference no prior above can reach by design: each server that shares its processor
model with another, predicted from those near-twins' shapes (`same_processor_reference`:
what knowing the processor exactly tells; the rest is the chassis), beside the shipped prior
judged by processor on the same servers.

    python3 -m bench.accuracy_priors [--sampling lowload|levels|all] [--csv PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.accuracy_specpower import (
    HARDWARE_COLUMNS,
    LOAD_COLUMNS,
    SCORED_LOADS_PCT,
    SHOWN_GRID_POINTS,
    _choices,
    add_sample_arguments,
    mape_pct,
    other_prior_sides,
    prior_from_exact_points,
    read_sample,
    resolve_sample,
    sample_found,
    sample_generation,
    server_facts,
)
from training.node_facts import NodeFacts
from training.shape_prior import GRID_UTIL, ShapePrior

NEAREST_K = (1, 3, 5)
JUDGINGS = ("by processor", "leave one out", "scored side")

# A prior: (bank curves [m, 11] W, the node's exact curve [11] W, the sampling whose grid
# points it shows, the bank's generations, what the cluster tells of the node (`NodeFacts`:
# its CPU model, cores, sockets), the bank's processor models, the bank's hardware [m, 2]:
# cores and sockets) -> predicted watts at the sampling's scored grid points. Only the shipped
# priors read what follows the sampling.
Prior = Callable[..., np.ndarray]


def grid_points(sampling: str) -> tuple[tuple[int, ...], np.ndarray]:
    """The grid points (0..10) a sampling shows, and those it is scored at."""
    scored = np.rint(np.array(SCORED_LOADS_PCT[sampling]) / 10).astype(int)
    return SHOWN_GRID_POINTS[sampling], scored


def _rise_shapes(curves_w: np.ndarray, top: int) -> np.ndarray:
    """[m, 11] watts -> shapes running from 0 at idle to 1 at grid point `top`."""
    curves_w = np.atleast_2d(curves_w)
    rise_w = np.maximum(curves_w[:, top : top + 1] - curves_w[:, :1], 1e-9)
    return (curves_w - curves_w[:, :1]) / rise_w


def _scaled(shape: np.ndarray, curve_w: np.ndarray, top: int, scored: np.ndarray) -> np.ndarray:
    """A shape through idle and grid point `top` of the node's curve, at the scored points."""
    return curve_w[0] + shape[scored] * (curve_w[top] - curve_w[0])


def line_prior(bank_w: np.ndarray, curve_w: np.ndarray, sampling: str, *_: object) -> np.ndarray:
    """Straight lines between shown points; above the highest, idle-to-highest extended."""
    shown, scored = grid_points(sampling)
    top = max(shown)
    inside = np.interp(GRID_UTIL[scored], GRID_UTIL[list(shown)], curve_w[list(shown)])
    slope_w = (curve_w[top] - curve_w[0]) / GRID_UTIL[top]
    above = curve_w[0] + slope_w * GRID_UTIL[scored]
    return np.where(scored > top, above, inside)


def mean_shape_prior(
    bank_w: np.ndarray, curve_w: np.ndarray, sampling: str, *_: object
) -> np.ndarray:
    shown, scored = grid_points(sampling)
    top = max(shown)
    return _scaled(_rise_shapes(bank_w, top).mean(axis=0), curve_w, top, scored)


def nearest_prior(k: int) -> Prior:
    def predict(bank_w: np.ndarray, curve_w: np.ndarray, sampling: str, *_: object) -> np.ndarray:
        shown, scored = grid_points(sampling)
        top = max(shown)
        inner = [j for j in shown if 0 < j < top]
        bank = _rise_shapes(bank_w, top)
        node = _rise_shapes(curve_w, top)[0]
        distance = ((bank[:, inner] - node[inner]) ** 2).sum(axis=1)
        nearest = np.argsort(distance, kind="stable")[:k]
        return _scaled(bank[nearest].mean(axis=0), curve_w, top, scored)

    return predict


class _BankPriors:
    """The shipped prior learned on each bank once (judging by processor, every server of one
    model shares its bank; the prior learns its facts forests lazily, one per highest shown
    load), the last `KEPT` kept."""

    KEPT = 64

    def __init__(self) -> None:
        self._priors: OrderedDict[str, ShapePrior] = OrderedDict()

    def __call__(
        self,
        bank_w: np.ndarray,
        generations: list[str | None] | None,
        models: list[str] | None,
        hardware: np.ndarray | None,
    ) -> ShapePrior:
        key = hashlib.sha1(np.ascontiguousarray(bank_w).tobytes()).hexdigest()
        prior = self._priors.get(key)
        if prior is None:
            prior = ShapePrior.from_curves(
                bank_w, generations=generations, groups=models, hardware=hardware
            )
            self._priors[key] = prior
            if len(self._priors) > self.KEPT:
                self._priors.popitem(last=False)
        return prior


_bank_priors = _BankPriors()


def shipped_prior(
    bank_w: np.ndarray,
    curve_w: np.ndarray,
    sampling: str,
    bank_generations: list[str | None] | None = None,
    facts: NodeFacts | None = None,
    bank_models: list[str] | None = None,
    bank_hardware: np.ndarray | None = None,
) -> np.ndarray:
    """As the model's pass 3 draws it, told what the cluster tells of the node."""
    _, scored = grid_points(sampling)
    prior = _bank_priors(bank_w, bank_generations, bank_models, bank_hardware)
    return prior_from_exact_points(prior, curve_w, sampling, GRID_UTIL[scored], facts)


def shipped_prior_generation_only(
    bank_w: np.ndarray,
    curve_w: np.ndarray,
    sampling: str,
    bank_generations: list[str | None] | None = None,
    facts: NodeFacts | None = None,
    *bank: object,
) -> np.ndarray:
    """The shipped prior for a cluster that tells the CPU model but not cores and sockets."""
    model_only = NodeFacts(cpu_model=facts.cpu_model) if facts is not None else None
    return shipped_prior(bank_w, curve_w, sampling, bank_generations, model_only, *bank)  # type: ignore[arg-type]


PRIORS: dict[str, Prior] = {
    "line": line_prior,
    "mean shape": mean_shape_prior,
    **{f"nearest {k}": nearest_prior(k) for k in NEAREST_K},
    "shipped prior, generation only": shipped_prior_generation_only,
    "shipped prior": shipped_prior,
}


@dataclass
class Sample:
    """The judged sample's servers first, then the other samples' prior sides (bank only)."""

    curves_w: np.ndarray  # [n, 11]
    models: np.ndarray  # processor model per server
    scored_side: np.ndarray  # [n] bool: on the committed split's held-out side
    generations: list[str | None]  # per server: its sample's period (what the bank knows)
    judged: np.ndarray  # [n] bool: of the judged sample (the others only teach)
    # per judged server, what a cluster would tell of it (its CPU model, cores, sockets)
    facts: list[NodeFacts | None] | None = None
    hardware: np.ndarray | None = None  # [n, 2] cores and sockets (HARDWARE_COLUMNS)


def read(csv: Path, split_csv: Path) -> Sample:
    sample, split = read_sample(csv, split_csv)
    others = other_prior_sides(csv)
    n_others = sum(len(o.curves_w) for o in others)
    return Sample(
        curves_w=np.vstack(
            [sample[LOAD_COLUMNS].to_numpy(np.float64), *(o.curves_w for o in others)]
        ),
        models=np.concatenate(
            [sample["result"].map(split["processor_model"]).to_numpy(), *(o.models for o in others)]
        ),
        scored_side=np.concatenate(
            [(sample["result"].map(split["split"]) == "eval").to_numpy(), np.zeros(n_others, bool)]
        ),
        generations=[sample_generation(csv)] * len(sample)
        + [g for o in others for g in o.generations],
        judged=np.arange(len(sample) + n_others) < len(sample),
        facts=[server_facts(row) for _, row in sample.iterrows()] + [None] * n_others,
        hardware=np.vstack(
            [sample[HARDWARE_COLUMNS].to_numpy(np.float64), *(o.hardware for o in others)]
        ),
    )


def banks(sample: Sample, judging: str) -> list[tuple[int, np.ndarray]]:
    """(server, the bank it is judged against) for every server a judging scores."""
    n = len(sample.curves_w)
    judged = np.flatnonzero(sample.judged)
    if judging == "by processor":
        return [(int(i), sample.models != sample.models[i]) for i in judged]
    if judging == "leave one out":
        return [(int(i), np.arange(n) != i) for i in judged]
    if judging == "scored side":
        scored_models = np.unique(sample.models[sample.scored_side])
        bank = ~sample.scored_side & ~np.isin(sample.models, scored_models)
        return [(int(i), bank) for i in np.flatnonzero(sample.scored_side)]
    raise ValueError(f"unknown judging {judging!r}; known: {', '.join(JUDGINGS)}")


def judge(sample: Sample, sampling: str, judging: str) -> dict[str, np.ndarray]:
    """Per prior, each judged server's MAPE at the sampling's scored loads."""
    _, scored = grid_points(sampling)
    errors: dict[str, list[float]] = {name: [] for name in PRIORS}
    for i, in_bank in banks(sample, judging):
        curve_w = sample.curves_w[i]
        bank_generations = [g for g, b in zip(sample.generations, in_bank, strict=True) if b]
        bank_hardware = sample.hardware[in_bank] if sample.hardware is not None else None
        for name, prior in PRIORS.items():
            predicted_w = prior(
                sample.curves_w[in_bank],
                curve_w,
                sampling,
                bank_generations,
                sample.facts[i] if sample.facts is not None else None,
                list(sample.models[in_bank]),
                bank_hardware,
            )
            errors[name].append(mape_pct(predicted_w, curve_w[scored]))
    return {name: np.array(values) for name, values in errors.items()}


def same_processor_reference(sample: Sample, sampling: str) -> tuple[np.ndarray, np.ndarray]:
    """A reference no prior here can reach by design: each judged server predicted from the
    *other* servers of its processor model (near-twins: the same processor in another
    chassis), each one's shape drawn through the server's own shown points (`_through_shown`),
    averaged. What knowing the processor exactly, turbo frequencies and all, tells about a curve;
    the rest is the chassis (fans, memory, disks, power supply). Returns the positions among
    the judged servers of those that have a near-twin, and their MAPE at the scored loads."""
    _, scored = grid_points(sampling)
    positions, errors = [], []
    for position, i in enumerate(np.flatnonzero(sample.judged)):
        twins = (sample.models == sample.models[i]) & (np.arange(len(sample.models)) != i)
        if twins.any():
            curve_w = sample.curves_w[i]
            predicted_w = np.mean(
                [_through_shown(twin_w, curve_w, sampling) for twin_w in sample.curves_w[twins]],
                axis=0,
            )
            positions.append(position)
            errors.append(mape_pct(predicted_w, curve_w[scored]))
    return np.array(positions, dtype=int), np.array(errors)


def _through_shown(shape_w: np.ndarray, curve_w: np.ndarray, sampling: str) -> np.ndarray:
    """Another curve's shape (`shape_w`, watts) through the node's own shown points, at the
    scored ones: between two shown points, the same share of the step between them; above the
    highest, the same rise per unit of the rise from idle to it."""
    shown, scored = grid_points(sampling)
    top = max(shown)
    predicted_w = []
    for j in scored:
        if j > top:
            low, high, base = 0, top, top
        else:
            low = max(k for k in shown if k < j)
            high = min(k for k in shown if k > j)
            base = low
        share = (shape_w[j] - shape_w[base]) / max(shape_w[high] - shape_w[low], 1e-9)
        predicted_w.append(curve_w[base] + share * (curve_w[high] - curve_w[low]))
    return np.array(predicted_w)


def _cell(errors: np.ndarray, line: np.ndarray | None) -> str:
    """MAPE median / p90, and the share of servers better than the line's."""
    cell = f"{np.median(errors):.2f} / {np.percentile(errors, 90):.2f} %"
    if line is not None:
        cell += f", beats the line on {np.mean(errors < line) * 100:.0f} %"
    return cell


def print_sampling(sample: Sample, sampling: str) -> None:
    shown = ", ".join(f"{j * 10}" for j in SHOWN_GRID_POINTS[sampling])
    scored = ", ".join(str(pct) for pct in SCORED_LOADS_PCT[sampling])
    print(f"\n{sampling}: exact watts at {shown} %, predicted at {scored} %")
    results = {judging: judge(sample, sampling, judging) for judging in JUDGINGS}
    counts = {judging: len(next(iter(r.values()))) for judging, r in results.items()}
    print(
        "| prior | "
        + " | ".join(f"{judging} ({counts[judging]} servers)" for judging in JUDGINGS)
        + " |"
    )
    print("| --- |" + " --- |" * len(JUDGINGS))
    for name in PRIORS:
        cells = []
        for judging in JUDGINGS:
            errors, line = results[judging][name], results[judging]["line"]
            cells.append(_cell(errors, None if name == "line" else line))
        print(f"| {name} | " + " | ".join(cells) + " |")
    positions, twin_errors = same_processor_reference(sample, sampling)
    if not len(positions):
        return
    by_processor = {name: errors[positions] for name, errors in results["by processor"].items()}
    print(
        f"\nnear-twins, a reference: the {len(positions)} servers that share their processor "
        "model with another server, predicted from those servers' shapes through its shown points"
    )
    print("| on these servers | MAPE |\n| --- | --- |")
    print(f"| the straight line | {_cell(by_processor['line'], None)} |")
    print(
        f"| the same processor model's other servers | {_cell(twin_errors, by_processor['line'])} |"
    )
    for name in ("shipped prior", "shipped prior, generation only"):
        print(f"| {name}, by processor | {_cell(by_processor[name], by_processor['line'])} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.accuracy_priors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sample_arguments(parser)
    parser.add_argument(
        "--sampling",
        default="lowload",
        help=f"comma-separated, or all: {', '.join(SHOWN_GRID_POINTS)} (default lowload)",
    )
    args = parser.parse_args(argv)
    try:
        samplings = _choices(args.sampling, tuple(SHOWN_GRID_POINTS), "--sampling")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    resolve_sample(args)
    if not sample_found(args.csv):
        return 2
    sample = read(args.csv, args.split)
    print(
        f"{int(sample.judged.sum())} servers of {len(set(sample.models[sample.judged]))} "
        f"processor models judged ({args.csv}); the banks also hold "
        f"{int((~sample.judged).sum())} servers of the other sample's prior side; MAPE "
        "median / p90 at the scored loads"
    )
    for sampling in samplings:
        print_sampling(sample, sampling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
