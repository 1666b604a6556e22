"""Per-node power curves P(u), tabulated in the background, interpolated on the request path.

Per-node models defeat batching: scoring 5000 nodes one onnxruntime call at a time costs most
of a second per pod. But a node's curve only changes when its telemetry or its model changes,
so ``CurveBuilder`` tabulates each node's P(u) on ``UTIL_GRID`` whenever that happens (reusing
every unchanged row of the previous table), and ``CurveTable`` answers "power increase of
adding demand d on top of u" for all candidate nodes at once with array arithmetic: no model
call, no I/O, no per-node Python loop.

Two rules keep the scores honest:
- CPU temperatures move along the grid with the node's ``thermal`` slope (degrees C per unit
  of utilisation), so the curve is not tabulated at today's temperature only.
- Beyond u = 1 the curve keeps rising with its last slope (never less steep than its average
  slope over 0..1), so an overcommitted node never looks free. Below u = 0 it is clamped.
Everything stays float64: rounding is what tied small pods at 0 W in earlier systems.

Each row also carries the highest load its node's model was trained on (the manifest's
`max_util_measured`, NaN when unknown or for the fleet fallback), read once when the row is
built, so `/explain` can name the predictions above it as extrapolated without touching the
bundle on the request path. Where the manifest gives it, a row also carries how sure its model
is above that load (`ExtrapolationBand`: the band training's shape prior expects the power in,
as ratios to the prediction), which `/explain` shows beside `extrapolated`.

A node served by the fleet fallback (no data of its own at all) gets the fleet's curve scaled
by its allocatable CPU against the own-model nodes' median (`predictor.core_scaling`), when
the builder is given exponents and the nodes' CPU counts; each row records the scale applied,
or why none (`CurveTable.fallback_scaling`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from types import MappingProxyType

import numpy as np

from predictor.bundle import ModelEntry, thermal_slopes
from predictor.core_scaling import (
    CoreExponents,
    FallbackScaling,
    fallback_scaling_for,
    scaled_grid_w,
)
from predictor.model import UTIL_FEATURE, Predictor

FALLBACK = "fallback"  # model_kind of a row served by the bundle's fleet fallback
log = logging.getLogger(__name__)

GRID_POINTS = 201
UTIL_GRID: np.ndarray = np.linspace(0.0, 1.0, GRID_POINTS)
UTIL_GRID.flags.writeable = False
_LAST = GRID_POINTS - 1
MAX_BATCH_ROWS = 65536  # bounds the memory of one onnxruntime call on the shared fallback


@dataclass(frozen=True)
class ExtrapolationBand:
    """How sure a node's model is above the highest load it was trained on: at loads `util`,
    the power it expects between `low` and `high` times its prediction (from the bundle's
    manifest, `extrapolation_interval`; between `max_util` and the first load the band widens
    from nothing)."""

    max_util: float
    util: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]

    def ratios(self, util: float) -> tuple[float, float]:
        """(low, high) ratios to the prediction at load `util` (1, 1 at or below `max_util`)."""
        at = [self.max_util, *self.util]
        return (
            float(np.interp(util, at, [1.0, *self.low])),
            float(np.interp(util, at, [1.0, *self.high])),
        )


def extrapolation_band(predictor: Predictor, node: str) -> ExtrapolationBand | None:
    """A node's own model's band above its highest trained load, or None (no band recorded,
    the fallback, or a malformed entry, which is logged and ignored: it only explains)."""
    entry = predictor.entry(node) if predictor.model_kind(node) == "own" else None
    info = None if entry is None else entry.info.get("extrapolation_interval")
    measured = max_util_measured(predictor, node)
    if not isinstance(info, Mapping) or not math.isfinite(measured):
        return None
    try:
        util, low, high = (tuple(float(v) for v in info[k]) for k in ("util", "low", "high"))
    except (KeyError, TypeError, ValueError):
        log.warning("node %s: extrapolation_interval in the manifest is malformed", node)
        return None
    if not (len(util) == len(low) == len(high)) or not util:
        log.warning("node %s: extrapolation_interval lists of different lengths", node)
        return None
    return ExtrapolationBand(measured, util, low, high)


@dataclass(frozen=True)
class CurveTable:
    """Immutable snapshot of every predictable node's P(u); safe to read from any thread."""

    version: str  # bundle version the curves were computed from
    names: tuple[str, ...]
    power_w_grid: np.ndarray  # [rows, GRID_POINTS] float64 watts at UTIL_GRID
    util_now: np.ndarray  # [rows] the telemetry's cpu_util the row was tabulated at
    model_kind: tuple[str, ...]  # per row "own" or "fallback" (for the explain view)
    feature_rows: np.ndarray  # [rows, F] float32 telemetry after fill: what the row depends on
    skipped: Mapping[str, str] = field(default_factory=dict)  # node -> why it has no row
    reused_rows: int = 0  # rows copied from the previous table in the build
    computed_rows: int = 0  # rows computed by model inference in the build
    # [rows] held-out MAPE (%) of the model serving each row, from the manifest (NaN: unknown).
    # Read by /explain, /status and /metrics, so it is looked up once here, not per request.
    model_mape_pct: np.ndarray | None = None
    # [rows] highest load the row's model was trained on (NaN: unknown); None: all unknown
    max_util_measured: np.ndarray | None = None
    # How each fallback row was scaled by its node's CPU count, or why not; None: not asked
    # (every fallback row then says "off").
    fallback_scaling: FallbackScaling | None = None
    # Per row, the band its model expects above `max_util_measured` (the manifest's
    # `extrapolation_interval`: ratios to the prediction at grid loads), or None; None: all none.
    extrapolation: tuple[ExtrapolationBand | None, ...] | None = None
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _slope_beyond_w: np.ndarray = field(init=False, repr=False, compare=False)
    _fallback_names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rows = len(self.names)
        grid = self.power_w_grid
        if grid.shape != (rows, GRID_POINTS) or self.util_now.shape != (rows,):
            raise ValueError(
                f"curve table of {rows} nodes needs power_w_grid [{rows}, {GRID_POINTS}] and "
                f"util_now [{rows}], got {grid.shape} and {self.util_now.shape}"
            )
        if len(self.model_kind) != rows or len(self.feature_rows) != rows:
            raise ValueError(f"curve table of {rows} nodes: model_kind/feature_rows lengths differ")
        if self.max_util_measured is None:
            object.__setattr__(self, "max_util_measured", np.full(rows, np.nan))
        elif self.max_util_measured.shape != (rows,):
            raise ValueError(f"curve table of {rows} nodes: max_util_measured length differs")
        if self.extrapolation is None:
            object.__setattr__(self, "extrapolation", (None,) * rows)
        elif len(self.extrapolation) != rows:
            raise ValueError(f"curve table of {rows} nodes: extrapolation length differs")
        if self.fallback_scaling is None:
            object.__setattr__(
                self, "fallback_scaling", FallbackScaling.unscaled(self.model_kind, FALLBACK)
            )
        elif len(self.fallback_scaling.reason) != rows:
            raise ValueError(f"curve table of {rows} nodes: fallback_scaling length differs")
        object.__setattr__(self, "_index", {name: i for i, name in enumerate(self.names)})
        object.__setattr__(self, "skipped", MappingProxyType(dict(self.skipped)))
        mape_pct = self.model_mape_pct
        if mape_pct is None:
            mape_pct = np.full(rows, np.nan)
        mape_pct = np.asarray(mape_pct, dtype=np.float64)
        if mape_pct.shape != (rows,):
            raise ValueError(f"curve table of {rows} nodes: model_mape_pct has {mape_pct.shape}")
        object.__setattr__(self, "model_mape_pct", mape_pct)
        fallback = tuple(
            n for n, kind in zip(self.names, self.model_kind, strict=True) if kind == FALLBACK
        )
        object.__setattr__(self, "_fallback_names", fallback)
        # Beyond u = 1: the last segment's slope, never less than the average slope over 0..1,
        # so a curve that saturates early (trees often do) still charges for overcommitment.
        last_slope = (grid[:, _LAST] - grid[:, _LAST - 1]) * _LAST  # watts per unit u
        chord_slope = grid[:, _LAST] - grid[:, 0]
        object.__setattr__(self, "_slope_beyond_w", np.maximum(last_slope, chord_slope))
        for array in (
            grid,
            self.util_now,
            self.feature_rows,
            self._slope_beyond_w,
            mape_pct,
            self.max_util_measured,
        ):
            array.flags.writeable = False

    @classmethod
    def empty(cls, version: str, n_features: int = 0) -> CurveTable:
        return cls(
            version=version,
            names=(),
            power_w_grid=np.empty((0, GRID_POINTS)),
            util_now=np.empty(0),
            model_kind=(),
            feature_rows=np.empty((0, n_features), dtype=np.float32),
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def fallback_names(self) -> tuple[str, ...]:
        """Nodes whose curve comes from the bundle's fleet fallback model, in table order."""
        return self._fallback_names

    def predicted_now_w(self) -> np.ndarray:
        """[rows] each node's predicted power at the telemetry it was tabulated at (watts)."""
        return self.power_w(np.arange(len(self.names), dtype=np.intp), self.util_now)

    def row_of(self, name: str) -> int:
        return self._index.get(name, -1)

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        """Row index per name (int), -1 for a node without a curve."""
        return np.fromiter(map(self._index.get, names, repeat(-1)), dtype=np.intp, count=len(names))

    def power_w(self, idx: np.ndarray, util: np.ndarray | float) -> np.ndarray:
        """P(util) per row index by linear interpolation on the grid.

        NaN where idx is -1 or util is NaN. Beyond u = 1 the curve keeps rising (see module
        docstring); below 0 it is clamped to P(0).
        """
        idx = np.asarray(idx, dtype=np.intp)
        util = np.asarray(util, dtype=np.float64)
        if idx.shape != util.shape:
            shape = np.broadcast_shapes(idx.shape, util.shape)
            idx, util = np.broadcast_to(idx, shape), np.broadcast_to(util, shape)
        if len(self.names) == 0:
            return np.full(idx.shape, np.nan)
        # The request path calls this for thousands of nodes at once, so each step is one
        # whole-array operation (written in place where it can be: small arrays are dominated
        # by the per-call cost, not by the arithmetic).
        missing = (idx < 0) | np.isnan(util)
        any_missing = bool(missing.any())
        rows = np.where(missing, 0, idx) if any_missing else idx  # never an index from NaN
        position = np.maximum(util, 0.0)  # a new array: safe to write into
        np.minimum(position, 1.0, out=position)
        if any_missing:
            position[missing] = 0.0
        position *= _LAST
        left = position.astype(np.intp)
        np.minimum(left, _LAST - 1, out=left)
        # Gathering from the flat table is cheaper than 2-D fancy indexing.
        flat = self.power_w_grid.reshape(-1)
        at = rows * GRID_POINTS
        at += left
        p_left = flat.take(at)
        at += 1
        power = flat.take(at)
        power -= p_left
        position -= left
        power *= position
        power += p_left
        over = util > 1.0
        if over.any():
            over_rows = rows[over]
            power[over] = flat.take(over_rows * GRID_POINTS + _LAST) + self._slope_beyond_w[
                over_rows
            ] * (util[over] - 1.0)
        if any_missing:
            power[missing] = np.nan
        return power

    def power_increase_w(
        self, idx: np.ndarray, util_from: np.ndarray | float, demand: np.ndarray | float
    ) -> np.ndarray:
        """P(util_from + demand) - P(util_from) per row index, watts; NaN where idx is -1."""
        util_from = np.asarray(util_from, dtype=np.float64)
        util_to = util_from + np.asarray(demand, dtype=np.float64)
        return self.power_w(idx, util_to) - self.power_w(idx, util_from)


class CurveBuilder:
    """Builds ``CurveTable``s, recomputing only nodes whose telemetry, model or scale changed.

    ``fallback_core_exponents``: scale the fleet fallback's curve by each node's CPU count
    (`predictor.core_scaling`) when ``build`` is given the nodes' allocatable CPU; None: never.
    """

    def __init__(
        self,
        *,
        max_batch_rows: int = MAX_BATCH_ROWS,
        fallback_core_exponents: CoreExponents | None = None,
    ) -> None:
        self.max_batch_rows = max_batch_rows
        self.fallback_core_exponents = fallback_core_exponents

    def build(
        self,
        predictor: Predictor,
        telemetry: Mapping[str, Mapping[str, float]],
        previous: CurveTable | None,
        node_cores: Mapping[str, float] | None = None,
    ) -> CurveTable:
        """A table for every node in ``telemetry`` that has a model and usable telemetry.

        ``node_cores``: allocatable CPU (cores) of the nodes the cluster knows, for scaling
        fallback curves; None: unknown (fallback rows then stay unscaled).
        """
        n_features = len(predictor.features)
        reusable = (
            previous if previous is not None and previous.version == predictor.version else None
        )
        skipped: dict[str, str] = {}
        names: list[str] = []
        kinds: list[str] = []
        keys: list[str] = []
        mape_pct: list[float] = []
        measured: list[float] = []
        bands: list[ExtrapolationBand | None] = []
        rows: list[np.ndarray] = []
        reuse_from: list[int] = []  # previous row per node, -1 = compute

        for node, values in telemetry.items():
            key = predictor.model_key(node)
            if key is None:
                skipped[node] = "no_model"
                continue
            row = predictor.feature_row(values)
            if row is None:
                skipped[node] = "no_telemetry"
                continue
            old = -1 if reusable is None else reusable.row_of(node)
            if old >= 0 and not np.array_equal(reusable.feature_rows[old], row):
                old = -1
            names.append(node)
            kinds.append(predictor.model_kind(node) or "")
            keys.append(key)
            mape_pct.append(heldout_mape_pct(predictor.entry(node)))
            measured.append(max_util_measured(predictor, node))
            bands.append(extrapolation_band(predictor, node))
            rows.append(row)
            reuse_from.append(old)

        scaling = self._fallback_scaling(predictor, names, kinds, node_cores)
        to_compute: dict[str, list[int]] = {}  # model key -> positions in `names`
        for position, old in enumerate(reuse_from):
            # A row is reused only if it was scaled exactly alike (the anchor or the node's
            # CPU count may have moved while its telemetry did not).
            if old >= 0 and not scaling.same_scale(position, reusable.fallback_scaling, old):
                reuse_from[position] = old = -1
            if old < 0:
                to_compute.setdefault(keys[position], []).append(position)

        feature_rows = np.array(rows, dtype=np.float32).reshape(len(names), n_features)
        grid = np.empty((len(names), GRID_POINTS), dtype=np.float64)
        reuse = np.asarray(reuse_from, dtype=np.intp)
        if reusable is not None and (reuse >= 0).any():
            grid[reuse >= 0] = reusable.power_w_grid[reuse[reuse >= 0]]

        util_col = predictor.features.index(UTIL_FEATURE)
        for key, positions in to_compute.items():
            self._tabulate(predictor, key, positions, names, feature_rows, util_col, grid)
        rescale = np.flatnonzero(
            (reuse < 0) & ((scaling.idle_factor != 1.0) | (scaling.dynamic_factor != 1.0))
        )
        if rescale.size:
            grid[rescale] = scaled_grid_w(
                grid[rescale], scaling.idle_factor[rescale], scaling.dynamic_factor[rescale]
            )

        keep = np.isfinite(grid).all(axis=1)
        for position in np.flatnonzero(~keep):
            skipped[names[position]] = "non_finite_prediction"
            log.warning(
                "node %s: model of bundle %s predicts non-finite watts; node left without a curve",
                names[position],
                predictor.version,
            )
        computed = sum(len(p) for p in to_compute.values())
        return CurveTable(
            version=predictor.version,
            names=tuple(n for n, k in zip(names, keep, strict=True) if k),
            power_w_grid=grid[keep],
            util_now=feature_rows[keep, util_col].astype(np.float64),
            model_kind=tuple(k for k, ok in zip(kinds, keep, strict=True) if ok),
            feature_rows=feature_rows[keep],
            max_util_measured=np.array(measured, dtype=np.float64).reshape(len(names))[keep],
            extrapolation=tuple(b for b, ok in zip(bands, keep, strict=True) if ok),
            skipped=skipped,
            reused_rows=len(names) - computed,
            computed_rows=computed,
            model_mape_pct=np.asarray(mape_pct, dtype=np.float64).reshape(len(names))[keep],
            fallback_scaling=scaling.select(keep),
        )

    def _fallback_scaling(
        self,
        predictor: Predictor,
        names: list[str],
        kinds: list[str],
        node_cores: Mapping[str, float] | None,
    ) -> FallbackScaling:
        """Each row's scale: fallback rows by their CPU count against the anchor."""
        return fallback_scaling_for(
            predictor,
            names,
            [kind == FALLBACK for kind in kinds],
            node_cores,
            self.fallback_core_exponents,
        )

    def _tabulate(
        self,
        predictor: Predictor,
        key: str,
        positions: list[int],
        names: list[str],
        feature_rows: np.ndarray,
        util_col: int,
        grid_out: np.ndarray,
    ) -> None:
        """Fill ``grid_out`` rows at ``positions`` with one model's predictions, batched."""
        nodes_per_call = max(1, self.max_batch_rows // GRID_POINTS)
        for start in range(0, len(positions), nodes_per_call):
            chunk = positions[start : start + nodes_per_call]
            batch = grid_rows(predictor, [names[p] for p in chunk], feature_rows[chunk], util_col)
            watts = predictor.run_model_w(key, batch.reshape(-1, batch.shape[-1]))
            grid_out[chunk] = watts.reshape(len(chunk), GRID_POINTS)


def heldout_mape_pct(entry: ModelEntry | None) -> float:
    """The manifest's held-out MAPE (%) of a model entry (`metrics.mape_pct`); NaN if absent."""
    metrics = entry.info.get("metrics") if entry is not None else None
    value = metrics.get("mape_pct") if isinstance(metrics, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value) if math.isfinite(value) else math.nan


def max_util_measured(predictor: Predictor, node: str) -> float:
    """The highest load a node's own model was trained on (NaN: the fallback, or not recorded)."""
    entry = predictor.entry(node) if predictor.model_kind(node) == "own" else None
    value = None if entry is None else entry.info.get("max_util_measured")
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else np.nan
    )


def grid_rows(
    predictor: Predictor, nodes: Sequence[str], feature_rows: np.ndarray, util_col: int
) -> np.ndarray:
    """Model inputs ``[nodes, GRID_POINTS, F]``: each node's row with u swept over the grid.

    CPU temperatures follow the node's thermal slope: ``t(u) = t_now + slope * (u - u_now)``.
    """
    batch = np.repeat(feature_rows[:, None, :], GRID_POINTS, axis=1)
    u_now = feature_rows[:, util_col].astype(np.float64)
    batch[:, :, util_col] = UTIL_GRID
    feature_index = {name: i for i, name in enumerate(predictor.features)}
    for n, node in enumerate(nodes):
        entry = predictor.entry(node)
        if entry is None:
            continue
        for feature, slope in thermal_slopes(entry).items():
            column = feature_index[feature]
            batch[n, :, column] = feature_rows[n, column] + slope * (UTIL_GRID - u_now[n])
    return batch
