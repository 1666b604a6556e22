"""What a core of work costs on each fleet's nodes, decile by decile of their true curves.

    python -m bench.fleet_curves [--nodes 16] [--seed 7]

For the energy bench's clusters (`bench.sim.cluster`, `--fleet old|mixed|modern`): cores, idle
and full-load watts, and the median over nodes of the watts one more core adds in the first,
the sixth and the last decile of load; and on how many nodes the last decile costs more than
the middle one (where packing a busy node further costs more than a quieter node would).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench.sim.cluster import FLEETS, build_cluster, curve_power_w

DECILES = np.linspace(0.0, 1.0, 11)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16, help="simulated nodes (default 16)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the fleet (default 7)")
    args = parser.parse_args(argv)
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    print("fleet   cores  idle W  full W  W/core 0-10 %  50-60 %  90-100 %  top dearer than mid")
    for fleet in FLEETS:
        cluster = build_cluster(args.nodes, args.seed, fleet=fleet)
        watts = curve_power_w(cluster, np.tile(DECILES, (args.nodes, 1)))
        per_core_w = np.diff(watts, axis=1) / (0.1 * cluster.cores[:, None])
        first, middle, top = per_core_w[:, 0], per_core_w[:, 5], per_core_w[:, 9]
        print(
            f"{fleet:7s} {cluster.cores.sum():5.0f} {watts[:, 0].sum():7.0f} "
            f"{watts[:, -1].sum():7.0f} {np.median(first):14.1f} {np.median(middle):8.1f} "
            f"{np.median(top):9.1f}  {int(np.sum(top > middle))} of {args.nodes}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
