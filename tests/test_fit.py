"""training.fit end to end through its CLI, plus the checks it relies on.

One small synthetic fleet is fitted once per module through `python -m training.fit` in a
subprocess; the tests then read what it wrote: the bundle (through `read_bundle` and
onnxruntime), report.json, report.txt and the plot.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from livedata.metrics_table import FEATURES
from predictor.bundle import read_bundle
from tests.support import fit_cli
from tests.support.prometheus import (
    free_port,
    require_prometheus,
    start_prometheus,
    write_openmetrics,
)
from training.dataset import (
    MetricsStream,
    clean_metrics,
    load_metrics,
    stream_metrics,
    write_metrics,
)
from training.export import onnx_predict_w
from training.families import (
    DEFAULT_FAMILIES,
    FAMILIES,
    Family,
    fit_family,
    thermal_slope_c_per_util,
)
from training.fit import (
    FEATURE_FILL,
    FitError,
    FitSettings,
    NodeRows,
    fit_fleet,
    fit_node,
    heldout_start_index,
    iter_node_rows,
)
from training.fit.node import choose_model, extender_probe_verdict, monotonic_verdict
from training.synth import synth_fleet

REPO = Path(__file__).resolve().parents[1]
MIN_ROWS = 200
LONELY = "node-lonely"


run_fit_cli = fit_cli.run_fit


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> dict:
    """A 3-node fleet (2 days at 120 s) plus a node with a single row, fitted via the CLI."""
    work = tmp_path_factory.mktemp("fit")
    fleet = synth_fleet(3, 48, 120, seed=3)
    lonely = fleet.iloc[[0]].copy()
    lonely["node"] = LONELY
    table = pd.concat([fleet, lonely], ignore_index=True)
    table["timestamp"] = table["timestamp"].map(lambda t: t.isoformat())
    metrics = work / "metrics.csv"
    table.to_csv(metrics, index=False)
    out = work / "bundle"
    completed = run_fit_cli(
        "--input", str(metrics), "--out", str(out), "--min-rows", str(MIN_ROWS), "--jobs", "2"
    )
    assert completed.returncode == 0, completed.stderr
    report_dir = work / "bundle-report"
    return {
        "out": out,
        "report_dir": report_dir,
        "report": json.loads((report_dir / "report.json").read_text()),
        "input": pd.read_csv(metrics),
    }


def _node_frame(fitted: dict, node: str) -> pd.DataFrame:
    frame = fitted["input"]
    frame = frame[frame["node"] == node].dropna(subset=["ambient_temp_c", "cpu1_temp_c"]).copy()
    frame["cpu2_temp_c"] = frame["cpu2_temp_c"].fillna(frame["cpu1_temp_c"])
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame.sort_values("timestamp")


def test_bundle_is_readable_and_onnx_reproduces_the_reported_error(fitted) -> None:
    bundle = read_bundle(fitted["out"])
    # the one-row node has no model of its own, but the fleet's shape scaled to its power
    assert set(bundle.nodes) == {"node-01", "node-02", "node-03", LONELY}
    assert bundle.features == FEATURES
    assert bundle.feature_fill == {"cpu2_temp_c": "cpu1_temp_c"}
    assert bundle.fallback is not None
    assert bundle.manifest["training_window"]["start"] < bundle.manifest["training_window"]["end"]
    for node, entry in bundle.nodes.items():
        if node == LONELY:
            continue
        frame = _node_frame(fitted, node)
        held_out = frame.iloc[heldout_start_index(len(frame), 0.2) :]
        assert len(held_out) == entry.info["rows_test"]
        predicted_w = onnx_predict_w(
            (bundle.directory / entry.file).read_bytes(),
            held_out[list(FEATURES)].to_numpy(np.float32),
        )
        # The manifest's MAE was computed with scikit-learn; ONNX must land within 0.01 W of it.
        onnx_mae_w = float(np.mean(np.abs(predicted_w - held_out["power_w"].to_numpy())))
        assert onnx_mae_w == pytest.approx(entry.info["metrics"]["mae_w"], abs=0.011)
        assert entry.info["family"] in FAMILIES
        assert entry.info["thermal"]["cpu1_temp_c_per_util"] > 5
        low, high = entry.info["power_range_w"]
        assert low == frame["power_w"].min() and high == frame["power_w"].max()
        train = frame.iloc[: heldout_start_index(len(frame), 0.2)]
        assert entry.info["max_util_measured"] == pytest.approx(
            np.percentile(train["cpu_util"], 99.5), abs=1e-4
        )


def test_held_out_rows_are_the_newest(fitted) -> None:
    for entry in fitted["report"]["nodes"]:
        if entry["model"] != "own":
            continue
        frame = _node_frame(fitted, entry["node"])
        n_test = math.ceil(len(frame) * 0.2)
        assert entry["rows_test"] == n_test
        assert entry["rows_train"] == len(frame) - n_test
        newest = frame["timestamp"].iloc[-n_test:]
        older = frame["timestamp"].iloc[:-n_test]
        assert entry["test_window"][0] == newest.min().isoformat().replace("+00:00", "Z")
        assert entry["test_window"][1] == newest.max().isoformat().replace("+00:00", "Z")
        assert entry["train_window"][1] == older.max().isoformat().replace("+00:00", "Z")
        assert entry["train_window"][1] < entry["test_window"][0]


def test_single_row_node_gets_the_fleet_shape_scaled_to_its_power(fitted) -> None:
    report = fitted["report"]
    assert report["fallback"]["min_rows"] == MIN_ROWS
    assert report["fallback"]["nodes"] == []  # nobody is left on the unscaled fleet curve
    assert report["fallback"]["scaled_nodes"] == [LONELY]
    assert report["summary"]["nodes_fallback"] == [
        {"node": LONELY, "reason": f"1 clean rows < --min-rows {MIN_ROWS}"}
    ]
    assert report["summary"]["nodes_scaled_fallback"] == 1
    lonely = next(e for e in report["nodes"] if e["node"] == LONELY)
    assert lonely["model"] == "fallback" and lonely["rows_test"] == 1
    assert lonely["family"] == "fleet-scaled"
    assert lonely["monotonic"]["verdict"] == "pass"
    # its one reading is at (near) the scaled curve: that is what it was scaled to
    assert lonely["metrics"]["mape_pct"] < 1.0
    bundle = read_bundle(fitted["out"])
    entry = bundle.nodes[LONELY]
    assert entry.info["family"] == "fleet-scaled"
    assert entry.info["scaled_fallback"]["reason"] == f"1 clean rows < --min-rows {MIN_ROWS}"
    assert bundle.fallback.info["min_rows"] == MIN_ROWS
    assert bundle.fallback.info["nodes"] == []
    table = (fitted["report_dir"] / "report.txt").read_text()
    assert f"threshold {MIN_ROWS} rows" in table
    assert f"{LONELY}" in table and "fallback scaled to its power" in table
    assert "1 clean rows < --min-rows" in table


def test_report_table_json_and_plot_with_the_baseline_line(fitted) -> None:
    report = fitted["report"]
    table = (fitted["report_dir"] / "report.txt").read_text()
    png = (fitted["report_dir"] / "predicted_vs_measured.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "idle-to-max line" in table and "line MAPE %" in table
    for entry in report["nodes"]:
        assert entry["node"] in table
        if entry["model"] != "own":
            continue
        baseline = entry["baseline"]
        assert baseline["idle_w"] < baseline["max_w"]
        assert baseline["mape_pct"] > entry["metrics"]["mape_pct"]
        assert entry["monotonic"]["verdict"] == "pass"
        assert [c["family"] for c in entry["candidates"]] == list(DEFAULT_FAMILIES)
        assert entry["parity_max_diff_w"] <= 0.01
    summary = report["summary"]
    assert summary["baseline_median_mape_pct"] > summary["median_mape_pct"]
    assert summary["parity_pass"] == summary["parity_checked"] == 3
    assert "node_missing" in report["input"]["dropped"] or report["input"]["dropped"]
    # The headline counts every node, the scaled fallback too; nobody did worse than the line.
    assert summary["nodes"] == 4 and summary["own_median_mape_pct"] is not None
    assert summary["nodes_worse_than_line"] == []
    assert "all 4 nodes (fallbacks included)" in table
    # The bundle stays small: the report lives beside it, not inside it (3 own models, the
    # scaled fallback of the lonely node, the fleet fallback).
    assert sorted(p.suffix for p in fitted["out"].iterdir()) == [".json"] + [".onnx"] * 5


def _falling_rows(n: int = 600) -> NodeRows:
    """A node whose measured power falls as utilisation rises (a broken meter, say)."""
    rng = np.random.default_rng(5)
    util = rng.uniform(0, 1, n)
    ambient = 22 + rng.normal(0, 1, n)
    cpu1 = ambient + 20 + 25 * util
    features = np.column_stack([util, ambient, cpu1, cpu1]).astype(np.float32)
    power_w = 300 - 150 * util + rng.normal(0, 1, n)
    return NodeRows("node-falling", np.arange(n) * 60.0, features, power_w)


def test_monotonicity_check_catches_a_decreasing_model() -> None:
    rows = _falling_rows()
    model = fit_family(FAMILIES["poly3"], rows.features, rows.power_w, seed=0)
    check = monotonic_verdict(model, np.median(rows.features, axis=0), tolerance_w=0.05)
    assert check["verdict"] == "fail"
    # part of the fall is credited to the CPU temperature, which follows load
    assert check["max_drop_w"] > 20

    # every family that can dip does dip here; rfmono cannot (checked below)
    settings = FitSettings(
        min_rows=100, families=("poly3", "poly5", "poly5t2", "gbr"), last_resort_families=()
    )
    chosen, _, candidates, _ = choose_model(
        rows.take(slice(0, 480)), rows.take(slice(480, None)), settings
    )
    assert chosen is None
    assert {c["monotonic"] for c in candidates} == {"fail"}

    outcome = fit_node(rows, settings)
    assert outcome.onnx is None
    # The reason says how far power falls, and where: at the node's own temperatures.
    assert outcome.fallback_reason.startswith(
        "no family passed the monotonicity check: predicted power falls by "
    )
    assert "W as utilisation rises at the node's typical temperatures" in outcome.fallback_reason

    # with the default last resort, the node keeps a model of its own: a monotone forest
    rescued = fit_node(rows, replace(settings, last_resort_families=("rfmono",)))
    assert rescued.family == "rfmono" and rescued.onnx is not None
    assert rescued.monotonic["verdict"] == "pass"
    assert [c["family"] for c in rescued.candidates][-1] == "rfmono"

    forest = fit_family(FAMILIES["rfmono"], rows.features, rows.power_w, seed=0)
    forest_check = monotonic_verdict(forest, np.median(rows.features, axis=0), tolerance_w=0.0)
    assert forest_check["verdict"] == "pass"  # constrained trees never fall along utilisation


def test_a_dipping_best_family_gives_way_to_the_next() -> None:
    rows = _falling_rows()
    util = rows.features[:, 0].astype(np.float64)
    wavy_w = 100 + 150 * util + 30 * np.sin(6 * util)  # falls between u ~0.3 and ~0.8
    outcome = fit_node(
        NodeRows(rows.node, rows.time_s, rows.features, wavy_w),
        FitSettings(min_rows=100, families=("poly5", "sqrt2")),
    )
    poly5, sqrt2 = outcome.candidates
    assert poly5["metrics"]["mae_w"] < sqrt2["metrics"]["mae_w"]  # the better fit...
    assert poly5["monotonic"] == "fail"  # ...follows the dip, so it is passed over
    assert outcome.family == "sqrt2"
    assert outcome.monotonic["verdict"] == "pass"


class _HotThrottlingModel:
    """Power rises with load but falls as a CPU runs above 60 C (throttling): fine at a cool
    node's own temperatures, falling along u where the extender probes hotter CPUs."""

    def fit(self, rows: np.ndarray, power_w: np.ndarray) -> _HotThrottlingModel:
        return self

    def predict(self, rows: np.ndarray) -> np.ndarray:
        util, cpu1_c = rows[:, 0].astype(np.float64), rows[:, 2].astype(np.float64)
        return 100 + 100 * util - 12 * np.clip(cpu1_c - 60, 0, None)


def test_a_model_the_extender_would_refuse_is_not_chosen(monkeypatch) -> None:
    thermal = {"cpu1_temp_c_per_util": 30.0}
    cool_node = np.array([0.3, 20.0, 35.0, 35.0], dtype=np.float32)
    check = monotonic_verdict(_HotThrottlingModel(), cool_node, 0.05, thermal)
    assert check["verdict"] == "pass"  # training's own check at the node's temperatures...
    verdict = extender_probe_verdict(_HotThrottlingModel(), thermal, "node-x")
    assert verdict.startswith("node 'node-x' model at ambient")  # ...but not the extender's
    assert "power decreases with utilisation" in verdict

    # and so choose_model passes over it for the next family
    throttle = Family("throttle", "smooth", lambda seed: _HotThrottlingModel(), "test only")
    monkeypatch.setitem(FAMILIES, "throttle", throttle)
    rng = np.random.default_rng(4)
    util = rng.uniform(0, 1, 400)
    features = np.column_stack([util, np.full(400, 20.0), 40 + 5 * util, 40 + 5 * util])
    rows = NodeRows("node-x", np.arange(400.0), features.astype(np.float32), 100 + 100 * util)
    settings = FitSettings(min_rows=100, families=("throttle", "sqrt2"))
    _, choice, candidates, _ = choose_model(
        rows.take(slice(0, 300)), rows.take(slice(300, None)), settings, thermal=thermal
    )
    verdicts = {c["family"]: c["monotonic"] for c in candidates}
    assert verdicts == {"throttle": "fail", "sqrt2": "pass"}
    assert choice["family"] == "sqrt2"


def test_thermal_slope_recovers_a_known_slope() -> None:
    rng = np.random.default_rng(2)
    util = rng.uniform(0, 1, 2000)
    ambient = 20 + 5 * rng.uniform(0, 1, 2000)
    cpu = 15 + ambient + 28.0 * util + rng.normal(0, 0.5, 2000)
    assert thermal_slope_c_per_util(util, ambient, cpu) == pytest.approx(28.0, abs=0.2)
    assert thermal_slope_c_per_util(np.full(50, 0.3), ambient[:50], cpu[:50]) is None


def test_default_models_price_even_a_tiny_pod_above_zero_watts_everywhere() -> None:
    # Trees are step functions of u: inside a step a small pod adds exactly 0 W and ties.
    # On this node a monotone forest beats the smooth families by more than the margin.
    fleet = synth_fleet(2, 72, 60, seed=7).dropna(subset=["ambient_temp_c", "cpu1_temp_c"])
    rows = next(r for r in iter_node_rows(fleet, FEATURE_FILL) if r.node == "node-02")
    outcome = fit_node(rows, FitSettings(min_rows=100))
    assert outcome.onnx is not None
    grid = np.tile(np.median(rows.features, axis=0), (200, 1)).astype(np.float32)
    grid[:, 0] = np.linspace(0.0, 0.99, 200)
    tiny_pod = grid.copy()
    tiny_pod[:, 0] += 0.003  # 100m on a 32-core node
    increase_w = onnx_predict_w(outcome.onnx, tiny_pod) - onnx_predict_w(outcome.onnx, grid)
    assert (increase_w > 0).all(), f"{outcome.family}: {np.sum(increase_w <= 0)} flat spots"


def test_cli_rejects_an_unknown_family_in_one_line(tmp_path) -> None:
    metrics = tmp_path / "m.csv"
    synth_fleet(1, 2, 60, seed=1).to_csv(metrics, index=False)
    completed = run_fit_cli(
        "--input", str(metrics), "--out", str(tmp_path / "b"), "--families", "poly3,spline"
    )
    assert completed.returncode == 2
    assert "unknown model family spline" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("quiet", [True, False])
def test_an_error_is_said_once_with_or_without_quiet(tmp_path, quiet: bool) -> None:
    metrics = tmp_path / "m.csv"
    synth_fleet(1, 2, 60, seed=1).assign(power_w=-5.0).to_csv(metrics, index=False)
    command = [sys.executable, "-m", "training.fit", "--input", str(metrics), "--out"]
    command += [str(tmp_path / "b"), *(["--quiet"] if quiet else [])]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2
    said = [line for line in completed.stderr.splitlines() if "none left to fit" in line]
    assert len(said) == 1, completed.stderr
    assert said[0].startswith("python -m training.fit: error: all ")


def test_trees_are_ruled_out_across_a_gap_in_utilisation() -> None:
    rows = _falling_rows()
    util = np.where(rows.features[:, 0] < 0.5, 0.02, 0.95).astype(np.float32)  # idle or busy
    features = rows.features.copy()
    features[:, 0] = util
    gapped = NodeRows(rows.node, rows.time_s, features, 100 + 150 * util.astype(np.float64))
    families = ("sqrt2", "sqrt3", "sqrt3t2", "rfmono")
    outcome = fit_node(gapped, FitSettings(min_rows=100, families=families))
    by_family = {c["family"]: c for c in outcome.candidates}
    assert "gap of 0.930" in by_family["rfmono"]["skipped"]
    assert outcome.family in {"sqrt2", "sqrt3", "sqrt3t2"}


def test_monotonicity_is_also_checked_with_cpu_temperatures_following_load() -> None:
    """The predictor raises CPU temperatures along u; a model that gives watts back for a hotter
    CPU can pass at fixed temperatures and still make P(u) fall on the predictor's curve."""
    rng = np.random.default_rng(9)
    n = 800
    util = rng.uniform(0, 1, n)
    ambient = 22 + rng.normal(0, 1, n)
    cpu1 = 50 + rng.normal(0, 8, n)  # uncorrelated with load here, so both effects are identified
    features = np.column_stack([util, ambient, cpu1, cpu1]).astype(np.float32)
    power_w = 100 + 100 * util - 3 * (cpu1 - 50)
    model = fit_family(FAMILIES["sqrt2"], features, power_w, seed=0)
    typical = np.median(features, axis=0)

    fixed = monotonic_verdict(model, typical, 0.05)
    assert fixed["verdict"] == "pass" and fixed["max_drop_along_thermal_w"] == 0.0
    slopes = {"cpu1_temp_c_per_util": 40.0, "cpu2_temp_c_per_util": 40.0}
    along = monotonic_verdict(model, typical, 0.05, slopes)
    assert along["max_drop_w"] == fixed["max_drop_w"]
    assert along["verdict"] == "fail"
    assert along["max_drop_along_thermal_w"] > 10  # -120 W of temperature against +100 W of load


def _prometheus_samples(nodes: dict[str, float], start_s: int, count: int, step_s: int) -> list:
    """node_exporter CPU counters, ipmi temperatures and DCMI power for a few nodes whose power
    follows utilisation (`nodes`: name -> watts at full load)."""
    rng = np.random.default_rng(8)
    times_s = start_s + step_s * np.arange(count)
    samples: list = []
    for node, max_w in nodes.items():
        util = np.clip(
            0.5 + 0.45 * np.sin(np.arange(count) / 7.0) + rng.normal(0, 0.03, count), 0, 1
        )
        busy_s = np.concatenate([[0.0], np.cumsum(util[1:] * step_s)])
        base = {"node": node}
        cpu_labels = {"instance": f"{node}:9100", "job": "node", **base, "cpu": "0"}
        for mode, counter in (
            ("idle", 10_000 + np.arange(count) * step_s - busy_s),
            ("user", busy_s),
        ):
            samples += [
                ("node_cpu_seconds_total", {**cpu_labels, "mode": mode}, t, v)
                for t, v in zip(times_s, counter, strict=True)
            ]
        uname = {"instance": f"{node}:9100", "job": "node", **base, "nodename": node}
        samples += [("node_uname_info", uname, t, 1.0) for t in times_s]
        ipmi = {"instance": f"{node}:9290", "job": "ipmi", **base}
        for name, sensor_id, temps_c in (
            ("Inlet Temp", "1", np.round(22 + rng.normal(0, 0.3, count))),
            ("CPU1 Temp", "2", np.round(45 + 30 * util)),
        ):
            samples += [
                ("ipmi_temperature_celsius", {**ipmi, "name": name, "id": sensor_id}, t, v)
                for t, v in zip(times_s, temps_c, strict=True)
            ]
        # power follows the utilisation of the interval that ends at the sample
        interval_util = np.concatenate([[util[0]], util[1:]])
        power_w = np.round(0.4 * max_w + 0.6 * max_w * interval_util)
        samples += [
            ("ipmi_dcmi_power_consumption_watts", ipmi, t, v)
            for t, v in zip(times_s, power_w, strict=True)
        ]
    return samples


@pytest.mark.prometheus
def test_collect_then_fit_from_a_real_prometheus(tmp_path) -> None:
    require_prometheus()
    start_s, count, step_s = 1_767_571_200, 900, 60  # 2026-01-05, 15 h at 60 s
    samples = _prometheus_samples({"node-a": 300.0, "node-b": 450.0}, start_s, count, step_s)
    with start_prometheus(tmp_path / "prom", openmetrics_text=write_openmetrics(samples)) as prom:
        completed = run_fit_cli(
            "--prometheus", prom.url,
            "--start", str(start_s + 300), "--end", str(start_s + (count - 1) * step_s),
            "--step", "60", "--out", str(tmp_path / "bundle"), "--min-rows", "200",
        )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    bundle = read_bundle(tmp_path / "bundle")
    assert set(bundle.nodes) == {"node-a", "node-b"}
    report = json.loads((tmp_path / "bundle-report" / "report.json").read_text())
    assert report["input"]["sources"][0].startswith(prom.url)
    for entry in report["nodes"]:
        assert entry["model"] == "own"
        low, high = entry["power_range_w"]
        assert high > 1.5 * low  # the collected power really followed the load
        assert entry["metrics"]["mape_pct"] < entry["baseline"]["mape_pct"] + 1.0


def test_unreachable_prometheus_is_a_one_line_error(tmp_path) -> None:
    # As a person types it (no --quiet): the one error line, no urllib3 retry warnings first.
    completed = subprocess.run(
        [
            sys.executable, "-m", "training.fit",
            "--prometheus", f"http://127.0.0.1:{free_port()}",
            "--start", "2026-01-05T00:00:00Z", "--end", "2026-01-05T06:00:00Z",
            "--out", str(tmp_path / "bundle"),
        ],
        cwd=fit_cli.REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert completed.returncode == 1  # a runtime failure, as training.collect says it
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("python -m training.fit: error: Prometheus at http://127.0.0.1:")
    assert "cannot connect" in line
    assert not (tmp_path / "bundle").exists()


def test_relative_start_and_end_reach_the_collector_not_argparse(tmp_path) -> None:
    # `-7d` looks like a flag to argparse; fit joins it to its flag as collect's CLI does.
    completed = run_fit_cli(
        "--prometheus", f"http://127.0.0.1:{free_port()}",
        "--start", "-7d", "--end", "-1h", "--out", str(tmp_path / "bundle"),
    )  # fmt: skip
    assert completed.returncode == 1  # reached the collector: Prometheus is not there
    assert "expected one argument" not in completed.stderr
    assert "127.0.0.1" in completed.stderr and "Traceback" not in completed.stderr


def test_a_streamed_directory_fits_the_same_models_as_the_whole_table(tmp_path) -> None:
    fleet = synth_fleet(3, 24, 120, seed=5)
    write_metrics(fleet, tmp_path / "whole.parquet")
    per_node = tmp_path / "per-node"
    for node, rows in fleet.groupby("node"):
        write_metrics(rows, per_node / f"{node}.parquet")
    settings = FitSettings(families=("sqrt2", "sqrt3"), min_rows=100)
    stream = stream_metrics(per_node)
    assert len(stream.groups) == 3
    streamed = fit_fleet(stream, tmp_path / "streamed", settings=settings, jobs=2, progress=False)
    whole = fit_fleet(
        load_metrics(tmp_path / "whole.parquet"),
        tmp_path / "whole",
        settings=settings,
        jobs=1,
        progress=False,
    )
    for key in ("rows_read", "rows_used", "dropped", "training_window"):
        assert streamed.report["input"][key] == whole.report["input"][key]
    assert [e["metrics"] for e in streamed.report["nodes"]] == [
        e["metrics"] for e in whole.report["nodes"]
    ]
    streamed_bundle, whole_bundle = (
        read_bundle(tmp_path / "streamed"),
        read_bundle(tmp_path / "whole"),
    )
    assert {n: e.info for n, e in streamed_bundle.nodes.items()} == {
        n: e.info for n, e in whole_bundle.nodes.items()
    }


def test_a_node_split_over_two_cleaned_groups_is_refused(tmp_path) -> None:
    fleet = synth_fleet(1, 24, 120, seed=5)
    half = len(fleet) // 2
    write_metrics(fleet.iloc[:half], tmp_path / "first.parquet")
    write_metrics(fleet.iloc[half:], tmp_path / "second.parquet")
    # stream_metrics would put both files in one group; a hand-made plan that splits them must
    # not fit the node twice as two halves
    stream = MetricsStream(
        groups=((tmp_path / "first.parquet",), (tmp_path / "second.parquet",)), n_nodes=1
    )
    with pytest.raises(FitError, match="node-01 has rows in two separately cleaned groups"):
        fit_fleet(stream, tmp_path / "bundle", settings=FitSettings(min_rows=100), jobs=1)
    assert len(stream_metrics(tmp_path).groups) == 1
    assert not (tmp_path / "bundle").exists()


def test_max_model_bytes_passes_over_a_large_family_for_the_next_one() -> None:
    fleet = synth_fleet(1, 24, 60, seed=9).dropna(subset=["ambient_temp_c", "cpu1_temp_c"])
    rows = next(iter_node_rows(fleet, FEATURE_FILL))
    families = ("sqrt3t2", "sqrt2")
    free = fit_node(rows, FitSettings(min_rows=100, families=families))
    assert free.family == "sqrt3t2"  # without a limit the temperature-aware curve wins here...
    limit = len(free.onnx) - 1
    limited = fit_node(rows, FitSettings(min_rows=100, families=families, max_model_bytes=limit))
    assert limited.family == "sqrt2"  # ...and with one just under its size the next one ships
    assert len(limited.onnx) <= limit
    by_family = {c["family"]: c for c in limited.candidates}
    assert by_family["sqrt3t2"]["over_max_model_bytes"] is True
    assert by_family["sqrt3t2"]["onnx_bytes"] == len(free.onnx)
    assert by_family["sqrt2"]["onnx_bytes"] == len(limited.onnx)
    assert all("onnx" not in c for c in limited.candidates)  # bytes stay out of the report
    assert limited.parity is not None and limited.parity.passed

    nothing_fits = fit_node(rows, FitSettings(min_rows=100, families=families, max_model_bytes=1))
    assert nothing_fits.onnx is None
    assert nothing_fits.fallback_reason == (
        "no family passed the monotonicity check with an ONNX within --max-model-bytes 1"
    )


def test_report_gives_model_bytes_by_family_as_written_in_the_bundle(fitted) -> None:
    bundle = read_bundle(fitted["out"])
    sizes: dict[str, list[int]] = {}
    for entry in bundle.nodes.values():
        sizes.setdefault(entry.info["family"], []).append(bundle.model_path(entry).stat().st_size)
    by_family = fitted["report"]["summary"]["model_bytes_by_family"]
    assert by_family == {
        family: {"models": len(s), "mean": round(sum(s) / len(s)), "max": max(s)}
        for family, s in sorted(sizes.items())
    }
    for entry in fitted["report"]["nodes"]:
        assert entry["onnx_bytes"] is not None  # own models and the scaled fallback


def test_a_fleet_whose_pooled_curve_dips_still_gets_a_rising_fallback(tmp_path) -> None:
    # Seed 2's 16 nodes: big servers idling and small ones busy, so pooled power falls with
    # utilisation; a fallback fitted on pooled rows dipped. The fleet's shape cannot.
    cleaned = clean_metrics(synth_fleet(16, 72, 60, seed=2), source="synth seed 2")
    run = fit_fleet(cleaned, tmp_path / "bundle", progress=False, jobs=1)
    fallback = run.report["fallback"]
    assert fallback["family"] == "fleet-shape"
    assert fallback["monotonic"]["verdict"] == "pass"
    own_curves = np.array([e["steady_curve_w"] for e in run.report["nodes"]])
    assert len(own_curves) == 16
    curve = np.array(fallback["steady_curve_w"])
    assert np.all(np.diff(curve) > 0)
    # the fleet's typical node: median idle power, median range
    assert curve[0] == pytest.approx(np.median(own_curves[:, 0]), abs=0.01)
    assert curve[-1] - curve[0] == pytest.approx(
        np.median(own_curves[:, -1] - own_curves[:, 0]), abs=0.01
    )
    bundle = read_bundle(tmp_path / "bundle")
    grid = np.zeros((11, len(FEATURES)), dtype=np.float32)
    grid[:, 0] = np.linspace(0, 1, 11)
    served_w = onnx_predict_w(bundle.model_path(bundle.fallback).read_bytes(), grid)
    assert served_w == pytest.approx(curve, abs=0.01)
