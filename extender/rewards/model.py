"""The reward model: decayed evidence per node and per node x workload, and the score it gives.

**Evidence.** Each outcome (`extender.rewards.outcomes`) adds 1 to the *good* or *bad* count of
its node and, when the pod has a workload, of the (workload, node) pair. Counts decay
exponentially with a half-life (`half_life_s`): an outcome `t` seconds old weighs
`2 ** (-t / half_life_s)`. With no new outcomes every count fades to 0 and the node is back to
the prior, neutral: a repaired node recovers by itself, a node that keeps failing keeps its
evidence, and an operator can reset one node at once (`reset_node`: the node annotation
`power-aware-scheduler/reward-reset-at`). Memory is bounded: at most `max_nodes` nodes,
`max_workloads` workloads and `max_pairs` pairs are kept; the one updated least recently goes
first, and evidence faded below `PRUNE_BELOW` is dropped (checked every `PRUNE_EVERY_S`).

**Posterior.** The chance that a placement goes well is a Beta(1 + good, 1 + bad) posterior (a
uniform prior: one imagined good and one imagined bad outcome). For a (workload, node) pair
the node's evidence from *other* workloads joins as a weak prior: `node_share` of an
observation per outcome, but at most `node_evidence_max` observations in all (in the
proportions of the node's good and bad), so a node that crashes everything looks a little
suspect to a workload it has never run, while a busy node's thousands of healthy pods cannot
drown one workload's own failures there:

    weight = min(node_share * other, node_evidence_max)        other = node's - pair's outcomes
    good_pair' = good_pair + weight * other_good / other         (bad alike)

**Exploration: an optimistic index, not Thompson sampling.** The score is an upper confidence
bound of the posterior, `mean + exploration * sd` clipped to 0..1 (the normal approximation of
Bayes-UCB's upper quantile; Kaufmann, Cappe and Garivier 2012). A node known to be good
scores ~1; so does a node with no evidence, so new and repaired nodes get pods; a node scores
low only when enough recent evidence says it is bad, and as that evidence fades its bound
rises back until it is tried again. Thompson sampling (drawing from the posterior per request)
explores as well, but its score is random per request: the same pod retried, or `/explain`
asked twice, gives different answers; the replicas of a Deployment scatter at random; tests
and the bench cannot reproduce a decision. The index is a deterministic function of the
evidence and the time, so the scheduler's choices change only when evidence does.

Failure modes of the index, and what answers them:

- *Herding.* Every pod of a burst sees the same bound, and all could land on one
  under-explored node before the first of them fails. Pods placed on a node and not judged
  yet count as observations at the posterior mean ("hallucinated" outcomes, as GP-BUCB does for
  pending evaluations; Desautels, Krause and Burdick 2014): they shrink the bonus without
  moving the mean, so the second pod of a burst sees a smaller bonus than the first.
- *Exploration rides on the other scores.* A bad node is retried only when its rising bound
  overtakes other candidates' total scores: an expensive node is retried late, a cheap one
  early. Its evidence still fades to neutral within a few half-lives.
- *A workload that fails everywhere* scores low everywhere: the ranking does not change, and
  the filter refuses to fail every candidate (it is the workload, not the nodes).
- *Correlated failures* (a bad rollout, a zone outage) charge whichever nodes ran the pods;
  relative scores mostly cancel them out, the rest fades with the half-life.
- *The normal approximation* overstates the bound at tiny evidence; clipped to 1, which is the
  intent (no evidence, no penalty).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from types import MappingProxyType
from typing import Any

import numpy as np

from extender.rewards.outcomes import Outcome

DOCUMENT_FORMAT = "power-aware-scheduler/rewards/v1"
PRIOR_GOOD = 1.0
PRIOR_BAD = 1.0
PRUNE_BELOW = 0.01  # evidence (good + bad) that has faded below this is forgotten ...
RESET_KEPT_HALF_LIVES = 10  # a per-node reset is remembered this long (evidence is 0.1 % by then)
PRUNE_EVERY_S = 600.0  # ... when a snapshot is built this long after the last pruning
DEFAULT_MAX_NODES = 10_000
DEFAULT_MAX_WORKLOADS = 5_000
DEFAULT_MAX_PAIRS = 100_000


@dataclass(frozen=True)
class ScoringConstants:
    """How evidence becomes a reward index (see the module docstring)."""

    exploration: float = 2.0
    node_share: float = 0.1
    node_evidence_max: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.exploration) and self.exploration >= 0):
            raise ValueError(f"exploration must be >= 0, got {self.exploration!r}")
        if not (math.isfinite(self.node_share) and 0 <= self.node_share <= 1):
            raise ValueError(f"nodeShare must be 0..1, got {self.node_share!r}")
        if not (math.isfinite(self.node_evidence_max) and self.node_evidence_max >= 0):
            raise ValueError(f"nodeEvidenceMax must be >= 0, got {self.node_evidence_max!r}")


def posterior_mean(good: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """Mean of Beta(1 + good, 1 + bad): the chance a placement goes well."""
    return (PRIOR_GOOD + good) / (PRIOR_GOOD + PRIOR_BAD + good + bad)


def reward_index(
    good: np.ndarray, bad: np.ndarray, in_flight: np.ndarray, constants: ScoringConstants
) -> np.ndarray:
    """The optimistic reward 0..1: posterior mean + exploration x sd, in-flight pods shrinking
    the sd as observations at the mean would."""
    alpha = PRIOR_GOOD + good
    total = alpha + PRIOR_BAD + bad
    mean = alpha / total
    sd = np.sqrt(mean * (1.0 - mean) / (total + in_flight + 1.0))
    return np.clip(mean + constants.exploration * sd, 0.0, 1.0)


def pair_evidence(
    pair_good: np.ndarray,
    pair_bad: np.ndarray,
    node_good: np.ndarray,
    node_bad: np.ndarray,
    constants: ScoringConstants,
) -> tuple[np.ndarray, np.ndarray]:
    """A pair's (good, bad) with the node's other evidence joined as a bounded prior."""
    other_good = np.maximum(node_good - pair_good, 0.0)
    other_bad = np.maximum(node_bad - pair_bad, 0.0)
    other = other_good + other_bad
    weight = np.minimum(constants.node_share * other, constants.node_evidence_max)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(other > 0, weight / other, 0.0)
    return pair_good + scale * other_good, pair_bad + scale * other_bad


# ---- the snapshot the request path reads --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WorkloadEvidence:
    """One workload's pairs: node rows (into the snapshot's node arrays) and their counts, as
    of `at_s` (decay them to the request's time with `RewardSnapshot.decayed`)."""

    rows: np.ndarray
    good: np.ndarray
    bad: np.ndarray
    at_s: np.ndarray


@dataclass(frozen=True, eq=False)
class RewardSnapshot:
    """Immutable evidence for the request path (arrays are read-only).

    Node arrays are indexed by row (`node_rows`: name -> row; `node_names[row]`, None for a
    free row). Counts are stored as of their own `at_s` and decayed when read, so a snapshot
    stays right as time passes and a new one only rebuilds what changed. `workloads` maps a
    workload to its pairs; `pair_in_flight` a workload to (rows, pods placed and not judged).
    """

    built_at_s: float
    half_life_s: float
    node_names: tuple[str | None, ...]
    node_rows: Mapping[str, int]
    node_good: np.ndarray
    node_bad: np.ndarray
    node_at_s: np.ndarray
    node_in_flight: np.ndarray
    workloads: Mapping[str, WorkloadEvidence]
    pair_in_flight: Mapping[str, tuple[np.ndarray, np.ndarray]]

    def rows_of(self, names: Sequence[str]) -> np.ndarray:
        """Row of each name (-1: no evidence for that node)."""
        return np.fromiter(
            map(self.node_rows.get, names, repeat(-1)), dtype=np.intp, count=len(names)
        )

    def decayed(self, counts: np.ndarray, at_s: np.ndarray, now_s: float) -> np.ndarray:
        """`counts` dated `at_s`, as they weigh at `now_s`."""
        elapsed_s = np.maximum(now_s - at_s, 0.0)
        return counts * np.exp2(-elapsed_s / self.half_life_s)

    def node_counts(self, now_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(good, bad) of every row, decayed to `now_s`."""
        return (
            self.decayed(self.node_good, self.node_at_s, now_s),
            self.decayed(self.node_bad, self.node_at_s, now_s),
        )

    def pair_counts(self, workload: str, node: str, now_s: float) -> tuple[float, float]:
        """(good, bad) of one pair at `now_s`; zeros when there is no evidence."""
        pairs = self.workloads.get(workload)
        row = self.node_rows.get(node, -1)
        if pairs is None or row < 0:
            return 0.0, 0.0
        found = np.flatnonzero(pairs.rows == row)
        if found.size == 0:
            return 0.0, 0.0
        at = found[:1]
        good = self.decayed(pairs.good[at], pairs.at_s[at], now_s)
        bad = self.decayed(pairs.bad[at], pairs.at_s[at], now_s)
        return float(good[0]), float(bad[0])

    @property
    def pairs(self) -> int:
        return sum(len(w.rows) for w in self.workloads.values())


# ---- the model -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Evidence:
    good: float = 0.0
    bad: float = 0.0
    at_s: float = 0.0

    def add(self, good: float, bad: float, at_s: float, half_life_s: float) -> None:
        if at_s >= self.at_s:
            factor = _decay(at_s - self.at_s, half_life_s)
            self.good, self.bad, self.at_s = self.good * factor, self.bad * factor, at_s
            self.good += good
            self.bad += bad
        else:  # an outcome dated before our last update weighs what it would have by now
            factor = _decay(self.at_s - at_s, half_life_s)
            self.good += good * factor
            self.bad += bad * factor

    def at(self, now_s: float, half_life_s: float) -> tuple[float, float]:
        factor = _decay(max(0.0, now_s - self.at_s), half_life_s)
        return self.good * factor, self.bad * factor


def _decay(elapsed_s: float, half_life_s: float) -> float:
    return math.exp(-math.log(2.0) * elapsed_s / half_life_s)


@dataclass
class Evictions:
    nodes: int = 0
    workloads: int = 0
    pairs: int = 0
    faded: int = 0  # pairs and nodes whose evidence faded away


class RewardModel:
    """Decayed good/bad evidence per node and per (workload, node), bounded; not thread-safe."""

    def __init__(
        self,
        *,
        half_life_s: float,
        max_nodes: int = DEFAULT_MAX_NODES,
        max_workloads: int = DEFAULT_MAX_WORKLOADS,
        max_pairs: int = DEFAULT_MAX_PAIRS,
    ) -> None:
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"halfLifeS must be a positive number of seconds, got {half_life_s!r}")
        for name, value in (
            ("maxNodes", max_nodes),
            ("maxWorkloads", max_workloads),
            ("maxPairs", max_pairs),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        self.half_life_s = float(half_life_s)
        self.max_nodes = max_nodes
        self.max_workloads = max_workloads
        self.max_pairs = max_pairs
        # Least recently updated first (move_to_end on every update).
        self._nodes: OrderedDict[str, _Evidence] = OrderedDict()
        self._pairs: OrderedDict[tuple[str, str], _Evidence] = OrderedDict()
        self._workload_nodes: OrderedDict[str, set[str]] = OrderedDict()
        self.evictions = Evictions()
        # Stable snapshot rows (a workload's cached arrays point at them), reused when freed.
        self._rows: dict[str, int] = {}
        self._row_names: list[str | None] = []
        self._free_rows: list[int] = []
        # Per-workload arrays of the last snapshot; rebuilt only for workloads that changed.
        self._workload_cache: dict[str, WorkloadEvidence] = {}
        self._dirty_workloads: set[str] = set()
        self._last_prune_s = -math.inf
        # Per-node resets: node -> the time before which its outcomes no longer count.
        self.node_resets: dict[str, float] = {}

    # ---- sizes ---------------------------------------------------------------------------

    @property
    def nodes(self) -> int:
        return len(self._nodes)

    @property
    def workloads(self) -> int:
        return len(self._workload_nodes)

    @property
    def pairs(self) -> int:
        return len(self._pairs)

    # ---- writers -------------------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        good = 1.0 if outcome.good else 0.0
        self.add(outcome.node, outcome.workload, good=good, bad=1.0 - good, at_s=outcome.at_s)

    def add(self, node: str, workload: str | None, *, good: float, bad: float, at_s: float) -> None:
        """Add evidence for `node` (and the pair, with a workload) dated `at_s`; evidence dated
        before the node's reset is ignored."""
        if at_s < self.node_resets.get(node, -math.inf):
            return
        evidence = self._nodes.get(node)
        if evidence is None:
            evidence = self._nodes[node] = _Evidence(at_s=at_s)
            while len(self._nodes) > self.max_nodes:
                self._evict_node(next(iter(self._nodes)))
        else:
            self._nodes.move_to_end(node)
        evidence.add(good, bad, at_s, self.half_life_s)
        if workload is not None:
            self._add_pair(workload, node, good, bad, at_s)

    def reset_node(self, node: str, at_s: float) -> bool:
        """Forget everything `node` taught (its evidence and its pairs') and ignore its outcomes
        dated before `at_s` from now on; False when a reset at least that recent was applied."""
        if not at_s > self.node_resets.get(node, -math.inf):
            return False
        self.node_resets[node] = at_s
        if self._nodes.pop(node, None) is not None:
            for workload in [w for w, nodes in self._workload_nodes.items() if node in nodes]:
                self._remove_pair((workload, node))
        return True

    def forget(self) -> None:
        """Drop all evidence (a reset)."""
        self._nodes.clear()
        self._pairs.clear()
        self._workload_nodes.clear()
        self._workload_cache.clear()
        self._dirty_workloads.clear()

    # ---- the snapshot --------------------------------------------------------------------

    def snapshot(
        self, now_s: float, in_flight: Mapping[tuple[str, str | None], int] | None = None
    ) -> RewardSnapshot:
        """The evidence (faded entries pruned every `PRUNE_EVERY_S`), with in-flight pods.

        Incremental: the node arrays are copied, the pairs of workloads that did not change
        since the last snapshot are reused as they are.
        """
        if now_s - self._last_prune_s >= PRUNE_EVERY_S:
            self._prune(now_s)
            self._last_prune_s = now_s
        in_flight = in_flight or {}
        self._assign_rows({node for node, _ in in_flight})
        size = len(self._row_names)
        good, bad, at_s = np.zeros(size), np.zeros(size), np.zeros(size)
        rows = self._rows
        for name, evidence in self._nodes.items():
            row = rows[name]
            good[row], bad[row], at_s[row] = evidence.good, evidence.bad, evidence.at_s
        flying = np.zeros(size)
        pair_flying: dict[str, dict[int, int]] = {}
        for (node, workload), pods in in_flight.items():
            flying[rows[node]] += pods
            if workload is not None:
                pair_flying.setdefault(workload, {})[rows[node]] = pods
        for workload in self._dirty_workloads:
            nodes = self._workload_nodes.get(workload)
            if nodes is None:
                self._workload_cache.pop(workload, None)
            else:
                self._workload_cache[workload] = self._workload_evidence(workload, nodes)
        self._dirty_workloads.clear()
        return RewardSnapshot(
            built_at_s=now_s,
            half_life_s=self.half_life_s,
            node_names=tuple(self._row_names),
            node_rows=MappingProxyType(dict(rows)),
            node_good=_frozen(good),
            node_bad=_frozen(bad),
            node_at_s=_frozen(at_s),
            node_in_flight=_frozen(flying),
            workloads=MappingProxyType(dict(self._workload_cache)),
            pair_in_flight=MappingProxyType(
                {
                    workload: (
                        _frozen(np.fromiter(entries, np.intp, len(entries))),
                        _frozen(np.fromiter(entries.values(), np.float64, len(entries))),
                    )
                    for workload, entries in pair_flying.items()
                }
            ),
        )

    # ---- persistence ---------------------------------------------------------------------

    def to_document(self, now_s: float, *, max_pairs: int | None = None) -> dict[str, Any]:
        """JSON-ready evidence decayed to `now_s`; the `max_pairs` most recent pairs at most."""
        self._prune(now_s)
        nodes = {
            name: _rounded(evidence.at(now_s, self.half_life_s))
            for name, evidence in self._nodes.items()
        }
        pairs = list(self._pairs.items())
        if max_pairs is not None:
            pairs = pairs[len(pairs) - max_pairs :] if max_pairs > 0 else []
        workloads: dict[str, dict[str, list[float]]] = {}
        for (workload, node), evidence in pairs:
            workloads.setdefault(workload, {})[node] = _rounded(
                evidence.at(now_s, self.half_life_s)
            )
        return {
            "format": DOCUMENT_FORMAT,
            "saved_at_s": now_s,
            "half_life_s": self.half_life_s,
            "nodes": nodes,
            "workloads": workloads,
            "node_resets": dict(self.node_resets),
        }

    def merge_document(self, document: object, *, where: str) -> None:
        """Add a saved document's evidence (dated its save time) to what is held; ValueError
        names what is wrong in it (and nothing is added then)."""
        if not isinstance(document, Mapping) or document.get("format") != DOCUMENT_FORMAT:
            found = document.get("format") if isinstance(document, Mapping) else document
            raise ValueError(f"{where}: not a rewards document (format {found!r})")
        saved_at_s = _number(document.get("saved_at_s"), f"{where}: saved_at_s")
        nodes = _entries(document.get("nodes", {}), f"{where}: nodes")
        workloads = document.get("workloads", {})
        if not isinstance(workloads, Mapping):
            raise ValueError(f"{where}: workloads must be a mapping")
        pairs = [
            (str(workload), node, counts)
            for workload, entries in workloads.items()
            for node, counts in _entries(entries, f"{where}: workloads[{workload!r}]").items()
        ]
        resets = _times(document.get("node_resets", {}), f"{where}: node_resets")
        for node, at_s in resets.items():  # first: evidence saved before a reset stays out
            self.node_resets[node] = max(at_s, self.node_resets.get(node, -math.inf))
        # Oldest first, so that the caps keep the most recent; pairs after their nodes, and
        # without adding to the nodes again (a node's entry already sums its pairs).
        for node, (good, bad) in nodes.items():
            self.add(node, None, good=good, bad=bad, at_s=saved_at_s)
        for workload, node, (good, bad) in pairs:
            if node in self._nodes:
                self._add_pair(workload, node, good, bad, saved_at_s)

    # ---- internals -----------------------------------------------------------------------

    def _assign_rows(self, extra: set[str]) -> None:
        """Rows for the nodes with evidence and `extra` (in flight); free the others' rows."""
        wanted = extra | self._nodes.keys()
        for name in [name for name in self._rows if name not in wanted]:
            row = self._rows.pop(name)
            self._row_names[row] = None
            self._free_rows.append(row)
        for name in wanted:
            if name not in self._rows:
                row = self._free_rows.pop() if self._free_rows else len(self._row_names)
                if row == len(self._row_names):
                    self._row_names.append(name)
                else:
                    self._row_names[row] = name
                self._rows[name] = row

    def _workload_evidence(self, workload: str, nodes: set[str]) -> WorkloadEvidence:
        entries = [(self._rows[node], self._pairs[(workload, node)]) for node in nodes]
        count = len(entries)
        return WorkloadEvidence(
            rows=_frozen(np.fromiter((row for row, _ in entries), np.intp, count)),
            good=_frozen(np.fromiter((e.good for _, e in entries), np.float64, count)),
            bad=_frozen(np.fromiter((e.bad for _, e in entries), np.float64, count)),
            at_s=_frozen(np.fromiter((e.at_s for _, e in entries), np.float64, count)),
        )

    def _add_pair(self, workload: str, node: str, good: float, bad: float, at_s: float) -> None:
        self._dirty_workloads.add(workload)
        key = (workload, node)
        pair = self._pairs.get(key)
        if pair is None:
            pair = self._pairs[key] = _Evidence(at_s=at_s)
            self._workload_nodes.setdefault(workload, set()).add(node)
        else:
            self._pairs.move_to_end(key)
        self._workload_nodes.move_to_end(workload)
        pair.add(good, bad, at_s, self.half_life_s)
        while len(self._workload_nodes) > self.max_workloads:
            self._evict_workload(next(iter(self._workload_nodes)))
        while len(self._pairs) > self.max_pairs:
            self._evict_pair(next(iter(self._pairs)))

    def _evict_node(self, node: str) -> None:
        del self._nodes[node]
        self.evictions.nodes += 1
        for workload in [w for w, nodes in self._workload_nodes.items() if node in nodes]:
            self._remove_pair((workload, node))

    def _evict_workload(self, workload: str) -> None:
        for node in list(self._workload_nodes.get(workload, ())):
            self._remove_pair((workload, node))
        self._workload_nodes.pop(workload, None)
        self._dirty_workloads.add(workload)
        self.evictions.workloads += 1

    def _evict_pair(self, key: tuple[str, str]) -> None:
        self._remove_pair(key)
        self.evictions.pairs += 1

    def _remove_pair(self, key: tuple[str, str]) -> None:
        self._pairs.pop(key, None)
        workload, node = key
        self._dirty_workloads.add(workload)
        nodes = self._workload_nodes.get(workload)
        if nodes is not None:
            nodes.discard(node)
            if not nodes:
                del self._workload_nodes[workload]

    def _prune(self, now_s: float) -> None:
        faded = [
            key
            for key, evidence in self._pairs.items()
            if sum(evidence.at(now_s, self.half_life_s)) < PRUNE_BELOW
        ]
        for key in faded:
            self._remove_pair(key)
        referenced = set().union(*self._workload_nodes.values())
        faded_nodes = [
            name
            for name, evidence in self._nodes.items()
            if name not in referenced and sum(evidence.at(now_s, self.half_life_s)) < PRUNE_BELOW
        ]
        for name in faded_nodes:
            del self._nodes[name]
        self.evictions.faded += len(faded) + len(faded_nodes)
        # A reset long past filters nothing that could still weigh: outcomes reported that late
        # are not reported at all.
        horizon_s = now_s - RESET_KEPT_HALF_LIVES * self.half_life_s
        for name in [n for n, at_s in self.node_resets.items() if at_s < horizon_s]:
            del self.node_resets[name]


def _rounded(counts: tuple[float, float]) -> list[float]:
    return [round(counts[0], 4), round(counts[1], 4)]


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _times(value: object, where: str) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping of node -> Unix seconds")
    return {str(node): _number(at_s, f"{where}[{node!r}]") for node, at_s in value.items()}


def _entries(value: object, where: str) -> dict[str, tuple[float, float]]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a mapping of node -> [good, bad]")
    entries: dict[str, tuple[float, float]] = {}
    for node, counts in value.items():
        if not isinstance(counts, list | tuple) or len(counts) != 2:
            raise ValueError(f"{where}[{node!r}]: expected [good, bad], got {counts!r}")
        good = _number(counts[0], f"{where}[{node!r}][0]")
        bad = _number(counts[1], f"{where}[{node!r}][1]")
        if good < 0 or bad < 0:
            raise ValueError(f"{where}[{node!r}]: counts must be >= 0, got {counts!r}")
        entries[str(node)] = (good, bad)
    return entries


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
