"""Node facts (contract 1's optional columns) and the interval above a node's highest load."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from scipy.interpolate import PchipInterpolator

from livedata.metrics_table import CONTRACT_COLUMNS, FACT_COLUMNS, FEATURES
from predictor.curves import CurveBuilder, ExtrapolationBand
from predictor.model import Predictor
from training import prior_rise
from training.dataset import MetricsInputError, clean_metrics
from training.fit import FitSettings, fit_fleet
from training.fit.node import iter_node_rows
from training.fit.settings import FEATURE_FILL
from training.monoshape import extrapolation_interval, fit_monotone_curve
from training.node_facts import NodeFacts, generation, nfd_cpu_model, processor_model
from training.report import format_table, full_load_band
from training.shape_prior import GRID_UTIL, ShapePrior, default_shape_prior, load_shapes_table
from training.synth import synth_fleet


@pytest.mark.parametrize(
    ("cpu_model", "expected"),
    [
        ("AMD EPYC 7763 64-Core Processor", "modern"),
        ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", "modern"),
        ("Intel(R) Xeon(R) 6780E", "modern"),
        ("Intel(R) Xeon(R) CPU E5-2660 v4 @ 2.00GHz", "old"),
        ("Intel Xeon X5670", "old"),
        ("2.6 GHz AMD Opteron 2435", "old"),
        ("GenuineIntel family 6 model 143", "modern"),
        ("GenuineIntel family 6 model 79", "old"),
        ("AuthenticAMD family 25 model 1", "modern"),
        ("AuthenticAMD family 21 model 2", "old"),
        ("QEMU Virtual CPU version 2.5+", None),
        ("", None),
        (None, None),
    ],
)
def test_the_generation_comes_from_the_cpu_model_or_its_cpuid(cpu_model, expected) -> None:
    assert generation(cpu_model) == expected


def test_every_shipped_server_is_placed_in_its_own_period() -> None:
    table = load_shapes_table(("old", "modern"))
    told = [generation(p) for p in table["processor"]]
    assert told == list(table["period"])


def test_an_old_node_is_fitted_against_exactly_the_prior_of_the_old_servers() -> None:
    # old nodes (and the energy bench's synthetic cluster, made of them) see what they saw
    # before the modern servers joined the prior
    old = ShapePrior.from_shapes_table(load_shapes_table(("old",)).drop(columns=["period"]))
    narrowed = default_shape_prior().for_generation("old")
    np.testing.assert_array_equal(narrowed.bank_watts, old.bank_watts)
    np.testing.assert_allclose(narrowed.precision, old.precision)
    assert default_shape_prior().for_generation(None) is default_shape_prior()
    assert default_shape_prior().n_servers == 242


def test_nfd_labels_become_a_cpuid_model_and_processor_names_fold_their_clock() -> None:
    labels = {
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/cpu-model.family": "6",
        "feature.node.kubernetes.io/cpu-model.id": "143",
    }
    assert nfd_cpu_model(labels) == "GenuineIntel family 6 model 143"
    assert nfd_cpu_model({}) is None
    assert processor_model("Intel Xeon Platinum 8180 @2.50GHz") == processor_model(
        "Intel(R) Xeon(R) Platinum 8180 CPU"
    )
    # node_exporter's EPYC names end in their core count, SPECpower's do not
    assert processor_model("AMD EPYC 7763 64-Core Processor") == processor_model("AMD EPYC 7763")
    assert processor_model("Ampere Altra 64-Bit Multi-Core Processor Q64-30") == (
        "ampere altra 64-bit multi-core q64-30"
    )


def _rows(n: int = 4) -> pd.DataFrame:
    stamps = pd.date_range("2026-01-05", periods=n, freq="min", tz="UTC")
    return pd.DataFrame(
        {
            "node": "n1",
            "timestamp": stamps,
            "cpu_util": np.linspace(0.1, 0.4, n),
            "ambient_temp_c": 22.0,
            "cpu1_temp_c": 40.0,
            "cpu2_temp_c": 41.0,
            "power_w": 200.0,
        }
    )


def test_fact_columns_are_kept_by_cleaning_and_empty_facts_drop_no_row() -> None:
    raw = _rows().assign(
        cpu_model=["AMD EPYC 9654", "", None, "AMD EPYC 9654"],
        cpu_cores=["96", "", "96", "96"],
        bmc_max_power_w=[610.0, np.nan, 612.0, 0.0],
    )
    frame = clean_metrics(raw, source="facts").frame
    assert len(frame) == 4
    assert list(frame.columns[: len(CONTRACT_COLUMNS)]) == list(CONTRACT_COLUMNS)
    facts = NodeFacts.from_rows(frame)
    assert facts.cpu_model == "AMD EPYC 9654" and facts.generation == "modern"
    assert facts.cpu_cores == 96 and facts.bmc_max_power_w == 612.0  # 0 W is no reading
    assert facts.psu_rating_w is None and facts.cpu_sockets is None
    without = clean_metrics(_rows(), source="no facts").frame
    assert list(without.columns) == list(CONTRACT_COLUMNS)
    assert not NodeFacts.from_rows(without).known


def test_a_fact_column_of_words_is_refused_with_where() -> None:
    raw = _rows().assign(psu_rating_w=["big", "huge", "large", "800"])
    with pytest.raises(MetricsInputError, match=r"psu_rating_w 'big'.*right column"):
        clean_metrics(raw, source="facts.csv")


def test_synth_writes_the_facts_and_the_fit_reads_them_per_node() -> None:
    fleet = synth_fleet(6, 2, 300, seed=3)
    assert set(FACT_COLUMNS) <= set(fleet.columns)
    cleaned = clean_metrics(fleet, source="synth").frame
    rows = list(iter_node_rows(cleaned, FEATURE_FILL))
    assert len(rows) == 6
    for node in rows:
        node_frame = fleet[fleet["node"] == node.node]
        assert node.facts is not None
        assert node.facts.bmc_max_power_w == pytest.approx(node_frame["power_w"].max())
        assert node.facts.psu_rating_w >= node.facts.bmc_max_power_w
        assert node.facts.generation in ("old", "modern")


def _lowload_rows(curve_w: np.ndarray, rng: np.random.Generator):
    util = np.clip(rng.choice(GRID_UTIL[:6], 3000) + rng.normal(0, 0.01, 3000), 0, 0.5)
    power_w = PchipInterpolator(GRID_UTIL, curve_w)(util) + rng.normal(0, 1.0, len(util))
    cpu_c = 35.0 + 35.0 * util
    features = np.column_stack([util, np.full(len(util), 23.0), cpu_c, cpu_c + 2.0])
    return features, power_w


def test_above_its_highest_load_a_node_gets_a_band_around_its_prediction() -> None:
    prior = default_shape_prior()
    # the 2023 two-socket server of the modern sample's README, shape: 163 W idle, 988 W full
    curve_w = np.array([163, 240, 290, 340, 410, 494, 580, 680, 790, 880, 988], dtype=float)
    features, power_w = _lowload_rows(curve_w, np.random.default_rng(1))
    # a processor the prior holds no server of: the band is the prior's own
    facts = NodeFacts(cpu_model="AMD EPYC 9534", cpu_cores=128, cpu_sockets=2)
    assert prior.same_processor(facts) is None
    curve, details = fit_monotone_curve(features, power_w, prior, facts)
    band = details.extrapolation
    assert details.top_grid_point == 5 and details.generation == "modern"
    assert band is not None and band.util == (0.6, 0.7, 0.8, 0.9, 1.0)
    assert all(lo < 1.0 < hi for lo, hi in zip(band.low, band.high, strict=True))
    assert band.high[-1] - band.low[-1] > band.high[0] - band.low[0]  # wider further out
    steady = np.column_stack(
        [GRID_UTIL, np.full(11, 23.0), 35 + 35 * GRID_UTIL, 37 + 35 * GRID_UTIL]
    )
    predicted_w = curve.predict_w(steady)[6:]
    inside = (curve_w[6:] >= predicted_w * band.low) & (curve_w[6:] <= predicted_w * band.high)
    assert inside.sum() >= 4
    # a BMC that once read 20 % more than the model predicts at full load: the band moves up
    # there, above the prediction; a power supply rated at the prediction caps the band
    steady_w = curve.predict_w(steady)
    modern = prior.for_generation("modern")
    shown = np.array([True] * 6 + [False] * 5)

    def band_with(facts: NodeFacts):
        return extrapolation_interval(modern, steady_w, 5, shown, facts)

    plain = band_with(NodeFacts())
    floored = band_with(NodeFacts(bmc_max_power_w=1.2 * steady_w[-1]))
    assert floored.low[-1] == pytest.approx(1.2, abs=1e-4) and floored.high[-1] >= 1.2
    assert floored.low[:-1] == plain.low[:-1] and floored.high[:-1] == plain.high[:-1]
    capped = band_with(NodeFacts(psu_rating_w=steady_w[-1]))
    assert np.all(np.array(capped.high) * steady_w[6:] <= steady_w[-1] * (1 + 1e-4))
    assert capped.high[-1] == pytest.approx(1.0, abs=1e-4) and capped.low == plain.low
    # the band says when the prediction drew on servers of the node's own processor
    assert band.same_processor_servers == plain.same_processor_servers == 0
    twinned = band_with(NodeFacts(cpu_model="AMD EPYC 9654 96-Core Processor"))
    assert twinned.same_processor_servers == 5
    assert twinned.as_dict()["same_processor_servers"] == 5


def test_a_node_that_showed_every_load_has_no_band() -> None:
    prior = default_shape_prior()
    util = np.random.default_rng(2).uniform(0, 1, 3000)
    curve_w = np.linspace(100, 300, 11)
    power_w = np.interp(util, GRID_UTIL, curve_w)
    cpu_c = 35.0 + 35.0 * util
    features = np.column_stack([util, np.full(len(util), 23.0), cpu_c, cpu_c + 2.0])
    _, details = fit_monotone_curve(features, power_w, prior)
    assert details.top_grid_point == 10 and details.extrapolation is None
    assert len(FEATURES) == features.shape[1]


def test_the_predictor_band_widens_from_the_highest_trained_load() -> None:
    band = ExtrapolationBand(0.5, (0.6, 1.0), (0.9, 0.8), (1.1, 1.3))
    assert band.ratios(0.4) == (1.0, 1.0)
    assert band.ratios(0.55) == pytest.approx((0.95, 1.05))
    assert band.ratios(0.8) == pytest.approx((0.85, 1.2))


def test_a_lowload_fleet_ships_its_bands_to_the_manifest_the_report_and_the_curves(
    tmp_path,
) -> None:
    fleet = synth_fleet(3, 24, 120, seed=4, sampling="lowload")
    cleaned = clean_metrics(fleet, source="synth lowload")
    run = fit_fleet(cleaned, tmp_path / "bundle", settings=FitSettings(min_rows=100), jobs=1)
    entries = {e["node"]: e for e in run.report["nodes"]}
    assert all(e["facts"]["generation"] in ("old", "modern") for e in entries.values())
    predictor = Predictor.load(tmp_path / "bundle")
    telemetry = {
        node: {"cpu_util": 0.3, "ambient_temp_c": 23.0, "cpu1_temp_c": 45.0} for node in entries
    }
    table = CurveBuilder().build(predictor, telemetry, None)
    for node, entry in entries.items():
        band = entry["extrapolation_interval"]
        assert entry["max_util_measured"] <= 0.55 and band["util"][-1] == 1.0
        assert predictor.entry(node).info["extrapolation_interval"] == band
        row_band = table.extrapolation[table.row_of(node)]
        low, high = row_band.ratios(1.0)
        assert (low, high) == pytest.approx((band["low"][-1], band["high"][-1]))
        assert low < 1.0 < high
        assert row_band.ratios(entry["max_util_measured"]) == (1.0, 1.0)
    text = format_table(run.report)
    assert "u=1 band" in text
    assert re.fullmatch(r"-\d+/\+\d+ %", full_load_band(next(iter(entries.values()))))


def test_near_twins_never_vouch_for_each_other_in_the_band() -> None:
    # every server has a twin (the same processor in another chassis): left out one server at
    # a time, its twin would predict it almost exactly and the band would come out too narrow
    rng = np.random.default_rng(5)
    shapes = [GRID_UTIL ** rng.uniform(0.5, 1.6) for _ in range(15)]
    bank_w = np.array([s for shape in shapes for s in (100 + 200 * shape, 101 + 201 * shape)])
    models = [f"cpu-{i}" for i in range(15) for _ in range(2)]
    shown = np.array([True] * 6 + [False] * 5)
    node_w = 90 + 180 * GRID_UTIL**0.9

    def band_width(prior: ShapePrior) -> float:
        _, low, high = prior.rise_interval(node_w[:6], 5, shown)
        return float(np.mean(np.log(high / low)))

    by_server = ShapePrior.from_curves(bank_w)
    by_model = ShapePrior.from_curves(bank_w, groups=models)
    assert band_width(by_model) > 2 * band_width(by_server)


def _turbo_bank(rng: np.random.Generator, n: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """Servers alike at 0-50 % whose upper half only their hardware tells: many cores per
    socket climb steeply (turbo), few flatten."""
    low_w = 100 + 200 * GRID_UTIL**0.8
    curves_w, hardware = [], []
    for _ in range(n):
        cores_per_socket = float(rng.choice([8, 64]))
        curve_w = low_w.copy()
        curve_w[6:] = low_w[5] + (GRID_UTIL[6:] - 0.5) * (800 if cores_per_socket > 32 else 200)
        curves_w.append(curve_w * rng.uniform(0.8, 1.2))
        hardware.append((2 * cores_per_socket, 2.0))
    return np.array(curves_w), np.array(hardware)


def test_the_facts_forest_reads_above_the_highest_load_what_the_shape_cannot_tell() -> None:
    bank_w, hardware = _turbo_bank(np.random.default_rng(3))
    models = [f"cpu-{i}" for i in range(len(bank_w))]
    prior = ShapePrior.from_curves(bank_w, groups=models, hardware=hardware)
    shown = np.array([True] * 6 + [False] * 5)
    node_w = 100 + 200 * GRID_UTIL**0.8
    steep_w = node_w.copy()
    steep_w[6:] = node_w[5] + (GRID_UTIL[6:] - 0.5) * 800
    rise_per_unit = (steep_w[6:] - steep_w[5]) / (steep_w[5] - steep_w[0])

    def rise(p: ShapePrior, facts: NodeFacts | None) -> np.ndarray:
        return p.rise_interval(node_w[:6], 5, shown, facts)[0]

    steep_facts = NodeFacts(cpu_cores=128, cpu_sockets=2)
    told = rise(prior, steep_facts)
    np.testing.assert_allclose(told, rise_per_unit, rtol=0.1)
    # the same node without its cores and sockets: the shape alone cannot tell, so the rise
    # is between the two kinds
    assert rise(prior, None)[-1] < 0.8 * rise_per_unit[-1]
    # facts without a bank that knows its servers' hardware change nothing
    shape_only = ShapePrior.from_curves(bank_w, groups=models)
    np.testing.assert_array_equal(rise(shape_only, steep_facts), rise(shape_only, None))
    # implausible facts (no sockets, more sockets than cores) are not read
    for odd in (NodeFacts(cpu_cores=128, cpu_sockets=0), NodeFacts(cpu_cores=1, cpu_sockets=2)):
        np.testing.assert_array_equal(rise(prior, odd), rise(prior, None))
    # pass 3 of a fit draws the same: its curve above 50 % follows the facts
    low, high = prior.rise_interval(node_w[:6], 5, shown, steep_facts)[1:]
    assert (low <= told).all() and (told <= high).all()
    increments = prior.conditional_shape(node_w[:6], 5, shown, steep_facts)
    shape = np.concatenate([[0.0], np.cumsum(increments)])
    drawn_w = node_w[0] + (node_w[5] - node_w[0]) * shape / shape[5]
    np.testing.assert_allclose(drawn_w[6:], steep_w[6:], rtol=0.05)


def test_servers_of_the_nodes_own_processor_share_the_rise_above_its_highest_load() -> None:
    # two processors alike at 0-50 %: "cpu-steep" servers climb 4x faster above it than
    # "cpu-flat" ones, and nothing else the prior reads tells them apart
    rng = np.random.default_rng(8)
    low_w = 100 + 200 * GRID_UTIL**0.8
    bank_w, models = [], []
    for i in range(40):
        curve_w = low_w.copy()
        curve_w[6:] = low_w[5] + (GRID_UTIL[6:] - 0.5) * (800 if i % 2 else 200)
        bank_w.append(curve_w * rng.uniform(0.9, 1.1))
        models.append("intel 6338" if i % 2 else f"cpu-flat-{i}")
    prior = ShapePrior.from_curves(np.array(bank_w), groups=models)
    shown = np.array([True] * 6 + [False] * 5)
    steep_rise = (GRID_UTIL[6:] - 0.5) * 800 / (low_w[5] - low_w[0])

    def rise(cpu_model: str | None) -> np.ndarray:
        return prior.rise_interval(low_w[:6], 5, shown, NodeFacts(cpu_model=cpu_model))[0]

    unknown = rise(None)
    assert (unknown < 0.8 * steep_rise).all()  # the shape alone cannot tell the two kinds
    # named as node_exporter names it, the processor's own servers count for half
    same = rise("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz")
    assert prior.same_processor(NodeFacts(cpu_model="Intel Xeon Gold 6338")).sum() == 20
    np.testing.assert_allclose(same, 0.5 * unknown + 0.5 * steep_rise, rtol=0.05)
    # a processor the bank holds none of, or a bank that does not know its processors, as before
    np.testing.assert_array_equal(rise("Intel Xeon Gold 6330"), unknown)
    anonymous = ShapePrior.from_curves(np.array(bank_w))
    assert anonymous.same_processor(NodeFacts(cpu_model="Intel Xeon Gold 6338")) is None
    # pass 3 of a fit draws the same rise, and the band goes around it
    rise_same, low, high = prior.rise_interval(
        low_w[:6], 5, shown, NodeFacts(cpu_model="Intel Xeon Gold 6338")
    )
    assert (low <= rise_same).all() and (rise_same <= high).all()
    increments = prior.conditional_shape(
        low_w[:6], 5, shown, NodeFacts(cpu_model="Intel Xeon Gold 6338")
    )
    shape = np.concatenate([[0.0], np.cumsum(increments)])
    np.testing.assert_allclose(shape[6:] / shape[5] - 1, rise_same, rtol=1e-6)


def test_the_flat_forest_predicts_what_scikit_learn_does() -> None:
    # the facts forest descends its trees as flat arrays (one node's prediction is a few dozen
    # array operations, not a walk per tree): it must give scikit-learn's predictions, one
    # output or several, on rows it learned from and rows it never saw
    rng = np.random.default_rng(9)
    x = rng.normal(size=(80, 5))
    y = np.column_stack([x[:, 0] * x[:, 1], np.abs(x[:, 2]) + x[:, 3] ** 2])
    unseen = rng.normal(size=(40, 5)) * 1.5
    for outputs in (y[:, :1], y):
        forest = prior_rise.extra_trees(x, outputs)
        flat = prior_rise.FlatForest.of(forest)
        for rows in (x, unseen, unseen[:1]):
            expected = forest.predict(rows).reshape(len(rows), -1)
            np.testing.assert_allclose(flat.predict(rows), expected, rtol=0, atol=1e-12)


def test_a_bank_hardware_table_must_fit_its_curves() -> None:
    bank_w, hardware = _turbo_bank(np.random.default_rng(4), n=10)
    with pytest.raises(ValueError, match="cores and sockets for each of the 10 curves"):
        ShapePrior.from_curves(bank_w, hardware=hardware[:9])
    with pytest.raises(ValueError, match="sockets >= 1 and cores >= sockets"):
        ShapePrior.from_curves(bank_w, hardware=np.column_stack([hardware[:, 1], hardware[:, 0]]))
    unknown = hardware.copy()
    unknown[3] = np.nan  # a server whose hardware was not recorded is simply not learned from
    assert ShapePrior.from_curves(bank_w, hardware=unknown).bank_hardware.shape == (10, 2)


def test_the_shipped_prior_knows_every_servers_cores_and_sockets() -> None:
    prior = default_shape_prior()
    assert prior.bank_hardware is not None and np.isfinite(prior.bank_hardware).all()
    modern = prior.for_generation("modern")
    assert modern.bank_hardware is not None and len(modern.bank_hardware) == modern.n_servers


@pytest.mark.parametrize("top", [2, 5, 9])
def test_the_facts_forest_extrapolates_from_any_highest_load(top: int) -> None:
    # down to one grid point above the highest (a mostly-idle node that once reached 90 %)
    bank_w, hardware = _turbo_bank(np.random.default_rng(6))
    prior = ShapePrior.from_curves(bank_w, hardware=hardware)
    shown = np.arange(11) <= top
    node_w = bank_w[0]
    facts = NodeFacts(cpu_cores=hardware[0, 0], cpu_sockets=hardware[0, 1])
    rise, low, high = prior.rise_interval(node_w[: top + 1], top, shown, facts)
    assert rise.shape == low.shape == high.shape == (10 - top,)
    assert (np.diff(rise) >= 0).all() and (low <= rise).all() and (rise <= high).all()
    increments = prior.conditional_shape(node_w[: top + 1], top, shown, facts)
    assert increments.shape == (10,) and increments.sum() == pytest.approx(1.0)
