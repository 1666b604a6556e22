"""Reward (score, optional filter): stop sending pods where they crash.

Nodes have faults that hurt some workloads and not others: a bad DIMM, a kernel or driver
mismatch, a noisy neighbour, thermal throttling. The power score alone keeps sending pods to
the cheapest node even when they die there. This plugin learns, from what pods did on each
node (`extender.rewards`: restarts, OOM kills, crash loops, readiness failures, evictions,
pods that never start, against healthy running time and completions), a reward per node and
per node x workload, and

- scores each candidate `10 x reward`, where the reward is an optimistic bound (0..1) of the
  chance that a placement of this pod's workload goes well there: ~1 for a node that is known
  good *and* for one with no evidence, low only when recent evidence says the node fails
  this workload (`extender.rewards.model` explains the choice and its failure modes);
- as a filter (when enabled), fails a candidate whose reward for the pod's workload is at most
  `filterThreshold` with at least `filterMinEvidence` recent outcomes of that workload there
  (its pods placed there and not judged yet count too, and shrink the bound's optimism, so a
  bad node is probed by a pod or two at a time, not a burst), and says so; unresolvable
  (preemption cannot repair a node). When that would fail every candidate, it fails none: a
  workload that fails everywhere is failing, not its nodes.

The workload is the pod's controller (Deployment, StatefulSet, Job...) or its `app` label
(`extender.rewards.outcomes.workload_of`); a pod without either is scored on its nodes'
overall rewards. The evidence fades with `halfLifeS`, so a repaired node earns pods back.

The data comes from a background source (`extender.rewards.source`) fed by the extender's pod
watch (live mode), published as the `rewards` state signal; the request path only reads it.
The evidence is saved to the ConfigMap `configMap` every `saveIntervalS` (`persist`), and
loaded at start. `/explain` adds `workload`, `reward` (what the score uses), `reward_node`
(the node over all workloads), `reward_good` and `reward_bad` (decayed outcomes of the
workload there, or of the node for a pod without workload), `reward_evidence` (their sum) and
`reward_in_flight` (pods placed there with no outcome yet).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.plugins.base import PASS_ALL, FilterVerdict, LiveSource, Plugin, SourceContext
from extender.rewards.model import (
    DEFAULT_MAX_NODES,
    DEFAULT_MAX_PAIRS,
    DEFAULT_MAX_WORKLOADS,
    RewardSnapshot,
    ScoringConstants,
    pair_evidence,
    reward_index,
)
from extender.rewards.outcomes import DEFAULT_MAX_TRACKED_PODS, OutcomeSettings, workload_of
from extender.rewards.source import REWARD_SIGNAL, RewardSettings, RewardSource

if TYPE_CHECKING:
    from extender.cycle import Cycle

DEFAULT_CONFIG_MAP = "power-extender-rewards"


@dataclass(frozen=True)
class RewardArgs:
    """The plugin's arguments (camelCase in `pluginConfig`)."""

    half_life_s: float = 21_600.0  # evidence halves every 6 h: a repaired node recovers
    exploration: float = 2.0  # sds of optimism in the reward bound
    node_share: float = 0.1  # weight per outcome of the node's other workloads' evidence ...
    node_evidence_max: float = 1.0  # ... up to this many outcomes in all
    filter_threshold: float = 0.3  # the filter fails a node whose reward is at most this ...
    filter_min_evidence: float = 5.0  # ... with at least this many recent outcomes there
    healthy_interval_s: float = 600.0  # continuous readiness that counts as one good outcome
    readiness_grace_s: float = 300.0  # not ready (containers running) longer: one bad outcome
    start_grace_s: float = 600.0  # bound but no container started this long: one bad outcome
    namespaces: tuple[str, ...] = ()  # learn from pods in these namespaces only (empty: all)
    max_nodes: int = DEFAULT_MAX_NODES
    max_workloads: int = DEFAULT_MAX_WORKLOADS
    max_pairs: int = DEFAULT_MAX_PAIRS
    max_tracked_pods: int = DEFAULT_MAX_TRACKED_PODS
    persist: bool = True  # save the evidence to a ConfigMap (live mode)
    config_map: str = DEFAULT_CONFIG_MAP
    config_map_namespace: str = ""  # empty: $POD_NAMESPACE, else the service account's
    save_interval_s: float = 60.0
    publish_interval_s: float = 1.0

    def __post_init__(self) -> None:
        namespaces = self.namespaces
        if isinstance(namespaces, str) or not all(isinstance(n, str) and n for n in namespaces):
            raise ValueError(f"namespaces must be a list of namespace names, got {namespaces!r}")
        object.__setattr__(self, "namespaces", tuple(namespaces))
        if not 0 <= self.filter_threshold <= 1:
            raise ValueError(f"filterThreshold must be 0..1, got {self.filter_threshold!r}")
        for name, value in (
            ("filterMinEvidence", self.filter_min_evidence),
            ("saveIntervalS", self.save_interval_s),
            ("publishIntervalS", self.publish_interval_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if not self.config_map:
            raise ValueError("configMap must name a ConfigMap")
        # The settings below check their own ranges and name the argument.
        self.settings()
        self.constants()

    def constants(self) -> ScoringConstants:
        return ScoringConstants(
            exploration=self.exploration,
            node_share=self.node_share,
            node_evidence_max=self.node_evidence_max,
        )

    def settings(self) -> RewardSettings:
        return settings_from_args(self)


def settings_from_args(args: RewardArgs) -> RewardSettings:
    """The reward source's settings from the plugin's arguments (also used by the bench)."""
    for name, value in (
        ("halfLifeS", args.half_life_s),
        ("healthyIntervalS", args.healthy_interval_s),
        ("readinessGraceS", args.readiness_grace_s),
        ("startGraceS", args.start_grace_s),
    ):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    outcomes = OutcomeSettings(
        healthy_interval_s=args.healthy_interval_s,
        readiness_grace_s=args.readiness_grace_s,
        start_grace_s=args.start_grace_s,
    )
    for name, value in (
        ("maxNodes", args.max_nodes),
        ("maxWorkloads", args.max_workloads),
        ("maxPairs", args.max_pairs),
        ("maxTrackedPods", args.max_tracked_pods),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    return RewardSettings(
        half_life_s=args.half_life_s,
        outcomes=outcomes,
        namespaces=args.namespaces,
        max_nodes=args.max_nodes,
        max_workloads=args.max_workloads,
        max_pairs=args.max_pairs,
        max_tracked_pods=args.max_tracked_pods,
        publish_interval_s=args.publish_interval_s,
        save_interval_s=args.save_interval_s,
    )


class CandidateRewards:
    """The rewards of one pod's candidates (arrays aligned to `cycle.names`).

    `reward` is what the score and filter use: the bound for the pod's workload, or the
    node's without one; `good`, `bad` and `in_flight` are the workload's (or the node's).
    """

    def __init__(
        self,
        workload: str | None,
        reward: np.ndarray,
        good: np.ndarray,
        bad: np.ndarray,
        in_flight: np.ndarray,
        node: tuple[np.ndarray, np.ndarray, np.ndarray],
        constants: ScoringConstants,
    ) -> None:
        self.workload = workload
        self.reward = reward
        self.good = good
        self.bad = bad
        self.in_flight = in_flight
        self._node = node
        self._constants = constants

    @property
    def evidence(self) -> np.ndarray:
        return self.good + self.bad

    @cached_property
    def node_reward(self) -> np.ndarray:
        """The node's bound over all workloads (for `/explain`; computed when asked)."""
        return reward_index(*self._node, self._constants)


class Reward(Plugin):
    name = "Reward"
    Args = RewardArgs

    def __init__(self, args: Any = None) -> None:
        super().__init__(args)
        self.constants = self.args.constants()
        self.source: RewardSource | None = None
        # The last cycle's rewards: filter, score and explain of one request share them.
        self._last: tuple[object, CandidateRewards] | None = None
        self._decayed = _DecayedNodes()

    # ---- extension points -----------------------------------------------------------------

    def filter(self, cycle: Cycle) -> FilterVerdict:
        rewards = self.rewards(cycle)
        if rewards.workload is None:
            return PASS_ALL
        args = self.args
        # Pods placed and not judged yet count as evidence at the reward they were placed on
        # (as in the index): a bad node is probed by a pod or two at a time, not a burst.
        failing = np.flatnonzero(
            (rewards.evidence + rewards.in_flight >= args.filter_min_evidence)
            & (rewards.reward <= args.filter_threshold)
        )
        if failing.size == 0 or failing.size == len(cycle):
            return PASS_ALL  # all failing: it is the workload, not the nodes
        reasons = {
            i: (
                f"reward {rewards.reward[i]:.2f} <= {args.filter_threshold:g} for "
                f"{rewards.workload} on this node: {rewards.bad[i]:.1f} failed and "
                f"{rewards.good[i]:.1f} good recent outcomes (half-life {args.half_life_s:g} s)"
            )
            for i in failing.tolist()
        }
        return FilterVerdict(reasons, frozenset(reasons))

    def score(self, cycle: Cycle) -> np.ndarray:
        return self.rewards(cycle).reward

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        return np.clip(10.0 * np.nan_to_num(raw, nan=0.0), 0.0, 10.0)

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        rewards = self.rewards(cycle)
        return {
            "workload": [rewards.workload] * len(cycle),
            "reward": _rounded(rewards.reward),
            "reward_node": _rounded(rewards.node_reward),
            "reward_good": _rounded(rewards.good),
            "reward_bad": _rounded(rewards.bad),
            "reward_evidence": _rounded(rewards.evidence),
            "reward_in_flight": rewards.in_flight.astype(int).tolist(),
        }

    def background(self, context: SourceContext) -> Sequence[LiveSource]:
        from extender.rewards.store import ConfigMapStore, default_namespace

        args = self.args
        store = None
        if context.pod_watch is None:
            learning_from = f"nothing: no pod watch in {context.mode} mode"
        else:
            scope = ", ".join(args.namespaces) if args.namespaces else "all namespaces"
            learning_from = f"the pod watch ({scope})"
            if args.persist and context.kube_api is not None:
                namespace = args.config_map_namespace or default_namespace()
                store = ConfigMapStore(context.kube_api, namespace, args.config_map)
        source = RewardSource(
            args.settings(),
            context.state,
            clock=context.clock,
            store=store,
            registry=context.registry,
            learning_from=learning_from,
        )
        if context.pod_watch is not None:
            context.pod_watch.add_pod_listener(source)
        self.source = source
        return [source]

    def status(self) -> Mapping[str, Any] | None:
        if self.source is None:
            return {"learning_from": "nothing: the reward source is not running"}
        return self.source.status()

    # ---- the rewards of a cycle's candidates -----------------------------------------------

    def rewards(self, cycle: Cycle) -> CandidateRewards:
        last = self._last
        if last is not None and last[0] is cycle:
            return last[1]
        rewards = candidate_rewards(cycle, self.constants, self._decayed)
        self._last = (cycle, rewards)
        return rewards


def candidate_rewards(
    cycle: Cycle, constants: ScoringConstants, decayed: _DecayedNodes | None = None
) -> CandidateRewards:
    """Each candidate's reward for the cycle's pod, from the published snapshot."""
    count = len(cycle)
    workload = workload_of(cycle.pod) if cycle.pod else None
    snapshot: RewardSnapshot | None = cycle.view.signal(REWARD_SIGNAL)
    pair_good, pair_bad, pair_flying = np.zeros(count), np.zeros(count), np.zeros(count)
    if snapshot is None or not snapshot.node_names:
        node = (np.zeros(count), np.zeros(count), np.zeros(count))
    else:
        rows, inverse = _rows(cycle, snapshot)
        node = _node_evidence(cycle, snapshot, rows, decayed or _DecayedNodes())
        pairs = snapshot.workloads.get(workload) if workload is not None else None
        if pairs is not None and pairs.rows.size:
            positions = inverse[pairs.rows]
            here = positions >= 0
            at = positions[here]
            pair_at_s = pairs.at_s[here]
            pair_good[at] = snapshot.decayed(pairs.good[here], pair_at_s, cycle.now_s)
            pair_bad[at] = snapshot.decayed(pairs.bad[here], pair_at_s, cycle.now_s)
        flying = snapshot.pair_in_flight.get(workload) if workload is not None else None
        if flying is not None:
            positions = inverse[flying[0]]
            here = positions >= 0
            pair_flying[positions[here]] = flying[1][here]
    node_good, node_bad, node_flying = node
    if workload is None:
        reward = reward_index(node_good, node_bad, node_flying, constants)
        return CandidateRewards(None, reward, node_good, node_bad, node_flying, node, constants)
    good, bad = pair_evidence(pair_good, pair_bad, node_good, node_bad, constants)
    reward = reward_index(good, bad, pair_flying, constants)
    return CandidateRewards(workload, reward, pair_good, pair_bad, pair_flying, node, constants)


class _DecayedNodes:
    """Every node's counts decayed to the second, for one snapshot (a one-slot cache).

    Computed once per snapshot and second (an hour-scale half-life moves nothing within a
    second), then gathered per request; a zero row at the end is where candidates without
    evidence read. Swapped whole, so readers on other threads see one consistent entry.
    """

    def __init__(self) -> None:
        self._slot: tuple[RewardSnapshot, int, tuple[np.ndarray, ...]] | None = None

    def at(self, snapshot: RewardSnapshot, now_s: float) -> tuple[np.ndarray, ...]:
        second = math.floor(now_s)
        slot = self._slot
        if slot is not None and slot[0] is snapshot and slot[1] == second:
            return slot[2]
        good, bad = snapshot.node_counts(float(second))
        arrays = tuple(
            _frozen(np.append(values, 0.0)) for values in (good, bad, snapshot.node_in_flight)
        )
        self._slot = (snapshot, second, arrays)
        return arrays


def _node_evidence(
    cycle: Cycle, snapshot: RewardSnapshot, rows: np.ndarray, decayed: _DecayedNodes
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates' node evidence: good, bad (decayed to now), in flight."""
    good, bad, flying = decayed.at(snapshot, cycle.now_s)
    return good.take(rows), bad.take(rows), flying.take(rows)


def _rows(cycle: Cycle, snapshot: RewardSnapshot) -> tuple[np.ndarray, np.ndarray]:
    """Snapshot row of each candidate (the appended zero row for one without evidence), and
    candidate position of each snapshot row (-1: none); remembered per candidate list and
    snapshot, as kube-scheduler repeats its lists."""
    key = ("reward_rows", id(snapshot), id(cycle.candidates))
    cached = cycle.view.recall(key)
    if cached is not None:
        return cached
    rows = snapshot.rows_of(cycle.names)
    inverse = np.full(len(snapshot.node_names), -1, dtype=np.intp)
    known = np.flatnonzero(rows >= 0)
    inverse[rows[known]] = known
    rows[rows < 0] = len(snapshot.node_names)  # the zero row `_node_evidence` appends
    rows.flags.writeable = False
    inverse.flags.writeable = False
    cycle.view.remember(key, (rows, inverse), snapshot, cycle.candidates)
    return rows, inverse


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _rounded(values: np.ndarray) -> list[float]:
    return [round(v, 4) for v in values.tolist()]
