"""The combiner: run the profile's filter and score plugins on one pod, weigh them into 0..10.

This is the decision the extender exists for, as pure array functions. `assess` takes one
cluster view, one curve table and one request's candidates, builds the cycle
(`extender.cycle`), then

- every filter plugin (in profile order) fails the candidates it must; a node's reason is the
  first plugin's that failed it, as kube-scheduler reports the first failing filter;
- every score plugin gives its raw measure and its 0..10 points (`Plugin.normalise`), and the
  final score is the weighted mean of the points, rounded half up to a Python int 0..10:

      score = round_half_up(sum(w_i * points_i) / sum(w_i))

Names the extender does not know score 0 and pass the filter (the watch may just be behind).
Nothing here logs or does I/O: the caller gets counters in the `Assessment` and logs them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from extender.cycle import Cycle, candidate_state, resolve_candidates
from extender.plugins.base import MAX_POINTS, finite_or_none
from extender.profile import DEFAULT_PROFILE, Profile
from extender.state import ClusterView, NodeInfo
from livedata.metrics_table import CPU_UTIL

if TYPE_CHECKING:
    from predictor.curves import CurveTable

MAX_SCORE = int(MAX_POINTS)


@dataclass(frozen=True, eq=False)
class PluginScore:
    """One score plugin's view of the candidates: raw measure, 0..10 points, weight."""

    name: str
    raw: np.ndarray
    points: np.ndarray
    weight: float


@dataclass(frozen=True, eq=False)
class Assessment:
    """Everything decided about one pod's candidate nodes; arrays aligned to `names`.

    `failed` maps a node name to the reason it fails the filter; `unresolvable` names those of
    them that evicting pods cannot fix, for `FailedAndUnresolvableNodes`. `scores` holds each
    score plugin's raw values and points by plugin name. The counters are for the caller to
    log and export.
    """

    cycle: Cycle
    profile: Profile
    scores: Mapping[str, PluginScore]
    score: np.ndarray
    failed: Mapping[str, str]
    unresolvable: frozenset[str]
    # filter plugin -> the candidates (indices) it was the first to fail, for /metrics
    failed_by: Mapping[str, Sequence[int]] = field(default_factory=dict)

    # ---- what every plugin shares, from the cycle ----------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        return self.cycle.names

    @property
    def demand_cores(self) -> float:
        return self.cycle.demand_cores

    @property
    def known(self) -> np.ndarray:
        return self.cycle.nodes.known

    @property
    def has_telemetry(self) -> np.ndarray:
        return self.cycle.nodes.has_telemetry

    @property
    def has_curve(self) -> np.ndarray:
        return self.cycle.nodes.has_curve

    @property
    def telemetry_age_s(self) -> np.ndarray:
        return self.cycle.telemetry_age_s

    @property
    def u(self) -> np.ndarray:
        return self.cycle.nodes.u

    @property
    def a(self) -> np.ndarray:
        return self.cycle.nodes.a

    @property
    def d(self) -> np.ndarray:
        return self.cycle.d

    @property
    def power_before_w(self) -> np.ndarray:
        return self.cycle.nodes.power_before

    @property
    def power_after_w(self) -> np.ndarray:
        return self.cycle.power_after_w

    @property
    def increase_w(self) -> np.ndarray:
        return self.cycle.increase_w

    @property
    def scorable(self) -> np.ndarray:
        return self.cycle.scorable

    # ---- counters ---------------------------------------------------------------------------

    @property
    def unknown_nodes(self) -> int:
        return len(self.names) - self.cycle.nodes.known_count

    @property
    def no_telemetry_nodes(self) -> int:
        # has_telemetry implies known.
        nodes = self.cycle.nodes
        return nodes.known_count - nodes.telemetry_count

    @property
    def no_curve_nodes(self) -> int:
        # predicted is has_telemetry & has_curve.
        nodes = self.cycle.nodes
        return nodes.telemetry_count - nodes.predicted.size

    # ---- answers ----------------------------------------------------------------------------

    def points(self, plugin: str) -> np.ndarray:
        """The 0..10 points of one score plugin (by its configured name)."""
        return self.scores[plugin].points

    def host_scores(self) -> list[tuple[str, int]]:
        """(name, score) pairs with Python ints, in request order."""
        return list(zip(self.names, self.score.tolist(), strict=True))

    def passes(self) -> list[bool]:
        """Filter verdict per candidate, in request order."""
        failed = self.failed
        return [name not in failed for name in self.names]

    def explain(self) -> list[dict[str, object]]:
        """One JSON-ready record per candidate: each plugin's inputs, raw value, points, weight.

        The plugins' own fields (`u`, `increase_w`, `energy_level`, ...) sit at the top of the
        record; `plugins` holds, per score plugin, its raw value, its 0..10 points, its weight
        and its contribution to the score (weight x points / total weight: one term of the
        weighted mean, before rounding).
        """
        cycle = self.cycle
        columns: dict[str, Sequence[object]] = {}
        for plugin in self.profile.plugins:
            columns.update(plugin.explain(cycle))
        total_weight = self.profile.total_weight or 1.0
        per_plugin = [
            (entry.name, finite_or_none(entry.raw), entry.points.tolist(), entry.weight)
            for entry in self.scores.values()
        ]
        records = []
        for i, name in enumerate(self.names):
            record: dict[str, object] = {"node": name}
            record.update((field, values[i]) for field, values in columns.items())
            record["plugins"] = {
                plugin: {
                    "raw": raw[i],
                    "points": points[i],
                    "weight": weight,
                    "contribution": weight * points[i] / total_weight,
                }
                for plugin, raw, points, weight in per_plugin
            }
            record["score"] = int(self.score[i])
            record["passes"] = name not in self.failed
            record["note"] = self._note(i)
            records.append(record)
        return records

    def _note(self, i: int) -> str:
        name = self.names[i]
        if name in self.failed:
            return self.failed[name]
        if not self.known[i]:
            return "unknown node: scored 0"
        if not self.has_telemetry[i]:
            if self.cycle.nodes.util_missing[i]:
                return f"telemetry has no {CPU_UTIL}: lowest power score"
            age_s = self.telemetry_age_s[i]
            if math.isfinite(age_s):
                return f"telemetry stale ({age_s:.0f} s old): lowest power score"
            return "no telemetry: lowest power score"
        if not self.has_curve[i]:
            return "no power curve for this node: lowest power score"
        return ""


def assess(
    view: ClusterView,
    curves: CurveTable | None,
    candidates: Sequence[str] | Sequence[NodeInfo],
    demand_cores: float,
    profile: Profile = DEFAULT_PROFILE,
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
    pod: Mapping[str, object] | None = None,
    run_filters: bool = True,
    run_scores: bool = True,
) -> Assessment:
    """Filter and score `candidates` (node names, or `NodeInfo`s built from request objects).

    With names, allocatable CPU, labels and annotations come from `view`; with `NodeInfo`s
    they come from the request and only telemetry and assumed load come from `view`.
    `telemetry_ttl_s` None means telemetry never goes stale (snapshot mode). A verb that needs
    only one half skips the other (`run_filters`, `run_scores`): `/filter` answers with
    verdicts, `/prioritize` with scores; skipped scores are 0 and nothing fails.
    """
    resolved = resolve_candidates(view, candidates)
    nodes = candidate_state(view, curves, resolved, now_s=now_s, telemetry_ttl_s=telemetry_ttl_s)
    cycle = Cycle(view, curves, resolved, nodes, demand_cores, now_s=now_s, pod=pod)
    names = cycle.names

    failed: dict[str, str] = {}
    failed_by: dict[str, list[int]] = {}
    unresolvable: set[str] = set()
    for plugin in profile.filters if run_filters else ():
        verdict = plugin.filter(cycle)
        for i, reason in verdict.failed.items():
            if names[i] not in failed:
                failed[names[i]] = reason
                failed_by.setdefault(plugin.name, []).append(i)
        unresolvable.update(names[i] for i in verdict.unresolvable)

    scores: dict[str, PluginScore] = {}
    for plugin, weight in profile.scores if run_scores else ():
        raw = plugin.score(cycle)
        scores[plugin.name] = PluginScore(plugin.name, raw, plugin.normalise(raw, cycle), weight)
    if run_scores:
        points = {name: entry.points for name, entry in scores.items()}
        score = combine(profile, points, len(names))
    else:
        score = np.zeros(len(names), dtype=np.int64)
    if nodes.known_count < len(names):
        score[~nodes.known] = 0

    return Assessment(
        cycle=cycle,
        profile=profile,
        scores=scores,
        score=score,
        failed=failed,
        unresolvable=frozenset(unresolvable),
        failed_by=failed_by,
    )


def combine(profile: Profile, points: Mapping[str, np.ndarray], count: int) -> np.ndarray:
    """The profile's weighted mean of score plugins' points, as int64 0..10 rounded half up.

    `points` maps each score plugin's name to its 0..10 points over `count` candidates; with no
    score plugin every candidate gets 0.
    """
    weighted = None
    for plugin, weight in profile.scores:
        term = weight * points[plugin.name]
        weighted = term if weighted is None else weighted + term
    if weighted is None:
        return np.zeros(count, dtype=np.int64)
    mixed = weighted / profile.total_weight
    # The epsilon keeps 6.5 computed as 6.4999999999 from rounding down.
    mixed += 0.5 + 1e-9
    score = np.floor(mixed, out=mixed).astype(np.int64)
    return np.minimum(np.maximum(score, 0, out=score), MAX_SCORE, out=score)
