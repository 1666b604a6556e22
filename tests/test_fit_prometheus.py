"""`python -m training.fit --prometheus`: collect from a real Prometheus, then fit, streamed.

The data is a synthetic fleet's exporter samples (node_exporter CPU counters, ipmi_exporter
temperatures and DCMI power) backfilled into a real Prometheus with promtool, as
`bench.training_scale` does at fleet scale. Collecting and fitting in one command must give
the models that `training.collect` followed by `fit --input` gives, without leaving the
collected spill behind.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bench.training_scale import backfill_prometheus
from predictor.bundle import Bundle, read_bundle
from tests.support import fit_cli
from tests.support.prometheus import PrometheusServer, require_prometheus, start_prometheus

pytestmark = pytest.mark.prometheus

NODES = 4
ROWS = 900  # 15 h at bench.training_scale's 60 s step
MIN_ROWS = "300"


def run_fit(*args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    return fit_cli.run_fit(*args, "--min-rows", MIN_ROWS, tmpdir=tmpdir)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    """(Prometheus, --start, --end) serving NODES synthetic nodes x ROWS steps."""
    require_prometheus()
    work = tmp_path_factory.mktemp("fleet")
    loaded = backfill_prometheus(NODES, ROWS, str(work), seed=5)
    with start_prometheus(work) as prometheus:  # the backfilled data directory, reopened
        yield prometheus, fit_cli.iso(loaded["first_s"] + 300), fit_cli.iso(loaded["last_s"])


def _predict_w(bundle: Bundle, node: str) -> np.ndarray:
    """The node's model on a grid of utilisations at fixed temperatures, through onnxruntime."""
    entry = bundle.nodes[node]
    session = ort.InferenceSession(str(bundle.model_path(entry)))
    features = np.full((21, len(bundle.features)), 35.0, dtype=np.float32)
    features[:, bundle.features.index("cpu_util")] = np.linspace(0.0, 1.0, 21)
    return session.run(None, {session.get_inputs()[0].name: features})[0]


def _report(bundle: Path) -> dict:
    return json.loads((bundle.parent / f"{bundle.name}-report" / "report.json").read_text())


def test_collect_and_fit_in_one_command_equals_collect_then_fit(
    fleet: tuple[PrometheusServer, str, str], tmp_path: Path
) -> None:
    prometheus, start, end = fleet
    spill = tmp_path / "spill"
    spill.mkdir()

    one_go = run_fit(
        "--prometheus", prometheus.url, "--start", start, "--end", end, "--out",
        str(tmp_path / "one-go"), tmpdir=spill,
    )  # fmt: skip
    assert one_go.returncode == 0, one_go.stderr
    # The temporary collection is gone (a library may leave its own dot-file in TMPDIR).
    assert [p.name for p in spill.iterdir() if not p.name.startswith(".")] == []

    kept = tmp_path / "collected"
    keep = run_fit(
        "--prometheus", prometheus.url, "--start", start, "--end", end, "--out",
        str(tmp_path / "keep"), "--keep-collected", str(kept), tmpdir=spill,
    )  # fmt: skip
    assert keep.returncode == 0, keep.stderr
    refit = run_fit("--input", str(kept), "--out", str(tmp_path / "refit"), tmpdir=spill)
    assert refit.returncode == 0, refit.stderr

    # Node-group files of collect's default size: all NODES nodes in one group here.
    assert sorted(p.name for p in kept.iterdir()) == ["nodes-00000.parquet"]
    reports = {name: _report(tmp_path / name) for name in ("one-go", "keep", "refit")}
    for report in reports.values():
        # 15 h is little data: a node may fall back to the fleet model, the same in all three
        own = report["summary"]["nodes_own_model"]
        assert own == reports["refit"]["summary"]["nodes_own_model"] > 0
        assert report["input"]["rows_used"] == reports["refit"]["input"]["rows_used"] > 0
    # Same rows, same fits: the models and their held-out errors agree node by node.
    figures = {
        name: {e["node"]: (e["family"], e["metrics"]) for e in report["nodes"]}
        for name, report in reports.items()
    }
    assert figures["one-go"] == figures["keep"] == figures["refit"]
    assert len(figures["refit"]) == NODES
    # ... and so do the ONNX models' predictions (the files differ in generated names).
    bundles = {name: read_bundle(tmp_path / name) for name in reports}
    assert bundles["one-go"].nodes.keys() == bundles["refit"].nodes.keys()
    for node in bundles["refit"].nodes:
        predictions = {name: _predict_w(bundle, node) for name, bundle in bundles.items()}
        np.testing.assert_array_equal(predictions["one-go"], predictions["refit"])
        np.testing.assert_array_equal(predictions["keep"], predictions["refit"])

    # The report names where the rows came from: Prometheus and the range, or the kept files.
    assert reports["one-go"]["input"]["sources"] == [f"{prometheus.url} [{start} .. {end}]"]
    assert reports["keep"]["input"]["sources"] == [str(kept / "nodes-00000.parquet")]


def test_a_range_without_data_is_a_clear_error_and_writes_no_bundle(
    fleet: tuple[PrometheusServer, str, str], tmp_path: Path
) -> None:
    prometheus, _, _ = fleet
    out = tmp_path / "bundle"
    done = run_fit(
        "--prometheus", prometheus.url, "--start", "2020-01-01T00:00:00Z", "--end",
        "2020-01-01T06:00:00Z", "--out", str(out), tmpdir=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"Prometheus at {prometheus.url} [2020-01-01T00:00:00+00:00" in done.stderr
    assert "has no data for any node" in done.stderr
    assert not out.exists()


def test_keep_collected_needs_prometheus(tmp_path: Path) -> None:
    done = run_fit(
        "--input", str(tmp_path), "--keep-collected", str(tmp_path / "c"), "--out",
        str(tmp_path / "b"), tmpdir=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--keep-collected only apply with --prometheus" in " ".join(done.stderr.split())
