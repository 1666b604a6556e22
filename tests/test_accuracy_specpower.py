"""bench.accuracy_specpower's committed split and a short run of the bench itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench import accuracy_cv, accuracy_specpower
from bench.specpower_split import DEFAULT_CSV, SAMPLES, SPLIT_CSV, draw_split, read_split

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / DEFAULT_CSV
MODERN_SAMPLE, MODERN_SPLIT = (REPO / SAMPLES["modern"][0]), SAMPLES["modern"][1]


def test_no_processor_model_is_on_both_sides_of_the_split() -> None:
    split = read_split(SPLIT_CSV)
    sides = split.groupby("processor_model")["split"].nunique()
    assert (sides == 1).all()
    counts = split["split"].value_counts()
    assert counts["eval"] == round(len(split) / 3) and counts["prior"] == len(split) - 39


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_the_committed_split_is_what_the_rule_draws_from_the_sample() -> None:
    drawn = draw_split(pd.read_csv(SAMPLE))
    pd.testing.assert_frame_equal(drawn.reset_index(drop=True), read_split(SPLIT_CSV))


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_the_bench_scores_every_held_out_server(monkeypatch, capsys) -> None:
    monkeypatch.chdir(REPO)
    code = accuracy_specpower.main(
        ["--sampling", "levels,lowload", "--hours", "48", "--jobs", "1", "--quiet"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "39 scored" in out and "learned from 154 servers of every sample's prior side" in out
    assert "scored at 10, 30, 50, 70, 90 %" in out and "scored at 60, 70, 80, 90, 100 %" in out
    assert "line through idle and 50 %, extended" in out
    assert out.count("on the fleet fallback: 0") == 2
    assert "| levels | tight |" in out and "| lowload | tight |" in out
    assert out.count("the prior from the exact watts shown:") == 2


@pytest.mark.skipif(not SAMPLE.is_file(), reason=f"{SAMPLE} (beside the repository) is missing")
def test_cross_validation_never_judges_a_server_by_a_prior_that_saw_its_processor(
    monkeypatch, capsys
) -> None:
    monkeypatch.chdir(REPO)
    side = accuracy_cv.load_side(DEFAULT_CSV, SPLIT_CSV, "prior")
    split = read_split(SPLIT_CSV)
    assert len(side.names) == (split["split"] == "prior").sum()
    curves = {tuple(np.round(c, 6)): m for c, m in zip(side.curves_w, side.models, strict=True)}
    modern = accuracy_specpower.prior_side(*SAMPLES["modern"], "modern")
    curves |= {
        tuple(np.round(c, 6)): m for c, m in zip(modern.curves_w, modern.models, strict=True)
    }
    for model, prior in zip(side.models, side.priors, strict=True):
        seen = {curves.get(tuple(np.round(c, 6))) for c in prior.bank_watts}
        # both samples' prior sides only, never its own processor model
        assert model not in seen and None not in seen
        assert len(prior.bank_watts) == len(curves) - sum(m == model for m in side.models)
    assert (
        accuracy_cv.main(["--sampling", "levels", "--temperature", "tight", "--hours", "24"]) == 0
    )
    out = capsys.readouterr().out
    assert "prior side: 77 servers" in out and "levels       tight" in out
    assert "[prior from exact watts" in out  # levels hides 10, 30, ..., 90 %: the prior's limit


@pytest.mark.parametrize("sampling", sorted(accuracy_specpower.SHOWN_GRID_POINTS))
def test_the_prior_from_exact_watts_passes_through_them_and_recovers_a_shape_it_knows(
    sampling: str,
) -> None:
    # A bank of one server shape at many sizes: the prior knows that shape exactly, so from
    # the exact watts at the loads a sampling shows it must draw the loads it hides.
    from training.shape_prior import GRID_UTIL, ShapePrior

    shape = GRID_UTIL**0.6  # concave, as real curves are
    sizes = np.linspace(80, 400, 24)
    bank_w = np.outer(sizes, 0.35 + 0.65 * shape) + np.linspace(0, 3, 24)[:, None] * GRID_UTIL
    prior = ShapePrior.from_curves(bank_w)
    server_w = 150 * (0.35 + 0.65 * shape)
    predicted_w = accuracy_specpower.prior_from_exact_points(prior, server_w, sampling, GRID_UTIL)
    shown = list(accuracy_specpower.SHOWN_GRID_POINTS[sampling])
    np.testing.assert_allclose(predicted_w[shown], server_w[shown], rtol=1e-9)
    assert np.all(np.diff(predicted_w) >= 0)
    hidden = [i for i in range(len(GRID_UTIL)) if i not in shown]
    np.testing.assert_allclose(predicted_w[hidden], server_w[hidden], rtol=0.01)
    # and a server of another shape is not forced onto the bank's: its shown watts still hold
    other_w = 150 * (0.35 + 0.65 * GRID_UTIL**1.4)
    other_pred_w = accuracy_specpower.prior_from_exact_points(prior, other_w, sampling, GRID_UTIL)
    np.testing.assert_allclose(other_pred_w[shown], other_w[shown], rtol=1e-9)


def test_the_modern_split_keeps_processor_models_apart_too() -> None:
    split = read_split(MODERN_SPLIT)
    assert (split.groupby("processor_model")["split"].nunique() == 1).all()
    assert len(split) == 126 and (split["split"] == "eval").sum() == 49


@pytest.mark.skipif(
    not MODERN_SAMPLE.is_file(), reason=f"{MODERN_SAMPLE} (beside the repository) is missing"
)
def test_the_committed_modern_split_is_what_the_rule_draws(monkeypatch) -> None:
    drawn = draw_split(pd.read_csv(MODERN_SAMPLE))
    pd.testing.assert_frame_equal(drawn.reset_index(drop=True), read_split(MODERN_SPLIT))
    monkeypatch.chdir(REPO)
    servers = accuracy_specpower.load_servers(*SAMPLES["modern"])
    assert len(servers.names) == 49
    # the prior knows the generation of every server it learned from: both are there
    assert set(servers.prior.bank_generations) == {"old", "modern"}
    assert servers.prior.for_generation("modern").n_servers == 77
