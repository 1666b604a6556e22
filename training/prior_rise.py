"""Above a node's highest load: the rise a shape prior predicts, and how far to trust it.

`training.shape_prior` predicts a node's curve above the highest load it showed as a rise per
unit of its rise from idle to that load. This module holds what that prediction is made of
besides the prior's ridge regressions and kernel:

- `FactsRise`: extra trees, across the prior's servers, from a curve's shape and what the
  cluster tells of its hardware (cores, sockets, generation) to its rise above the top;
  `FlatForest` predicts with their trees flattened into numpy arrays (scikit-learn's answers,
  about 25 times faster for one row);
- `RiseCalibration`: how much of the straight line through idle and the top to mix in, and the
  band (`INTERVAL_QUANTILES`) the rise falls in, both learned from the prior's own servers
  predicted without their processor model;
- `rise_above`, `line_rise`: the rise of a tabulated curve and of the line, per unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import ExtraTreesRegressor
from sklearn.model_selection import GroupKFold

from training.node_facts import NodeFacts

# The interval given above the highest load: these quantiles of how the prior's servers' own
# rises came out against what the prior (learned without each of them) predicted for them.
INTERVAL_QUANTILES = (0.1, 0.9)
# Above a node's highest load, when the cluster tells its cores and sockets (`NodeFacts`): a
# forest of extra trees from its shown shape and its hardware to its rise (`FactsRise`), in
# place of the ridge regression and kernel. From SPECpower's exact watts at 0-50 %, judged by
# processor model, the prior then predicts 60-100 % at 3.63 / 8.48 % (old servers) and
# 5.03 / 11.63 % (modern) median / p90, against 4.44 / 10.72 % and 6.21 / 12.51 % told the CPU
# model only (`python -m bench.accuracy_priors`). scikit-learn's defaults but the leaf size,
# chosen by cross-validation on the prior side only (`bench.accuracy_cv`, lowload, tight:
# leaves of 1 / 3 / 5 / 10 servers gave old 3.28 / 3.76 / 3.93 / 4.50 %, modern 5.92 / 6.17 /
# 6.25 / 6.32 % median). Its left-out predictions (processor models split over
# `FACTS_FOREST_FOLDS` folds) calibrate it against the line and give the band.
FACTS_FOREST_TREES = 100
FACTS_FOREST_MIN_LEAF = 1
FACTS_FOREST_FOLDS = 5
_GENERATION_CODE = {"old": 0.0, "modern": 1.0}  # unknown: 0.5, between them


def checked_hardware(hardware: np.ndarray | None, n_servers: int) -> np.ndarray | None:
    """[m, 2] cores and sockets as floats (NaN: unknown), or None; a clear error otherwise."""
    if hardware is None:
        return None
    hardware = np.asarray(hardware, dtype=np.float64)
    if hardware.shape != (n_servers, 2):
        raise ValueError(
            f"hardware must give cores and sockets for each of the {n_servers} curves, got an "
            f"array of shape {hardware.shape}"
        )
    known = np.isfinite(hardware).all(axis=1)
    cores, sockets = hardware[known, 0], hardware[known, 1]
    if not ((sockets >= 1).all() and (cores >= sockets).all()):
        raise ValueError("every server's hardware needs sockets >= 1 and cores >= sockets")
    return hardware


def node_hardware(facts: NodeFacts | None) -> np.ndarray | None:
    """[2] the node's cores and sockets when its facts tell both (plausibly), else None."""
    if facts is None or facts.cpu_cores is None or facts.cpu_sockets is None:
        return None
    cores, sockets = float(facts.cpu_cores), float(facts.cpu_sockets)
    if not (np.isfinite(cores) and np.isfinite(sockets) and 1 <= sockets <= cores):
        return None
    return np.array([cores, sockets])


@dataclass(frozen=True, eq=False)
class FactsRise:
    """Extra trees, across the prior's servers, from a curve's shape up to grid point `top` and
    what the cluster tells of its hardware to its rise above `top`.

    Features: the shape at every grid point between idle and `top` (rise from idle as a share
    of the rise to `top`; a node's from its pass-2 curve, so also where it showed no load),
    idle over watts at `top`, the generation (0 old, 1 modern, 0.5
    unknown), log cores per socket, sockets, and log watts per core at `top`. Target: the rise
    above `top` per unit of the rise from idle to `top`, as `_ShownShapeRegression.bank_rise`.
    Turbo makes the top of a curve depend on how many cores share a socket's power and how much
    each draws, which a half curve's shape alone does not show; trees find those interactions
    where a ridge regression in them did not (`bench.accuracy_priors`: the shipped prior with
    and without cores and sockets).
    """

    top: int
    model: FlatForest
    calibration: RiseCalibration

    @staticmethod
    def features(
        curves_w: np.ndarray,
        hardware: np.ndarray,
        generations: list[str | None],
        top: int,
    ) -> np.ndarray:
        curves_w, hardware = np.atleast_2d(curves_w), np.atleast_2d(hardware)
        top_w = np.maximum(curves_w[:, top], 1e-3)
        rise_w = np.maximum(curves_w[:, top] - curves_w[:, 0], 1e-9)
        inner = list(range(1, top))
        cores, sockets = hardware[:, 0], hardware[:, 1]
        return np.column_stack(
            [
                (curves_w[:, inner] - curves_w[:, :1]) / rise_w[:, None],
                curves_w[:, 0] / top_w,
                [_GENERATION_CODE.get(g, 0.5) for g in generations],  # type: ignore[arg-type]
                np.log(cores / sockets),
                sockets,
                np.log(top_w / cores),
            ]
        )

    @classmethod
    def learn(
        cls,
        bank_w: np.ndarray,
        hardware: np.ndarray,
        generations: list[str | None],
        groups: np.ndarray,
        top: int,
    ) -> FactsRise:
        """Learn the forest on the bank, and its calibration against the line from each
        server's prediction by a forest learned without its processor model (the models split
        over `FACTS_FOREST_FOLDS` folds, so near-twins never vouch for each other)."""
        x = cls.features(bank_w, hardware, generations, top)
        rise = np.maximum(rise_above(bank_w, top), 1e-4)
        left_out = np.empty_like(rise)
        folds = min(FACTS_FOREST_FOLDS, len(np.unique(groups)))
        for train, held in GroupKFold(n_splits=folds).split(x, rise, groups):
            left_out[held] = (
                extra_trees(x[train], rise[train]).predict(x[held]).reshape(len(held), -1)
            )
        return cls(
            top=top,
            model=FlatForest.of(extra_trees(x, rise)),
            calibration=RiseCalibration.learn(np.maximum(left_out, 1e-4), rise, top),
        )

    def predict(
        self, curve_w: np.ndarray, hardware: np.ndarray, generation: str | None
    ) -> np.ndarray:
        """One node's curve at 0..top (watts) and hardware -> its rise above top per unit."""
        x = self.features(curve_w[: self.top + 1], hardware, [generation], self.top)
        return np.maximum(self.model.predict(x).reshape(-1), 1e-4)


def extra_trees(x: np.ndarray, rise: np.ndarray) -> ExtraTreesRegressor:
    """Extra trees learned on `x` -> `rise` ([m, points above top]; one point above: learned
    as one target, so it predicts [n], which callers reshape)."""
    forest = ExtraTreesRegressor(
        n_estimators=FACTS_FOREST_TREES, min_samples_leaf=FACTS_FOREST_MIN_LEAF, random_state=0
    )
    return forest.fit(x, rise.ravel() if rise.shape[1] == 1 else rise)


@dataclass(frozen=True, eq=False)
class FlatForest:
    """A fitted forest's trees as flat arrays, descended all at once.

    A fit asks the facts forest for one node at a time, twice per node that extrapolates;
    scikit-learn's `predict` walks its trees one by one through joblib, about 5 ms for 100
    trees and one row, which made it the largest cost of fitting a fleet
    (`bench.training_scale`). Here every tree takes one step per pass, as numpy operations over
    [rows, trees], so one row costs a few dozen array operations. It predicts what
    `forest.predict` does: the same float32 features against the same thresholds, the mean of
    the trees' leaves.
    """

    left: np.ndarray  # [all nodes] the left child's index, -1 at a leaf
    right: np.ndarray  # [all nodes] the right child's index
    feature: np.ndarray  # [all nodes] the feature a split compares (0 at a leaf)
    threshold: np.ndarray  # [all nodes] go left when the feature is <= this
    value: np.ndarray  # [all nodes, outputs] a leaf's mean target
    roots: np.ndarray  # [trees] each tree's first node
    depth: int  # the deepest tree's depth: steps until every row is at a leaf

    @classmethod
    def of(cls, forest: ExtraTreesRegressor) -> FlatForest:
        trees = [estimator.tree_ for estimator in forest.estimators_]
        offsets = np.cumsum([0] + [t.node_count for t in trees[:-1]])

        def children(side: str) -> np.ndarray:
            return np.concatenate(
                [
                    np.where(getattr(t, side) < 0, -1, getattr(t, side) + offset)
                    for t, offset in zip(trees, offsets, strict=True)
                ]
            )

        return cls(
            left=children("children_left"),
            right=children("children_right"),
            feature=np.concatenate([np.maximum(t.feature, 0) for t in trees]),
            threshold=np.concatenate([t.threshold for t in trees]),
            value=np.concatenate([t.value[:, :, 0] for t in trees]),
            roots=offsets.astype(np.int64),
            depth=max(t.max_depth for t in trees),
        )

    def predict(self, x: np.ndarray) -> np.ndarray:
        """[n, features] -> [n, outputs]."""
        # scikit-learn compares float32 features with float64 thresholds
        x = np.atleast_2d(np.asarray(x, dtype=np.float32)).astype(np.float64)
        node = np.repeat(self.roots[None, :], len(x), axis=0)  # [n, trees]
        rows = np.arange(len(x))[:, None]
        for _ in range(self.depth):
            left = self.left[node]
            go_left = x[rows, self.feature[node]] <= self.threshold[node]
            node = np.where(left < 0, node, np.where(go_left, left, self.right[node]))
        return self.value[node].mean(axis=1)


def rise_above(curves_w: np.ndarray, top: int) -> np.ndarray:
    """[m, 10 - top] each curve's rise above grid point `top`, per unit of its rise from idle
    to `top` (what the regressions and the forest learn to predict)."""
    return (curves_w[:, top + 1 :] - curves_w[:, top : top + 1]) / np.maximum(
        curves_w[:, top : top + 1] - curves_w[:, :1], 1e-9
    )


def line_rise(top: int, points_above: int) -> np.ndarray:
    """The straight line through idle and grid point `top`, extended: its rise at each of the
    `points_above` grid points above `top`, per unit of the rise from idle to `top`."""
    return np.arange(1, points_above + 1) / top


@dataclass(frozen=True)
class RiseCalibration:
    """Above grid point `top`: how much of the straight line to take and how wide the band is.

    The rise is the prior's and the line's combined in log by inverse mean squared error, each
    measured on the prior's own servers left out one at a time: where the prior tells the rise
    well the line counts for little, where it cannot tell (its error as large as the line's)
    the two count alike, so the result is rarely worse than the line. The band holds the
    `INTERVAL_QUANTILES` of the combined prediction's ratios, actual to predicted.
    """

    line_weight: np.ndarray  # [10 - top] share of the line's log rise
    low_ratio: np.ndarray  # [10 - top] actual / predicted, lower quantile (<= 1)
    high_ratio: np.ndarray  # upper quantile (>= 1)

    @classmethod
    def learn(cls, prior_rise: np.ndarray, actual_rise: np.ndarray, top: int) -> RiseCalibration:
        line = line_rise(top, actual_rise.shape[1])
        prior_error2 = np.mean(np.log(actual_rise / prior_rise) ** 2, axis=0)
        line_error2 = np.mean(np.log(actual_rise / line) ** 2, axis=0)
        line_weight = prior_error2 / np.maximum(prior_error2 + line_error2, 1e-12)
        combined = np.maximum.accumulate(
            np.exp((1 - line_weight) * np.log(prior_rise) + line_weight * np.log(line)), axis=1
        )
        low, high = np.quantile(actual_rise / combined, INTERVAL_QUANTILES, axis=0)
        return cls(line_weight, np.minimum(low, 1.0), np.maximum(high, 1.0))

    def rise(self, prior_rise: np.ndarray, top: int) -> np.ndarray:
        """One node's rise above `top` (non-decreasing), from the prior's own (its ridge and
        kernel's, or the facts forest's)."""
        log_rise = (1 - self.line_weight) * np.log(prior_rise) + self.line_weight * np.log(
            line_rise(top, prior_rise.shape[-1])
        )
        return np.maximum.accumulate(np.exp(log_rise))
