"""The report's predicted-vs-measured plot: which nodes it shows and what each shows.

An operator reads the plot to see how far off the models are in watts, which is what a
placement is priced in. Ranked by MAPE, the "worst" node was a 20-50 W node whose error in
watts was among the lowest of the fleet; ranked by held-out MAE in watts, the worst node is
the one whose predictions cost the most watts of error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.report import HeldoutSeriesStore, plot_heldout_nodes, plot_picks


def entry(node: str, mae_w: float, mape_pct: float, model: str = "own") -> dict:
    return {
        "node": node,
        "model": model,
        "metrics": {"mae_w": mae_w, "mape_pct": mape_pct, "p95_abs_err_w": 2.5 * mae_w},
    }


ENTRIES = [
    # A small node: 8 % off in relative terms, but only 2.4 W.
    entry("tiny-30w", mae_w=2.4, mape_pct=8.0),
    entry("mid-200w", mae_w=3.0, mape_pct=1.5),
    entry("big-450w", mae_w=11.0, mape_pct=2.4),
    entry("quiet-150w", mae_w=0.9, mape_pct=0.6),
    entry("lonely", mae_w=40.0, mape_pct=30.0, model="fallback"),  # not an own model
]


def test_best_median_worst_are_ranked_by_error_in_watts_not_percent() -> None:
    picks = {label: chosen["node"] for label, chosen in plot_picks(ENTRIES)}
    assert picks == {"best": "quiet-150w", "median": "mid-200w", "worst": "big-450w"}
    # MAPE would have called the 30 W node the worst, at 2.4 W of error.
    by_mape = max(
        (e for e in ENTRIES if e["model"] == "own"), key=lambda e: e["metrics"]["mape_pct"]
    )
    assert by_mape["node"] == "tiny-30w"


def test_each_node_gets_a_power_panel_and_a_residual_panel(tmp_path: Path) -> None:
    time_s = 1_767_571_200 + 60.0 * np.arange(120)
    with HeldoutSeriesStore() as store:
        for index, chosen in enumerate(ENTRIES):
            measured_w = 100.0 + 10.0 * np.sin(np.arange(120) / 9.0) + index
            store.put(chosen["node"], time_s, measured_w, measured_w + 1.5)
        path = tmp_path / "predicted_vs_measured.png"
        asked: list[str] = []
        titles = plot_heldout_nodes(
            path, ENTRIES, lambda node: asked.append(node) or store.get(node)
        )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # only the plotted nodes' series are fetched (on Dask each one is a trip to a worker)
    assert asked == ["quiet-150w", "mid-200w", "big-450w"]
    assert len(titles) == 6  # three nodes, two panels each
    assert titles[0] == (
        "best by held-out error in watts: quiet-150w (MAE 0.9 W, p95 2.2 W, MAPE 0.60 %)"
    )
    assert titles[1] == "quiet-150w: residual, predicted - measured"
    assert titles[4].startswith("worst by held-out error in watts: big-450w (MAE 11.0 W")
    assert titles[5] == "big-450w: residual, predicted - measured"


def test_a_fleet_without_own_models_still_gets_a_plot(tmp_path: Path) -> None:
    with HeldoutSeriesStore() as store:
        path = tmp_path / "empty.png"
        assert plot_heldout_nodes(path, [entry("lonely", 40.0, 30.0, "fallback")], store.get) == []
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
