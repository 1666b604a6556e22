"""The policies with power management, registered by name (contract 5).

- `default+autoscaler`: kube-scheduler's default plugins (`bench.sim.kube_default`) and
  cluster-autoscaler's rule at its defaults (`bench.sim.autoscaler`): the fair competitor;
- `power-aware+power-management`: our extender with the Consolidation score
  (`bench/sim/profiles/power-management.yaml`) and the node power controller's own policy
  (`controllers.node_power.policy`, through `bench.sim.power.PowerManagement`);
- `power-aware+power-management-foresight`: the same, its headroom told how far the trace's
  requested CPU rises within the next boot time: a reference for the distance to the bound
  (`bench.sim.bound`), not a policy a cluster can run.

Both run on the same power states (`bench.sim.power`): boot time and power, shutdown time,
off power, from `SimSettings`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.sim.autoscaler import ClusterAutoscaler
from bench.sim.policies import DefaultPolicy, Policy
from bench.sim.power import PowerAwareExtenderPolicy, PowerManagement
from bench.sim.runner import PolicySpec, extender_policy, register_policy
from bench.sim.scenario import Scenario
from controllers.node_power.policy import ArrivalRateMeter, PolicySettings

POWER_MANAGEMENT_PROFILE = Path(__file__).parent / "profiles" / "power-management.yaml"


@contextlib.contextmanager
def default_with_autoscaler(scenario: Scenario, rng: np.random.Generator) -> Iterator[Policy]:
    policy = DefaultPolicy(rng)
    policy.name = "default+autoscaler"
    # Its own stream for the expander's random choice, so placements draw as `default` does.
    autoscaler_rng = np.random.default_rng([scenario.settings.seed, 15])
    policy.power = ClusterAutoscaler(scenario.sim_settings, autoscaler_rng)
    yield policy


@contextlib.contextmanager
def power_aware_with_power_management(
    scenario: Scenario, rng: np.random.Generator, name: str = "power-aware+power-management"
) -> Iterator[Policy]:
    assert scenario.bundle_dir is not None
    bench = scenario.settings
    with extender_policy(
        name,
        scenario.cluster,
        scenario.bundle_dir,
        bench,
        hears_labels=False,
        config_file=Path(bench.power_management_profile or POWER_MANAGEMENT_PROFILE),
        rng=rng,
        policy_class=PowerAwareExtenderPolicy,
    ) as policy:
        assert isinstance(policy, PowerAwareExtenderPolicy)
        policy.power = power_management_for(scenario, policy)
        yield policy


@contextlib.contextmanager
def power_management_with_foresight(
    scenario: Scenario, rng: np.random.Generator
) -> Iterator[Policy]:
    """power-aware+power-management whose headroom is told how far the trace's requested CPU
    rises within the next boot time (`PowerManagement.foresight`): a reference for what not
    knowing the next boot time's demand costs, as `oracle` is for placement."""
    name = "power-aware+power-management-foresight"
    with power_aware_with_power_management(scenario, rng, name) as policy:
        assert isinstance(policy, PowerAwareExtenderPolicy)
        assert isinstance(policy.power, PowerManagement)
        policy.power.foresight = True
        yield policy


def power_management_for(scenario: Scenario, policy: PowerAwareExtenderPolicy) -> PowerManagement:
    """The node power controller's policy for `policy`'s extender, at the run's settings
    (`--boot-time`, `--cooldown`, `--off-margin-sd`, `--min-headroom-cores`,
    `--headroom-factor`, `--target-wait-p99-s`, `--arrival-windows`)."""
    assert scenario.bundle_dir is not None
    bench = scenario.settings
    settings = PolicySettings(boot_s=scenario.sim_settings.boot_s)
    if bench.power_cooldown_s is not None:
        settings = dataclasses.replace(settings, cooldown_s=bench.power_cooldown_s)
    if bench.off_margin_sd is not None:
        settings = dataclasses.replace(settings, off_margin_sd=bench.off_margin_sd)
    if bench.min_headroom_cores is not None:
        settings = dataclasses.replace(settings, min_headroom_cores=bench.min_headroom_cores)
    if bench.headroom_factor is not None:
        settings = dataclasses.replace(settings, headroom_factor=bench.headroom_factor)
    if bench.target_wait_p99_s:
        settings = dataclasses.replace(settings, target_wait_p99_s=bench.target_wait_p99_s)
    manager = PowerManagement(scenario.sim_settings, scenario.bundle_dir, settings, policy)
    if bench.arrival_windows_s:
        manager.meter = ArrivalRateMeter(bench.arrival_windows_s)
    return manager


register_policy(
    PolicySpec(
        "default+autoscaler",
        "default plugins + cluster-autoscaler's scale-down at its defaults (requests under 0.5 "
        "of allocatable for 10 min, then off; empty nodes in bulk, others one at a time; no "
        "scale-down 10 min after a scale-up) and its scale-up on pending pods (a random node "
        "that fits)",
        default_with_autoscaler,
    )
)
register_policy(
    PolicySpec(
        "power-aware+power-management",
        "power-aware with the Consolidation score + the node power controller's policy "
        "(controllers.node_power.policy: off what stays unneeded, worst idle W/core first; "
        "headroom for the arrival rate; wake the cheapest node for pending pods)",
        power_aware_with_power_management,
        needs_bundle=True,
    )
)
register_policy(
    PolicySpec(
        "power-aware+power-management-foresight",
        "a reference, not a policy: power-aware+power-management with a headroom told how far "
        "the trace's requested CPU rises within the next boot time (no rate meter, no learner; "
        "the same margin and limits)",
        power_management_with_foresight,
        needs_bundle=True,
    )
)
