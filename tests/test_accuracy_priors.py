"""bench.accuracy_priors: the priors it compares, the banks it judges them against, its output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import accuracy_priors, accuracy_specpower
from bench.specpower_split import DEFAULT_CSV, SPLIT_CSV
from training import prior_rise
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


def test_a_near_twin_lends_its_shape_through_the_servers_own_shown_points() -> None:
    # servers 0 and 1 share a processor model and a shape at different watts; server 2 has
    # its own model (no near-twin) and server 3 shares model "b" but is not judged
    shared_w = concave_curve_w(40, 120, 0.6)
    other_w = concave_curve_w(70, 200, 1.4)
    sample = accuracy_priors.Sample(
        curves_w=np.stack([shared_w, 1.5 * shared_w, other_w, other_w]),
        models=np.array(["a", "a", "c", "b"]),
        scored_side=np.zeros(4, dtype=bool),
        generations=[None] * 4,
        judged=np.array([True, True, True, False]),
    )
    for sampling in ("lowload", "levels"):
        positions, errors = accuracy_priors.same_processor_reference(sample, sampling)
        assert positions.tolist() == [0, 1]
        np.testing.assert_allclose(errors, 0.0, atol=1e-9)
    # another shape through the node's own points: far from a different shape,
    # and between two shown points it stays between their watts
    predicted_w = accuracy_priors._through_shown(other_w, shared_w, "levels")
    assert accuracy_specpower.mape_pct(predicted_w, shared_w[ODD]) > 1.0
    assert (predicted_w > shared_w[ODD - 1]).all() and (predicted_w < shared_w[ODD + 1]).all()


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_the_bench_judges_every_prior_three_ways(monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    # the rows are tested here, not the figures: small facts forests, in a cache of their own
    monkeypatch.setattr(prior_rise, "FACTS_FOREST_TREES", 10)
    monkeypatch.setattr(accuracy_priors, "_bank_priors", accuracy_priors._BankPriors())
    assert accuracy_priors.main(["--sampling", "all", "--split", str(SPLIT_CSV)]) == 0
    out = capsys.readouterr().out
    assert "116 servers of 62 processor models" in out
    assert out.count("| prior | by processor (116 servers) | leave one out (116 servers) |") == 2
    assert out.count("scored side (39 servers)") == 2
    for name in accuracy_priors.PRIORS:
        assert out.count(f"| {name} |") == 2
    # and the near-twin reference, on the servers that have one, beside the shipped prior
    assert out.count("near-twins, a reference: the 74 servers") == 2
    assert out.count("| the same processor model's other servers |") == 2
    assert out.count("| shipped prior, by processor |") == 2


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
                servers.prior, curve_w, "lowload", loads_u, accuracy_specpower.server_facts(row)
            ),
            curve_w[ABOVE_HALF],
        )
        for curve_w, (_, row) in zip(servers.curves_w, servers.table.iterrows(), strict=True)
    ]
    np.testing.assert_allclose(judged, direct)
