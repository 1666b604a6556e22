"""Fit: collected node metrics -> per-node power models -> a model bundle (training.fit).

The step between telemetry and the extender. For every node:

1. split its cleaned rows chronologically: the newest `--test-fraction` is held out (a random
   shuffle would leak neighbouring samples of the same time series into the test set);
2. fit every candidate family (`training.families`; by default only `monoshape`, monotone in
   utilisation by construction, with a population shape prior for the loads the node has not
   shown) on the older rows, on float32 features so tree thresholds mean the same in
   scikit-learn and in ONNX;
3. rank the families by held-out MAE and keep the best one whose predicted power never falls as
   utilisation rises, at the node's median temperatures and with CPU temperatures following
   load (the extender prices a pod by P(u + d) - P(u): a dip would make a busier node look
   cheaper), and that the extender's probe accepts; `training.families.DEFAULT_FAMILIES` says
   why the default is one family; when a flexible family is asked for with `--families`, it
   must beat the best other one by `FLEXIBLE_MARGIN` (10 % of MAE) to be chosen, because its
   ONNX is ~50x larger (ConfigMaps hold 1 MiB), it is flat outside the data it saw, and inside
   a step a small pod adds exactly 0 W; with `--max-model-bytes`, a family whose ONNX is larger
   is passed over for the next one; if no family given passes, `monoshape` is tried last;
4. convert the winner to ONNX and check it against scikit-learn on the held-out rows; record
   the highest load the node was measured at (the manifest's `max_util_measured`: above it the
   model extrapolates, and the extender's /explain says so).

A node with fewer than `--min-rows` clean rows, or whose load never moved enough to show how
its power grows, gets the fleet's shape scaled to the power it was measured at; the fleet
fallback (the fleet's median curve) serves nodes with no rows at all (`fallback`). The report
says per node, in words, why a node has no model of its own, and gives headline errors over
every node, fallbacks included.

Nodes are fitted in worker processes over all cores, streamed: at most a few nodes' rows are in
flight, and a finished node leaves behind only its ONNX bytes, its figures and (on disk) its
held-out predictions for the plot.

- `settings`: `FitSettings`, the tuned constants, `FitError`;
- `node`: one node's rows, the candidate families, the checks, `fit_node` -> `FitOutcome`;
- `fallback`: the fleet's shape, the fleet fallback and the fallback scaled to a node's power;
- `fleet`: `fit_fleet`: the nodes in worker processes, the fallbacks (also `FitOutcome`s), the
  report, the bundle (`finish_run`, shared with `distributed`);
- `distributed`: `--dask`: node groups read and fitted on a Dask cluster's workers, the same
  bundle written by the client (`fit_fleet_on_dask`);
- `cli`: `python -m training.fit` (flags, input from files or Prometheus, exit statuses).
"""

from training.fit.fleet import FitRun, default_report_dir, fit_fleet
from training.fit.node import FitOutcome, NodeRows, fit_node, heldout_start_index, iter_node_rows
from training.fit.settings import FEATURE_FILL, FitError, FitSettings

__all__ = [
    "FEATURE_FILL",
    "FitError",
    "FitOutcome",
    "FitRun",
    "FitSettings",
    "NodeRows",
    "default_report_dir",
    "fit_fleet",
    "fit_node",
    "heldout_start_index",
    "iter_node_rows",
]
