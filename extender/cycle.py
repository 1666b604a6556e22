"""One pod's scheduling cycle: what every plugin reads, computed once per request.

kube-scheduler's framework hands each plugin a `CycleState`; this is ours. A request passes
through the state (`ClusterView` -> `Candidates`), then through here, then through the plugins,
once:

    ClusterView.candidates(names)          resolved names, node info (cached per layout)
      -> candidate_state(view, curves, ...) u, a, fresh telemetry, curve rows, P(u + a)
                                            (pod-independent: cached per view and list)
      -> Cycle(pod, demand)                 d, and lazily P(u + a + d) and the increase
      -> plugins (filter, score)            read the cycle; never write it

For each candidate node, with `u` its measured CPU utilisation, `a` the CPU of pods bound
recently (whose load the metrics do not show yet) and `d` the pod's CPU demand, all over the
node's allocatable CPU, the predicted power increase of placing the pod there is

    dP = P_node(u + a + d) - P_node(u + a)

read from the node's tabulated curve (`predictor.curves.CurveTable`). Everything that does not
depend on the pod (u, a, which nodes have telemetry and a curve, P(u + a)) is computed once
per cluster view and candidate list and remembered on the view: scoring the next pod on the
same candidates costs d, one curve lookup and the plugins' arithmetic. Nothing here logs or
does I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from extender.state import Candidates, ClusterView, NodeAttribute, NodeInfo

if TYPE_CHECKING:
    from predictor.curves import CurveTable


@dataclass(frozen=True, eq=False)
class CandidateState:
    """What is known of the candidates before looking at the pod; arrays aligned to `names`.

    `u` and `a` are fractions of allocatable CPU (`u` NaN without telemetry), `util_from` is
    u + a and `power_before` P(u + a) (NaN where not `predicted`). Shared between requests:
    read-only. With a telemetry TTL it holds from `valid_from_s` until the first fresh
    telemetry among the candidates turns stale (`valid_until_s`).
    """

    names: tuple[str, ...]
    known: np.ndarray
    allocatable: np.ndarray
    observed_at_s: np.ndarray
    has_telemetry: np.ndarray
    # a reading without a usable cpu_util (absent, null, negative): no telemetry, but not stale
    util_missing: np.ndarray
    u: np.ndarray
    a: np.ndarray
    curve_idx: np.ndarray
    has_curve: np.ndarray
    predicted: np.ndarray  # positions with telemetry and a curve
    util_from: np.ndarray
    power_before: np.ndarray
    known_count: int
    telemetry_count: int
    valid_from_s: float
    valid_until_s: float

    def with_assumed(self, assumed_cores: np.ndarray, curves: CurveTable | None) -> CandidateState:
        """This state (a view's, computed with no assumed load) with `assumed_cores` added.

        Bindings are few next to nodes: P(u + a) is looked up again only where a > 0.
        """
        with np.errstate(invalid="ignore", divide="ignore"):
            a = assumed_cores / self.allocatable
        loaded = np.flatnonzero(assumed_cores > 0)
        if loaded.size == 0:
            return dataclasses.replace(self, a=_frozen(a))
        util_from = self.u + a
        power_before = self.power_before.copy()
        loaded = loaded[self.has_telemetry[loaded] & self.has_curve[loaded]]
        if curves is not None and loaded.size:
            power_before[loaded] = curves.power_w(self.curve_idx[loaded], util_from[loaded])
        return dataclasses.replace(
            self, a=_frozen(a), util_from=_frozen(util_from), power_before=_frozen(power_before)
        )

    def at(self, resolved: Candidates) -> CandidateState:
        """This state (a view's) at `resolved`'s positions; names the view lacks get none."""

        def gather(array: np.ndarray, missing: float | bool | int) -> np.ndarray:
            return _frozen(resolved.gather(array, missing))

        has_telemetry = gather(self.has_telemetry, False)
        has_curve = gather(self.has_curve, False)
        return CandidateState(
            names=resolved.names,
            known=resolved.has_node_info,
            allocatable=resolved.allocatable_cpu,
            observed_at_s=gather(self.observed_at_s, -np.inf),
            has_telemetry=has_telemetry,
            util_missing=gather(self.util_missing, False),
            u=gather(self.u, np.nan),
            a=gather(self.a, np.nan),
            curve_idx=gather(self.curve_idx, -1),
            has_curve=has_curve,
            predicted=_frozen(np.flatnonzero(has_telemetry & has_curve)),
            util_from=gather(self.util_from, np.nan),
            power_before=gather(self.power_before, np.nan),
            known_count=int(np.count_nonzero(resolved.has_node_info)),
            telemetry_count=int(np.count_nonzero(has_telemetry)),
            valid_from_s=self.valid_from_s,
            valid_until_s=self.valid_until_s,
        )


def resolve_candidates(
    view: ClusterView, candidates: Sequence[str] | Sequence[NodeInfo]
) -> Candidates:
    """Request candidates (names, or `NodeInfo`s from request objects) against the view."""
    if not candidates or isinstance(candidates[0], str):
        return view.candidates(candidates)  # type: ignore[arg-type]
    return view.candidates_from_nodes(candidates)  # type: ignore[arg-type]


def candidate_state(
    view: ClusterView,
    curves: CurveTable | None,
    resolved: Candidates,
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
) -> CandidateState:
    """The pod-independent part of a cycle: the view's own state, gathered at the candidates.

    kube-scheduler does not send one candidate list: it sends the nodes it found feasible,
    from a start that rotates pod after pod (`percentageOfNodesToScore`), so lists rarely
    repeat. What does not depend on the pod is therefore computed for every node of the view
    at once (`view_state`) and a request gathers its candidates from it: a few array takes.
    Candidates from request objects (`nodeCacheCapable: false`) carry their own allocatable
    CPU and are computed on their own.
    """
    if resolved.nodes is not None:
        return _candidate_state(
            view, curves, resolved, now_s=now_s, telemetry_ttl_s=telemetry_ttl_s
        )
    # A list that does come again (every node, on a small cluster) is gathered once per view
    # and curve table (a new table replaces the entry rather than keeping the old one alive).
    key = ("candidate_state", id(resolved), telemetry_ttl_s)
    cached = _still_valid(view.recall(key), curves, now_s)
    if cached is not None:
        return cached
    whole = view_state(view, curves, now_s=now_s, telemetry_ttl_s=telemetry_ttl_s)
    state = whole.at(resolved)
    # The key holds the list's id: keep the list alive with the entry so its id is not reused.
    view.remember(key, (curves, state), resolved)
    return state


def view_state(
    view: ClusterView,
    curves: CurveTable | None,
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
) -> CandidateState:
    """The pod-independent state of every view node (aligned to `view.names`), remembered.

    Two layers, each cached where it lives: what depends on the nodes, their telemetry and the
    curves (u, which nodes are scorable, P(u)) belongs to the telemetry and is shared by the
    views that bindings rebuild; what a binding changes (a, P(u + a)) is recomputed per view,
    and only at the nodes that have assumed load.
    """
    # One per TTL, for one curve table (held in the entry, so its id is never reused).
    key = ("view_state", telemetry_ttl_s)
    cached = _still_valid(view.recall(key), curves, now_s)
    if cached is not None:
        return cached
    # One baseline per TTL, for the curves it was computed with: a new curve table (every
    # bundle swap) replaces it rather than keeping the old table alive beside it.
    _, baseline = view.telemetry_memo(
        ("baseline", telemetry_ttl_s),
        lambda: (
            curves,
            _candidate_state(
                view,
                curves,
                view.all_candidates(),
                now_s=now_s,
                telemetry_ttl_s=telemetry_ttl_s,
                assumed=False,
            ),
        ),
        valid=lambda entry: _still_valid(entry, curves, now_s) is not None,
    )
    state = baseline.with_assumed(view.assumed_cpu, curves)
    view.remember(key, (curves, state))
    return state


def _still_valid(
    entry: tuple[CurveTable | None, CandidateState] | None, curves: CurveTable | None, now_s: float
) -> CandidateState | None:
    """The state of a cached (curves, state) entry, if computed with `curves` and valid now."""
    if entry is None:
        return None
    entry_curves, state = entry
    if entry_curves is curves and state.valid_from_s <= now_s < state.valid_until_s:
        return state
    return None


def _candidate_state(
    view: ClusterView,
    curves: CurveTable | None,
    resolved: Candidates,
    *,
    now_s: float,
    telemetry_ttl_s: float | None,
    assumed: bool = True,
) -> CandidateState:
    count = len(resolved.names)
    known = resolved.has_node_info
    allocatable = resolved.allocatable_cpu
    util = resolved.gather(view.cpu_util, np.nan)
    observed_at_s = resolved.gather(view.observed_at_s, -np.inf)
    # Without (a view's baseline): the views that bindings rebuild add it (`with_assumed`).
    assumed_cores = resolved.gather(view.assumed_cpu, 0.0) if assumed else np.zeros(count)

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
        util_missing = known & (observed_at_s > -np.inf) & ~(util >= 0)
        a = assumed_cores / allocatable

    # Only nodes in the view can have telemetry, so their curve rows are all that matter.
    if curves is not None and count:
        curve_idx = resolved.curve_rows(view.curve_rows(curves))
    else:
        curve_idx = np.full(count, -1, dtype=np.intp)
    has_curve = curve_idx >= 0

    predicted = np.flatnonzero(has_telemetry & has_curve)
    util_from = u + a
    power_before = _power_at(curves, curve_idx, util_from, predicted)

    return CandidateState(
        names=resolved.names,
        known=known,
        allocatable=allocatable,
        observed_at_s=observed_at_s,
        has_telemetry=_frozen(has_telemetry),
        util_missing=_frozen(util_missing),
        u=_frozen(u),
        a=_frozen(a),
        curve_idx=curve_idx,
        has_curve=_frozen(has_curve),
        predicted=_frozen(predicted),
        util_from=_frozen(util_from),
        power_before=_frozen(power_before),
        known_count=int(np.count_nonzero(known)),
        telemetry_count=int(np.count_nonzero(has_telemetry)),
        valid_from_s=now_s,
        valid_until_s=valid_until_s,
    )


def _power_at(
    curves: CurveTable | None, curve_idx: np.ndarray, util: np.ndarray, predicted: np.ndarray
) -> np.ndarray:
    """P(util) at the `predicted` positions, NaN elsewhere (one lookup, no copy when all are)."""
    count = len(curve_idx)
    if curves is None or predicted.size == 0:
        return np.full(count, np.nan)
    if predicted.size == count:
        return curves.power_w(curve_idx, util)
    power = np.full(count, np.nan)
    power[predicted] = curves.power_w(curve_idx[predicted], util[predicted])
    return power


class Cycle:
    """One pod against its candidate nodes: the plugins' shared, read-only input.

    `pod` is the Pod object as kube-scheduler sent it (None in benches that score a bare
    demand). The predicted power after placement and the increase are computed on first use
    and shared by every plugin that reads them (the power score, the power cap, carbon...).
    """

    def __init__(
        self,
        view: ClusterView,
        curves: CurveTable | None,
        candidates: Candidates,
        nodes: CandidateState,
        demand_cores: float,
        *,
        now_s: float,
        pod: Mapping[str, Any] | None = None,
    ) -> None:
        if not math.isfinite(demand_cores) or demand_cores < 0:
            raise ValueError(f"demand_cores must be finite and >= 0, got {demand_cores!r}")
        self.view = view
        self.curves = curves
        self.candidates = candidates
        self.nodes = nodes
        self.names = nodes.names
        self.demand_cores = float(demand_cores)
        self.now_s = now_s
        self.pod = pod
        with np.errstate(invalid="ignore", divide="ignore"):
            self.d = demand_cores / nodes.allocatable

    def __len__(self) -> int:
        return len(self.names)

    def node_values(self, attribute: NodeAttribute) -> np.ndarray:
        """A plugin's per-node attribute at the candidates (cached per candidate list)."""
        return self.candidates.node_values(attribute)

    @cached_property
    def telemetry_age_s(self) -> np.ndarray:
        """Seconds since each candidate's telemetry was observed (inf without any)."""
        return self.now_s - self.nodes.observed_at_s

    @cached_property
    def power_after_w(self) -> np.ndarray:
        """P(u + a + d): the node's predicted power with the pod placed; NaN if unscorable."""
        nodes = self.nodes
        return _power_at(self.curves, nodes.curve_idx, nodes.util_from + self.d, nodes.predicted)

    @cached_property
    def increase_w(self) -> np.ndarray:
        """P(u + a + d) - P(u + a); NaN where the node could not be scored."""
        return self.power_after_w - self.nodes.power_before

    @cached_property
    def scorable(self) -> np.ndarray:
        """Nodes with an increase: fresh telemetry and a curve."""
        return np.isfinite(self.increase_w)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
