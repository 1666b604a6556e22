"""What the held-out error figures of a bundle mean, for ``/status``.

A bundle's manifest records each model's error against measured power on rows training left
out (``metrics``: ``mape_pct``, ``mae_w``, ``p95_abs_err_w``). The figures answer different
questions, and one read alone misleads: the fleet fallback's error is the error for a node with
no model of its own, many times that of the per-node models beside it. ``bundle_accuracy``
groups them, each group with a sentence saying what it measures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from predictor.bundle import Bundle, ModelEntry

SUMMARISED_METRICS = ("mape_pct", "mae_w")
FALLBACK_METRICS = ("mape_pct", "mae_w", "p95_abs_err_w")
# training.fit marks a node given the fleet's shape scaled to its readings with this entry key.
SCALED_FALLBACK_KEY = "scaled_fallback"

OWN_MODELS_MEANS = (
    "Each node's own model, judged on its own held-out rows: the error of the power predicted "
    "for that node (median and worst over the nodes)."
)
SCALED_FALLBACKS_MEANS = (
    "Nodes with too few rows, or too little change in load, for a model of their own: the "
    "fleet's curve shape scaled to the power the node was measured at, judged on the node's newest "
    "rows."
)
FLEET_FALLBACK_MEANS = (
    "The bundle's fleet fallback, one curve for every node that has no model of its own (a "
    "node training had no power readings for, such as a new one), judged on held-out rows "
    "pooled from every node with enough rows for a model of its own: the error to expect for "
    "a node the bundle has no model for, not the error of the per-node models (own_models)."
)


def bundle_accuracy(bundle: Bundle) -> dict[str, Any]:
    """The bundle's held-out figures by kind of model, each with what it means."""
    own = {n: e for n, e in bundle.nodes.items() if SCALED_FALLBACK_KEY not in e.info}
    scaled = {n: e for n, e in bundle.nodes.items() if SCALED_FALLBACK_KEY in e.info}
    return {
        "held_out_rows": held_out_rows(bundle.manifest),
        "own_models": {**_summary(own), "means": OWN_MODELS_MEANS},
        "scaled_fallbacks": {**_summary(scaled), "means": SCALED_FALLBACKS_MEANS},
        "fleet_fallback": None if bundle.fallback is None else _fleet_fallback(bundle.fallback),
    }


def held_out_rows(manifest: Mapping[str, Any]) -> str:
    """Which rows the figures come from, as the manifest's `training` section records it."""
    training = manifest.get("training")
    fraction = training.get("test_fraction") if isinstance(training, Mapping) else None
    if not _is_number(fraction):
        return "not recorded in the bundle's manifest (training.test_fraction)"
    rows = f"the newest {fraction * 100:g} % of each node's rows"
    window = manifest.get("training_window")
    if isinstance(window, Mapping) and window.get("start") and window.get("end"):
        rows += f" in the training window {window['start']} .. {window['end']}"
    return f"{rows}, which no model was fitted on"


def _summary(entries: Mapping[str, ModelEntry]) -> dict[str, Any]:
    summary: dict[str, Any] = {"nodes": len(entries)}
    for metric in SUMMARISED_METRICS:
        values = {
            node: v for node, e in entries.items() if (v := model_metric(e, metric)) is not None
        }
        if not values:
            summary[metric] = None
            continue
        worst = max(values, key=values.__getitem__)
        summary[metric] = {
            "median": statistics.median(values.values()),
            "max": values[worst],
            "max_node": worst,
        }
    return summary


def _fleet_fallback(entry: ModelEntry) -> dict[str, Any]:
    rows = entry.info.get("rows_test")
    return {
        **{metric: model_metric(entry, metric) for metric in FALLBACK_METRICS},
        "rows": rows if isinstance(rows, int) and not isinstance(rows, bool) else None,
        "means": FLEET_FALLBACK_MEANS,
    }


def model_metric(entry: ModelEntry, name: str) -> float | None:
    """A held-out figure of a model entry (manifest `metrics`), None when absent or not finite."""
    metrics = entry.info.get("metrics")
    value = metrics.get(name) if isinstance(metrics, Mapping) else None
    return float(value) if _is_number(value) else None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
