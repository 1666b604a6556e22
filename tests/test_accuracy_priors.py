"""bench.accuracy_priors: the priors it compares, the banks it judges them against, its output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import accuracy_priors, accuracy_specpower
from bench.specpower_split import DEFAULT_CSV, SPLIT_CSV
from training.node_facts import generation
from training.shape_prior import GRID_UTIL

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / DEFAULT_CSV
ABOVE_HALF = np.arange(6, 11)  # lowload's scored grid points
ODD = np.array([1, 3, 5, 7, 9])  # levels'


def concave_curve_w(idle_w: float, dynamic_w: float, power: float) -> np.ndarray:
    return idle_w + dynamic_w * GRID_UTIL**power


def test_the_line_is_exact_on_a_straight_curve_whatever_was_shown() -> None:
    curve_w = 80.0 + 170.0 * GRID_UTIL
    bank_w = np.stack([concave_curve_w(60, 200, p) for p in (0.6, 0.8, 1.2)])
    for sampling, scored in (("lowload", ABOVE_HALF), ("levels", ODD)):
        predicted_w = accuracy_priors.line_prior(bank_w, curve_w, sampling)
        np.testing.assert_allclose(predicted_w, curve_w[scored])


def test_the_nearest_server_lends_its_shape_not_its_watts() -> None:
    # the node has the shape of the bank's second server at twice its watts: nearest 1 finds
    # it from the shown points alone and scales it through the node's own idle and top
    node_w = 2 * concave_curve_w(50, 150, 0.7)
    bank_w = np.stack([concave_curve_w(50, 150, p) for p in (0.5, 0.7, 0.9, 1.3)])
    for sampling, scored in (("lowload", ABOVE_HALF), ("levels", ODD)):
        predicted_w = accuracy_priors.nearest_prior(1)(bank_w, node_w, sampling)
        np.testing.assert_allclose(predicted_w, node_w[scored])
        mean_w = accuracy_priors.mean_shape_prior(bank_w, node_w, sampling)
        assert accuracy_specpower.mape_pct(mean_w, node_w[scored]) > 0.5


def test_the_forest_learns_from_the_facts_what_the_shown_shape_cannot_tell() -> None:
    # every bank server shows the same shape at 0-50 %; above it, servers with many cores per
    # socket climb steeply (turbo) and the others flatten. Only the facts tell them apart.
    rng = np.random.default_rng(3)
    low = concave_curve_w(100, 200, 0.8)
    bank_w, hardware = [], []
    for _ in range(60):
        cores_per_socket = float(rng.choice([8, 64]))
        curve_w = low.copy()
        steep = cores_per_socket > 32
        curve_w[6:] = low[5] + (GRID_UTIL[6:] - 0.5) * (400 if steep else 150)
        bank_w.append(curve_w * rng.uniform(0.8, 1.2))
        hardware.append((2 * cores_per_socket, 2.0))
    bank_w, hardware = np.array(bank_w), np.array(hardware)
    steep_node_w = bank_w[np.flatnonzero(hardware[:, 0] > 64)[0]]
    steep_hardware = np.array([128.0, 2.0])
    args = (bank_w, steep_node_w, "lowload", ["modern"] * 60, "modern", None, hardware)
    with_facts = accuracy_priors.ForestPrior(with_facts=True)(*args, steep_hardware)
    shape_only = accuracy_priors.ForestPrior(with_facts=False)(*args, steep_hardware)
    truth_w = steep_node_w[ABOVE_HALF]
    assert accuracy_specpower.mape_pct(with_facts, truth_w) < 1.0
    assert accuracy_specpower.mape_pct(shape_only, truth_w) > 5.0
    # the facts forest needs them, and says so
    with pytest.raises(ValueError, match="hardware"):
        accuracy_priors.ForestPrior(with_facts=True)(bank_w, steep_node_w, "lowload")


def test_the_banks_keep_near_twins_apart_only_when_judging_by_processor() -> None:
    sample = accuracy_priors.Sample(
        curves_w=np.stack([concave_curve_w(50 + i, 150, 0.7) for i in range(5)]),
        models=np.array(["a", "a", "b", "c", "c"]),
        scored_side=np.array([False, False, True, False, True]),
        generations=[None] * 5,
        judged=np.ones(5, dtype=bool),
    )
    by_processor = dict(accuracy_priors.banks(sample, "by processor"))
    assert by_processor[0].tolist() == [False, False, True, True, True]
    assert by_processor[4].tolist() == [True, True, True, False, False]
    leave_one_out = dict(accuracy_priors.banks(sample, "leave one out"))
    assert leave_one_out[0].tolist() == [False, True, True, True, True]
    scored = dict(accuracy_priors.banks(sample, "scored side"))
    assert sorted(scored) == [2, 4]
    # the scored side is judged against the prior side without any scored processor model
    # (server 3 shares model c with scored server 4)
    assert scored[2].tolist() == [True, True, False, False, False]
    with pytest.raises(ValueError, match="unknown judging"):
        accuracy_priors.banks(sample, "by vendor")


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_the_bench_judges_every_prior_three_ways(monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    assert accuracy_priors.main(["--sampling", "all", "--split", str(SPLIT_CSV)]) == 0
    out = capsys.readouterr().out
    assert "116 servers of 62 processor models" in out
    assert out.count("| prior | by processor (116 servers) | leave one out (116 servers) |") == 2
    assert out.count("scored side (39 servers)") == 2
    for name in accuracy_priors.PRIORS:
        assert out.count(f"| {name} |") == 2


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_learners_add_their_rows_with_the_nodes_hardware(monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    # fewer trees than the bench's 300: the rows and the facts' plumbing are what is tested
    monkeypatch.setattr(
        accuracy_priors,
        "LEARNERS",
        {
            "forest on the shape": accuracy_priors.ForestPrior(False, n_trees=10),
            "forest on shape and facts": accuracy_priors.ForestPrior(True, n_trees=10),
        },
    )
    assert accuracy_priors.main(["--sampling", "lowload", "--learners"]) == 0
    out = capsys.readouterr().out
    for name in [*accuracy_priors.PRIORS, "forest on the shape", "forest on shape and facts"]:
        assert out.count(f"| {name} |") == 1
    sample = accuracy_priors.read(DEFAULT_CSV, SPLIT_CSV)
    assert sample.hardware is not None and sample.hardware.shape == (len(sample.curves_w), 2)
    # every server has its cores and sockets, the other sample's prior side included
    assert (sample.hardware >= 1).all() and (sample.hardware[:, 0] >= sample.hardware[:, 1]).all()


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_the_shipped_prior_on_the_scored_side_is_what_the_scored_bench_prints(monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    sample = accuracy_priors.read(DEFAULT_CSV, SPLIT_CSV)
    judged = accuracy_priors.judge(sample, "lowload", "scored side")["shipped prior"]
    servers = accuracy_specpower.load_servers(DEFAULT_CSV, SPLIT_CSV)
    loads_u = GRID_UTIL[ABOVE_HALF]
    direct = [
        accuracy_specpower.mape_pct(
            accuracy_specpower.prior_from_exact_points(
                servers.prior, curve_w, "lowload", loads_u, generation(processor)
            ),
            curve_w[ABOVE_HALF],
        )
        for curve_w, processor in zip(servers.curves_w, servers.table["processor"], strict=True)
    ]
    np.testing.assert_allclose(judged, direct)
