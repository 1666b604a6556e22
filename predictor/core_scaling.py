"""The fleet fallback scaled by a node's CPU count, for nodes with no power data at all.

A node with no rows in training is served by the bundle's fleet fallback: one curve learned
from the nodes that have models of their own, the same for a 60 W and a 600 W server. What is
known of such a node is its allocatable CPU (from its Node object), and across real servers
(SPECpower_ssj2008, 116 servers) the dynamic range P(1) - P(0) grows with the core count as a
power law (exponent ~0.71, log-log correlation 0.87), idle power barely (~0.17, 0.19). So the
fallback curve of a node with `c` cores is scaled relative to the fleet it was learned from,
whose size is taken as the median allocatable CPU of the cluster's nodes with a model of their
own (the anchor):

    r = clip(c / anchor_cores, MIN_CORE_RATIO, MAX_CORE_RATIO)
    P(u) = P_fleet(0) * r^idle_exponent + (P_fleet(u) - P_fleet(0)) * r^dynamic_exponent

No anchor (no own-model node with a known CPU count in the cluster) or an unknown CPU count:
the curve is left as it is, and the row says why (`reason`), for `/explain`.

Where the exponents live: they describe servers in general, not one fleet or one training
run, so they are not in the bundle (old bundles would lack them, and every bundle would carry
the same two numbers). They ship with this package, `predictor/data/core_scaling.json`,
written by `python -m training.shape_prior core-scaling` from the SPECpower table training
ships (`training/data/specpower_shapes.csv`); the service reads only this copy, and
`tests/test_core_scaling.py` refits them and checks the copy matches.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # only for the annotation: predictor.model does not import this module
    from predictor.model import Predictor

CORE_SCALING_FILE = "core_scaling.json"
# The ratio is clipped to this band: SPECpower's servers span 2..64 cores, and a power law fitted
# across them says little about a node 20 times the fleet's size (or a twentieth of it). Beyond
# the band the fallback is as wrong either way; the clip keeps it from being absurd.
MIN_CORE_RATIO = 0.25
MAX_CORE_RATIO = 4.0

# Why a fallback row's curve was or was not scaled (`FallbackScaling.reason`).
SCALED = "scaled"
CLIPPED = "scaled_clipped"  # scaled, with the ratio clipped to the band
OFF = "off"  # --no-fallback-core-scaling, or a builder without exponents
NO_ANCHOR = "no_own_model_nodes"  # no own-model node with known allocatable CPU in the cluster
UNKNOWN_CORES = "allocatable_unknown"  # the node's allocatable CPU is not known
REASON_TEXT = {
    SCALED: "scaled by its allocatable CPU against the own-model nodes' median",
    CLIPPED: (
        f"scaled by its allocatable CPU, the ratio clipped to "
        f"[{MIN_CORE_RATIO:g}, {MAX_CORE_RATIO:g}]"
    ),
    OFF: "not scaled: fallback core scaling is off",
    NO_ANCHOR: "not scaled: no node with a model of its own and a known CPU count in the cluster",
    UNKNOWN_CORES: "not scaled: the node's allocatable CPU is unknown",
}


@dataclass(frozen=True)
class CoreExponents:
    """idle ~ cores^idle, dynamic range ~ cores^dynamic, across servers."""

    idle: float
    dynamic: float
    source: str = ""

    def __post_init__(self) -> None:
        for name, value in (("idle", self.idle), ("dynamic", self.dynamic)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"core exponent {name} must be a number, got {value!r}")
            # A negative exponent would make bigger servers cheaper; above 1.5 is no server.
            if not (math.isfinite(value) and 0.0 <= value <= 1.5):
                raise ValueError(f"core exponent {name} must be within 0..1.5, got {value!r}")


@functools.cache
def shipped_core_exponents() -> CoreExponents:
    """The exponents shipped in `predictor/data/core_scaling.json` (read once per process)."""
    text = resources.files("predictor").joinpath("data", CORE_SCALING_FILE).read_text()
    document = json.loads(text)
    try:
        return CoreExponents(
            idle=document["idle_exponent"],
            dynamic=document["dynamic_exponent"],
            source=str(document.get("source", CORE_SCALING_FILE)),
        )
    except (KeyError, ValueError) as exc:
        raise ValueError(f"predictor/data/{CORE_SCALING_FILE}: {exc}") from None


def anchor_cores(own_model_cores: np.ndarray) -> float | None:
    """The median of the own-model nodes' allocatable CPU (finite, > 0); None without any."""
    cores = np.asarray(own_model_cores, dtype=np.float64)
    cores = cores[np.isfinite(cores) & (cores > 0)]
    return float(np.median(cores)) if cores.size else None


def usable_cores(value: object) -> float:
    """A node's allocatable CPU as a float; NaN when unknown (missing, not finite, <= 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    value = float(value)
    return value if math.isfinite(value) and value > 0 else math.nan


@dataclass(frozen=True, eq=False)
class FallbackScaling:
    """How each curve row was scaled by core count; arrays aligned to the table's rows.

    Own-model rows have `reason` None and factors 1. A fallback row has a reason from
    `REASON_TEXT`; when scaled, `ratio` is the ratio applied (after clipping) and the factors
    multiply P_fleet(0) and P_fleet(u) - P_fleet(0). Unscaled rows: ratio NaN, factors 1.
    """

    exponents: CoreExponents | None  # None: scaling off
    anchor_cores: float | None  # median allocatable CPU of the own-model nodes in the cluster
    anchor_nodes: int  # how many own-model nodes that median is over
    cores: np.ndarray  # [rows] the node's allocatable CPU when the row was built (NaN: unknown)
    ratio: np.ndarray  # [rows] c / anchor after clipping; NaN where not scaled
    idle_factor: np.ndarray  # [rows] r^idle_exponent; 1 where not scaled
    dynamic_factor: np.ndarray  # [rows] r^dynamic_exponent; 1 where not scaled
    reason: tuple[str | None, ...] = field(default=())

    def __post_init__(self) -> None:
        rows = len(self.reason)
        for array in (self.cores, self.ratio, self.idle_factor, self.dynamic_factor):
            if array.shape != (rows,):
                raise ValueError(f"fallback scaling of {rows} rows: an array has {array.shape}")
            array.flags.writeable = False

    @classmethod
    def unscaled(cls, kinds: tuple[str, ...], fallback_kind: str) -> FallbackScaling:
        """No scaling information (a table built without it): fallback rows say `off`."""
        rows = len(kinds)
        return cls(
            exponents=None,
            anchor_cores=None,
            anchor_nodes=0,
            cores=np.full(rows, np.nan),
            ratio=np.full(rows, np.nan),
            idle_factor=np.ones(rows),
            dynamic_factor=np.ones(rows),
            reason=tuple(OFF if kind == fallback_kind else None for kind in kinds),
        )

    @classmethod
    def for_rows(
        cls,
        exponents: CoreExponents | None,
        cores: np.ndarray,
        is_fallback: np.ndarray,
        own_model_cores: np.ndarray,
    ) -> FallbackScaling:
        """The scaling of every row: `cores` [rows] the allocatable CPU (NaN: unknown),
        `is_fallback` [rows] the rows the fleet fallback serves, `own_model_cores` the
        allocatable CPU of the cluster's nodes with a model of their own (for the anchor)."""
        cores = np.asarray(cores, dtype=np.float64)
        is_fallback = np.asarray(is_fallback, dtype=bool)
        rows = len(cores)
        own = np.asarray(own_model_cores, dtype=np.float64)
        anchor = anchor_cores(own) if exponents is not None else None
        anchor_nodes = int(np.count_nonzero(np.isfinite(own) & (own > 0)))
        known = np.isfinite(cores) & (cores > 0)
        scaled = is_fallback & known & (anchor is not None)
        ratio = np.full(rows, np.nan)
        idle_factor = np.ones(rows)
        dynamic_factor = np.ones(rows)
        clipped = np.zeros(rows, dtype=bool)
        if exponents is not None and anchor is not None and scaled.any():
            raw = cores[scaled] / anchor
            applied = np.clip(raw, MIN_CORE_RATIO, MAX_CORE_RATIO)
            ratio[scaled] = applied
            idle_factor[scaled] = applied**exponents.idle
            dynamic_factor[scaled] = applied**exponents.dynamic
            clipped[scaled] = applied != raw
        reason: list[str | None] = []
        for fallback, ok, cut in zip(
            is_fallback.tolist(), scaled.tolist(), clipped.tolist(), strict=True
        ):
            if not fallback:
                reason.append(None)
            elif exponents is None:
                reason.append(OFF)
            elif ok:
                reason.append(CLIPPED if cut else SCALED)
            elif anchor is None:
                reason.append(NO_ANCHOR)
            else:
                reason.append(UNKNOWN_CORES)
        return cls(
            exponents=exponents,
            anchor_cores=anchor,
            anchor_nodes=anchor_nodes if anchor is not None else 0,
            cores=np.where(is_fallback, cores, np.nan),
            ratio=ratio,
            idle_factor=idle_factor,
            dynamic_factor=dynamic_factor,
            reason=tuple(reason),
        )

    def select(self, keep: np.ndarray) -> FallbackScaling:
        """The rows where `keep` is True (the builder drops rows with non-finite predictions)."""
        return FallbackScaling(
            exponents=self.exponents,
            anchor_cores=self.anchor_cores,
            anchor_nodes=self.anchor_nodes,
            cores=self.cores[keep],
            ratio=self.ratio[keep],
            idle_factor=self.idle_factor[keep],
            dynamic_factor=self.dynamic_factor[keep],
            reason=tuple(r for r, k in zip(self.reason, keep.tolist(), strict=True) if k),
        )

    def same_scale(self, row: int, other: FallbackScaling, other_row: int) -> bool:
        """Whether a row of `other` was scaled exactly as this row (so its curve is reusable)."""
        return bool(
            self.idle_factor[row] == other.idle_factor[other_row]
            and self.dynamic_factor[row] == other.dynamic_factor[other_row]
        )

    def describe(self, row: int) -> dict[str, object] | None:
        """For `/explain`: None for an own-model row, else what was applied or why nothing."""
        reason = self.reason[row]
        if reason is None:
            return None
        scaled = reason in (SCALED, CLIPPED)
        cores = float(self.cores[row])
        return {
            "applied": scaled,
            "reason": reason,
            "text": REASON_TEXT[reason],
            "allocatable_cores": cores if math.isfinite(cores) else None,
            "anchor_cores": self.anchor_cores,
            "ratio": float(self.ratio[row]) if scaled else None,
            "idle_factor": float(self.idle_factor[row]),
            "dynamic_factor": float(self.dynamic_factor[row]),
        }

    def summary(self) -> dict[str, object]:
        """For `/status`: on or off, the exponents, the anchor and the rows by reason."""
        by_reason: dict[str, int] = {}
        for reason in self.reason:
            if reason is not None:
                by_reason[reason] = by_reason.get(reason, 0) + 1
        exponents = self.exponents
        return {
            "enabled": exponents is not None,
            "idle_exponent": exponents.idle if exponents else None,
            "dynamic_exponent": exponents.dynamic if exponents else None,
            "exponents_source": exponents.source if exponents else None,
            "anchor_cores": self.anchor_cores,
            "anchor_nodes": self.anchor_nodes,
            "ratio_band": [MIN_CORE_RATIO, MAX_CORE_RATIO],
            "nodes_by_reason": by_reason,
        }


def scaled_grid_w(
    grid_w: np.ndarray, idle_factor: np.ndarray, dynamic_factor: np.ndarray
) -> np.ndarray:
    """Per row of a [rows, points] curve table: P(0) * idle_factor + (P(u) - P(0)) * dynamic_factor.

    The first column is u = 0 (the curve tables' grid starts there).
    """
    idle_w = grid_w[:, :1]
    return idle_w * idle_factor[:, None] + (grid_w - idle_w) * dynamic_factor[:, None]


def node_cores_of(names: tuple[str, ...] | list[str], cores: Mapping[str, float]) -> np.ndarray:
    """[names] allocatable CPU per name from a mapping; NaN when missing or unusable."""
    return np.fromiter(
        (usable_cores(cores.get(name)) for name in names), dtype=np.float64, count=len(names)
    )


def fallback_scaling_for(
    predictor: Predictor,
    names: Sequence[str],
    is_fallback: Sequence[bool],
    node_cores: Mapping[str, float] | None,
    exponents: CoreExponents | None,
) -> FallbackScaling:
    """Each named node's scale: fallback rows by their CPU count against the anchor (the curve
    tables and the node power controller's idle watts both scale this way)."""
    cores = node_cores or {}
    # The anchor is the fleet the fallback was learned from: nodes with a fitted model of
    # their own. A scaled fallback ships as a node's own file but was not fitted on the
    # node's data and did not shape the fleet curve, so it does not count.
    own_cores = [
        cores[node]
        for node, entry in predictor.bundle.nodes.items()
        if node in cores and "scaled_fallback" not in entry.info
    ]
    return FallbackScaling.for_rows(
        exponents,
        node_cores_of(list(names), cores),
        np.asarray(is_fallback, dtype=bool),
        np.asarray(own_cores, dtype=np.float64),
    )
