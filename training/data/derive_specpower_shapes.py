"""Derive the shipped shapes tables from SPECpower_ssj2008 CSV exports (run once, by hand).

The synthetic fleet (`training.synth`) draws its power curves from real servers, and the shape
prior (`training.shape_prior`) learns from them. The project must not read files outside its
repository at run time, so this script condenses the public results into small tables that are
committed next to it, one per sample:

    python3 training/data/derive_specpower_shapes.py \
        ../shared/data/specpower/ssj2008-sample.csv > training/data/specpower_shapes.csv
    python3 training/data/derive_specpower_shapes.py --period modern \
        ../shared/data/specpower/ssj2008-modern-sample.csv \
        > training/data/specpower_modern_shapes.csv

Each output row is one server: its SPEC result id, the sample's period (`old`: servers of
2007-2016, `modern`: 2017-2025), the processor as SPEC names it, socket and core counts, idle
and maximum wall power, and the 11-point curve (active idle, 10 %, ..., 100 % load) divided by
the maximum, so `share_000` is the idle share of maximum power and `share_100` is 1.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

LOAD_COLUMNS = ["watts_idle"] + [f"watts_{pct}" for pct in range(10, 101, 10)]
SHARE_COLUMNS = [f"share_{pct:03d}" for pct in range(0, 101, 10)]
PERIODS = ("old", "modern")
HEADER_COMMENT = (
    "# Source: SPECpower_ssj2008 public results (spec.org CSV export, "
    "https://www.spec.org/power_ssj2008/results/), via {name}; "
    "derived by training/data/derive_specpower_shapes.py"
)


def result_id(disclosure_url: str) -> str:
    """`.../power_ssj2008-20121224-00594.html` -> `power_ssj2008-20121224-00594`."""
    return Path(disclosure_url).stem


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="derive_specpower_shapes.py",
        description="SPECpower_ssj2008 CSV -> the shipped shapes table, on stdout",
    )
    parser.add_argument("csv", type=Path, help="a SPECpower_ssj2008 sample (one row a server)")
    parser.add_argument(
        "--period", choices=PERIODS, default="old", help="which sample it is (default old)"
    )
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as source:
        servers = list(csv.DictReader(source))
    writer = csv.writer(sys.stdout, lineterminator="\n")
    print(HEADER_COMMENT.format(name=args.csv.name))
    writer.writerow(
        [
            "result",
            "period",
            "processor",
            "chips",
            "cores",
            "watts_idle",
            "watts_max",
            *SHARE_COLUMNS,
        ]
    )
    for row, server in enumerate(servers, start=2):
        try:
            watts = [float(server[column]) for column in LOAD_COLUMNS]
        except (KeyError, ValueError) as exc:
            print(f"error: {args.csv}: row {row}: no usable watts ({exc})", file=sys.stderr)
            return 2
        shares = [f"{w / watts[-1]:.4f}" for w in watts]
        writer.writerow(
            [
                result_id(server["disclosure_url"]),
                args.period,
                server["processor"],
                server["chips"],
                server["cores"],
                f"{watts[0]:g}",
                f"{watts[-1]:g}",
                *shares,
            ]
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
