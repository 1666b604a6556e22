"""PowerState (filter): a node the power controller has powered off, is waking or draining fails.

The node power controller (`controllers.node_power`) writes the annotation
`power-aware-scheduler/power-state` (contract 4) on the nodes it manages:

    value      the node                                   here
    on         is on and takes pods                       passes
    draining   is cordoned, its pods evicted, to go off   fails (unresolvable)
    off        is powered off                             fails (unresolvable)
    waking     is booting, not Ready yet                  fails (unresolvable)
    (none)     is not managed by the controller           passes
    other      unknown: logged when the node is written   passes

Off and waking nodes are also NotReady and draining ones cordoned, so kube-scheduler's own
filters already keep pods away from them almost always. This filter closes the gaps between
the annotation and the node's status (the seconds before a cordon lands, or before a booted
node's kubelet reports NotReady), so that a node going off never gets a pod. The failure is
unresolvable: preempting pods does not power a node on. Waking a node for pending pods is the
controller's decision, never the scheduler's: the filter never prefers a node that is off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from extender.plugins.base import PASS_ALL, FilterVerdict, Plugin
from extender.state import NodeAttribute, NodeInfo
from livedata.labels import (
    POWER_DRAINING,
    POWER_OFF,
    POWER_ON,
    POWER_STATE_ANNOTATION,
    POWER_STATES,
    POWER_WAKING,
)

if TYPE_CHECKING:
    from extender.cycle import Cycle


class PowerStateCode(IntEnum):
    """Codes of the power-state node attribute (int8)."""

    UNMANAGED = 0
    ON = 1
    DRAINING = 2
    OFF = 3
    WAKING = 4
    UNKNOWN = 5


_CODES: Mapping[str, PowerStateCode] = {
    POWER_ON: PowerStateCode.ON,
    POWER_DRAINING: PowerStateCode.DRAINING,
    POWER_OFF: PowerStateCode.OFF,
    POWER_WAKING: PowerStateCode.WAKING,
}
# How /explain spells each code: the annotation values, "unmanaged" (none), "unknown".
_NAMES_BY_CODE = ("unmanaged", POWER_ON, POWER_DRAINING, POWER_OFF, POWER_WAKING, "unknown")
FAILING_REASONS: Mapping[int, str] = {
    PowerStateCode.DRAINING: (
        f"{POWER_STATE_ANNOTATION} is {POWER_DRAINING}: the node is being emptied to power off"
    ),
    PowerStateCode.OFF: (
        f"{POWER_STATE_ANNOTATION} is {POWER_OFF}: the node is powered off (the node power "
        "controller wakes nodes for pending pods)"
    ),
    PowerStateCode.WAKING: f"{POWER_STATE_ANNOTATION} is {POWER_WAKING}: the node is booting",
}
_FAILING = np.array(sorted(FAILING_REASONS), dtype=np.int8)
_ANY_FAILING = object()  # layout_memo key: does any node of the cluster fail the filter?


def _any_failing(states: np.ndarray) -> bool:
    return bool(np.isin(states, _FAILING).any())


def power_state_of(annotations: Mapping[str, str] | None) -> PowerStateCode:
    """The node's power state from its annotations; none means not managed (on)."""
    value = (annotations or {}).get(POWER_STATE_ANNOTATION)
    if value is None:
        return PowerStateCode.UNMANAGED
    return _CODES.get(value.strip().lower(), PowerStateCode.UNKNOWN)


def _unknown_state(node: NodeInfo) -> str | None:
    if power_state_of(node.annotations) != PowerStateCode.UNKNOWN:
        return None
    return (
        f"unknown {POWER_STATE_ANNOTATION} annotation "
        f"{node.annotations.get(POWER_STATE_ANNOTATION)!r} (expected one of "
        f"{', '.join(POWER_STATES)}); the node passes as if on"
    )


POWER_STATE = NodeAttribute(
    "power_state",
    lambda node: int(power_state_of(node.annotations)),
    np.int8,
    int(PowerStateCode.UNMANAGED),
    check=_unknown_state,
)


class PowerState(Plugin):
    name = "PowerState"
    node_attributes = (POWER_STATE,)

    def filter(self, cycle: Cycle) -> FilterVerdict:
        # Most of the time no node of the cluster is off, waking or draining: then nothing
        # per candidate is needed (the answer holds until a node changes). Node objects sent
        # with the request carry their own annotations: those are read as they are.
        view = cycle.view
        if cycle.candidates.nodes is None and not view.layout_memo(
            _ANY_FAILING, lambda: _any_failing(view.node_values(POWER_STATE))
        ):
            return PASS_ALL
        state = cycle.node_values(POWER_STATE)
        failing = np.flatnonzero(np.isin(state, _FAILING)).tolist()
        if not failing:
            return FilterVerdict({})
        return FilterVerdict(
            {i: FAILING_REASONS[int(state[i])] for i in failing}, frozenset(failing)
        )

    def explain(self, cycle: Cycle) -> Mapping[str, Sequence[object]]:
        codes = cycle.node_values(POWER_STATE).tolist()
        return {"power_state": [_NAMES_BY_CODE[c] for c in codes]}
