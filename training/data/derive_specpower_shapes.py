"""Derive `specpower_shapes.csv` from a SPECpower_ssj2008 CSV export (run once, by hand).

The synthetic fleet (`training.synth`) draws its power curves from real servers. The project
must not read files outside its repository at run time, so this script condenses the public
results into a small table that is committed next to it:

    python3 training/data/derive_specpower_shapes.py \
        ../shared/data/specpower/ssj2008-sample.csv > training/data/specpower_shapes.csv

Each output row is one server: its SPEC result id, socket and core counts, idle and maximum
wall power, and the 11-point curve (active idle, 10 %, ..., 100 % load) divided by the maximum,
so `share_000` is the idle share of maximum power and `share_100` is 1.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

LOAD_COLUMNS = ["watts_idle"] + [f"watts_{pct}" for pct in range(10, 101, 10)]
SHARE_COLUMNS = [f"share_{pct:03d}" for pct in range(0, 101, 10)]
HEADER_COMMENT = (
    "# Source: SPECpower_ssj2008 public results (spec.org CSV export, "
    "https://www.spec.org/power_ssj2008/results/), via ssj2008-sample.csv; "
    "derived by training/data/derive_specpower_shapes.py"
)


def result_id(disclosure_url: str) -> str:
    """`.../power_ssj2008-20121224-00594.html` -> `power_ssj2008-20121224-00594`."""
    return Path(disclosure_url).stem


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: derive_specpower_shapes.py SSJ2008_CSV > specpower_shapes.csv", file=sys.stderr
        )
        return 2
    with open(argv[0], newline="") as source:
        servers = list(csv.DictReader(source))
    writer = csv.writer(sys.stdout, lineterminator="\n")
    print(HEADER_COMMENT)
    writer.writerow(["result", "chips", "cores", "watts_idle", "watts_max", *SHARE_COLUMNS])
    for server in servers:
        watts = [float(server[column]) for column in LOAD_COLUMNS]
        shares = [f"{w / watts[-1]:.4f}" for w in watts]
        writer.writerow(
            [
                result_id(server["disclosure_url"]),
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
