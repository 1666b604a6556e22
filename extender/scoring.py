"""Filter verdicts and scores: the decision the extender exists for, as pure array functions.

For each candidate node, with `u` its measured CPU utilisation, `a` the CPU of pods bound
recently (whose load the metrics do not show yet) and `d` the pod's CPU demand, both over the
node's allocatable CPU, the predicted power increase of placing the pod there is

    dP = P_node(u + a + d) - P_node(u + a)

read from the node's tabulated curve (`predictor.curves.CurveTable`). The power score ranks
candidates by `dP` in float precision, relative to the cheapest candidate with fresh telemetry
and a curve:

    power = clip(10 - 5 * log2(dP / dP_min), 0, 10)

so the cheapest node scores 10, a node whose increase is 15 % higher about one point less, one
twice as costly 5, and four times or more 0 (all equal: all 10). A ratio, not min-max over the
candidates: min-max sets the scale by the most expensive node, so one inefficient node squeezes
every reasonable candidate into the top point or two, and kube-scheduler's spreading plugins
(LeastAllocated, BalancedAllocation), whose scores are added to ours, then overturn differences
of 50 % in watts. In `bench.energy_sim` (16 nodes, 45 % of the CPU requested, seeds 1, 3, 7)
the extender saved 6.8-8.3 % of the default placement's energy with min-max and 8.1-9.5 % with
the ratio, as much as always taking the cheapest node does. Increases below 1 mW count as
1 mW. A node without telemetry (none, stale, or no allocatable CPU) or without a curve gets
power score 0, so a missing metric never looks best. The energy score comes from the node
label `energy-status`:

    label            stored energy   energy score
    (no label)       grid power      10
    well-powered     75-100 %        10
    vulnerable       40-75 %          6
    low-powered      15-40 %          3
    powerless        0-15 %           0  (and fails the filter)
    anything else    unknown          6  (treated like vulnerable: neither trusted nor
                                          excluded; the state logs it when the node is written)

The final score is `round_half_up((w_power * power + w_energy * energy) / (w_power + w_energy))`,
a Python int 0..10. The default weights (0.6, 0.4) price a battery's watts above the grid's:
a well-powered node beats a low-powered one unless its power score is lower by more than 4.7
(its increase about 1.9 times the low-powered node's), and a vulnerable one unless lower by
more than 2.7 (about 1.45 times). With (0.7, 0.3) the low-powered node's watts cost only 1.5
times as much, and in `bench.energy_sim` battery nodes then spent more hours powerless (25 h
against 18 h). Names the extender does not know score 0 and pass the filter (the watch may just
be behind).

The filter fails `powerless` nodes and nodes whose predicted power after placement exceeds
their `power-aware-scheduler/max-power-w` annotation. Nodes without telemetry pass. Powerless
nodes are also marked unresolvable, so that the scheduler does not try preemption on them;
a max-power failure is resolvable (evicting pods lowers the node's power).

Everything that does not depend on the pod (u, a, which nodes have telemetry and a curve,
P(u + a)) is computed once per cluster view and candidate list (`candidate_state`) and
remembered on the view: scoring the next pod on the same candidates costs d, one curve lookup
and the normalisation. Nothing here logs or does I/O: the caller gets counters in the
`Assessment` and logs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from extender.state import Candidates, ClusterView, NodeInfo

ENERGY_LABEL = "energy-status"
MAX_POWER_ANNOTATION = "power-aware-scheduler/max-power-w"
MAX_SCORE = 10
# Power score points lost each time a node's increase doubles against the cheapest candidate's.
POINTS_PER_DOUBLING = 5.0
MIN_INCREASE_W = 1e-3


class EnergyLevel(IntEnum):
    """Codes stored in `ClusterView.energy_level` (int8)."""

    POWERLESS = 0
    LOW_POWERED = 1
    VULNERABLE = 2
    WELL_POWERED = 3
    GRID = 4
    UNKNOWN = 5


ENERGY_LABEL_VALUES: Mapping[str, EnergyLevel] = {
    "powerless": EnergyLevel.POWERLESS,
    "low-powered": EnergyLevel.LOW_POWERED,
    "vulnerable": EnergyLevel.VULNERABLE,
    "well-powered": EnergyLevel.WELL_POWERED,
}

# Plain ints for the request path (an IntEnum member lookup costs microseconds there).
_POWERLESS = int(EnergyLevel.POWERLESS)
_UNKNOWN = int(EnergyLevel.UNKNOWN)

# How the explain view spells each level: the label values, "grid" (no label), "unknown".
ENERGY_LEVEL_NAMES: Mapping[EnergyLevel, str] = {
    **{level: label for label, level in ENERGY_LABEL_VALUES.items()},
    EnergyLevel.GRID: "grid",
    EnergyLevel.UNKNOWN: "unknown",
}

# Indexed by EnergyLevel code.
ENERGY_SCORES = np.array([0.0, 3.0, 6.0, 10.0, 10.0, 6.0])
ENERGY_SCORES.flags.writeable = False


def energy_level_of(labels: Mapping[str, str] | None) -> EnergyLevel:
    """The node's energy level from its labels; no `energy-status` label means grid power."""
    if not labels:
        return EnergyLevel.GRID
    value = labels.get(ENERGY_LABEL)
    if value is None:
        return EnergyLevel.GRID
    return ENERGY_LABEL_VALUES.get(value, EnergyLevel.UNKNOWN)


def max_power_of(annotations: Mapping[str, str] | None) -> float:
    """The node's max-power annotation in watts; NaN when absent or not a positive number."""
    if not annotations:
        return math.nan
    raw = annotations.get(MAX_POWER_ANNOTATION)
    if raw is None:
        return math.nan
    try:
        watts = float(raw)
    except (TypeError, ValueError):
        return math.nan
    return watts if math.isfinite(watts) and watts > 0 else math.nan


@dataclass(frozen=True)
class ScoringWeights:
    """Relative weights of the power and energy scores in the final score (any scale)."""

    power: float = 0.6
    energy: float = 0.4

    def __post_init__(self) -> None:
        for name, weight in (("power", self.power), ("energy", self.energy)):
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"scoring weight {name} must be finite and >= 0, got {weight!r}")
        if self.power + self.energy <= 0:
            raise ValueError("scoring weights power and energy must not both be 0")


DEFAULT_WEIGHTS = ScoringWeights()


class PowerCurves(Protocol):
    """What scoring needs of `predictor.curves.CurveTable`."""

    def index_of(self, names: Sequence[str]) -> np.ndarray: ...

    def power_w(self, idx: np.ndarray, util: np.ndarray) -> np.ndarray: ...

    def power_increase_w(
        self, idx: np.ndarray, util_from: np.ndarray, demand: np.ndarray
    ) -> np.ndarray: ...


@dataclass(frozen=True, eq=False)
class Assessment:
    """Everything decided about one pod's candidate nodes; arrays aligned to `names`.

    Utilisations `u`, `a`, `d` are fractions of allocatable CPU. Power arrays are NaN where the
    node could not be scored (`scorable` False). `failed` maps a node name to the reason it fails
    the filter; `unresolvable` names those of them that evicting pods cannot fix (powerless:
    preempting pods does not charge a battery), for `FailedAndUnresolvableNodes`. The counters
    are for the caller to log and export.
    """

    names: tuple[str, ...]
    known: np.ndarray
    u: np.ndarray
    a: np.ndarray
    d: np.ndarray
    telemetry_age_s: np.ndarray
    has_telemetry: np.ndarray
    has_curve: np.ndarray
    scorable: np.ndarray
    power_before_w: np.ndarray
    power_after_w: np.ndarray
    increase_w: np.ndarray
    energy_level: np.ndarray
    max_power_w: np.ndarray
    power_score: np.ndarray
    energy_score: np.ndarray
    score: np.ndarray
    failed: Mapping[str, str]
    unresolvable: frozenset[str]
    demand_cores: float
    unknown_nodes: int
    no_telemetry_nodes: int
    no_curve_nodes: int
    unknown_energy_labels: int

    def host_scores(self) -> list[tuple[str, int]]:
        """(name, score) pairs with Python ints, in request order."""
        return list(zip(self.names, self.score.tolist(), strict=True))

    def passes(self) -> list[bool]:
        """Filter verdict per candidate, in request order."""
        failed = self.failed
        return [name not in failed for name in self.names]

    def explain(self) -> list[dict[str, object]]:
        """One JSON-ready record per candidate: the inputs and outputs of its score."""
        records = []
        for i, name in enumerate(self.names):
            records.append(
                {
                    "node": name,
                    "u": _finite_or_none(self.u[i]),
                    "a": _finite_or_none(self.a[i]),
                    "d": _finite_or_none(self.d[i]),
                    "power_before_w": _finite_or_none(self.power_before_w[i]),
                    "power_after_w": _finite_or_none(self.power_after_w[i]),
                    "increase_w": _finite_or_none(self.increase_w[i]),
                    "energy_level": ENERGY_LEVEL_NAMES[EnergyLevel(int(self.energy_level[i]))],
                    "power_score": float(self.power_score[i]),
                    "energy_score": float(self.energy_score[i]),
                    "score": int(self.score[i]),
                    "passes": name not in self.failed,
                    "note": self._note(i),
                }
            )
        return records

    def _note(self, i: int) -> str:
        name = self.names[i]
        if name in self.failed:
            return self.failed[name]
        if not self.known[i]:
            return "unknown node: scored 0"
        if not self.has_telemetry[i]:
            age_s = self.telemetry_age_s[i]
            if math.isfinite(age_s):
                return f"telemetry stale ({age_s:.0f} s old): lowest power score"
            return "no telemetry: lowest power score"
        if not self.has_curve[i]:
            return "no power curve for this node: lowest power score"
        return ""


def assess(
    view: ClusterView,
    curves: PowerCurves | None,
    candidates: Sequence[str] | Sequence[NodeInfo],
    demand_cores: float,
    weights: ScoringWeights = DEFAULT_WEIGHTS,
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
) -> Assessment:
    """Score and filter `candidates` (node names, or `NodeInfo`s built from request objects).

    With names, allocatable CPU, labels and annotations come from `view`; with `NodeInfo`s
    they come from the request and only telemetry and assumed load come from `view`.
    `telemetry_ttl_s` None means telemetry never goes stale (snapshot mode).
    """
    if not math.isfinite(demand_cores) or demand_cores < 0:
        raise ValueError(f"demand_cores must be finite and >= 0, got {demand_cores!r}")
    nodes = candidate_state(view, curves, candidates, now_s=now_s, telemetry_ttl_s=telemetry_ttl_s)
    names, count = nodes.names, len(nodes.names)

    # What this pod adds: d, and the power after placing it, P(u + a + d).
    with np.errstate(invalid="ignore", divide="ignore"):
        telemetry_age_s = now_s - nodes.observed_at_s
        d = demand_cores / nodes.allocatable
    predicted = nodes.predicted
    if curves is None or predicted.size == 0:
        power_after = np.full(count, np.nan)
    elif predicted.size == count:
        power_after = curves.power_w(nodes.curve_idx, nodes.util_from + d)
    else:
        power_after = np.full(count, np.nan)
        power_after[predicted] = curves.power_w(
            nodes.curve_idx[predicted], nodes.util_from[predicted] + d[predicted]
        )
    power_before = nodes.power_before
    increase = power_after - power_before
    scorable = np.isfinite(increase)

    power_score = power_scores(increase, scorable)
    energy_score = ENERGY_SCORES[nodes.energy]
    score = final_scores(power_score, energy_score, weights)
    if nodes.known_count < count:
        score[~nodes.known] = 0

    failed: dict[str, str] = {}
    for i in nodes.powerless:
        failed[names[i]] = "energy-status is powerless (0-15 % stored energy)"
    # A node without the annotation has max_power NaN, which compares False.
    over = scorable & (power_after > nodes.max_power)
    for i in np.flatnonzero(over).tolist():
        failed.setdefault(
            names[i],
            f"predicted power after placement {power_after[i]:.1f} W exceeds "
            f"{MAX_POWER_ANNOTATION} {nodes.max_power[i]:g} W",
        )

    return Assessment(
        names=names,
        known=nodes.known,
        u=nodes.u,
        a=nodes.a,
        d=d,
        telemetry_age_s=telemetry_age_s,
        has_telemetry=nodes.has_telemetry,
        has_curve=nodes.has_curve,
        scorable=scorable,
        power_before_w=power_before,
        power_after_w=power_after,
        increase_w=increase,
        energy_level=nodes.energy,
        max_power_w=nodes.max_power,
        power_score=power_score,
        energy_score=energy_score,
        score=score,
        failed=failed,
        unresolvable=frozenset(names[i] for i in nodes.powerless),
        demand_cores=float(demand_cores),
        # has_telemetry implies known; predicted is has_telemetry & has_curve.
        unknown_nodes=count - nodes.known_count,
        no_telemetry_nodes=nodes.known_count - nodes.telemetry_count,
        no_curve_nodes=nodes.telemetry_count - predicted.size,
        unknown_energy_labels=nodes.unknown_energy_labels,
    )


@dataclass(frozen=True, eq=False)
class CandidateState:
    """What scoring knows of the candidates before it looks at the pod; aligned to `names`.

    `u` and `a` are fractions of allocatable CPU (`u` NaN without telemetry), `util_from` is
    u + a and `power_before` P(u + a) (NaN where not `predicted`). Shared between requests:
    read-only. With a telemetry TTL it holds from `valid_from_s` until the first fresh
    telemetry among the candidates turns stale (`valid_until_s`).
    """

    names: tuple[str, ...]
    known: np.ndarray
    allocatable: np.ndarray
    energy: np.ndarray
    max_power: np.ndarray
    observed_at_s: np.ndarray
    has_telemetry: np.ndarray
    u: np.ndarray
    a: np.ndarray
    curve_idx: np.ndarray
    has_curve: np.ndarray
    predicted: np.ndarray  # positions with telemetry and a curve
    util_from: np.ndarray
    power_before: np.ndarray
    powerless: tuple[int, ...]  # positions of known powerless nodes
    known_count: int
    telemetry_count: int
    unknown_energy_labels: int
    valid_from_s: float
    valid_until_s: float


def candidate_state(
    view: ClusterView,
    curves: PowerCurves | None,
    candidates: Sequence[str] | Sequence[NodeInfo],
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
) -> CandidateState:
    """The pod-independent part of `assess`; for names, remembered on the view per candidate list.

    kube-scheduler sends the same candidates for pod after pod, and the view (telemetry and
    assumed load) changes far less often than pods arrive: then only the pod's own demand is
    left to compute.
    """
    count = len(candidates)
    by_name = not count or isinstance(candidates[0], str)
    names = candidates if by_name else [node.name for node in candidates]
    # Cached per node layout: the same list again is one comparison, not a lookup per name.
    resolved = view.candidates(names)  # type: ignore[arg-type]
    if not by_name:
        nodes: Sequence[NodeInfo] = candidates  # type: ignore[assignment]
        return _candidate_state(
            view,
            curves,
            resolved,
            known=np.ones(count, dtype=bool),
            allocatable=np.fromiter((n.allocatable_cpu for n in nodes), np.float64, count),
            energy=np.fromiter((energy_level_of(n.labels) for n in nodes), np.int8, count),
            max_power=np.fromiter((max_power_of(n.annotations) for n in nodes), np.float64, count),
            now_s=now_s,
            telemetry_ttl_s=telemetry_ttl_s,
        )
    key = ("candidate_state", id(resolved), id(curves), telemetry_ttl_s)
    cached = view.recall(key)
    if cached is not None and cached.valid_from_s <= now_s < cached.valid_until_s:
        return cached
    state = _candidate_state(
        view,
        curves,
        resolved,
        known=resolved.has_node_info,
        allocatable=resolved.allocatable_cpu,
        energy=resolved.energy_level,
        max_power=resolved.max_power_w,
        now_s=now_s,
        telemetry_ttl_s=telemetry_ttl_s,
    )
    # The key holds ids: keep the objects alive with the entry so that no id is reused.
    view.remember(key, state, resolved, curves)
    return state


def _candidate_state(
    view: ClusterView,
    curves: PowerCurves | None,
    resolved: Candidates,
    *,
    known: np.ndarray,
    allocatable: np.ndarray,
    energy: np.ndarray,
    max_power: np.ndarray,
    now_s: float,
    telemetry_ttl_s: float | None,
) -> CandidateState:
    count = len(resolved.names)
    util = resolved.gather(view.cpu_util, np.nan)
    observed_at_s = resolved.gather(view.observed_at_s, -np.inf)
    assumed_cores = resolved.gather(view.assumed_cpu, 0.0)

    with np.errstate(invalid="ignore", divide="ignore"):
        # NaN compares False, so these also reject missing allocatable CPU and utilisation.
        has_telemetry = known & (allocatable > 0) & (allocatable < np.inf) & (util >= 0)
        if telemetry_ttl_s is None:
            has_telemetry &= observed_at_s > -np.inf
            valid_until_s = math.inf
        else:
            has_telemetry &= now_s - observed_at_s <= telemetry_ttl_s
            # Telemetry only ages: the first fresh reading to go stale ends this state.
            fresh_at_s = observed_at_s[has_telemetry]
            valid_until_s = (
                float(fresh_at_s.min()) + telemetry_ttl_s if fresh_at_s.size else math.inf
            )
        u = np.where(has_telemetry, np.minimum(util, 1.0), np.nan)
        a = assumed_cores / allocatable

    # Only nodes in the view can have telemetry, so their curve rows are all that matter.
    if curves is not None and count:
        curve_idx = resolved.curve_rows(view.curve_rows(curves))
    else:
        curve_idx = np.full(count, -1, dtype=np.intp)
    has_curve = curve_idx >= 0

    predicted = np.flatnonzero(has_telemetry & has_curve)
    util_from = u + a
    if curves is None or predicted.size == 0:
        power_before = np.full(count, np.nan)
    elif predicted.size == count:
        power_before = curves.power_w(curve_idx, util_from)
    else:
        power_before = np.full(count, np.nan)
        power_before[predicted] = curves.power_w(curve_idx[predicted], util_from[predicted])

    return CandidateState(
        names=resolved.names,
        known=known,
        allocatable=allocatable,
        energy=energy,
        max_power=max_power,
        observed_at_s=observed_at_s,
        has_telemetry=_frozen(has_telemetry),
        u=_frozen(u),
        a=_frozen(a),
        curve_idx=curve_idx,
        has_curve=_frozen(has_curve),
        predicted=_frozen(predicted),
        util_from=_frozen(util_from),
        power_before=_frozen(power_before),
        powerless=tuple(np.flatnonzero(known & (energy == _POWERLESS)).tolist()),
        known_count=int(np.count_nonzero(known)),
        telemetry_count=int(np.count_nonzero(has_telemetry)),
        unknown_energy_labels=int(np.count_nonzero(known & (energy == _UNKNOWN))),
        valid_from_s=now_s,
        valid_until_s=valid_until_s,
    )


def power_scores(increase_w: np.ndarray, scorable: np.ndarray) -> np.ndarray:
    """Power score per node from its increase relative to the cheapest scorable node; others 0."""
    scorable_count = int(np.count_nonzero(scorable))
    if scorable_count == 0:
        return np.zeros(increase_w.shape, dtype=np.float64)
    every_node = scorable_count == len(increase_w)
    values = increase_w if every_node else increase_w[scorable]
    # A floor keeps the ratio finite when the best increase is 0 (a flat model segment).
    floored = np.maximum(values, MIN_INCREASE_W)
    doublings = np.log2(floored / floored.min())
    ranked = MAX_SCORE - POINTS_PER_DOUBLING * doublings
    np.minimum(np.maximum(ranked, 0.0, out=ranked), float(MAX_SCORE), out=ranked)
    if every_node:
        return ranked
    scores = np.zeros(increase_w.shape, dtype=np.float64)
    scores[scorable] = ranked
    return scores


def final_scores(
    power_score: np.ndarray, energy_score: np.ndarray, weights: ScoringWeights = DEFAULT_WEIGHTS
) -> np.ndarray:
    """The weighted mean of power and energy scores as int64 0..10, rounded half up."""
    mixed = (weights.power * power_score + weights.energy * energy_score) / (
        weights.power + weights.energy
    )
    # The epsilon keeps 6.5 computed as 6.4999999999 from rounding down.
    mixed += 0.5 + 1e-9
    score = np.floor(mixed, out=mixed).astype(np.int64)
    return np.minimum(np.maximum(score, 0, out=score), MAX_SCORE, out=score)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
