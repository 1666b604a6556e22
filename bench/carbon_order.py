"""How often ranking by the next hours orders nodes differently from ranking by the present hour.

    python -m bench.carbon_order [--seeds 7,1,3] [--horizons 2,4,8] [--zone-intensity LOW,HIGH]

The node power controller ranks nodes by grams per idle core: idle watts per core times the
node's intensity, its zone's mean over the next `--carbon-horizon` (`PolicySettings.rank_by`,
`livedata.carbon_source.node_g_per_kwh`). The horizon can change a choice only where two nodes'
order by that mean differs from their order by the present hour. On the multizone preset's
cluster and zone series (`bench.sim.carbon`) for each seed, every hour of the run, this counts:

- zone pairs whose order by the present hour differs from their order by the horizon's mean;
- pairs of nodes in different zones whose grams per idle core (true idle power, true hourly
  series: no forecast error) are ordered differently.

It prints the shares; no policy runs. What `bench.energy_sim --carbon-horizon` measures in CO2
follows from how many of the controller's choices hinge on those pairs (docs/results.md).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections.abc import Sequence

import numpy as np

from bench.energy_sim import _intensity_range  # the presets registered, the flag's parser
from bench.sim.carbon import carbon_world
from bench.sim.carbon_series import HOUR_S
from bench.sim.engine import SimSettings
from bench.sim.scenario import PRESETS, BenchSettings, apply_preset_defaults, build_scenario


def order_changes(
    now_g: np.ndarray, ahead_g: np.ndarray, groups: np.ndarray | None = None
) -> tuple[int, int]:
    """(pairs ordered differently by `now_g` and by `ahead_g`, pairs compared); with `groups`,
    only pairs of different groups are compared. A tie on either side is no change."""
    changed = compared = 0
    for a, b in itertools.combinations(range(len(now_g)), 2):
        if groups is not None and groups[a] == groups[b]:
            continue
        compared += 1
        changed += bool((now_g[a] - now_g[b]) * (ahead_g[a] - ahead_g[b]) < 0)
    return changed, compared


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.carbon_order", description=__doc__)
    parser.add_argument("--seeds", default="7,1,3", help="(default: %(default)s)")
    parser.add_argument("--horizons", default="2,4,8", help="hours (default: %(default)s)")
    parser.add_argument(
        "--zone-intensity",
        metavar="LOW,HIGH",
        default=None,
        help="the cleanest and dirtiest zones' means, g/kWh, as bench.energy_sim's flag "
        "(default: the preset's)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        horizons = [int(h) for h in args.horizons.split(",")]
        spread = (
            dict(
                zip(
                    ("zone_low_g_per_kwh", "zone_high_g_per_kwh"),
                    _intensity_range(args.zone_intensity),
                    strict=True,
                )
            )
            if args.zone_intensity
            else {}
        )
    except (ValueError, argparse.ArgumentTypeError) as error:
        print(
            f"error: --seeds and --horizons take integers, --zone-intensity LOW,HIGH: {error}",
            file=sys.stderr,
        )
        return 2
    if not all(h > 0 for h in horizons):
        print("error: --horizons must be positive hours", file=sys.stderr)
        return 2
    for seed in seeds:
        settings, sim_settings = apply_preset_defaults(
            PRESETS["multizone"],
            BenchSettings(preset="multizone", seed=seed, **spread),
            SimSettings(),
            set(spread),
        )
        scenario = build_scenario(settings, sim_settings)
        world, cluster = carbon_world(scenario), scenario.cluster
        idle_w_per_core = cluster.spec.idle_share * cluster.spec.max_power_w / cluster.cores
        zone, series = world.node_zone, world.series.g_per_kwh
        hours = int(np.ceil((scenario.trace.end_s + sim_settings.tail_s) / HOUR_S))
        cores = [int(cluster.cores[zone == z].sum()) for z in range(len(world.series.zones))]
        print(
            f"seed {seed}: zone means {np.round(series[:, :hours].mean(axis=1)).tolist()} g/kWh, "
            f"cores per zone {cores}, {hours} hours"
        )
        for horizon in horizons:
            zones = nodes = (0, 0)
            for hour in range(hours):
                now_g, ahead_g = series[:, hour], series[:, hour : hour + horizon].mean(axis=1)
                zones = tuple(map(sum, zip(zones, order_changes(now_g, ahead_g), strict=True)))
                node_now, node_ahead = (
                    now_g[zone] * idle_w_per_core,
                    ahead_g[zone] * idle_w_per_core,
                )
                changed = order_changes(node_now, node_ahead, zone)
                nodes = tuple(map(sum, zip(nodes, changed, strict=True)))
            print(
                f"  {horizon} h: zone pairs ordered differently {zones[0]}/{zones[1]} "
                f"({zones[0] / zones[1]:.1%}); node pairs across zones {nodes[0]}/{nodes[1]} "
                f"({nodes[0] / nodes[1]:.1%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
