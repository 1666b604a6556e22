"""What real servers' power curves look like: a population shape prior learned from SPECpower.

Server power curves share a few shapes (a steep first 10 % of load, then nearly straight, often a
last turbo step), and a node's telemetry rarely shows all of its curve: load held at a few
levels, mostly idle, never above half. `training.monoshape` fits each node's curve with this
prior filling what its data does not show; the fleet fallback scales its mean shape to a node's
power. Everything here works on curves tabulated at `GRID_UTIL` (0, 10 %, ..., 100 % load, as
SPECpower_ssj2008 measures them), as *shapes*: a curve minus its idle power, divided by its
dynamic range `P(1) - P(0)`, so its ten per-decile increments are non-negative and sum to 1.

- a Gaussian over the increments: their mean (`mean_increments`) and the leading principal
  components of their spread plus an isotropic rest (`precision`). `shape_precision(mean)`
  turns it into a penalty on the *shape* alone: its null space is the mean itself, so the
  penalty never pulls a node's watts, only how they are shared between deciles;
- the servers' own shapes (`bank_shapes`), for a node's own prior mean
  (`conditional_shape`): through the node's curve where it has data, and between and above
  the loads it showed, ridge regressions on its shown shape learned across the servers
  (`_ShownShapeRegression`), mixed with the shapes of the servers that looked like it,
  weighted by how alike they are (`local_mean_increments`' kernel). Above a node's highest
  load this is the extrapolation, combined with the straight line through idle and that
  load by how well each predicted the prior's own servers left out (`training.prior_rise`),
  which also gives the band the prior expects the power in there (`rise_interval`);
- each server's generation (`old`: 2007-2016, `modern`: 2017-2025), so a node whose CPU
  model tells its generation (`training.node_facts`) is drawn from its own
  (`for_generation`): curves of 2017 on idle lower and climb steeper at the top;
- each server's cores and sockets (`bank_hardware`), so above the highest load of a node whose
  facts tell its own, the rise is a forest's on its shape and that hardware
  (`prior_rise.FactsRise`), calibrated against the line and banded the same way: how steep
  turbo makes the top depends on how many cores share a socket and how much each draws;
- each server's processor model (`bank_groups`), so above the highest load of a node whose CPU
  model names a processor the bank holds servers of (`same_processor`), their rise counts for
  half (`SAME_PROCESSOR_SHARE`): the same processor's turbo frequencies and power limits,
  though in another chassis;
- how dynamic range grows with idle power across servers (`dynamic_w_from_idle`), for the
  fallback of a node with too few rows to fit: log D = a + b log idle;
- how idle power and dynamic range grow with the CPU count (`fit_core_exponents`), for the
  fleet fallback of a node with no rows at all: the extender scales the fleet's curve by the
  node's allocatable CPU with these two power-law exponents. The service must not import
  training, so they ship as data beside their user (`predictor/data/core_scaling.json`,
  written by `python -m training.shape_prior core-scaling`; a test refits and compares).

`default_shape_prior()` learns it from the curves shipped with the package
(`training/data/specpower_shapes.csv`, 116 servers of 2007-2016, and
`specpower_modern_shapes.csv`, 126 of 2017-2025), once per process. The core-count exponents
are fitted on the first table (`load_shapes_table()`'s default), as the shipped
`core_scaling.json` was. Benchmarks learn a prior from a subset (`from_curves`) to measure on
servers it never saw.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, field
from importlib import resources
from io import StringIO

import numpy as np
import pandas as pd

from training.node_facts import GENERATIONS, NodeFacts, processor_model
from training.prior_rise import (
    FactsRise,
    RiseCalibration,
    checked_hardware,
    node_hardware,
    rise_above,
)

SHAPES_FILE = "specpower_shapes.csv"
SHAPES_FILES = {"old": SHAPES_FILE, "modern": "specpower_modern_shapes.csv"}
SHARE_COLUMNS = tuple(f"share_{pct:03d}" for pct in range(0, 101, 10))
GRID_UTIL = np.linspace(0.0, 1.0, 11)
GRID_UTIL.flags.writeable = False
N_DECILES = 10

# Principal components kept for the shape Gaussian; the rest of the spread is isotropic. Chosen
# by leave-one-out on SPECpower curves (research for issue 14): 3 explain most of the spread,
# more chase individual servers.
DEFAULT_COMPONENTS = 3
# Kernel width of the local prior mean, in normalised-shape units over the compared points,
# and the weight of a difference in log watts at the highest observed point (servers of a
# similar size extrapolate alike). Chosen by leave-one-out on the prior servers only.
LOCAL_BANDWIDTH = 0.02
LOCAL_LOG_WATTS_WEIGHT = 0.002
# The regressions behind `conditional_shape` (how a curve fills a gap between two loads it
# showed, how it rises above the highest): their ridge penalties on standardised features, and
# their share against the kernel mean of similar servers. Chosen by cross-validation on the
# prior's servers, leaving out each processor model in turn (`bench.accuracy_cv`: at curve
# level, then on a week of telemetry); never on the scored servers.
# A measured curve may dip this share of its range between two loads and still teach a shape.
MAX_DIP_SHARE = 0.05
GAP_RIDGE = 3.0
RISE_RIDGE = 10.0
GAP_RIDGE_SHARE = 0.75
RISE_RIDGE_SHARE = 0.5
# A generation's own prior needs this many servers; below, the prior of every server is used.
MIN_GENERATION_SERVERS = 20
# A bank needs this many servers with cores and sockets known to learn the forest.
MIN_FACTS_SERVERS = 30
# Above a node's highest load, when its CPU model names a processor the bank holds servers of
# (`processor_model`), their rise counts for this share and the prior's (forest or ridge, with
# the line) for the rest. Chosen on the prior sides of the committed splits (each server with
# a near-twin there, the prior learned without its processor model; lowload, exact watts;
# the facts forest's leaves then at least 3 servers):
# old servers 3.91 / 9.32 % -> 3.24 / 6.49 % median / p90, modern 5.57 / 11.57 % ->
# 5.60 / 10.86 %; their rise alone (share 1) did worse on modern servers (p90 16.75 %): two
# chassis of one processor differ above half load (docs/results.md, "Near-twins").
SAME_PROCESSOR_SHARE = 0.5


def load_shapes_table(periods: tuple[str, ...] = ("old",)) -> pd.DataFrame:
    """The SPECpower curve shapes shipped with the package (one row per real server), of the
    given periods (`SHAPES_FILES`: `old`, servers of 2007-2016; `modern`, 2017-2025)."""
    tables = []
    for period in periods:
        if period not in SHAPES_FILES:
            raise ValueError(f"unknown period {period!r}; known: {', '.join(SHAPES_FILES)}")
        text = resources.files("training").joinpath("data", SHAPES_FILES[period]).read_text()
        tables.append(pd.read_csv(StringIO(text), comment="#"))
    return pd.concat(tables, ignore_index=True)


def table_generations(table: pd.DataFrame) -> list[str | None]:
    """Each row's generation: its `period` column (the shipped tables have one), else None."""
    if "period" not in table.columns:
        return [None] * len(table)
    return [p if p in GENERATIONS else None for p in table["period"]]


def normalised_shapes(curves_w: np.ndarray) -> np.ndarray:
    """[m, 11] watts -> [m, 11] shapes running from 0 at idle to 1 at full load."""
    curves_w = np.asarray(curves_w, dtype=np.float64)
    dynamic_w = curves_w[:, -1:] - curves_w[:, :1]
    return (curves_w - curves_w[:, :1]) / dynamic_w


@dataclass(frozen=True, eq=False)
class ShapePrior:
    """A population of server power curves, condensed for fitting one node against it."""

    mean_increments: np.ndarray  # [10] mean share of the dynamic range per decile (sums to 1)
    precision: np.ndarray  # [10, 10] inverse covariance of the increments
    bank_shapes: np.ndarray  # [m, 11] each server's normalised shape
    bank_watts: np.ndarray  # [m, 11] each server's curve in watts
    dynamic_from_idle: tuple[float, float]  # (a, b): log D = a + b log idle, least squares
    # each server's generation ("old", "modern" or None: unknown), for `for_generation`
    bank_generations: tuple[str | None, ...] = ()
    # each server's processor model (`training.node_facts.processor_model`; empty: unknown,
    # each server then its own): near-twins are left out together when the band is learned
    bank_groups: tuple[str, ...] = ()
    # [m, 2] each server's cores (all sockets) and sockets; NaN where unknown, None: no server's
    bank_hardware: np.ndarray | None = None
    # `_ShownShapeRegression`s learned so far, per pattern of shown grid points and top
    _regressions: dict = field(default_factory=dict, init=False, repr=False)
    _by_generation: dict = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_curves(
        cls,
        curves_w: np.ndarray,
        components: int = DEFAULT_COMPONENTS,
        generations: list[str | None] | None = None,
        groups: list[str] | None = None,
        hardware: np.ndarray | None = None,
    ) -> ShapePrior:
        """Learn the prior from servers' curves in watts at `GRID_UTIL` ([m, 11], m >= 3), and
        optionally each server's generation (`for_generation` then knows them), processor
        model (`groups`: left out together when the band above a node's highest load is
        learned) and hardware (`hardware`, [m, 2]: cores and sockets, NaN where unknown; a
        node whose facts tell its own is then extrapolated by `FactsRise`)."""
        curves_w = np.asarray(curves_w, dtype=np.float64)
        if curves_w.ndim != 2 or curves_w.shape[1] != len(GRID_UTIL) or len(curves_w) < 3:
            raise ValueError(
                f"a shape prior needs at least 3 curves of {len(GRID_UTIL)} points, "
                f"got an array of shape {curves_w.shape}"
            )
        dynamic_w = curves_w[:, -1] - curves_w[:, 0]
        dips_w = np.maximum.accumulate(curves_w, axis=1) - curves_w
        if (
            not (curves_w[:, 0] > 0).all()
            or not (dynamic_w > 0).all()
            or (dips_w.max(axis=1) > MAX_DIP_SHARE * dynamic_w).any()
        ):
            raise ValueError(
                "every curve of a shape prior must be positive and non-decreasing (dips of "
                f"up to {MAX_DIP_SHARE:.0%} of its range are evened out)"
            )
        # A measured curve may dip a watt between two loads (one Arm server of the modern
        # sample does): a shape is non-decreasing, so the dip is evened out.
        curves_w = np.maximum.accumulate(curves_w, axis=1)
        shapes = normalised_shapes(curves_w)
        increments = np.diff(shapes, axis=1)
        mean = increments.mean(axis=0)
        spread = increments - mean
        covariance = spread.T @ spread / max(1, len(increments) - 1)
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
        # Increments sum to 1, so the covariance has rank 9 at most: the rest of the spread
        # is the mean of eigenvalues components..8, spread evenly over all directions.
        kept = min(components, N_DECILES - 2)
        rest = float(np.mean(np.maximum(eigenvalues[kept : N_DECILES - 1], 1e-12)))
        model_covariance = (eigenvectors[:, :kept] * eigenvalues[:kept]) @ eigenvectors[
            :, :kept
        ].T + rest * np.eye(N_DECILES)
        log_idle = np.log(curves_w[:, 0])
        log_dynamic = np.log(curves_w[:, -1] - curves_w[:, 0])
        slope, intercept = np.polyfit(log_idle, log_dynamic, 1)
        return cls(
            mean_increments=mean / mean.sum(),
            precision=np.linalg.inv(model_covariance),
            bank_shapes=shapes,
            bank_watts=curves_w,
            dynamic_from_idle=(float(intercept), float(slope)),
            bank_generations=tuple(generations or [None] * len(curves_w)),
            bank_groups=tuple(str(g) for g in groups) if groups is not None else (),
            bank_hardware=checked_hardware(hardware, len(curves_w)),
        )

    @classmethod
    def from_shapes_table(
        cls, table: pd.DataFrame, components: int = DEFAULT_COMPONENTS
    ) -> ShapePrior:
        """Learn the prior from rows of the shipped table's format (`watts_max`, `share_*`)."""
        missing = [c for c in ("watts_max", *SHARE_COLUMNS) if c not in table.columns]
        if missing:
            raise ValueError(f"shape table lacks the columns {', '.join(missing)}")
        curves_w = (
            table[list(SHARE_COLUMNS)].to_numpy(np.float64)
            * table["watts_max"].to_numpy(np.float64)[:, None]
        )
        groups = [processor_model(p) for p in table["processor"]] if "processor" in table else None
        hardware = (
            table[["cores", "chips"]].to_numpy(np.float64)
            if {"cores", "chips"} <= set(table.columns)
            else None
        )
        return cls.from_curves(curves_w, components, table_generations(table), groups, hardware)

    def for_generation(self, generation: str | None) -> ShapePrior:
        """The prior of this generation's servers only (`old` or `modern`), when it has at
        least `MIN_GENERATION_SERVERS` of them; otherwise (or for None) this prior itself.

        Curves of 2017 on idle lower and climb steeper at the top than those of 2007-2016, so
        a node known to be of one generation is best drawn from its own."""
        if generation is None:
            return self
        if generation not in self._by_generation:
            mine = np.array([g == generation for g in self.bank_generations], dtype=bool)
            self._by_generation[generation] = (
                ShapePrior.from_curves(
                    self.bank_watts[mine],
                    generations=[generation] * int(mine.sum()),
                    groups=list(self.groups[mine]),
                    hardware=None if self.bank_hardware is None else self.bank_hardware[mine],
                )
                if mine.sum() >= MIN_GENERATION_SERVERS and mine.sum() < self.n_servers
                else self
            )
        return self._by_generation[generation]

    @property
    def n_servers(self) -> int:
        return len(self.bank_shapes)

    @property
    def groups(self) -> np.ndarray:
        """[m] each server's processor model, or its index where none was given."""
        if len(self.bank_groups) == self.n_servers:
            return np.array(self.bank_groups, dtype=object)
        return np.array([f"#{i}" for i in range(self.n_servers)], dtype=object)

    def mean_shape(self) -> np.ndarray:
        """The mean normalised shape at `GRID_UTIL`: 0 at idle, 1 at full load."""
        return np.concatenate([[0.0], np.cumsum(self.mean_increments)])

    def shape_precision(self, mean_increments: np.ndarray) -> np.ndarray:
        """Penalty matrix on normalised increments v around `mean_increments`, scale left free.

        `Q - Q m m' Q / (m' Q m)`: the Gaussian's precision with the direction of the mean
        projected out, so `v' Qs v` is the same for v and any multiple of it. Applied to a
        node's increments divided by its dynamic range, it judges only the shape.
        """
        q = self.precision
        qm = q @ mean_increments
        shape_q = q - np.outer(qm, qm) / float(mean_increments @ qm)
        return 0.5 * (shape_q + shape_q.T)

    def local_mean_increments(
        self, curve_w: np.ndarray, top: int, observed: np.ndarray
    ) -> np.ndarray:
        """Mean increments of the servers whose shape up to grid point `top` looks like this one.

        `curve_w` is the node's fitted steady-state curve at grid points 0..top (watts),
        `observed` marks the grid points its data showed. Both the node's curve and each
        server's are normalised by their rise from idle to point `top`, compared at the observed
        points between, and weighted by a Gaussian kernel (plus a little weight on how alike
        their watts at `top` are). Above `top` the result is what such servers did next.
        """
        if top < 2:
            return self.mean_increments
        increments = self._kernel_weights(curve_w, top, observed) @ np.diff(
            self.bank_shapes, axis=1
        )
        return increments / increments.sum()

    def _kernel_weights(
        self,
        curve_w: np.ndarray,
        top: int,
        observed: np.ndarray,
        among: np.ndarray | None = None,
    ) -> np.ndarray:
        """[m] how much each server looks like the node up to `top` (see local_mean_increments);
        `among` ([m] bool): only those servers (the result then has one weight per one of them)."""
        node = (curve_w[: top + 1] - curve_w[0]) / max(curve_w[top] - curve_w[0], 1e-6)
        bank_watts = self.bank_watts if among is None else self.bank_watts[among]
        bank = (self.bank_shapes if among is None else self.bank_shapes[among])[:, : top + 1]
        bank = (bank - bank[:, :1]) / (bank[:, top : top + 1] - bank[:, :1])
        inner = [j for j in range(1, top) if observed[j]] or list(range(1, top))
        # mean squared distance scaled to ~4 compared points, so the bandwidth means the same
        # whatever the number of points a node has shown
        distance2 = ((bank[:, inner] - node[inner]) ** 2).sum(axis=1) / len(inner) * 4
        distance2 += (
            LOCAL_LOG_WATTS_WEIGHT
            * (np.log(bank_watts[:, top]) - np.log(max(curve_w[top], 1e-3))) ** 2
        )
        weights = np.exp(-0.5 * (distance2 - distance2.min()) / LOCAL_BANDWIDTH**2)
        return weights / weights.sum()

    def conditional_shape(
        self,
        curve_w: np.ndarray,
        top: int,
        observed: np.ndarray,
        facts: NodeFacts | None = None,
    ) -> np.ndarray:
        """Mean increments of a shape through the node's own curve where its data are.

        `curve_w`, `top` and `observed` as for `local_mean_increments`. The shape follows the
        node's curve at the grid points it showed (and at 0 and `top`); a gap between two of
        them is shared out, and the rise above `top` drawn, as a ridge regression on the node's
        shown shape predicts (`_ShownShapeRegression`, learned on the prior's servers for this
        pattern of shown points), mixed with what the servers that look like it did
        (`local_mean_increments`' kernel): `GAP_RIDGE_SHARE` and `RISE_RIDGE_SHARE` of the
        regression. So the node's own shape where it has data (its steps between shown points
        and their differences, its watts, its idle share) informs the deciles it never
        showed, not only which servers it resembles. When `facts` tell the node's cores and
        sockets, the rise above `top` is the facts forest's instead (`FactsRise`); when its
        CPU model names a processor the bank holds, that rise is half theirs (`_rise`).
        """
        curve_w = np.asarray(curve_w, dtype=np.float64)[: top + 1]
        if top < 2:
            return self.mean_increments
        anchors = tuple(sorted({0, top} | {j for j in range(1, top) if observed[j]}))
        regression = self._shown_shape_regression(anchors, top)
        gap_shares, _ = regression.predict(curve_w)
        weights = self._kernel_weights(curve_w, top, observed)
        shape = np.zeros(len(GRID_UTIL))
        shape[: top + 1] = np.maximum.accumulate(
            (curve_w - curve_w[0]) / max(curve_w[top] - curve_w[0], 1e-6)
        )
        if regression.gap_points:
            shares = GAP_RIDGE_SHARE * gap_shares + (1 - GAP_RIDGE_SHARE) * (
                weights @ regression.bank_gap_shares
            )
            for j, share in zip(regression.gap_points, np.clip(shares, 0.0, 1.0), strict=True):
                below, above = regression.gap_ends[j]
                shape[j] = shape[below] + share * (shape[above] - shape[below])
            shape[: top + 1] = np.maximum.accumulate(shape[: top + 1])
        if top < N_DECILES:
            rise, _ = self._rise(curve_w, top, observed, facts, weights)
            shape[top + 1 :] = shape[top] + rise
        increments = np.maximum(np.diff(shape), 1e-4)
        return increments / increments.sum()

    def rise_interval(
        self,
        curve_w: np.ndarray,
        top: int,
        observed: np.ndarray,
        facts: NodeFacts | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """How sure the prior is above grid point `top`: ([10 - top] the rise it predicts at
        each grid point above, and the `INTERVAL_QUANTILES` band around it), each per unit of
        the node's rise from idle to `top` (so watts = P(top) + r * (P(top) - P(0))).

        The band is how the prior's own servers came out against what it predicted for each
        of them from their points up to `top`, learned without it (`RiseCalibration`): their
        ratios of actual to predicted rise, quantiles taken, applied to this node's
        prediction. `facts` as for `conditional_shape`."""
        curve_w = np.asarray(curve_w, dtype=np.float64)[: top + 1]
        if top >= N_DECILES or top < 2:
            empty = np.zeros(0)
            return empty, empty, empty
        rise, calibration = self._rise(curve_w, top, observed, facts)
        return rise, rise * calibration.low_ratio, rise * calibration.high_ratio

    def _rise(
        self,
        curve_w: np.ndarray,
        top: int,
        observed: np.ndarray,
        facts: NodeFacts | None,
        kernel_weights: np.ndarray | None = None,
    ) -> tuple[np.ndarray, RiseCalibration]:
        """The rise above `top` per unit of the rise to it (non-decreasing), and the
        calibration whose band goes around it. The prior's own rise is the facts forest's when
        the node's cores and sockets are known and the bank has enough servers with theirs,
        else the ridge regression mixed with the kernel mean of similar servers
        (`kernel_weights`, when the caller has them already); the calibration combines it with
        the line; then the bank's servers of the node's own processor model, where it holds
        any, count for `SAME_PROCESSOR_SHARE`."""
        hardware = node_hardware(facts)
        forest = self._facts_rise(top) if hardware is not None else None
        if forest is not None:
            generation = facts.generation if facts is not None else None
            prior_rise = forest.predict(curve_w, hardware, generation)
            calibration = forest.calibration
        else:
            anchors = tuple(sorted({0, top} | {j for j in range(1, top) if observed[j]}))
            regression = self._shown_shape_regression(anchors, top)
            _, regressed = regression.predict(curve_w)
            if kernel_weights is None:
                kernel_weights = self._kernel_weights(curve_w, top, observed)
            prior_rise = _prior_rise(regressed, kernel_weights @ regression.bank_rise)
            calibration = self._rise_calibration(anchors, top, observed)
        rise = calibration.rise(prior_rise, top)
        same = self.same_processor(facts)
        if same is not None:
            same_rise = np.maximum(rise_above(self.bank_watts[same], top), 0.0).mean(axis=0)
            rise = np.maximum.accumulate(
                (1 - SAME_PROCESSOR_SHARE) * rise + SAME_PROCESSOR_SHARE * same_rise
            )
        return rise, calibration

    def same_processor(self, facts: NodeFacts | None) -> np.ndarray | None:
        """[m] bool: the bank's servers of the processor model the node's CPU model names
        (`processor_model`: `Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz` and SPECpower's `Intel
        Xeon Gold 6338` are one), or None when the facts name none, the bank does not know its
        servers' processors, or holds no server of this one."""
        if facts is None or not facts.cpu_model or len(self.bank_groups) != self.n_servers:
            return None
        same = self.groups == processor_model(facts.cpu_model)
        return same if same.any() else None

    def _facts_rise(self, top: int) -> FactsRise | None:
        """The facts forest above grid point `top` (learned once: it reads the node's curve at
        every grid point up to `top`, shown or filled by pass 2, so one per `top` serves every
        pattern of shown points), or None when the bank has fewer than `MIN_FACTS_SERVERS`
        servers with cores and sockets."""
        key = ("facts", top)
        if key not in self._regressions:
            known = (
                np.zeros(self.n_servers, dtype=bool)
                if self.bank_hardware is None
                else np.isfinite(self.bank_hardware).all(axis=1)
            )
            self._regressions[key] = (
                FactsRise.learn(
                    self.bank_watts[known],
                    self.bank_hardware[known],
                    [self.bank_generations[i] for i in np.flatnonzero(known)],
                    self.groups[known],
                    top,
                )
                if known.sum() >= MIN_FACTS_SERVERS
                else None
            )
        return self._regressions[key]

    def _rise_calibration(
        self, anchors: tuple[int, ...], top: int, observed: np.ndarray
    ) -> RiseCalibration:
        """How well the prior and the straight line each predicted the rise above `top` of the
        prior's own servers, each learned without the server's processor model (`bank_groups`:
        near-twins never vouch for each other; the regression left out by its hat matrix, the
        kernel without them): the line's weight and the band."""
        key = ("calibration", anchors, top)
        if key not in self._regressions:
            regression = self._shown_shape_regression(anchors, top)
            groups = self.groups
            left_out_log_rise = regression.left_out_log_rise(groups)
            prior_rise = np.empty_like(regression.bank_rise)
            for i in range(self.n_servers):
                others = groups != groups[i]
                weights = self._kernel_weights(self.bank_watts[i], top, observed, others)
                prior_rise[i] = _prior_rise(
                    np.exp(left_out_log_rise[i]), weights @ regression.bank_rise[others]
                )
            self._regressions[key] = RiseCalibration.learn(
                prior_rise, np.maximum(regression.bank_rise, 1e-4), top
            )
        return self._regressions[key]

    def _shown_shape_regression(self, anchors: tuple[int, ...], top: int) -> _ShownShapeRegression:
        key = (anchors, top)
        regression = self._regressions.get(key)
        if regression is None:
            regression = _ShownShapeRegression.learn(self.bank_watts, anchors, top)
            self._regressions[key] = regression
        return regression

    def dynamic_w_from_idle(self, idle_w: float) -> float:
        """The typical dynamic range `P(1) - P(0)` of a server idling at `idle_w` watts."""
        intercept, slope = self.dynamic_from_idle
        return float(np.exp(intercept + slope * np.log(max(idle_w, 1.0))))


@dataclass(frozen=True, eq=False)
class _ShownShapeRegression:
    """Ridge regressions, across the prior's servers, from a curve's shape at the grid points a
    node showed (`anchors`, 0..`top`) to what it did between and above them.

    Features: the shape's steps between shown points (normalised by the rise from idle to
    `top`), their differences (curvature), log watts at `top`, and idle over watts at `top`.
    Targets: at each grid point in a gap, the share of the gap's rise reached there; above
    `top`, the rise per unit of the rise from idle to `top` (regressed in log, so positive).
    """

    anchors: tuple[int, ...]
    top: int
    gap_points: tuple[int, ...]
    gap_ends: dict[int, tuple[int, int]]
    mean_x: np.ndarray
    scale_x: np.ndarray
    gap: tuple[np.ndarray, np.ndarray]  # (intercept, coefficients)
    rise: tuple[np.ndarray, np.ndarray]
    bank_gap_shares: np.ndarray  # [m, gaps] each server's shares, for the kernel mean
    bank_rise: np.ndarray  # [m, 10 - top]
    bank_x: np.ndarray  # [m, features] standardised, for the left-out predictions

    def left_out_log_rise(self, groups: np.ndarray) -> np.ndarray:
        """[m, 10 - top] each server's log rise as the rise regression predicts it learned
        without the servers of its group (`groups`: one label per server, its processor
        model, so near-twins leave together). Exact for ridge with the hat matrix H: a group
        g's left-out residuals are (I - H_gg)^-1 times its residuals (the intercept's share
        taken as 1/m)."""
        xs = self.bank_x
        m = len(xs)
        lhs = xs.T @ xs + RISE_RIDGE * np.eye(xs.shape[1])
        hat = xs @ np.linalg.solve(lhs, xs.T) + 1.0 / m
        fitted = self.rise[0] + xs @ self.rise[1]
        actual = np.log(np.maximum(self.bank_rise, 1e-4))
        residual = actual - fitted
        left_out = np.empty_like(residual)
        for group in np.unique(groups):
            rows = np.flatnonzero(groups == group)
            block = np.eye(len(rows)) - hat[np.ix_(rows, rows)]
            left_out[rows] = np.linalg.lstsq(block, residual[rows], rcond=None)[0]
        return actual - left_out

    @staticmethod
    def features(curves_w: np.ndarray, anchors: tuple[int, ...], top: int) -> np.ndarray:
        rise = np.maximum(curves_w[:, top] - curves_w[:, 0], 1e-9)
        steps = np.diff((curves_w[:, list(anchors)] - curves_w[:, :1]) / rise[:, None], axis=1)
        top_w = np.maximum(curves_w[:, top], 1e-3)
        return np.column_stack(
            [steps, np.diff(steps, axis=1), np.log(top_w), curves_w[:, 0] / top_w]
        )

    @classmethod
    def learn(cls, bank_w: np.ndarray, anchors: tuple[int, ...], top: int) -> _ShownShapeRegression:
        gap_points = tuple(j for j in range(1, top) if j not in anchors)
        gap_ends = {
            j: (max(k for k in anchors if k < j), min(k for k in anchors if k > j))
            for j in gap_points
        }
        shares = np.zeros((len(bank_w), len(gap_points)))
        for column, j in enumerate(gap_points):
            below, above = gap_ends[j]
            shares[:, column] = (bank_w[:, j] - bank_w[:, below]) / np.maximum(
                bank_w[:, above] - bank_w[:, below], 1e-9
            )
        rise = rise_above(bank_w, top)
        x = cls.features(bank_w, anchors, top)
        mean_x, scale_x = x.mean(axis=0), x.std(axis=0) + 1e-9
        xs = (x - mean_x) / scale_x

        def ridge(y: np.ndarray, penalty: float) -> tuple[np.ndarray, np.ndarray]:
            mean_y = y.mean(axis=0)
            lhs = xs.T @ xs + penalty * np.eye(xs.shape[1])
            return mean_y, np.linalg.solve(lhs, xs.T @ (y - mean_y))

        return cls(
            anchors=anchors,
            top=top,
            gap_points=gap_points,
            gap_ends=gap_ends,
            mean_x=mean_x,
            scale_x=scale_x,
            gap=ridge(shares, GAP_RIDGE),
            rise=ridge(np.log(np.maximum(rise, 1e-4)), RISE_RIDGE),
            bank_gap_shares=shares,
            bank_rise=rise,
            bank_x=xs,
        )

    def predict(self, curve_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One node's curve at 0..top (watts) -> (gap shares, rise above top per unit rise)."""
        x = (self.features(curve_w[None, :], self.anchors, self.top)[0] - self.mean_x) / (
            self.scale_x
        )
        return self.gap[0] + x @ self.gap[1], np.exp(self.rise[0] + x @ self.rise[1])


def _prior_rise(regressed: np.ndarray, kernel_mean: np.ndarray) -> np.ndarray:
    """The prior's own rise above `top`: the regression mixed with the kernel mean of similar
    servers (`RISE_RIDGE_SHARE`)."""
    return np.maximum(RISE_RIDGE_SHARE * regressed + (1 - RISE_RIDGE_SHARE) * kernel_mean, 1e-4)


@functools.cache
def default_shape_prior() -> ShapePrior:
    """The prior learned from every server shipped in `training/data/` (both periods: 242
    servers); `for_generation` narrows it to a node's generation when its facts tell it."""
    return ShapePrior.from_shapes_table(load_shapes_table(tuple(SHAPES_FILES)))


DERIVE_CORE_SCALING = (
    "python -m training.shape_prior core-scaling > predictor/data/core_scaling.json"
)


@dataclass(frozen=True)
class CoreFit:
    """Power laws in the CPU count across servers: idle ~ cores^b_idle, range ~ cores^b_dyn."""

    idle_exponent: float  # least-squares slope of log idle_w on log cores
    dynamic_exponent: float  # same for log (full_w - idle_w)
    idle_log_correlation: float  # how much of idle power the core count explains (weakly)
    dynamic_log_correlation: float
    servers: int
    median_cores: float


def fit_core_exponents(cores: np.ndarray, idle_w: np.ndarray, full_w: np.ndarray) -> CoreFit:
    """Fit both exponents by least squares in log-log space over servers (at least 3)."""
    cores = np.asarray(cores, dtype=np.float64)
    idle_w = np.asarray(idle_w, dtype=np.float64)
    full_w = np.asarray(full_w, dtype=np.float64)
    if not (cores.shape == idle_w.shape == full_w.shape) or cores.ndim != 1 or len(cores) < 3:
        raise ValueError(
            f"core exponents need at least 3 servers with cores, idle and full-load watts, got "
            f"arrays of shapes {cores.shape}, {idle_w.shape}, {full_w.shape}"
        )
    if not ((cores > 0).all() and (idle_w > 0).all() and (full_w > idle_w).all()):
        raise ValueError("every server needs cores > 0, idle watts > 0 and full load > idle")
    log_cores = np.log(cores)
    log_idle = np.log(idle_w)
    log_dynamic = np.log(full_w - idle_w)
    return CoreFit(
        idle_exponent=float(np.polyfit(log_cores, log_idle, 1)[0]),
        dynamic_exponent=float(np.polyfit(log_cores, log_dynamic, 1)[0]),
        idle_log_correlation=float(np.corrcoef(log_cores, log_idle)[0, 1]),
        dynamic_log_correlation=float(np.corrcoef(log_cores, log_dynamic)[0, 1]),
        servers=len(cores),
        median_cores=float(np.median(cores)),
    )


def core_exponents_from_table(table: pd.DataFrame) -> CoreFit:
    """The fit on rows of the shipped table's format (`cores`, `watts_idle`, `watts_max`)."""
    missing = [c for c in ("cores", "watts_idle", "watts_max") if c not in table.columns]
    if missing:
        raise ValueError(f"shape table lacks the columns {', '.join(missing)}")
    return fit_core_exponents(
        table["cores"].to_numpy(np.float64),
        table["watts_idle"].to_numpy(np.float64),
        table["watts_max"].to_numpy(np.float64),
    )


def core_scaling_document(fit: CoreFit) -> dict[str, object]:
    """What `predictor/data/core_scaling.json` holds: the exponents and where they came from."""
    return {
        "about": (
            "How a server's idle power and dynamic range (full load - idle) grow with its CPU "
            "count, as power laws fitted in log-log space over SPECpower_ssj2008 servers. The "
            "extender scales the bundle's fleet fallback curve by a node's allocatable CPU "
            "with them (predictor.core_scaling)."
        ),
        "source": f"training/data/{SHAPES_FILE} ({fit.servers} SPECpower_ssj2008 servers)",
        "derived_by": DERIVE_CORE_SCALING,
        "servers": fit.servers,
        "median_cores": fit.median_cores,
        "idle_exponent": round(fit.idle_exponent, 6),
        "dynamic_exponent": round(fit.dynamic_exponent, 6),
        "idle_log_correlation": round(fit.idle_log_correlation, 4),
        "dynamic_log_correlation": round(fit.dynamic_log_correlation, 4),
    }


def main(argv: list[str]) -> int:
    if argv != ["core-scaling"]:
        print(f"usage: {DERIVE_CORE_SCALING}", file=sys.stderr)
        return 2
    document = core_scaling_document(core_exponents_from_table(load_shapes_table()))
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
