"""The `edge` preset: sites of a few nodes and a cloud, measured RTTs, pods with delay limits.

The world (`EdgeWorld`, built by `prepare` into `scenario.world["edge"]`):

- **Topology.** The largest quarter of the nodes (by cores) form the cloud (label
  `kubernetes.io/role=cloud`); the others are spread over edge sites of about three nodes each
  (`topology.kubernetes.io/zone=site-<k>`). Every node pair has a typical Goldpinger call time
  (HTTP, so 0.5 ms above the network's RTT): 0.4-1.5 ms within a site, 8-30 ms between two
  sites, 25-60 ms from a site to the cloud, 0.3-0.8 ms inside the cloud, drawn per site pair
  plus up to 1 ms per node pair.
- **Measurements, as Goldpinger and the Delay plugin make them.** Every 30 s every node calls
  every other; a call takes the typical time times a log-normal jitter (sigma 0.15), and 0.5 %
  of calls time out at 300 ms. Every refresh (30 s) the extender is given the RTT matrix the
  plugin's background source would publish: per link, the quantile of the last five minutes'
  calls in Goldpinger's buckets, estimated with the plugin's own code
  (`extender.sources.goldpinger.histogram_quantile`, the plugin's default quantile and
  estimate), stamped with the time and valid for `maxAgeS`. The extender never sees the
  typical times, only these measurements.
- **Workload.** The bench's generated trace; 40 % of its pods (drawn per pod) carry one
  `delay_<node>: "<ms>"` label, the node drawn from a random site, the limit from 5 ms (half of
  them: that site only), 20 ms (30 %) and 50 ms (20 %).

A placement **violates** a constraint when the node's typical call time to `<from>` (the
median of the jitter: what the constraint is about) exceeds the limit; `delay_violations`
counts the pods placed in violation, for every policy. `kpis` add the constrained pods, those
left unplaced, and the share of unconstrained pods that went to the cloud.

Policies registered here: `delay-only` (kube-scheduler's default scoring plus our extender with
the Delay filter alone: the seed's constraint without power awareness), `power-aware+delay`
(our default scoring plus the Delay filter with its shipped settings, delay score weight 0:
each link's median over 5 minutes, read as a 95 % upper confidence bound),
`power-aware+delay-median` (the same reading the median as is), `power-aware+delay-p90`
(the same reading the p90 as is), `power-aware+delay+cloud` (the shipped Delay filter plus
CloudPreference at `--cloud-weight`, 0.3 by default: pods without a limit steered to the
cloud, as the edge seed binds them there), and the reference
`cheapest+delay` (the node whose true curve adds the fewest watts among those whose typical RTT
meets the limit: what the constraints cost any placement). `--delay-share` sets the share of
constrained pods.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from bench.sim.ceiling import ceiling_energy_kwh, constrained_ceiling_energy_kwh
from bench.sim.cluster import curve_power_w
from bench.sim.engine import PolicyResult
from bench.sim.policies import CheapestPolicy, Decision, Policy
from bench.sim.runner import PolicyNotApplicable, PolicySpec, extender_policy, register_policy
from bench.sim.scenario import BenchSettings, Preset, Scenario, register_preset
from extender.plugins.delay import DelayArgs
from extender.rtt import RTT_SIGNAL, RttLink, RttMatrix
from extender.sources.goldpinger import histogram_quantile
from livedata.collect_config import parse_duration_s
from livedata.labels import CLOUD_ROLE, DELAY_LABEL_PREFIX, ROLE_LABEL, ZONE_LABEL

WORLD_KEY = "edge"
CLOUD_SHARE = 0.25
NODES_PER_SITE = 3
HTTP_OVERHEAD_MS = 0.5
WITHIN_SITE_MS = (0.4, 1.5)
BETWEEN_SITES_MS = (8.0, 30.0)
SITE_TO_CLOUD_MS = (25.0, 60.0)
WITHIN_CLOUD_MS = (0.3, 0.8)
PER_NODE_PAIR_MS = 1.0
# Goldpinger: a call every REFRESH_INTERVAL (30 s); failed calls at the 300 ms ping timeout.
PING_INTERVAL_S = 30.0
JITTER_SIGMA = 0.15
LOSS = 0.005
TIMEOUT_MS = 300.0
GOLDPINGER_BUCKETS_S = np.array(
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, math.inf]
)
CONSTRAINED_SHARE = 0.4  # BenchSettings.delay_share, --delay-share
LIMITS_MS = (5.0, 20.0, 50.0)
LIMIT_WEIGHTS = (0.5, 0.3, 0.2)
SHIPPED = DelayArgs()  # the plugin's defaults: median over 5 minutes, upper bucket bounds


@dataclass(frozen=True)
class EdgeWorld:
    """Sites, the cloud, typical RTTs between nodes, and each pod's delay constraint."""

    nodes: tuple[str, ...]
    site: np.ndarray  # site index per node; -1 for the cloud
    typical_ms: np.ndarray  # n x n, symmetric, 0 on the diagonal: median Goldpinger call time
    constraints: Mapping[str, tuple[int, float]]  # pod uid -> (origin node index, limit ms)
    seed: int
    positions: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", {n: i for i, n in enumerate(self.nodes)})

    @property
    def cloud(self) -> np.ndarray:
        return self.site < 0

    @property
    def site_count(self) -> int:
        return int(self.site.max()) + 1

    def labels_of(self, uid: str) -> dict[str, str]:
        constraint = self.constraints.get(uid)
        if constraint is None:
            return {}
        origin, limit_ms = constraint
        return {f"{DELAY_LABEL_PREFIX}{self.nodes[origin]}": f"{limit_ms:g}"}

    def node_labels_of(self, node: str) -> dict[str, str]:
        site = int(self.site[self.positions[node]])
        return {ROLE_LABEL: CLOUD_ROLE} if site < 0 else {ZONE_LABEL: f"site-{site + 1}"}

    def allowed_nodes(self, uid: str) -> np.ndarray | None:
        """The nodes whose typical RTT to the pod's origin meets its limit (None: any node)."""
        constraint = self.constraints.get(uid)
        if constraint is None:
            return None
        origin, limit_ms = constraint
        return self.typical_ms[origin] <= limit_ms

    def violates(self, uid: str, node: str) -> bool:
        allowed = self.allowed_nodes(uid)
        return allowed is not None and not bool(allowed[self.positions[node]])


def build_world(
    names: Sequence[str],
    cores: np.ndarray,
    trace_names: Sequence[str],
    seed: int,
    constrained_share: float = CONSTRAINED_SHARE,
) -> EdgeWorld:
    """The edge world of a cluster and a trace (deterministic for a seed)."""
    rng = np.random.default_rng([seed, 18])
    count = len(names)
    cloud_count = max(1, round(CLOUD_SHARE * count))
    # The biggest servers are the cloud's; ties by name, so the split does not depend on order.
    by_size = sorted(range(count), key=lambda i: (-cores[i], names[i]))
    site = np.full(count, -1, dtype=np.intp)
    edge_nodes = np.array(sorted(by_size[cloud_count:]), dtype=np.intp)
    sites = max(1, round(edge_nodes.size / NODES_PER_SITE))
    site[rng.permutation(edge_nodes)] = np.arange(edge_nodes.size) % sites

    between = rng.uniform(*BETWEEN_SITES_MS, (sites, sites))
    between = np.triu(between, 1) + np.triu(between, 1).T
    to_cloud = rng.uniform(*SITE_TO_CLOUD_MS, sites)
    typical = np.zeros((count, count))
    for i in range(count):
        for j in range(i + 1, count):
            a, b = site[i], site[j]
            if a < 0 and b < 0:
                ms = rng.uniform(*WITHIN_CLOUD_MS)
            elif a == b:
                ms = rng.uniform(*WITHIN_SITE_MS)
            elif a < 0 or b < 0:
                ms = to_cloud[max(a, b)] + rng.uniform(0.0, PER_NODE_PAIR_MS)
            else:
                ms = between[a, b] + rng.uniform(0.0, PER_NODE_PAIR_MS)
            typical[i, j] = typical[j, i] = ms + HTTP_OVERHEAD_MS

    pick = np.random.default_rng([seed, 18, 1])
    constraints: dict[str, tuple[int, float]] = {}
    for uid in trace_names:
        if pick.random() >= constrained_share:
            continue
        origin_site = int(pick.integers(sites))
        members = np.flatnonzero(site == origin_site)
        origin = int(pick.choice(members))
        limit_ms = float(pick.choice(LIMITS_MS, p=LIMIT_WEIGHTS))
        constraints[uid] = (origin, limit_ms)
    return EdgeWorld(tuple(names), site, typical, constraints, seed)


class GoldpingerModel:
    """Goldpinger's calls between the simulated nodes and the RTT matrix the Delay source makes.

    Deterministic per world: every policy run gets a new model and sees the same measurements.
    `delay` holds the plugin settings the measurements follow (quantile, window, estimate,
    refresh interval, maximum age).
    """

    def __init__(self, world: EdgeWorld, delay: DelayArgs = SHIPPED, start_s: float = 0.0) -> None:
        self.world = world
        self.delay = delay
        self.rng = np.random.default_rng([world.seed, 18, 2])
        count = len(world.nodes)
        self.window_calls = max(1, round(parse_duration_s(delay.window) / PING_INTERVAL_S))
        self.calls_ms = np.full((count, count, self.window_calls), np.nan)
        self.slot = 0
        # Goldpinger ran before the simulation started: a full window of calls at time 0.
        self.next_call_s = start_s - self.window_calls * PING_INTERVAL_S
        self.next_refresh_s = start_s
        self.off_diagonal = ~np.eye(count, dtype=bool)

    def _call_all(self) -> None:
        shape = self.world.typical_ms.shape
        jitter = np.exp(self.rng.normal(0.0, JITTER_SIGMA, shape))
        lost = self.rng.random(shape) < LOSS
        self.calls_ms[:, :, self.slot] = np.where(lost, TIMEOUT_MS, self.world.typical_ms * jitter)
        self.slot = (self.slot + 1) % self.window_calls

    def signals(self, now_s: float) -> dict[str, object]:
        """The calls made up to `now_s`; a new matrix when a refresh is due."""
        while self.next_call_s <= now_s:
            self._call_all()
            self.next_call_s += PING_INTERVAL_S
        if now_s < self.next_refresh_s:
            return {}
        self.next_refresh_s = now_s + self.delay.refresh_interval_s
        return {RTT_SIGNAL: self.matrix(now_s)}

    def matrix(self, now_s: float) -> RttMatrix:
        """Each directed link's quantile over the window, in Goldpinger's buckets."""
        bounds_ms = 1000.0 * GOLDPINGER_BUCKETS_S
        # Cumulative calls per bucket, per ordered pair: (n, n, buckets).
        cumulative = (self.calls_ms[:, :, :, None] <= bounds_ms).sum(axis=2).astype(float)
        nodes = self.world.nodes
        links = []
        for i, j in zip(*np.nonzero(self.off_diagonal), strict=True):
            rtt_s = histogram_quantile(
                self.delay.quantile,
                GOLDPINGER_BUCKETS_S,
                cumulative[i, j],
                estimate=self.delay.bucket_estimate,
                confidence=self.delay.confidence,
            )
            if not math.isnan(rtt_s):
                links.append(
                    RttLink(nodes[i], nodes[j], 1000.0 * rtt_s, now_s, now_s + self.delay.max_age_s)
                )
        return RttMatrix.build(
            links, nodes=nodes, built_at_s=now_s, sources=("simulated goldpinger",)
        )


@dataclass
class EdgeFeed:
    """The `WorldFeed` of one extender policy run: labels, and Goldpinger's measurements."""

    world: EdgeWorld
    goldpinger: GoldpingerModel

    def pod_labels(self, uid: str) -> Mapping[str, str]:
        return self.world.labels_of(uid)

    def node_labels(self, node: str) -> Mapping[str, str]:
        return self.world.node_labels_of(node)

    def signals(self, now_s: float) -> Mapping[str, object]:
        return self.goldpinger.signals(now_s)


# ---- preset ---------------------------------------------------------------------------------


def world_of(scenario: Scenario) -> EdgeWorld:
    world = scenario.world.get(WORLD_KEY)
    if not isinstance(world, EdgeWorld):
        raise PolicyNotApplicable(
            "this policy places pods with delay constraints: it needs the edge preset's sites "
            "and RTTs (--preset edge)"
        )
    return world


def prepare(scenario: Scenario) -> None:
    cluster = scenario.cluster
    scenario.world[WORLD_KEY] = build_world(
        cluster.names,
        cluster.cores,
        scenario.trace.names,
        scenario.settings.seed,
        scenario.settings.delay_share,
    )


def evaluate(scenario: Scenario, result: PolicyResult) -> None:
    """Fill `delay_violations` and the edge KPIs from the run's placement decisions."""
    world = world_of(scenario)
    placed: dict[str, str] = {}
    for decision in result.decisions:
        if decision.node:
            placed[decision.pod] = decision.node  # the last placement (moves included)
    violating = sum(1 for uid, node in placed.items() if world.violates(uid, node))
    constrained = [uid for uid in scenario.trace.names if uid in world.constraints]
    unconstrained_placed = [uid for uid in placed if uid not in world.constraints]
    on_cloud = sum(1 for uid in unconstrained_placed if world.cloud[world.positions[placed[uid]]])
    result.delay_violations = violating
    result.kpis.update(
        {
            "delay_constrained_pods": len(constrained),
            "delay_constrained_unplaced": sum(1 for uid in constrained if uid not in placed),
            "unconstrained_on_cloud_share": round(
                on_cloud / len(unconstrained_placed) if unconstrained_placed else 0.0, 4
            ),
        }
    )


def report(scenario: Scenario, results: Sequence[PolicyResult]) -> dict[str, float] | None:
    """The delay figures beside the energy, policy by policy, and the least energy any
    placement within the limits could use (`constrained_ceiling_energy_kwh`)."""
    world = world_of(scenario)
    edge_count = int(np.count_nonzero(~world.cloud))
    share = len(world.constraints) / max(1, len(scenario.trace))
    print(
        f"edge: {world.site_count} sites ({edge_count} nodes) and {int(world.cloud.sum())} "
        f"cloud nodes; {len(world.constraints)} of {len(scenario.trace)} pods ({share:.0%}) "
        f"carry a delay_<node> limit of {', '.join(f'{ms:g}' for ms in LIMITS_MS)} ms"
    )
    reference = next((r for r in results if r.policy == "power-aware"), None)
    header = (
        f"{'policy':<20} {'delay violations':>16} {'constrained unplaced':>20} "
        f"{'unplaced':>8} {'unconstrained on cloud':>22} {'energy kWh':>10} "
        f"{'vs power-aware':>14}"
    )
    print(header)
    for result in results:
        versus = f"{result.energy_kwh / reference.energy_kwh:.4f}" if reference is not None else "-"
        print(
            f"{result.policy:<20} {result.delay_violations:>16d} "
            f"{int(result.kpis['delay_constrained_unplaced']):>20d} "
            f"{result.unplaced_pods:>8d} "
            f"{result.kpis['unconstrained_on_cloud_share']:>22.1%} "
            f"{result.energy_kwh:>10.2f} {versus:>14}"
        )
    if scenario.sim_settings.empty_node_power_w is not None or not results:
        return None  # the bounds assume every node stays on
    horizon_s, step_s = results[0].duration_s, scenario.sim_settings.tick_s
    ceiling_kwh = ceiling_energy_kwh(scenario.cluster, scenario.trace, horizon_s, step_s)
    within_kwh = constrained_ceiling_energy_kwh(
        scenario.cluster, scenario.trace, horizon_s, step_s, world.allowed_nodes
    )
    above = within_kwh / ceiling_kwh - 1.0
    print(
        f"ceiling within the delay limits: no placement that keeps every pod within its limit "
        f"uses less than {within_kwh:.2f} kWh with every node on, {above:.1%} above the "
        f"ceiling without limits ({ceiling_kwh:.2f} kWh; bench.sim.ceiling)"
    )
    return {
        "delay_ceiling_energy_kwh": round(within_kwh, 4),
        "delay_ceiling_vs_ceiling": round(within_kwh / ceiling_kwh, 4),
    }


register_preset(
    Preset(
        name="edge",
        description=(
            "the 16 nodes as edge sites of 3 plus a 4-node cloud, Goldpinger-measured RTTs with "
            "jitter, 40 % of pods with delay_<node> limits (5/20/50 ms); no batteries"
        ),
        policies=(
            "default",
            "power-aware",
            "delay-only",
            "power-aware+delay",
            "power-aware+delay-median",
            "power-aware+delay-p90",
            "power-aware+delay+cloud",
            "cheapest",
            "cheapest+delay",
        ),
        defaults={"battery_share": 0.0},
        prepare=prepare,
        evaluate=evaluate,
        report=report,
    )
)


# ---- policies -------------------------------------------------------------------------------

DELAY_ONLY_PROFILE = {
    "plugins": {
        "filter": {"enabled": [{"name": "Delay"}]},
        "score": {"disabled": [{"name": "*"}]},
    }
}
POWER_AWARE_DELAY_PROFILE = {
    "plugins": {
        "filter": {"enabled": [{"name": "Delay"}]},
        "score": {"enabled": [{"name": "Delay", "weight": 0.0}]},
    }
}


def power_aware_delay_cloud_profile(settings: BenchSettings) -> Mapping[str, object]:
    """`power-aware+delay+cloud`'s profile: power-aware+delay's, and CloudPreference at
    `--cloud-weight` (default 0.3, its docstring's example: a cloud node still loses to an edge
    node whose power increase is less than half as large)."""
    plugins = POWER_AWARE_DELAY_PROFILE["plugins"]
    cloud = {"name": "CloudPreference", "weight": settings.cloud_weight}
    return {"plugins": {**plugins, "score": {"enabled": [*plugins["score"]["enabled"], cloud]}}}


def _delay_policy(
    name: str,
    profile: Mapping[str, object] | Callable[[BenchSettings], Mapping[str, object]],
    delay_args: Mapping[str, object],
):
    """The factory of an extender policy with a Delay profile (or one made from the run's
    settings), measured with `delay_args`."""
    delay = DelayArgs(**{_snake(key): value for key, value in delay_args.items()})

    @contextlib.contextmanager
    def make(scenario: Scenario, rng: np.random.Generator) -> Iterator[Policy]:
        world = world_of(scenario)
        assert scenario.bundle_dir is not None
        chosen = profile(scenario.settings) if callable(profile) else profile
        document = {**chosen, "pluginConfig": [{"name": "Delay", "args": dict(delay_args)}]}
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as directory:
            config_file = Path(directory) / "profile.yaml"
            config_file.write_text(yaml.safe_dump(document, sort_keys=False))
            feed = EdgeFeed(world, GoldpingerModel(world, delay))
            with extender_policy(
                name,
                scenario.cluster,
                scenario.bundle_dir,
                scenario.settings,
                hears_labels=True,
                config_file=config_file,
                rng=rng,
                feed=feed,
            ) as policy:
                yield policy

    def factory(scenario: Scenario, rng: np.random.Generator) -> AbstractContextManager[Policy]:
        return make(scenario, rng)

    return factory


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


register_policy(
    PolicySpec(
        "delay-only",
        "kube-scheduler's default scores + our extender with the Delay filter only (edge preset)",
        _delay_policy("delay-only", DELAY_ONLY_PROFILE, {}),
        needs_bundle=True,
    )
)
register_policy(
    PolicySpec(
        "power-aware+delay",
        "power-aware + the Delay filter on Goldpinger-measured RTTs, shipped settings: median "
        "over 5 min as a 95 % upper confidence bound, upper bucket bound (edge preset)",
        _delay_policy("power-aware+delay", POWER_AWARE_DELAY_PROFILE, {}),
        needs_bundle=True,
    )
)
register_policy(
    PolicySpec(
        "power-aware+delay+cloud",
        "power-aware+delay plus CloudPreference at --cloud-weight (default 0.3): pods without "
        "a delay limit steered to kubernetes.io/role=cloud nodes (edge preset)",
        _delay_policy("power-aware+delay+cloud", power_aware_delay_cloud_profile, {}),
        needs_bundle=True,
    )
)
register_policy(
    PolicySpec(
        "power-aware+delay-p90",
        "power-aware+delay judging links by their p90 over 5 min read as is (quantile: 0.9, "
        "confidence: 0) (edge preset)",
        _delay_policy(
            "power-aware+delay-p90",
            POWER_AWARE_DELAY_PROFILE,
            {"quantile": 0.9, "confidence": 0.0},
        ),
        needs_bundle=True,
    )
)


class CheapestWithinLimits(CheapestPolicy):
    """A reference: the node whose true curve adds the fewest watts among those whose typical
    RTT meets the pod's constraint (true RTTs, true curves: not deployable). Beside `cheapest`
    it prices the constraints themselves, whatever the scheduler."""

    name = "cheapest+delay"

    def __init__(self, world: EdgeWorld, true_power_w, node_cores: np.ndarray) -> None:
        super().__init__(true_power_w, node_cores)
        self.world = world
        self._uid = ""

    def place(self, uid: str, pod, ledger, now_s: float):
        self._uid = uid
        return super().place(uid, pod, ledger, now_s)

    def choose(self, pod, ledger, feasible: np.ndarray, increase_w: np.ndarray):
        within = self.world.allowed_nodes(self._uid)
        if within is not None:
            allowed = within[feasible]
            if not allowed.any():
                return Decision(None, reason="no node with room meets the delay limit")
            feasible, increase_w = feasible[allowed], increase_w[allowed]
        return super().choose(pod, ledger, feasible, increase_w)


register_policy(
    PolicySpec(
        "cheapest+delay",
        "cheapest among the nodes whose true RTT meets the pod's delay limit (edge preset)",
        lambda scenario, rng: contextlib.nullcontext(
            CheapestWithinLimits(
                world_of(scenario),
                lambda util: curve_power_w(scenario.cluster, util),
                scenario.cluster.cores,
            )
        ),
        reference=True,
    )
)


register_policy(
    PolicySpec(
        "power-aware+delay-median",
        "power-aware+delay judging links by their median over 5 min read as is, without the "
        "confidence bound (confidence: 0; the shipped setting before it) (edge preset)",
        _delay_policy("power-aware+delay-median", POWER_AWARE_DELAY_PROFILE, {"confidence": 0.0}),
        needs_bundle=True,
    )
)
