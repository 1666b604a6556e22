"""PowerCap (filter): a node whose predicted power after placement exceeds its cap fails.

The cap is the node annotation `power-aware-scheduler/max-power-w` (contract 4), in watts; a
node without it, or with a value that is not a positive number (logged when the node is
written), has no cap. Nodes without telemetry or a curve pass: nothing predicts them over.
The failure is resolvable: evicting pods lowers the node's power, so preemption may help.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from extender.plugins.base import PASS_ALL, FilterVerdict, Plugin
from extender.state import Candidates, NodeAttribute, NodeInfo
from livedata.labels import MAX_POWER_ANNOTATION

if TYPE_CHECKING:
    from extender.cycle import Cycle


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


def _unreadable_cap(node: NodeInfo) -> str | None:
    annotation = node.annotations.get(MAX_POWER_ANNOTATION)
    if annotation is None or not math.isnan(max_power_of(node.annotations)):
        return None
    return f"ignoring max-power annotation {annotation!r} (not a positive number of watts)"


MAX_POWER_W = NodeAttribute(
    "max_power_w",
    lambda node: max_power_of(node.annotations),
    np.float64,
    math.nan,
    check=_unreadable_cap,
)


_CAPPED = object()  # key of the capped positions, derived once per candidate list


def _capped_positions(candidates: Candidates) -> np.ndarray:
    positions = np.flatnonzero(np.isfinite(candidates.node_values(MAX_POWER_W)))
    positions.flags.writeable = False
    return positions


class PowerCap(Plugin):
    name = "PowerCap"
    node_attributes = (MAX_POWER_W,)

    def filter(self, cycle: Cycle) -> FilterVerdict:
        capped = cycle.candidates.memo(_CAPPED, _capped_positions)
        if capped.size == 0:
            return PASS_ALL  # most clusters: no node has a cap, nothing to predict
        max_power_w = cycle.node_values(MAX_POWER_W)
        power_after_w = cycle.power_after_w
        # No prediction is NaN, which compares False: such nodes pass.
        with np.errstate(invalid="ignore"):
            over = capped[power_after_w[capped] > max_power_w[capped]].tolist()
        return FilterVerdict(
            {
                i: f"predicted power after placement {power_after_w[i]:.1f} W exceeds "
                f"{MAX_POWER_ANNOTATION} {max_power_w[i]:g} W"
                for i in over
            }
        )
