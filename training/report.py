"""The training report: what each node's model is, how good it is, and why it was chosen.

Operators read it to decide whether to trust a bundle, so every figure comes from the newest,
held-out part of each node's data, next to a baseline that needs no training at all: a straight
line from idle to maximum power (what many schedulers assume). Written as

* `report.json`: everything, for tools;
* `report.txt`: a readable table (also logged);
* `predicted_vs_measured.png`: predicted and measured power over held-out time, and the
  residual below it, for the best, median and worst nodes by held-out error in watts.

Held-out series are kept on disk while nodes are fitted (`HeldoutSeriesStore`), so a 1000-node
run does not hold every node's predictions in memory just to plot three of them.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

REPORT_JSON = "report.json"
REPORT_TXT = "report.txt"
PLOT_PNG = "predicted_vs_measured.png"


# --- error figures -------------------------------------------------------------------------


def error_metrics(measured_w: np.ndarray, predicted_w: np.ndarray) -> dict[str, float | None]:
    """MAE (W), MAPE (%) and 95th-percentile absolute error (W); None when there are no rows."""
    measured_w = np.asarray(measured_w, dtype=np.float64)
    predicted_w = np.asarray(predicted_w, dtype=np.float64)
    if len(measured_w) == 0:
        return {"mae_w": None, "mape_pct": None, "p95_abs_err_w": None}
    abs_err_w = np.abs(predicted_w - measured_w)
    positive = measured_w > 0  # cleaning drops non-positive power; guard the division anyway
    mape_pct = (
        float(np.mean(abs_err_w[positive] / measured_w[positive]) * 100) if positive.any() else None
    )
    return {
        "mae_w": round(float(np.mean(abs_err_w)), 4),
        "mape_pct": None if mape_pct is None else round(mape_pct, 4),
        "p95_abs_err_w": round(float(np.percentile(abs_err_w, 95)), 4),
    }


@dataclass(frozen=True)
class IdleToMaxLine:
    """The baseline: power rises in a straight line from idle (u = 0) to maximum (u = 1)."""

    idle_w: float
    max_w: float

    @classmethod
    def from_train(cls, util: np.ndarray, power_w: np.ndarray) -> IdleToMaxLine:
        """Estimate idle and max from training rows.

        Nodes rarely sit at exactly 0 or 100 %, so the line goes through the median power of the
        least busy and the busiest 5 % of rows and is extended to u = 0 and u = 1. On a node that
        does reach both ends this is just idle and max power.
        """
        util = np.asarray(util, dtype=np.float64)
        power_w = np.asarray(power_w, dtype=np.float64)
        low_u, high_u = np.percentile(util, [5, 95])
        low = util <= low_u
        high = util >= high_u
        u0, p0 = float(np.median(util[low])), float(np.median(power_w[low]))
        u1, p1 = float(np.median(util[high])), float(np.median(power_w[high]))
        if u1 - u0 < 1e-3:  # utilisation never varied: a flat line at the typical power
            return cls(idle_w=p0, max_w=p0)
        slope = (p1 - p0) / (u1 - u0)
        return cls(idle_w=p0 - slope * u0, max_w=p0 + slope * (1 - u0))

    def predict_w(self, util: np.ndarray) -> np.ndarray:
        return self.idle_w + (self.max_w - self.idle_w) * np.asarray(util, dtype=np.float64)


# --- held-out series, kept on disk until the plot is drawn ---------------------------------


class HeldoutSeriesStore:
    """Per-node held-out (time, measured, predicted) arrays in a temporary directory."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="heldout-")
        self._paths: dict[str, Path] = {}

    def put(self, node: str, time_s: np.ndarray, measured_w: np.ndarray, predicted_w: np.ndarray):
        path = Path(self._dir.name) / f"{len(self._paths)}.npz"
        np.savez(path, time_s=time_s, measured_w=measured_w, predicted_w=predicted_w)
        self._paths[node] = path

    def get(self, node: str) -> dict[str, np.ndarray] | None:
        path = self._paths.get(node)
        if path is None:
            return None
        with np.load(path) as data:
            return {key: data[key] for key in data.files}

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self) -> HeldoutSeriesStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def best_median_worst(error_by_node: Mapping[str, float]) -> list[tuple[str, str]]:
    """(label, node) for the lowest, median and highest error (fewer if few nodes)."""
    ranked = sorted(error_by_node, key=lambda node: (error_by_node[node], node))
    if not ranked:
        return []
    picks = [("best", ranked[0]), ("median", ranked[len(ranked) // 2]), ("worst", ranked[-1])]
    seen: set[str] = set()
    unique = []
    for label, node in picks:
        if node not in seen:
            seen.add(node)
            unique.append((label, node))
    return unique


def plot_picks(node_entries: Sequence[Mapping]) -> list[tuple[str, Mapping]]:
    """(label, report entry) of the nodes the plot shows: best, median and worst own model by
    held-out mean absolute error in watts.

    Watts, not MAPE: a placement is priced in watts, and a percentage flatters big nodes and
    blames small ones (a 20-50 W node 5 % off is 2 W off; a 400 W node 2 % off is 8 W off).
    """
    entries = {
        entry["node"]: entry
        for entry in node_entries
        if entry["model"] == "own" and entry["metrics"].get("mae_w") is not None
    }
    mae_w = {node: entry["metrics"]["mae_w"] for node, entry in entries.items()}
    return [(label, entries[node]) for label, node in best_median_worst(mae_w)]


def plot_heldout_nodes(
    path: Path,
    node_entries: Sequence[Mapping],
    heldout_series: Callable[[str], dict[str, np.ndarray] | None],
) -> list[str]:
    """The predicted-vs-measured plot of `plot_picks`'s nodes, from their held-out series.

    `heldout_series(node)` fetches one node's series (`HeldoutSeriesStore.get`, or a Dask
    worker that kept them): only the plotted nodes' are asked for."""
    series = [
        (label, entry["node"], heldout_series(entry["node"]), entry["metrics"])
        for label, entry in plot_picks(node_entries)
    ]
    return plot_predicted_vs_measured(path, [s for s in series if s[2] is not None])


def _figure_text(metrics: Mapping) -> str:
    figures = []
    for key, text in (("mae_w", "MAE {:.1f} W"), ("p95_abs_err_w", "p95 {:.1f} W")):
        if metrics.get(key) is not None:
            figures.append(text.format(metrics[key]))
    if metrics.get("mape_pct") is not None:
        figures.append(f"MAPE {metrics['mape_pct']:.2f} %")
    return ", ".join(figures)


def plot_predicted_vs_measured(
    path: Path, series: Sequence[tuple[str, str, dict[str, np.ndarray], Mapping]]
) -> list[str]:
    """Two panels per (label, node, arrays, held-out metrics): measured and predicted watts over
    held-out time, and below it the residual (predicted - measured, W) with the p95 band.

    Returns the panel titles, top to bottom.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    panels = max(1, len(series))
    fig, axes = plt.subplots(
        2 * panels,
        1,
        figsize=(11, 4.6 * panels),
        squeeze=False,
        gridspec_kw={"height_ratios": [2.2, 1.0] * panels},
    )
    titles: list[str] = []
    for index, (label, node, arrays, metrics) in enumerate(series):
        power_axis, residual_axis = axes[2 * index, 0], axes[2 * index + 1, 0]
        times = [datetime.fromtimestamp(float(t), tz=UTC) for t in arrays["time_s"]]
        residual_w = arrays["predicted_w"] - arrays["measured_w"]
        power_axis.plot(times, arrays["measured_w"], lw=0.8, color="0.35", label="measured")
        power_axis.plot(times, arrays["predicted_w"], lw=0.9, color="tab:orange", label="predicted")
        title = f"{label} by held-out error in watts: {node} ({_figure_text(metrics)})"
        power_axis.set_title(title, fontsize=10)
        power_axis.set_ylabel("power (W)")
        power_axis.legend(loc="upper right", fontsize=8)
        residual_axis.plot(times, residual_w, lw=0.7, color="tab:blue")
        residual_axis.axhline(0.0, color="0.2", lw=0.8)
        p95_w = metrics.get("p95_abs_err_w")
        if p95_w is not None:
            residual_axis.axhspan(-p95_w, p95_w, color="tab:blue", alpha=0.12, label="p95 band")
            residual_axis.legend(loc="upper right", fontsize=8)
        residual_title = f"{node}: residual, predicted - measured"
        residual_axis.set_title(residual_title, fontsize=9)
        residual_axis.set_ylabel("error (W)")
        residual_axis.sharex(power_axis)
        for axis in (power_axis, residual_axis):
            axis.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
        titles += [title, residual_title]
    if not series:
        axes[0, 0].text(0.5, 0.5, "no node has its own model", ha="center", va="center")
        axes[1, 0].set_visible(False)
    axes[-1, 0].set_xlabel("time (UTC)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return titles


# --- the readable table --------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def full_load_band(entry: Mapping) -> str:
    """A node's band at full load, when its model extrapolates there: `-6/+14 %` (the bounds
    against the prediction, `extrapolation_interval`); `-` otherwise."""
    band = entry.get("extrapolation_interval")
    if not band or not band.get("util") or band["util"][-1] < 1.0:
        return "-"
    low, high = band["low"][-1], band["high"][-1]
    return f"-{(1 - low) * 100:.0f}/+{(high - 1) * 100:.0f} %"


def format_table(report: Mapping) -> str:
    """The report as fixed-width text: a summary, then one line per node."""
    summary = report["summary"]
    lines = [
        f"power model training report ({report['created_at']})",
        f"input: {', '.join(report['input']['sources'])}; rows read {report['input']['rows_read']},"
        f" rows used {report['input']['rows_used']}",
        "dropped rows: "
        + (
            ", ".join(f"{reason} {count}" for reason, count in report["input"]["dropped"].items())
            or "none"
        ),
        f"held-out: newest {report['settings']['test_fraction'] * 100:.0f} % of each node's rows",
        f"nodes: {summary['nodes']} ({summary['nodes_own_model']} own model, "
        f"{len(summary['nodes_fallback'])} on a fallback, of which "
        f"{summary['nodes_scaled_fallback']} scaled to their own power; threshold "
        f"{report['fallback']['min_rows']} rows)",
        f"held-out MAPE, all {summary['nodes']} nodes (fallbacks included): median "
        f"{_fmt(summary['median_mape_pct'])} %, p90 {_fmt(summary['p90_mape_pct'])} %; own "
        f"models: median {_fmt(summary['own_median_mape_pct'])} %, p90 "
        f"{_fmt(summary['own_p90_mape_pct'])} %; idle-to-max line: median "
        f"{_fmt(summary['baseline_median_mape_pct'])} %, p90 "
        f"{_fmt(summary['baseline_p90_mape_pct'])} %",
        f"worse than the idle-to-max line: {len(summary['nodes_worse_than_line'])} node(s)"
        + "".join(
            f"; {w['node']} {_fmt(w['mape_pct'])} % vs {_fmt(w['line_mape_pct'])} %"
            for w in summary["nodes_worse_than_line"]
        ),
        f"never falling along utilisation (median temperatures, and CPU temperatures following "
        f"load): {summary['monotonic_pass']} of "
        f"{summary['nodes_own_model']} chosen models pass",
        f"ONNX parity (<= {report['parity_tolerance_w']} W): {summary['parity_pass']} of "
        f"{summary['parity_checked']} models pass",
        "above its highest load a model extrapolates: `u=1 band` is the range its power at full "
        "load is expected in, against the prediction (10-90 % of the shape prior's own errors)",
        "",
    ]
    header = (
        f"{'node':<24} {'model':<13} {'train':>6} {'test':>5} {'MAE W':>7} {'MAPE %':>7} "
        f"{'p95 W':>7} {'line MAPE %':>11} {'max u':>5} {'u=1 band':>11} {'monotonic':<10} "
        "note"
    )
    lines += [header, "-" * len(header)]
    for entry in report["nodes"]:
        metrics = entry["metrics"]
        baseline = entry.get("baseline") or {}
        model = entry["family"]  # fallbacks: fleet-scaled (scaled to its power) or fleet
        lines.append(
            f"{entry['node'][:24]:<24} {model[:13]:<13} {entry['rows_train']:>6} "
            f"{entry['rows_test']:>5} {_fmt(metrics['mae_w']):>7} {_fmt(metrics['mape_pct']):>7} "
            f"{_fmt(metrics['p95_abs_err_w']):>7} {_fmt(baseline.get('mape_pct')):>11} "
            f"{_fmt(entry.get('max_util_measured')):>5} {full_load_band(entry):>11} "
            f"{entry['monotonic']['verdict']:<10} {entry.get('note', '')}"
        )
    fallback = report["fallback"]
    fm = fallback["metrics"]
    lines += [
        "",
        f"fleet fallback (nodes with no rows): {fallback['family']}, the fleet's typical curve "
        f"({_fmt(fallback['steady_curve_w'][0], 0)} W idle to "
        f"{_fmt(fallback['steady_curve_w'][-1], 0)} W at full load), held-out MAE "
        f"{_fmt(fm['mae_w'])} W, MAPE {_fmt(fm['mape_pct'])} % over {fallback['rows_test']} "
        f"pooled rows; monotonic {fallback['monotonic']['verdict']}",
    ]
    return "\n".join(lines)


def write_report(report_dir: Path, report: Mapping) -> tuple[Path, Path]:
    """Write report.json and report.txt into `report_dir` (created) and log the table."""
    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / REPORT_JSON
    txt_path = report_dir / REPORT_TXT
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    table = format_table(report)
    txt_path.write_text(table + "\n")
    log.info("training report:\n%s", table)
    return json_path, txt_path


def summarise(node_entries: Sequence[Mapping]) -> dict:
    """Fleet-level figures over the per-node report entries.

    The headline MAPE counts *every* node, fallbacks included (a fallback node's error is its
    fallback's on its rows): leaving them out would hide exactly the nodes that fit worst.
    Own models' figures and the nodes doing worse than the idle-to-max line are given apart.
    """
    own = [entry for entry in node_entries if entry["model"] == "own"]

    def mapes(entries: Sequence[Mapping]) -> list[float]:
        return [
            e["metrics"]["mape_pct"] for e in entries if e["metrics"].get("mape_pct") is not None
        ]

    line = [
        e["baseline"]["mape_pct"]
        for e in node_entries
        if e.get("baseline") and e["baseline"]["mape_pct"] is not None
    ]
    worse = [
        {
            "node": e["node"],
            "model": e["model"],
            "mape_pct": e["metrics"]["mape_pct"],
            "line_mape_pct": e["baseline"]["mape_pct"],
        }
        for e in node_entries
        if e.get("baseline")
        and e["baseline"]["mape_pct"] is not None
        and e["metrics"].get("mape_pct") is not None
        and e["metrics"]["mape_pct"] >= e["baseline"]["mape_pct"]
    ]
    families: dict[str, int] = {}
    model_bytes: dict[str, list[int]] = {}
    for entry in own:
        families[entry["family"]] = families.get(entry["family"], 0) + 1
    for entry in node_entries:
        if entry.get("onnx_bytes") is not None:
            model_bytes.setdefault(entry["family"], []).append(entry["onnx_bytes"])

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)), 4) if values else None

    return {
        "nodes": len(node_entries),
        "nodes_own_model": len(own),
        "nodes_fallback": [
            {"node": e["node"], "reason": e["fallback_reason"]}
            for e in node_entries
            if e["model"] != "own"
        ],
        "nodes_scaled_fallback": sum(1 for e in node_entries if e.get("scaled_fallback")),
        "families_chosen": families,
        # what each family costs in the bundle (ConfigMaps hold 1 MiB): see --max-model-bytes
        "model_bytes_by_family": {
            family: {"models": len(sizes), "mean": round(float(np.mean(sizes))), "max": max(sizes)}
            for family, sizes in sorted(model_bytes.items())
        },
        "median_mape_pct": pct(mapes(node_entries), 50),
        "p90_mape_pct": pct(mapes(node_entries), 90),
        "own_median_mape_pct": pct(mapes(own), 50),
        "own_p90_mape_pct": pct(mapes(own), 90),
        "baseline_median_mape_pct": pct(line, 50),
        "baseline_p90_mape_pct": pct(line, 90),
        "nodes_worse_than_line": worse,
        "monotonic_pass": sum(1 for e in own if e["monotonic"]["verdict"] == "pass"),
        "parity_checked": sum(1 for e in own if e.get("parity_max_diff_w") is not None),
        "parity_pass": sum(
            1
            for e in own
            if e.get("parity_max_diff_w") is not None and e["parity_max_diff_w"] <= 0.01
        ),
    }
