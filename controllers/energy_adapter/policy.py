"""The energy adapter's decisions, pure: a node's level with hysteresis, and the patch that sets it.

The bands (label values and their stored-energy boundaries) are contract 4's, defined once in
`livedata.labels`. What only the adapter adds:

- hysteresis: a node leaves its level only when the reading has moved past the level's
  boundary by `hysteresis_pct` (a battery hovering at 75 % must not flip the label, and with it
  the placement of new pods, at every reading);
- the `power-aware-scheduler/powerless:NoSchedule` taint that goes with the `powerless` label;
- the JSON merge patch that brings a Node's label and taints to the decided level.

A "level" here is a label value (a band's name), as the adapter reads and writes it on Nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from livedata.labels import (
    ENERGY_BAND_BY_NAME,
    ENERGY_BANDS,
    ENERGY_LABEL,
    POWERLESS,
    energy_band_for,
)

POWERLESS_TAINT_KEY = "power-aware-scheduler/powerless"
POWERLESS_TAINT_EFFECT = "NoSchedule"
MERGE_PATCH = "application/merge-patch+json"  # content type of the patches planned here
DEFAULT_HYSTERESIS_PCT = 3.0
# The margin must leave every band a core that no neighbour's extension reaches.
MAX_HYSTERESIS_PCT = min(band.high_pct - band.low_pct for band in ENERGY_BANDS) / 2


def level_for(stored_pct: float) -> str:
    """The level (label value) of a stored-energy percentage (0..100), without hysteresis."""
    return energy_band_for(stored_pct).name


def next_level(stored_pct: float, current: str | None, hysteresis_pct: float) -> str:
    """The level a node should have now, given the one it has (None or unknown: none).

    The node keeps `current` while the reading stays within the current band widened by
    `hysteresis_pct` on both sides; once outside, it takes the plain level of the reading
    (which may skip levels after a sudden jump).
    """
    target = level_for(stored_pct)
    band = ENERGY_BAND_BY_NAME.get(current) if current is not None else None
    if band is None or target == current:
        return target
    if band.low_pct - hysteresis_pct <= stored_pct < band.high_pct + hysteresis_pct:
        return band.name
    return target


@dataclass(frozen=True)
class NodeEnergy:
    """What the adapter needs of a Node: its label, its taints and its resourceVersion."""

    name: str
    label: str | None  # the current energy-status value, whatever it is
    taints: tuple[Mapping[str, Any], ...]
    resource_version: str

    @property
    def level(self) -> str | None:
        """The current label if it is one of the bands, else None."""
        return self.label if self.label in ENERGY_BAND_BY_NAME else None

    @property
    def tainted(self) -> bool:
        return any(t.get("key") == POWERLESS_TAINT_KEY for t in self.taints)

    @classmethod
    def from_object(cls, node: Mapping[str, Any]) -> NodeEnergy:
        """From a Node's JSON (as the API returns it)."""
        metadata = node.get("metadata") or {}
        labels = metadata.get("labels") or {}
        return cls(
            name=metadata.get("name") or "",
            label=labels.get(ENERGY_LABEL),
            taints=tuple((node.get("spec") or {}).get("taints") or ()),
            resource_version=str(metadata.get("resourceVersion") or ""),
        )


def plan_node_patch(
    node: NodeEnergy, target_level: str, *, taint_powerless: bool
) -> dict[str, Any] | None:
    """The JSON merge patch that gives `node` the target label (and taint), or None if it has it.

    Taints are a list, which a merge patch replaces whole: the patch carries the node's other
    taints unchanged plus the node's resourceVersion, so a taint someone else added in the
    meantime makes the API answer 409 (and the next pass retries) instead of being lost.
    """
    patch: dict[str, Any] = {}
    if node.label != target_level:
        patch["metadata"] = {"labels": {ENERGY_LABEL: target_level}}
    want_taint = taint_powerless and target_level == POWERLESS
    if want_taint != node.tainted:
        taints = [dict(t) for t in node.taints if t.get("key") != POWERLESS_TAINT_KEY]
        if want_taint:
            taints.append({"key": POWERLESS_TAINT_KEY, "effect": POWERLESS_TAINT_EFFECT})
        patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
        # null removes the field (merge patch), as the API shows a node without taints.
        patch["spec"] = {"taints": taints or None}
    return patch or None
