"""Benchmark accuracy on real server power curves (SPECpower_ssj2008), between measured loads.

Each server of `../shared/data/specpower/ssj2008-sample.csv` becomes a node with contract-1 rows
sampled *around* 0, 20, 40, 60, 80 and 100 % load only: utilisation jittered around the level,
power following the measured curve between those even levels, plus meter noise and whole-watt
readings, at constant temperatures (SPECpower runs at a controlled ambient). The levels are
visited in a shuffled order over time, so the chronological held-out split sees every level.

The whole fleet goes through the real pipeline (`training.fit.fit_fleet`: family choice, ONNX,
parity, bundle), then each node's ONNX model predicts power at 10, 30, 50, 70 and 90 % load:
loads it never saw, measured by SPECpower. Printed: median and p90 MAPE over servers for our
models and for the idle-to-max straight line fitted on the same training rows (the baseline),
and which families were chosen.

    python3 -m bench.accuracy_specpower [--csv ../shared/data/specpower/ssj2008-sample.csv]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from livedata.metrics_table import FEATURES
from predictor.bundle import read_bundle
from training.dataset import clean_metrics
from training.export import onnx_predict_w
from training.fit import FitSettings, fit_fleet, heldout_start_index
from training.fit.cli import setup_logging
from training.report import IdleToMaxLine

log = logging.getLogger("bench.accuracy_specpower")

DEFAULT_CSV = Path("../shared/data/specpower/ssj2008-sample.csv")
TRAIN_LOADS_PCT = (0, 20, 40, 60, 80, 100)
PREDICT_LOADS_PCT = (10, 30, 50, 70, 90)
CONSTANT_TEMPS_C = {"ambient_temp_c": 23.0, "cpu1_temp_c": 55.0, "cpu2_temp_c": 53.0}
START = pd.Timestamp("2026-01-05T00:00:00Z")


def watts_column(load_pct: int) -> str:
    return "watts_idle" if load_pct == 0 else f"watts_{load_pct}"


def server_rows(
    node: str,
    measured_w: dict[int, float],
    rng: np.random.Generator,
    *,
    blocks_per_level: int,
    rows_per_block: int,
    util_jitter: float,
    noise_pct: float,
    step_s: float,
) -> pd.DataFrame:
    """Contract-1 rows for one server, sampled around the even load levels only."""
    levels = np.repeat(np.array(TRAIN_LOADS_PCT, dtype=float) / 100, blocks_per_level)
    rng.shuffle(levels)
    util = np.repeat(levels, rows_per_block) + rng.normal(
        0, util_jitter, len(levels) * rows_per_block
    )
    util = np.clip(util, 0.0, 1.0)
    curve_u = np.array(TRAIN_LOADS_PCT, dtype=float) / 100
    curve_w = np.array([measured_w[pct] for pct in TRAIN_LOADS_PCT])
    power_w = np.interp(util, curve_u, curve_w)
    power_w = np.round(power_w * (1 + rng.normal(0, noise_pct / 100, len(util))))
    n = len(util)
    return pd.DataFrame(
        {
            "node": node,
            "timestamp": START + pd.to_timedelta(np.arange(n) * step_s, unit="s"),
            "cpu_util": np.round(util, 4),
            **{name: np.full(n, value) for name, value in CONSTANT_TEMPS_C.items()},
            "power_w": power_w,
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m bench.accuracy_specpower", description=__doc__
    )
    parser.add_argument(
        "--csv",
        type=Path,
        default=DEFAULT_CSV,
        help=f"SPECpower CSV, relative to the repo root (default {DEFAULT_CSV})",
    )
    parser.add_argument("--seed", type=int, default=7, help="sampling seed (default 7)")
    parser.add_argument(
        "--blocks-per-level", type=int, default=8, help="visits to each load level (default 8)"
    )
    parser.add_argument(
        "--rows-per-block", type=int, default=15, help="samples per visit (default 15)"
    )
    parser.add_argument(
        "--util-jitter",
        type=float,
        default=0.02,
        help="std-dev of utilisation around the level, fraction (default 0.02)",
    )
    parser.add_argument(
        "--noise-pct", type=float, default=1.0, help="meter noise, %% of power (default 1.0)"
    )
    parser.add_argument("--jobs", type=int, default=0, help="worker processes (0 = all cores)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or logs")
    args = parser.parse_args(argv)
    setup_logging(args.quiet)
    logging.getLogger("training.report").setLevel(logging.WARNING)
    if not args.csv.is_file():
        print(
            f"error: {args.csv}: no such file (run from the repo root or pass --csv)",
            file=sys.stderr,
        )
        return 2

    servers = pd.read_csv(args.csv)
    rng = np.random.default_rng(args.seed)
    names = [f"spec-{i:03d}" for i in range(len(servers))]
    measured = {
        name: {pct: float(row[watts_column(pct)]) for pct in range(0, 101, 10)}
        for name, (_, row) in zip(names, servers.iterrows(), strict=True)
    }
    table = pd.concat(
        [
            server_rows(
                name,
                measured[name],
                rng,
                blocks_per_level=args.blocks_per_level,
                rows_per_block=args.rows_per_block,
                util_jitter=args.util_jitter,
                noise_pct=args.noise_pct,
                step_s=60.0,
            )
            for name in names
        ],
        ignore_index=True,
    )
    rows_per_server = len(table) // len(names)
    settings = FitSettings(min_rows=min(500, rows_per_server), seed=args.seed)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specpower-") as work:
        out = Path(work) / "bundle"
        cleaned = clean_metrics(table, source=str(args.csv))
        run = fit_fleet(
            cleaned, out, settings=settings, jobs=args.jobs or None, progress=not args.quiet
        )
        bundle = read_bundle(out)
        fit_s = time.perf_counter() - started

        loads_u = np.array(PREDICT_LOADS_PCT, dtype=float) / 100
        grid = np.column_stack(
            [loads_u] + [np.full(len(loads_u), CONSTANT_TEMPS_C[f]) for f in FEATURES[1:]]
        ).astype(np.float32)
        ours_pct, line_pct = [], []
        for name in names:
            truth_w = np.array([measured[name][pct] for pct in PREDICT_LOADS_PCT])
            entry = bundle.entry_for(name)
            predicted_w = onnx_predict_w((out / entry.file).read_bytes(), grid)
            ours_pct.append(np.mean(np.abs(predicted_w - truth_w) / truth_w) * 100)
            node_rows = table[table["node"] == name]
            train = node_rows.iloc[: heldout_start_index(len(node_rows), settings.test_fraction)]
            line = IdleToMaxLine.from_train(
                train["cpu_util"].to_numpy(), train["power_w"].to_numpy()
            )
            line_pct.append(np.mean(np.abs(line.predict_w(loads_u) - truth_w) / truth_w) * 100)

    summary = run.report["summary"]
    ours, line = np.array(ours_pct), np.array(line_pct)
    print(
        f"servers: {len(names)} from {args.csv}; {rows_per_server} rows each around loads "
        f"{', '.join(map(str, TRAIN_LOADS_PCT))} %"
    )
    print(
        f"fit + export: {fit_s:.1f} s; families chosen: {summary['families_chosen']}; "
        f"on the fleet fallback: {len(summary['nodes_fallback'])}"
    )
    print(f"MAPE at unseen loads {', '.join(map(str, PREDICT_LOADS_PCT))} %:")
    print(
        f"  our models:        median {np.median(ours):.2f} %, p90 {np.percentile(ours, 90):.2f} %"
    )
    print(
        f"  idle-to-max line:  median {np.median(line):.2f} %, p90 {np.percentile(line, 90):.2f} %"
    )
    print(
        f"  line / ours (median): {np.median(line) / np.median(ours):.1f}x; "
        f"servers where ours beats the line: {int(np.sum(ours < line))} of {len(names)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
