"""Simulated clusters with hand-chosen power curves, for the energy bench's tests."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from bench.energy_sim import BenchSettings
from bench.sim.cluster import SimCluster
from bench.sim.engine import SimSettings
from bench.sim.power import PowerAwareExtenderPolicy, PowerManagement
from bench.sim.power_policies import POWER_MANAGEMENT_PROFILE
from bench.sim.runner import extender_policy
from controllers.node_power.policy import PolicySettings
from extender.config import DEFAULT_BUNDLE_DIR
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


@contextlib.contextmanager
def power_managed_extender(
    cluster: SimCluster,
    settings: BenchSettings,
    sim_settings: SimSettings,
    policy_settings: PolicySettings | None = None,
) -> Iterator[tuple[PowerAwareExtenderPolicy, PowerManagement]]:
    """The power-aware extender on the shipped bundle, with the power management profile and the
    node power controller's policy (`PowerManagement`) attached, as the bench runs them."""
    with extender_policy(
        "power-aware+power-management",
        cluster,
        DEFAULT_BUNDLE_DIR,
        settings,
        hears_labels=False,
        config_file=POWER_MANAGEMENT_PROFILE,
        policy_class=PowerAwareExtenderPolicy,
    ) as policy:
        assert isinstance(policy, PowerAwareExtenderPolicy)
        manager = PowerManagement(
            sim_settings, DEFAULT_BUNDLE_DIR, policy_settings, extender=policy
        )
        policy.power = manager
        yield policy, manager
