"""Simulated clusters with hand-chosen power curves, for the energy bench's tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from bench.sim.cluster import SimCluster
from training.synth import fleet_spec

GIB = 1024**3


def sim_cluster(
    curve_shares: Sequence[Sequence[float]], max_power_w: Sequence[float], cores: Sequence[float]
) -> SimCluster:
    """Nodes whose power at utilisation u is curve_share (11 points, 0 %..100 %) x max power.

    No curvature warp and no fans, so energy can be computed by hand; 16 GiB each, on the grid.
    """
    count = len(curve_shares)
    spec = dataclasses.replace(
        fleet_spec(count, 0),
        curve_share=np.asarray(curve_shares, dtype=float),
        curvature_exp=np.ones(count),
        max_power_w=np.asarray(max_power_w, dtype=float),
        fan_w_per_c=np.zeros(count),
    )
    return SimCluster(
        spec=spec,
        cores=np.asarray(cores, dtype=float),
        memory_bytes=np.full(count, 16 * GIB),
        on_battery=np.zeros(count, dtype=bool),
        battery_capacity_wh=np.zeros(count),
        solar_peak_w=np.zeros(count),
    )
