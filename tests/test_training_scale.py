"""bench.training_scale: its measuring pieces on a tiny fleet (the bench itself prints figures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.training_scale import bundle_sizes, cpu_bound_s, measure_fit, parse_ints
from predictor.bundle import read_bundle
from training.synth import write_fleet_files

REPO = Path(__file__).resolve().parents[1]


def test_help_documents_every_flag_with_its_default() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench.training_scale", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0
    text = " ".join(completed.stdout.split())  # argparse wraps lines where it likes
    for flag, default in (
        ("--nodes", "default 100,1000"),
        ("--rows", "default 1000,10000"),
        ("--nodes-per-file", "default 10"),
        ("--collect-nodes", "default 20,100"),
        ("--collect-rows", "default 1000"),
        ("--jobs", "default 0"),
        ("--work", "default out/bench-training-scale"),
    ):
        assert flag in text and default in text
    assert "EXTRAPOLATED" in text  # says which figure is not measured


def test_parse_ints_and_the_cpu_bound_estimate() -> None:
    assert parse_ints("100, 1000") == [100, 1000]
    with pytest.raises(Exception, match="positive integers"):
        parse_ints("0,10")
    assert cpu_bound_s(cpu_s=100.0, parent_cpu_s=10.0, jobs=2) == 50.0
    assert cpu_bound_s(cpu_s=100.0, parent_cpu_s=70.0, jobs=2) == 70.0  # the parent is the limit


def test_measure_fit_streams_a_directory_and_sizes_the_bundle(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_fleet_files(data, 3, hours=12, step_s=60, seed=2, nodes_per_file=2)
    result = measure_fit(str(data), str(tmp_path / "bundle"), jobs=1)
    assert result["rows_used"] > 3 * 600
    assert result["nodes_own"] == 3
    assert result["peak_self_mib"] >= result["baseline_mib"] > 0
    assert result["cpu_s"] > 0 and result["wall_s"] > 0
    assert (tmp_path / "bundle.log").read_text().count("fitting 3 nodes") == 1

    total, by_family = bundle_sizes(tmp_path / "bundle")
    bundle = read_bundle(tmp_path / "bundle")
    assert sum(count for count, _, _ in by_family.values()) == len(bundle.nodes) == 3
    model_bytes = sum(bundle.model_path(e).stat().st_size for e in bundle.nodes.values())
    assert sum(summed for _, summed, _ in by_family.values()) == model_bytes
    assert total > model_bytes  # the fallback and the manifest too
