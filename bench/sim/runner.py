"""The bench's policies by name, and one policy's run on a scenario.

Each policy is registered as a `PolicySpec`: its name (contract 5 names, so runs compare across
versions), what it is, and how to make it for a scenario (a context manager, because the
extender policies serve a real extender for the length of their run). Modules that add
policies register them with `register_policy`. Each policy's random stream (tie breaks) follows
the seed and its name, so adding a policy moves no other policy's figures.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.sim.cluster import SimCluster, curve_power_w
from bench.sim.engine import PolicyResult, simulate
from bench.sim.pod_faults import FaultPlan, PodFaults
from bench.sim.policies import (
    CheapestPolicy,
    DefaultPolicy,
    ExtenderPolicy,
    OraclePolicy,
    Policy,
    RandomPolicy,
    ReschedulingPolicy,
    SimClock,
    WorldFeed,
)
from bench.sim.scenario import PRESETS, BenchSettings, Scenario
from bench.support.server import serve_app
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.runtime import Runtime
from extender.state import ClusterState, NodeInfo
from predictor.bundle import BundleError

PolicyFactory = Callable[[Scenario, np.random.Generator], AbstractContextManager[Policy]]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    description: str
    make: PolicyFactory
    needs_bundle: bool = False  # serves the extender on the scenario's trained models
    reference: bool = False  # priced on the simulator's true curves: not deployable


POLICIES: dict[str, PolicySpec] = {}


class PolicyNotApplicable(ValueError):
    """A policy that cannot run on the chosen preset (it needs that preset's world)."""


def setup_logging(quiet: bool) -> None:
    """The bench CLIs' logging: progress at INFO (warnings only with `quiet`). The extender,
    the models and the HTTP stack each policy run starts log a line per bundle install and
    warnings we expect here; they are kept to warnings."""
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("extender", "predictor", "training", "uvicorn", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def register_policy(spec: PolicySpec) -> PolicySpec:
    if spec.name in POLICIES:
        raise ValueError(f"policy {spec.name!r} is registered twice")
    POLICIES[spec.name] = spec
    return spec


def policy_rng(scenario: Scenario, name: str) -> np.random.Generator:
    """The policy's own random stream (kube-scheduler's tie breaks), from the seed and the
    policy's name: the same whatever other policies are registered or run beside it."""
    return np.random.default_rng([scenario.settings.seed, 5, zlib.crc32(name.encode())])


def run_policy(name: str, scenario: Scenario, *, progress: bool) -> tuple[PolicyResult, dict]:
    """Simulate one policy on the scenario; returns its result and extender request figures."""
    spec = POLICIES[name]
    if spec.needs_bundle and scenario.bundle_dir is None:
        raise ValueError(f"policy {name} needs a model bundle")
    with spec.make(scenario, policy_rng(scenario, name)) as policy:
        result = simulate(
            scenario.cluster,
            scenario.trace,
            policy,
            scenario.sim_settings,
            progress=progress,
            meters=[make() for make in scenario.meters],
            faults=_faults_of(scenario),
        )
        preset = PRESETS.get(scenario.settings.preset)
        if preset is not None and preset.evaluate is not None:
            preset.evaluate(scenario, result)  # the preset's own KPIs (delay violations...)
        figures = {}
        if isinstance(policy, ExtenderPolicy):
            figures = {
                "extender_requests": policy.requests,
                "extender_mean_ms": round(1000.0 * policy.request_s / max(1, policy.requests), 3),
            }
    return result, figures


def _faults_of(scenario: Scenario) -> PodFaults | None:
    """Fresh fault bookkeeping for one run, when the preset has hidden faults."""
    plan = scenario.world.get("faults")
    if not isinstance(plan, FaultPlan):
        return None
    spec = scenario.cluster.spec
    return plan.run(spec.idle_share * spec.max_power_w)


# ---- one extender service per extender policy (fresh state, simulated clock) ------------------


@contextlib.contextmanager
def extender_policy(
    name: str,
    cluster: SimCluster,
    bundle_dir: Path,
    settings: BenchSettings,
    *,
    hears_labels: bool = True,
    config_file: Path | None = None,
    rng: np.random.Generator | None = None,
    feed: WorldFeed | None = None,
    policy_class: type[ExtenderPolicy] = ExtenderPolicy,
) -> Iterator[ExtenderPolicy]:
    """Serve the extender for one policy run; yields a policy talking to it over HTTP.

    The service is `create_app` on a `Runtime` with its own `ClusterState` (nodes as the Node
    watch would list them), the simulated clock and the scoring profile of `config_file`
    (default: the built-in one), under a real uvicorn on 127.0.0.1. `policy_class` is the
    `ExtenderPolicy` (or a subclass that plays more of the cluster) the run talks through.
    """
    config = ExtenderConfig(
        bundle_dir=bundle_dir,
        port=0,
        assumed_window_s=settings.assumed_window_s,
        config_file=config_file,
    ).validate()
    clock = SimClock()
    runtime = Runtime(config, clock=clock)
    state: ClusterState = runtime.state
    state.replace_nodes(
        NodeInfo(node, float(cores), dict(feed.node_labels(node)) if feed is not None else {})
        for node, cores in zip(cluster.names, cluster.cores, strict=True)
    )
    if not runtime.load_bundle():
        refused = runtime.watcher.last_refused
        raise BundleError(
            f"the extender refused the bundle {bundle_dir}: "
            f"{refused.error if refused else 'unknown error'}"
        )
    # No background threads: curves are refreshed synchronously after each telemetry round.
    try:
        with serve_app(create_app(runtime)) as url:
            policy = policy_class(
                name,
                url,
                state,
                runtime.refresh_curves,
                clock,
                cluster.names,
                cluster.cores,
                settings.extender_weight,
                rng if rng is not None else np.random.default_rng([settings.seed, 5]),
                hears_labels=hears_labels,
                feed=feed,
            )
            try:
                yield policy
            finally:
                policy.close()
    finally:
        runtime.stop()


# ---- the built-in policies -------------------------------------------------------------------


@contextlib.contextmanager
def _simple(policy: Policy) -> Iterator[Policy]:
    yield policy


def _true_power_w(cluster: SimCluster) -> Callable[[np.ndarray], np.ndarray]:
    def true_power_w(util: np.ndarray) -> np.ndarray:
        return curve_power_w(cluster, util)  # fans left out, as the ceiling does

    return true_power_w


def _register_extender(name: str, description: str, *, hears_labels: bool) -> None:
    def make(scenario: Scenario, rng: np.random.Generator) -> AbstractContextManager[Policy]:
        assert scenario.bundle_dir is not None
        return extender_policy(
            name,
            scenario.cluster,
            scenario.bundle_dir,
            scenario.settings,
            hears_labels=hears_labels,
            rng=rng,
        )

    register_policy(PolicySpec(name, description, make, needs_bundle=True))


register_policy(
    PolicySpec(
        "default",
        "kube-scheduler's default plugins (v1.36, or --kube-version): NodeResourcesFit + "
        "LeastAllocated + BalancedAllocation + PodTopologySpread's system defaults",
        lambda scenario, rng: _simple(DefaultPolicy(rng)),
    )
)
register_policy(
    PolicySpec("random", "any node that fits", lambda scenario, rng: _simple(RandomPolicy(rng)))
)
_register_extender(
    "power-aware",
    "default plugins + our extender (/filter, /prioritize) at --extender-weight; every node "
    "looks grid-powered to it",
    hears_labels=False,
)
_register_extender(
    "power-aware+battery",
    "power-aware while battery nodes' energy-status labels reach the extender",
    hears_labels=True,
)
register_policy(
    PolicySpec(
        "oracle",
        "the extender's ranking from the simulator's true curves, no telemetry lag",
        lambda scenario, rng: _simple(
            OraclePolicy(
                _true_power_w(scenario.cluster),
                scenario.cluster.cores,
                scenario.settings.extender_weight,
                rng,
            )
        ),
        reference=True,
    )
)
register_policy(
    PolicySpec(
        "cheapest",
        "the node whose true curve adds the fewest watts, no kube-scheduler scores",
        lambda scenario, rng: _simple(
            CheapestPolicy(_true_power_w(scenario.cluster), scenario.cluster.cores)
        ),
        reference=True,
    )
)
register_policy(
    PolicySpec(
        "rescheduling",
        "cheapest plus free moves of running pods to cheaper nodes every --reschedule-every s",
        lambda scenario, rng: _simple(
            ReschedulingPolicy(
                _true_power_w(scenario.cluster),
                scenario.cluster.cores,
                scenario.settings.reschedule_interval_s,
            )
        ),
        reference=True,
    )
)
