"""What carbon-aware placement saves as grid zones differ more: the multizone preset over spreads.

    python -m bench.carbon_sweep [--spreads 300:300,150:450,100:600,50:700,20:900]
                                 [--hours 24] [--seed 7] [--deferrable-share 0]
                                 [--empty-node-power W] [--out-dir out/energy_sim] [--json FILE]

Each spread `LOW:HIGH` sets the long-run mean intensity of the cleanest and the dirtiest of the
four zones (g/kWh; the others geometric between, `bench.sim.carbon_series`); the zones' shapes
(solar dip, evening peak, wind-driven walk) come from the seed, so only the spread changes
between rows. Published grid data span about 20 (hydro, nuclear) to 750 (coal) g/kWh; 50:700 is
the preset's default.

Placement by the carbon-blind policies (`default`, `power-aware`) does not depend on
intensities, so each runs once with one CO2 meter per spread; `power-aware+carbon` runs once
per spread. Every figure is measured in this run, against the default scheduler's and
power-aware's of the same spread: CO2 (kg), the share of it above the nodes' idle emissions
(what placement can change while every node stays on), energy, and the least CO2 any placement
with every node on could emit (`bench.sim.carbon.co2_ceiling`; not with --empty-node-power).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from bench.sim import presets as _presets  # noqa: F401  (registers the multizone preset)
from bench.sim.carbon import CarbonMeter, carbon_world, co2_ceiling
from bench.sim.engine import SimSettings
from bench.sim.kube_default import DEFAULT_KUBE_VERSION, KUBE_VERSIONS
from bench.sim.runner import run_policy, setup_logging
from bench.sim.scenario import (
    PRESETS,
    BenchSettings,
    apply_preset_defaults,
    build_scenario,
    trained_bundle,
)

log = logging.getLogger("bench.carbon_sweep")

DEFAULT_SPREADS = ((300.0, 300.0), (150.0, 450.0), (100.0, 600.0), (50.0, 700.0), (20.0, 900.0))
BLIND = ("default", "power-aware")
CARBON = "power-aware+carbon"


def parse_spreads(text: str) -> tuple[tuple[float, float], ...]:
    spreads = []
    for part in text.split(","):
        try:
            low, high = (float(v) for v in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LOW:HIGH pairs, got {part!r}") from None
        if not 0 < low <= high:
            raise argparse.ArgumentTypeError(f"need 0 < LOW <= HIGH, got {part!r}")
        spreads.append((low, high))
    return tuple(spreads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.carbon_sweep",
        description=(
            "CO2 and energy of default, power-aware and power-aware+carbon on the multizone "
            "preset, for several spreads between the cleanest and the dirtiest zone."
        ),
    )
    parser.add_argument(
        "--spreads",
        type=parse_spreads,
        default=DEFAULT_SPREADS,
        metavar="LOW:HIGH,...",
        help="zone mean ranges in g/kWh (default "
        + ",".join(f"{lo:g}:{hi:g}" for lo, hi in DEFAULT_SPREADS)
        + ")",
    )
    parser.add_argument("--hours", type=float, default=24.0, help="hours of pod arrivals (24)")
    parser.add_argument("--seed", type=int, default=7, help="seed of cluster, trace, zones (7)")
    parser.add_argument(
        "--deferrable-share",
        type=float,
        default=0.0,
        help="share of pods with power-aware-scheduler/defer-until (0)",
    )
    parser.add_argument(
        "--empty-node-power",
        type=float,
        default=None,
        metavar="WATTS",
        help="nodes running nothing sleep at this power (instant wake-up, optimistic)",
    )
    parser.add_argument(
        "--kube-version",
        choices=KUBE_VERSIONS,
        default=DEFAULT_KUBE_VERSION,
        help="whose default plugins and scores the simulated kube-scheduler gives "
        f"({DEFAULT_KUBE_VERSION})",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("out/energy_sim"))
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def sweep(
    spreads: Sequence[tuple[float, float]],
    settings: BenchSettings,
    sim_settings: SimSettings,
    out_dir: Path,
    *,
    progress: bool,
) -> list[dict]:
    """One row of figures per spread (see the module docstring)."""
    scenarios = [
        build_scenario(
            replace(settings, zone_low_g_per_kwh=low, zone_high_g_per_kwh=high), sim_settings
        )
        for low, high in spreads
    ]
    bundle_dir = trained_bundle(settings, out_dir, progress=progress)
    for scenario in scenarios:
        scenario.bundle_dir = bundle_dir

    # Carbon-blind placement: one run per policy, metered against every spread's zones.
    blind: dict[str, list[CarbonMeter]] = {}
    first = scenarios[0]
    own_meters = first.meters  # its own spread's, for its power-aware+carbon run below
    try:
        for name in BLIND:
            meters = [CarbonMeter(carbon_world(s), s.cluster) for s in scenarios]
            first.meters = [lambda meter=meter: meter for meter in meters]
            started = time.perf_counter()
            run_policy(name, first, progress=progress)
            log.info("%s: %.0f s", name, time.perf_counter() - started)
            blind[name] = meters
    finally:
        first.meters = own_meters

    rows = []
    for i, ((low, high), scenario) in enumerate(zip(spreads, scenarios, strict=True)):
        started = time.perf_counter()
        result, _ = run_policy(CARBON, scenario, progress=progress)
        log.info("%s at %g:%g: %.0f s", CARBON, low, high, time.perf_counter() - started)
        default, power_aware = blind["default"][i], blind["power-aware"][i]
        carbon_above_idle_kg = result.kpis["co2_above_idle_kg"]
        default_above_idle_kg = (default.co2_g - default.idle_co2_g) / 1000.0
        rows.append(
            {
                "zone_means_g_per_kwh": [
                    round(float(m), 1) for m in carbon_world(scenario).series.means()
                ],
                "low": low,
                "high": high,
                "co2_kg": {
                    "default": round(default.co2_g / 1000.0, 4),
                    "power-aware": round(power_aware.co2_g / 1000.0, 4),
                    CARBON: round(result.co2_kg, 4),
                },
                "energy_kwh": {
                    "default": round(default.energy_kwh, 4),
                    "power-aware": round(power_aware.energy_kwh, 4),
                    CARBON: round(result.energy_kwh, 4),
                },
                "co2_above_idle_kg": {
                    "default": round(default_above_idle_kg, 4),
                    CARBON: carbon_above_idle_kg,
                },
                "unplaced_pods": result.unplaced_pods,
                "kpis": dict(result.kpis),
            }
        )
        if scenario.sim_settings.empty_node_power_w is None:  # the bound keeps every node on
            rows[-1]["co2_ceiling_kg"] = round(co2_ceiling(scenario, result.duration_s).co2_kg, 4)
    return rows


def print_rows(rows: Sequence[dict], kube_version: str = DEFAULT_KUBE_VERSION) -> None:
    print(f"default: kube-scheduler v{kube_version}'s default plugins")
    print(
        f"{'zones g/kWh':<30} {'CO2 kg default':>14} {'power-aware':>11} {'+carbon':>8} "
        f"{'vs default':>10} {'vs power-aware':>14} {'above idle vs default':>21} "
        f"{'energy vs power-aware':>21} {'ceiling vs default':>18}"
    )
    for row in rows:
        co2, energy, above = row["co2_kg"], row["energy_kwh"], row["co2_above_idle_kg"]
        ceiling = (
            f"{row['co2_ceiling_kg'] / co2['default'] - 1:>+18.1%}"
            if "co2_ceiling_kg" in row
            else f"{'-':>18}"
        )
        means = "/".join(f"{m:.0f}" for m in row["zone_means_g_per_kwh"])
        print(
            f"{means:<30} {co2['default']:>14.2f} {co2['power-aware']:>11.2f} {co2[CARBON]:>8.2f} "
            f"{co2[CARBON] / co2['default'] - 1:>+10.1%} "
            f"{co2[CARBON] / co2['power-aware'] - 1:>+14.1%} "
            f"{above[CARBON] / above['default'] - 1:>+21.1%} "
            f"{energy[CARBON] / energy['power-aware'] - 1:>+21.1%} {ceiling}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)
    if not 0 <= args.deferrable_share <= 1:
        print(
            f"error: --deferrable-share must be 0..1, got {args.deferrable_share}", file=sys.stderr
        )
        return 2
    settings, sim_settings = apply_preset_defaults(
        PRESETS["multizone"], BenchSettings(preset="multizone"), SimSettings(), set()
    )
    settings = replace(
        settings, hours=args.hours, seed=args.seed, deferrable_share=args.deferrable_share
    )
    sim_settings = replace(
        sim_settings, empty_node_power_w=args.empty_node_power, kube_version=args.kube_version
    )
    rows = sweep(args.spreads, settings, sim_settings, args.out_dir, progress=not args.quiet)
    print_rows(rows, args.kube_version)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "settings": vars(args)
                    | {
                        "spreads": args.spreads,
                        "out_dir": str(args.out_dir),
                        "json": str(args.json),
                    },
                    "rows": rows,
                },
                indent=1,
                default=str,
            )
        )
        print(f"figures: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
