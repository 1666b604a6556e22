"""EnergyLevel (filter and score): prefer nodes with stored energy to spare; never a powerless one.

The node label `energy-status` (contract 4, bands in `livedata.labels`), as the energy adapter
writes it from a battery's charge:

    label            stored energy   points
    (no label)       grid power      10
    grid             grid power      10  (the same, said explicitly; /explain's word for it)
    well-powered     75-100 %        10
    vulnerable       40-75 %          6
    low-powered      15-40 %          3
    powerless        0-15 %           0  (and fails the filter)
    anything else    unknown          6  (treated like vulnerable: neither trusted nor
                                          excluded; logged when the node is written)

Powerless nodes fail as unresolvable: preempting pods does not charge a battery, so
kube-scheduler should not try preemption there. With the default weights (PowerIncrease 0.6,
EnergyLevel 0.4) a battery's watts are priced above the grid's: a well-powered node beats a
low-powered one unless its power points are lower by more than 4.7 (its increase about 1.9
times the low-powered node's), and a vulnerable one unless lower by more than 2.7 (about 1.45
times). With (0.7, 0.3) the low-powered node's watts cost only 1.5 times as much, and in
`bench.energy_sim` battery nodes then spent more hours powerless (25 h against 18 h).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from extender.plugins.base import PASS_ALL, FilterVerdict, Plugin
from extender.state import Candidates, ClusterView, NodeAttribute, NodeInfo
from livedata.labels import (
    ENERGY_LABEL,
    ENERGY_LABEL_VALUES,
    GRID,
    LOW_POWERED,
    POWERLESS,
    VULNERABLE,
    WELL_POWERED,
)

if TYPE_CHECKING:
    from extender.cycle import Cycle


class EnergyLevel(IntEnum):
    """Codes of the energy-level node attribute (int8)."""

    POWERLESS = 0
    LOW_POWERED = 1
    VULNERABLE = 2
    WELL_POWERED = 3
    GRID = 4
    UNKNOWN = 5


LEVEL_OF_LABEL: Mapping[str, EnergyLevel] = {
    POWERLESS: EnergyLevel.POWERLESS,
    LOW_POWERED: EnergyLevel.LOW_POWERED,
    VULNERABLE: EnergyLevel.VULNERABLE,
    WELL_POWERED: EnergyLevel.WELL_POWERED,
    GRID: EnergyLevel.GRID,
}

# How /explain spells each level: the label values (grid also for no label), "unknown".
ENERGY_LEVEL_NAMES: Mapping[EnergyLevel, str] = {
    **{level: label for label, level in LEVEL_OF_LABEL.items()},
    EnergyLevel.UNKNOWN: "unknown",
}
_NAMES_BY_CODE = tuple(ENERGY_LEVEL_NAMES[EnergyLevel(code)] for code in range(len(EnergyLevel)))

# Points, indexed by EnergyLevel code.
ENERGY_SCORES = np.array([0.0, 3.0, 6.0, 10.0, 10.0, 6.0])
ENERGY_SCORES.flags.writeable = False


def energy_level_of(labels: Mapping[str, str] | None) -> EnergyLevel:
    """The node's energy level from its labels; no `energy-status` label means grid power."""
    if not labels:
        return EnergyLevel.GRID
    value = labels.get(ENERGY_LABEL)
    if value is None:
        return EnergyLevel.GRID
    return LEVEL_OF_LABEL.get(value, EnergyLevel.UNKNOWN)


def _unknown_label(node: NodeInfo) -> str | None:
    if energy_level_of(node.labels) != EnergyLevel.UNKNOWN:
        return None
    return (
        f"unknown {ENERGY_LABEL} label {node.labels.get(ENERGY_LABEL)!r}, scored like "
        f"'vulnerable'; valid values: {', '.join(ENERGY_LABEL_VALUES)} (no label: grid)"
    )


ENERGY_LEVEL = NodeAttribute(
    "energy_level",
    lambda node: int(energy_level_of(node.labels)),
    np.int8,
    int(EnergyLevel.UNKNOWN),
    check=_unknown_label,
)
POWERLESS_REASON = "energy-status is powerless (0-15 % stored energy)"
# Keys of what is derived once per candidate list (labels change with the node layout only).
_POWERLESS_VERDICT = object()
_POINTS = object()
_ANY_POWERLESS = object()  # layout_memo key: is any node of the cluster powerless?


def _any_powerless(view: ClusterView) -> bool:
    level = view.node_values(ENERGY_LEVEL)
    return bool((view.has_node_info & (level == EnergyLevel.POWERLESS)).any())


def _powerless_verdict(candidates: Candidates) -> FilterVerdict:
    level = candidates.node_values(ENERGY_LEVEL)
    known = candidates.has_node_info
    powerless = np.flatnonzero(known & (level == EnergyLevel.POWERLESS)).tolist()
    if not powerless:
        return PASS_ALL
    return FilterVerdict(dict.fromkeys(powerless, POWERLESS_REASON), frozenset(powerless))


def _points(candidates: Candidates) -> np.ndarray:
    points = ENERGY_SCORES[candidates.node_values(ENERGY_LEVEL)]
    points.flags.writeable = False
    return points


class EnergyLevelPlugin(Plugin):
    name = "EnergyLevel"
    node_attributes = (ENERGY_LEVEL,)

    def filter(self, cycle: Cycle) -> FilterVerdict:
        # Most of the time no node of the cluster is powerless: then nothing per candidate
        # is needed (the answer holds until a node changes). Node objects sent with the
        # request carry their own labels: those are read as they are.
        view = cycle.view
        if cycle.candidates.nodes is None and not view.layout_memo(
            _ANY_POWERLESS, lambda: _any_powerless(view)
        ):
            return PASS_ALL
        return cycle.candidates.memo(_POWERLESS_VERDICT, _powerless_verdict)

    def score(self, cycle: Cycle) -> np.ndarray:
        return cycle.candidates.memo(_POINTS, _points)

    def normalise(self, raw: np.ndarray, cycle: Cycle) -> np.ndarray:
        return raw  # already 0..10 points

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        return {
            "energy_level": [_NAMES_BY_CODE[c] for c in cycle.node_values(ENERGY_LEVEL).tolist()]
        }

    def node_metrics(self, view: ClusterView) -> Iterable[Metric]:
        """`power_aware_extender_node_energy_level{node, level} 1` per node the extender knows
        (kube-state-metrics' convention for a state: the level is a label, the value 1)."""
        family = GaugeMetricFamily(
            "power_aware_extender_node_energy_level",
            f"The node's energy level from its {ENERGY_LABEL} label (grid: none), as scored; "
            "value 1",
            labels=["node", "level"],
        )
        codes = view.node_values(ENERGY_LEVEL)[view.has_node_info].tolist()
        for name, code in zip(view.names, codes, strict=False):
            family.add_metric([name, _NAMES_BY_CODE[code]], 1.0)
        return (family,)
