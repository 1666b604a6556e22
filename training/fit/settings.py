"""The settings of a training run: every choice `training.fit` makes, and its error type.

The command line sets the first few (`FitSettings`); the rest are tuned here, each with the
reason for its value. `FEATURE_FILL` is what the bundle's manifest says about a missing feature.
"""

from __future__ import annotations

from dataclasses import dataclass

from livedata.metrics_table import CPU1_TEMP_C, CPU2_TEMP_C
from training.families import DEFAULT_FAMILIES, LAST_RESORT_FAMILIES
from training.shape_prior import ShapePrior

# A one-socket node's empty CPU2 temperature takes CPU1's, in training as in the predictor
# (the manifest's `feature_fill`).
FEATURE_FILL: dict[str, str] = {CPU2_TEMP_C: CPU1_TEMP_C}
DEFAULT_TEST_FRACTION = 0.2
# ~8 h at 60 s: below this a node has rarely seen enough of its utilisation range for a curve
# of its own; the fleet fallback is the safer guess.
DEFAULT_MIN_ROWS = 500
# Predicted power may fall this much along utilisation before a model counts as decreasing:
# float32 rounding, never a real dip.
DEFAULT_MONOTONIC_TOLERANCE_W = 0.05
FLEXIBLE_MARGIN = 0.10  # a flexible family must cut held-out MAE by 10 % to beat a smooth one
# Trees cost time linear in rows and have only a few hundred leaves to place: beyond several
# thousand rows they gain little. Capping them keeps a 1000-node fleet with 10k rows per node
# within minutes on two cores. Smooth families always see every training row.
FLEXIBLE_MAX_ROWS = 8_000
# Trees predict a constant across a stretch of utilisation with no rows (a node that is either
# idle or busy), where a smooth curve interpolates; wider gaps than this rule trees out.
FLEXIBLE_MAX_UTIL_GAP = 0.05
FALLBACK_MAX_ROWS = 40_000  # pooled held-out rows the fleet fallback is judged on (per node)
# A node whose utilisation spans less than this (2nd to 98th percentile) has shown one load
# only: no family can tell how its power grows from that (a smooth one would come out flat, and
# pods would look free there). It gets the fleet's shape scaled to its power instead.
MIN_UTIL_SPAN = 0.05


class FitError(RuntimeError):
    """The run cannot produce a trustworthy bundle; the message says why."""


@dataclass(frozen=True)
class FitSettings:
    """Every choice a training run makes; the CLI sets the first five, the rest are tuned here."""

    families: tuple[str, ...] = DEFAULT_FAMILIES
    last_resort_families: tuple[str, ...] = LAST_RESORT_FAMILIES
    test_fraction: float = DEFAULT_TEST_FRACTION
    min_rows: int = DEFAULT_MIN_ROWS
    seed: int = 0
    max_model_bytes: int | None = None  # None: no limit on a node's ONNX size
    monotonic_tolerance_w: float = DEFAULT_MONOTONIC_TOLERANCE_W
    fallback_max_rows: int = FALLBACK_MAX_ROWS
    flexible_max_rows: int = FLEXIBLE_MAX_ROWS
    flexible_max_util_gap: float = FLEXIBLE_MAX_UTIL_GAP
    min_util_span: float = MIN_UTIL_SPAN
    # The population shape prior of `monoshape` (None: the one shipped with the package,
    # learned from every server in training/data/specpower_*shapes.csv). Benchmarks pass one
    # learned from part of the sample, to score on servers it has not seen.
    shape_prior: ShapePrior | None = None


DEFAULT_SETTINGS = FitSettings()
