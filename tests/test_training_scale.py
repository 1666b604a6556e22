"""bench.training_scale: its measuring pieces on a tiny fleet (the bench itself prints figures)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.training_scale import (
    _one_block_hours,
    bundle_sizes,
    measure_end_to_end,
    measure_fit,
    parse_ints,
    parse_sizes,
    same_models,
)
from predictor.bundle import read_bundle
from tests.support.prometheus import require_prometheus
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
        ("--end-to-end", "default 100x10000,1000x10000"),
        ("--jobs", "default 0"),
        ("--work", "default out/bench-training-scale"),
        ("--dask", "local:1"),
    ):
        assert flag in text and default in text
    assert "training.fit --prometheus" in text  # says what the end-to-end figure runs


def test_parse_ints_and_sizes() -> None:
    assert parse_ints("100, 1000") == [100, 1000]
    with pytest.raises(Exception, match="positive integers"):
        parse_ints("0,10")
    assert parse_sizes("1000x10000, 100x1000") == [(1000, 10_000), (100, 1000)]
    assert parse_sizes("none") == []
    with pytest.raises(Exception, match=r"NODESxROWS.*'1000'"):
        parse_sizes("1000")


@pytest.mark.parametrize("first_s", [0.0, 1_767_571_200.0, 1_767_650_000.0])
def test_one_backfilled_block_holds_the_whole_range(first_s: float) -> None:
    last_s = first_s + 10_000 * 60
    hours = _one_block_hours(first_s, last_s)
    assert hours >= 2 and first_s // (hours * 3600) == last_s // (hours * 3600)


@pytest.mark.prometheus
def test_end_to_end_runs_fit_against_a_real_prometheus(tmp_path: Path) -> None:
    require_prometheus()  # the bench's own helpers raise instead of skipping
    in_process, dask = measure_end_to_end(
        4, 900, tmp_path / "e2e", seed=3, jobs=1, nodes_per_file=2,
        modes=["in-process", "local:2"],
    )  # fmt: skip
    run = in_process
    assert run["nodes_own"] > 0 and run["rows_used"] > 4 * 800  # fitted what it collected
    assert run["samples"] > 4 * 6 * 800  # CPU counter, uname, 3 temperatures, power per node
    # the split comes from the collector's log line: it must have been found
    assert 0 < run["collect_s"] < run["wall_s"]
    assert run["peak_mib"] > 100 and run["server_peak_mib"] > 10
    assert Path(run["log"]).read_text().count("training.collect: collected") == 1
    # the same Prometheus through --dask local:2: the same models, its workers measured
    assert dask["mode"] == "local:2" and dask["workers"] == 2
    assert dask["rows_used"] == run["rows_used"] and same_models(run["bundle"], dask["bundle"])
    assert len(dask["distributed"]["worker_peak_mib"]) == 2
    assert sum(dask["distributed"]["worker_busy_s"].values()) > 0


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
