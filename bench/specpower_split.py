"""The committed split of the SPECpower sample: servers the shape prior learns from, servers it
is judged on.

`bench.accuracy_specpower` measures models on real servers' curves, and the models use a shape
prior learned from real servers' curves (`training.shape_prior`). Measured on servers the prior
has seen, the prior would look better than it is, so the bench learns its prior from one part
of the sample and scores on the other. Many results in the sample are near-twins (the same
processor in another chassis or memory size: 62 processor models for 116 servers), so the split
is by processor model: a processor's servers are all on one side. Each sample (`SAMPLES`:
`old`, servers of 2007-2016; `modern`, 2017-2025) has its own split, drawn the same way.

How it is drawn, so it can be checked: processor models are normalised (`processor_model`),
ordered by the sha256 of their name, and taken into the evaluation side in that order until it
holds a third of the servers. The result is committed (`bench/data/specpower_split.csv`) and the
bench refuses a sample that does not match it.

    python3 -m bench.specpower_split [--sample old|modern]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import pandas as pd

from training.node_facts import processor_model

DEFAULT_CSV = Path("../shared/data/specpower/ssj2008-sample.csv")
SPLIT_CSV = Path(__file__).resolve().parent / "data" / "specpower_split.csv"
# The two samples (`old`: servers of 2007-2016, `modern`: 2017-2025), each with its own split.
SAMPLES: dict[str, tuple[Path, Path]] = {
    "old": (DEFAULT_CSV, SPLIT_CSV),
    "modern": (
        Path("../shared/data/specpower/ssj2008-modern-sample.csv"),
        SPLIT_CSV.with_name("specpower_modern_split.csv"),
    ),
}
EVAL_SHARE = 1 / 3


def result_id(disclosure_url: str) -> str:
    """`.../power_ssj2008-20121224-00594.html` -> `power_ssj2008-20121224-00594`."""
    return Path(disclosure_url).stem


def draw_split(servers: pd.DataFrame) -> pd.DataFrame:
    """One row per server: `result`, `processor_model`, `split` ("prior" or "eval")."""
    table = pd.DataFrame(
        {
            "result": servers["disclosure_url"].map(result_id),
            "processor_model": servers["processor"].map(processor_model),
        }
    )
    models = sorted(
        table["processor_model"].unique(),
        key=lambda model: hashlib.sha256(model.encode()).hexdigest(),
    )
    sizes = table["processor_model"].value_counts()
    wanted = round(len(table) * EVAL_SHARE)
    held_out: set[str] = set()
    for model in models:
        if sum(sizes[m] for m in held_out) >= wanted:
            break
        held_out.add(model)
    table["split"] = ["eval" if m in held_out else "prior" for m in table["processor_model"]]
    return table


def read_split(path: Path = SPLIT_CSV) -> pd.DataFrame:
    return pd.read_csv(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.specpower_split", description=__doc__)
    parser.add_argument("--sample", choices=tuple(SAMPLES), default="old")
    parser.add_argument("--csv", type=Path, help="the SPECpower sample (default: --sample's)")
    parser.add_argument("--out", type=Path, help="default: the sample's split in bench/data/")
    args = parser.parse_args(argv)
    args.csv = args.csv or SAMPLES[args.sample][0]
    args.out = args.out or SAMPLES[args.sample][1]
    if not args.csv.is_file():
        print(f"error: {args.csv}: no such file (run from the repo root)", file=sys.stderr)
        return 2
    split = draw_split(pd.read_csv(args.csv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    split.to_csv(args.out, index=False)
    counts = split["split"].value_counts()
    held_out_models = split.loc[split["split"] == "eval", "processor_model"].nunique()
    print(
        f"{args.out}: {counts['eval']} servers ({held_out_models} processor models) for "
        f"evaluation, {counts['prior']} for the prior"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
