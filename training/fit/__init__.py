"""Fit: collected node metrics -> per-node power models -> a model bundle (training.fit).

The step between telemetry and the extender. For every node:

1. split its cleaned rows chronologically: the newest `--test-fraction` is held out (a random
   shuffle would leak neighbouring samples of the same time series into the test set);
2. fit every candidate family (`training.families`) on the older rows, on float32 features so
   tree thresholds mean the same in scikit-learn and in ONNX;
3. rank the families by held-out MAE and keep the best one whose predicted power never falls as
   utilisation rises at the node's median temperatures (the extender prices a pod by
   P(u + d) - P(u): a dip would make a busier node look cheaper); the defaults are smooth
   families only (`training.families.DEFAULT_FAMILIES` says why); when a flexible family is
   asked for with `--families`, it must beat the best smooth one by `FLEXIBLE_MARGIN` (10 % of
   MAE) to be chosen, because its ONNX is ~50x larger (ConfigMaps hold 1 MiB), it is flat
   outside the data it saw, and inside a step a small pod adds exactly 0 W; with
   `--max-model-bytes`, a family whose ONNX is larger is passed over for the next one (fleet
   bundles: smooth models are ~1-3 KiB, `rfmono` ~15-60 KiB per node);
4. convert the winner to ONNX and check it against scikit-learn on the held-out rows.

Nodes with fewer than `--min-rows` clean rows, or with no family passing the check, are served
by a fleet fallback model fitted the same way on a subsample of every eligible node's rows
(with a utilisation-only family added to its candidates: across different servers, temperature
mostly says which server it is).

Nodes are fitted in worker processes over all cores, streamed: at most a few nodes' rows are in
flight, and a finished node leaves behind only its ONNX bytes, its figures and (on disk) its
held-out predictions for the plot.

- `settings`: `FitSettings`, the tuned constants, `FitError`;
- `node`: one node's rows, the candidate families, the checks, `fit_node` -> `FitOutcome`;
- `fleet`: `fit_fleet`: the nodes in worker processes, the fleet fallback (also a
  `FitOutcome`), the report, the bundle;
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
