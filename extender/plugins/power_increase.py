"""PowerIncrease (score): the fewer watts placing the pod adds to a node, the better.

Raw value: `increase_w = P_node(u + a + d) - P_node(u + a)` (see `extender.cycle`), in float
precision: never truncated to whole watts, and small pods do not tie at 0. Points rank the
candidates by the ratio to the cheapest candidate with fresh telemetry and a curve:

    points = clip(10 - pointsPerDoubling * log2(increase_w / increase_w_min), 0, 10)

so the cheapest node scores 10, one whose increase is 15 % higher about one point less, one
twice as costly 5, four times or more 0 (all equal: all 10). Why a ratio and not min-max over
the candidates: min-max sets the scale by the most expensive node, so one inefficient node
squeezes every reasonable candidate into the top points, and kube-scheduler's spreading
plugins (LeastAllocated, BalancedAllocation), whose scores are added to ours, then overturn
differences of 50 % in watts. In `bench.energy_sim` (16 nodes, 45 % of the CPU requested,
seeds 1, 3, 7) the extender saved 6.8-8.3 % of the default placement's energy with min-max
and 8.1-9.5 % with the ratio, as much as always taking the cheapest node does. Increases below
`minIncreaseW` count as that much. A node without telemetry (none, stale, or no allocatable
CPU) or without a curve scores 0, so a missing metric never looks best. `/explain` also says
which model predicts each node (its own or the bundle's fleet fallback) and that model's
held-out error, so a node scored by a rough fallback is visible where its score is, and how
its fallback curve was scaled by its CPU count (`fallback_scale`), or why it was not.

It also gives, per node, the highest load its model was trained on
(`max_util_measured`, from the bundle, read when curves are built) and whether the prediction
after placement lies above it (`extrapolated`: the model's shape there comes from the
population prior, not from the node's own data; None when unknown, e.g. the fleet fallback),
and there how sure the model is: `extrapolation_interval_w`, the band [low_w, high_w] its power
after placement is expected in (the bundle's `extrapolation_interval`, from training's shape
prior; None when not extrapolated or the model recorded none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from extender.plugins.base import Plugin, cost_ratio_points, finite_or_none

if TYPE_CHECKING:
    from extender.cycle import Cycle


@dataclass(frozen=True)
class PowerIncreaseArgs:
    # Points lost each time a node's increase doubles against the cheapest candidate's.
    points_per_doubling: float = 5.0
    # Increases below this count as this much: the ratio stays finite on a flat model segment.
    min_increase_w: float = 1e-3

    def __post_init__(self) -> None:
        if not self.points_per_doubling > 0:
            raise ValueError(f"pointsPerDoubling must be > 0, got {self.points_per_doubling!r}")
        if not self.min_increase_w > 0:
            raise ValueError(f"minIncreaseW must be > 0, got {self.min_increase_w!r}")


class PowerIncrease(Plugin):
    name = "PowerIncrease"
    Args = PowerIncreaseArgs

    def score(self, cycle: Cycle) -> np.ndarray:
        return cycle.increase_w

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        return cost_ratio_points(
            raw, points_per_doubling=self.args.points_per_doubling, floor=self.args.min_increase_w
        )

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        nodes = cycle.nodes
        measured = np.full(len(cycle), np.nan)
        if cycle.curves is not None and nodes.has_curve.any():
            rows = nodes.curve_idx[nodes.has_curve]
            measured[nodes.has_curve] = cycle.curves.max_util_measured[rows]
        util_after = nodes.util_from + cycle.d
        known = np.isfinite(measured) & np.isfinite(util_after) & cycle.scorable
        extrapolated = [
            bool(above) if ok else None
            for above, ok in zip(util_after > measured, known, strict=True)
        ]
        interval = extrapolation_interval_w(cycle, extrapolated, util_after)
        return {
            "u": finite_or_none(nodes.u),
            "a": finite_or_none(nodes.a),
            "d": finite_or_none(cycle.d),
            "power_before_w": finite_or_none(nodes.power_before),
            "power_after_w": finite_or_none(cycle.power_after_w),
            "increase_w": finite_or_none(cycle.increase_w),
            "max_util_measured": finite_or_none(measured),
            "extrapolated": extrapolated,
            "extrapolation_interval_w": interval,
            **model_columns(cycle),
        }


def extrapolation_interval_w(
    cycle: Cycle, extrapolated: Sequence[bool | None], util_after: np.ndarray
) -> list[list[float] | None]:
    """Per candidate placed above its model's highest trained load, the band its power after
    placement is expected in, [low_w, high_w] (the bundle's `extrapolation_interval` applied to
    the prediction); None where it is not extrapolated or its model gave no band."""
    curves, rows = cycle.curves, cycle.nodes.curve_idx
    power_after = cycle.power_after_w
    interval: list[list[float] | None] = []
    for k, above in enumerate(extrapolated):
        band = curves.extrapolation[rows[k]] if above and curves is not None else None
        if band is None or not np.isfinite(power_after[k]):
            interval.append(None)
            continue
        low, high = band.ratios(float(util_after[k]))
        interval.append([round(power_after[k] * low, 3), round(power_after[k] * high, 3)])
    return interval


def model_columns(cycle: Cycle) -> dict[str, list[object]]:
    """Which model predicts each candidate: `model` is "own" (the node's), "fallback" (the
    bundle's fleet model, for nodes without one) or None (no curve), `model_mape_pct` that
    model's held-out MAPE from the bundle's manifest (None when it has none), and for a
    fallback node `fallback_scale`: the core-count scale its curve got (ratio to the own-model
    nodes' median, idle and dynamic factors) or why none (None for other nodes)."""
    rows = cycle.nodes.curve_idx
    curves = cycle.curves
    if curves is None or len(curves) == 0:
        return {
            "model": [None] * len(rows),
            "model_mape_pct": [None] * len(rows),
            "fallback_scale": [None] * len(rows),
        }
    has_row = rows >= 0
    kinds = [curves.model_kind[row] if row >= 0 else None for row in rows.tolist()]
    mape_pct = np.where(has_row, curves.model_mape_pct[np.where(has_row, rows, 0)], np.nan)
    scaling = curves.fallback_scaling
    scale = [scaling.describe(row) if row >= 0 else None for row in rows.tolist()]
    return {"model": kinds, "model_mape_pct": finite_or_none(mape_pct), "fallback_scale": scale}
