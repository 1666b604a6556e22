"""bench.scheduler_throughput runs end to end at a small size: a real kube-scheduler binds every
pod in each mode, and the summary holds a rate per mode and where the time went on both sides.

A benchmark, not a timed test: nothing here asserts a rate beyond it being measured.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scheduler_throughput import MODES, main


@pytest.mark.slow
def test_a_small_run_binds_every_pod_in_each_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "throughput.json"
    assert main(["--nodes", "20", "--pods", "40", "--rounds", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {run["mode"] for run in result["runs"]} == set(MODES)
    for run in result["runs"]:
        assert run["bound"] == 40, run
        assert run["pods_per_s"] > 0
        assert run["scheduler_ms"].get("Filter", 0) > 0  # the scheduler's own histogram, read
    summary = result["summary"]["20"]
    assert set(summary["pods_per_s"]) == set(MODES)
    # The extender answered both verbs in the shipped mode (its own /metrics, server side).
    assert {"filter", "prioritize"} <= set(summary["extender_ms"])
    printed = capsys.readouterr().out
    assert "prioritize only" in printed and "where the time goes" in printed
