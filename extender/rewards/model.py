"""The reward model: decayed evidence per node and per node x workload, and the score it gives.

**Evidence.** Each outcome (`extender.rewards.outcomes`) adds 1 to the *good* or *bad* count of
its node and, when the pod has a workload, of the (workload, node) pair. Counts decay
exponentially with a half-life (`half_life_s`): an outcome `t` seconds old weighs
`2 ** (-t / half_life_s)`. With no new outcomes every count fades to 0 and the node is back to
the prior, neutral: a repaired node recovers by itself, a node that keeps failing keeps its
evidence. Memory is bounded: at most `max_nodes` nodes, `max_workloads` workloads and
`max_pairs` pairs are kept; the one updated least recently goes first, and evidence faded
below `PRUNE_BELOW` is dropped when a snapshot is built.

**Posterior.** The chance that a placement goes well is a Beta(1 + good, 1 + bad) posterior (a
uniform prior: one imagined good and one imagined bad outcome). For a (workload, node) pair
the node's evidence from *other* workloads joins at `node_share` of its weight, so a node that
crashes everything looks suspect to a workload it has never run, while a node that crashes one
workload hardly touches the others:

    good_pair' = good_pair + node_share * (good_node - good_pair)       (bad alike)

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
from typing import Any

import numpy as np

from extender.rewards.outcomes import Outcome

DOCUMENT_FORMAT = "power-aware-scheduler/rewards/v1"
PRIOR_GOOD = 1.0
PRIOR_BAD = 1.0
PRUNE_BELOW = 0.01  # evidence (good + bad) that has faded below this is forgotten
DEFAULT_MAX_NODES = 10_000
DEFAULT_MAX_WORKLOADS = 5_000
DEFAULT_MAX_PAIRS = 100_000


@dataclass(frozen=True)
class ScoringConstants:
    """How evidence becomes a reward index (see the module docstring)."""

    exploration: float = 2.0
    node_share: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.exploration) and self.exploration >= 0):
            raise ValueError(f"exploration must be >= 0, got {self.exploration!r}")
        if not (math.isfinite(self.node_share) and 0 <= self.node_share <= 1):
            raise ValueError(f"nodeShare must be 0..1, got {self.node_share!r}")


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


def pair_evidence(pair: np.ndarray, node: np.ndarray, constants: ScoringConstants) -> np.ndarray:
    """A pair's count with the node's other evidence mixed in at `node_share`."""
    return pair + constants.node_share * np.maximum(node - pair, 0.0)


# ---- the snapshot the request path reads --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WorkloadEvidence:
    """One workload's pairs: node rows (into the snapshot's node arrays) and their counts."""

    rows: np.ndarray
    good: np.ndarray
    bad: np.ndarray
    in_flight: np.ndarray


@dataclass(frozen=True, eq=False)
class RewardSnapshot:
    """Immutable evidence as of `built_at_s`, for the request path (arrays are read-only).

    Node arrays are aligned to `node_names`; `workloads` maps a workload to its pairs.
    """

    built_at_s: float
    half_life_s: float
    node_names: tuple[str, ...]
    node_rows: Mapping[str, int]
    node_good: np.ndarray
    node_bad: np.ndarray
    node_in_flight: np.ndarray
    workloads: Mapping[str, WorkloadEvidence]

    def rows_of(self, names: Sequence[str]) -> np.ndarray:
        """Row of each name (-1: no evidence for that node)."""
        return np.fromiter(
            map(self.node_rows.get, names, repeat(-1)), dtype=np.intp, count=len(names)
        )

    @property
    def pairs(self) -> int:
        return sum(len(w.rows) for w in self.workloads.values())


# ---- the model -------------------------------------------------------------------------------


@dataclass
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
        """Add evidence for `node` (and the pair, with a workload) dated `at_s`."""
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

    def forget(self) -> None:
        """Drop all evidence (a reset)."""
        self._nodes.clear()
        self._pairs.clear()
        self._workload_nodes.clear()

    # ---- the snapshot --------------------------------------------------------------------

    def snapshot(
        self, now_s: float, in_flight: Mapping[tuple[str, str | None], int] | None = None
    ) -> RewardSnapshot:
        """Evidence decayed to `now_s` (faded entries pruned), with in-flight pod counts."""
        self._prune(now_s)
        in_flight = in_flight or {}
        names = list(self._nodes)
        rows = {name: i for i, name in enumerate(names)}
        for node, _ in in_flight:
            if node not in rows:
                rows[node] = len(names)
                names.append(node)
        count = len(names)
        good, bad, flying = np.zeros(count), np.zeros(count), np.zeros(count)
        for i, evidence in enumerate(self._nodes.values()):
            good[i], bad[i] = evidence.at(now_s, self.half_life_s)
        by_workload: dict[str, dict[str, tuple[float, float, int]]] = {}
        for (workload, node), evidence in self._pairs.items():
            by_workload.setdefault(workload, {})[node] = (*evidence.at(now_s, self.half_life_s), 0)
        for (node, workload), pods in in_flight.items():
            flying[rows[node]] += pods
            if workload is not None:
                entries = by_workload.setdefault(workload, {})
                g, b, _ = entries.get(node, (0.0, 0.0, 0))
                entries[node] = (g, b, pods)
        workloads = {
            workload: _workload_evidence(entries, rows) for workload, entries in by_workload.items()
        }
        return RewardSnapshot(
            built_at_s=now_s,
            half_life_s=self.half_life_s,
            node_names=tuple(names),
            node_rows=rows,
            node_good=_frozen(good),
            node_bad=_frozen(bad),
            node_in_flight=_frozen(flying),
            workloads=workloads,
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
        # Oldest first, so that the caps keep the most recent; pairs after their nodes, and
        # without adding to the nodes again (a node's entry already sums its pairs).
        for node, (good, bad) in nodes.items():
            self.add(node, None, good=good, bad=bad, at_s=saved_at_s)
        for workload, node, (good, bad) in pairs:
            if node in self._nodes:
                self._add_pair(workload, node, good, bad, saved_at_s)

    # ---- internals -----------------------------------------------------------------------

    def _add_pair(self, workload: str, node: str, good: float, bad: float, at_s: float) -> None:
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
        self.evictions.workloads += 1

    def _evict_pair(self, key: tuple[str, str]) -> None:
        self._remove_pair(key)
        self.evictions.pairs += 1

    def _remove_pair(self, key: tuple[str, str]) -> None:
        self._pairs.pop(key, None)
        workload, node = key
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
        faded_nodes = [
            name
            for name, evidence in self._nodes.items()
            if sum(evidence.at(now_s, self.half_life_s)) < PRUNE_BELOW
            and not any(name in nodes for nodes in self._workload_nodes.values())
        ]
        for name in faded_nodes:
            del self._nodes[name]
        self.evictions.faded += len(faded) + len(faded_nodes)


def _workload_evidence(
    entries: Mapping[str, tuple[float, float, int]], rows: Mapping[str, int]
) -> WorkloadEvidence:
    values = list(entries.items())
    return WorkloadEvidence(
        rows=_frozen(np.fromiter((rows[n] for n, _ in values), np.intp, len(values))),
        good=_frozen(np.fromiter((v[0] for _, v in values), np.float64, len(values))),
        bad=_frozen(np.fromiter((v[1] for _, v in values), np.float64, len(values))),
        in_flight=_frozen(np.fromiter((v[2] for _, v in values), np.float64, len(values))),
    )


def _rounded(counts: tuple[float, float]) -> list[float]:
    return [round(counts[0], 4), round(counts[1], 4)]


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


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
