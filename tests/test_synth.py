"""The synthetic fleet looks like real BMC telemetry and is a valid contract-1 table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from livedata.metrics_table import CONTRACT_COLUMNS, FACT_COLUMNS
from training.dataset import (
    clean_metrics,
    load_metrics,
    stream_metrics,
    write_metrics,
)
from training.node_facts import generation
from training.synth import fleet_spec, load_shapes, node_names, synth_fleet, write_fleet_files

NODES = 50
HOURS = 48.0
STEP_S = 60.0
SEED = 7


@pytest.fixture(scope="module")
def fleet() -> pd.DataFrame:
    return synth_fleet(NODES, HOURS, STEP_S, SEED)


def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    first = synth_fleet(5, 6.0, 60.0, seed=3)
    again = synth_fleet(5, 6.0, 60.0, seed=3)
    other = synth_fleet(5, 6.0, 60.0, seed=4)
    pd.testing.assert_frame_equal(first, again)
    assert (
        not first["power_w"].reset_index(drop=True).equals(other["power_w"].reset_index(drop=True))
    )


def test_contract_columns_types_and_order(fleet: pd.DataFrame) -> None:
    # the contract's columns, then the node facts a cluster would report (one value a node)
    assert list(fleet.columns) == [*CONTRACT_COLUMNS, *FACT_COLUMNS]
    assert (fleet.groupby("node")[list(FACT_COLUMNS)].nunique() == 1).all().all()
    assert str(fleet["timestamp"].dt.tz) == "UTC"
    assert fleet["node"].nunique() == NODES
    ordered = fleet.sort_values(["node", "timestamp"], kind="stable")
    assert ordered.index.equals(fleet.index)
    assert not fleet.duplicated(["node", "timestamp"]).any()
    assert fleet["cpu_util"].between(0.0, 1.0).all()
    assert (fleet["power_w"] > 0).all()


def test_node_names_are_zero_padded_to_the_width_of_n() -> None:
    assert node_names(3) == ["node-01", "node-02", "node-03"]
    assert node_names(100)[0] == "node-001"
    assert node_names(100)[-1] == "node-100"


def test_utilisation_visits_the_whole_range_on_every_node(fleet: pd.DataFrame) -> None:
    per_node = fleet.groupby("node")["cpu_util"]
    assert (per_node.min() < 0.05).all()
    assert (per_node.max() > 0.95).all()
    share_per_decile = pd.cut(fleet["cpu_util"], np.linspace(0, 1, 11), include_lowest=True)
    assert (share_per_decile.value_counts(normalize=True) > 0.01).all()


def test_power_is_quantised_in_whole_watts_or_five_watt_steps(fleet: pd.DataFrame) -> None:
    power = fleet.groupby("node")["power_w"]
    whole = power.apply(lambda watts: bool(np.all(watts == np.round(watts))))
    five = power.apply(lambda watts: bool(np.all(watts % 5 == 0)))
    assert whole.all()
    assert five.sum() >= 3, "some nodes should read in 5 W steps"
    assert (~five).sum() >= 3, "some nodes should read in whole watts"


def test_missing_rows_and_sensor_dropouts_in_range(fleet: pd.DataFrame) -> None:
    expected_rows = int(HOURS * 3600 / STEP_S)
    missing_share = 1.0 - fleet.groupby("node").size() / expected_rows
    assert missing_share.between(0.003, 0.035).all()
    assert 0.01 <= missing_share.mean() <= 0.02

    dropout = fleet["cpu1_temp_c"].isna()
    assert 0.002 <= dropout.mean() <= 0.03
    # Dropouts come as short runs, and blank the node's other temperature sensors too.
    assert fleet.loc[dropout, "ambient_temp_c"].isna().all()
    run_starts = dropout & ~dropout.shift(fill_value=False)
    mean_run = dropout.sum() / run_starts.sum()
    assert 1.5 <= mean_run <= 8


def test_some_nodes_have_one_socket(fleet: pd.DataFrame) -> None:
    cpu2_present = fleet.groupby("node")["cpu2_temp_c"].apply(lambda t: t.notna().mean())
    one_socket = cpu2_present == 0
    assert 1 <= one_socket.sum() < NODES
    assert (cpu2_present[~one_socket] > 0.95).all()


def test_cpu_temperature_rises_with_load(fleet: pd.DataFrame) -> None:
    for node, rows in fleet.dropna(subset=["cpu1_temp_c"]).groupby("node"):
        busy = rows["cpu1_temp_c"][rows["cpu_util"] > 0.8].mean()
        idle = rows["cpu1_temp_c"][rows["cpu_util"] < 0.1].mean()
        assert busy > idle + 10, f"{node}: {idle:.1f} C idle, {busy:.1f} C busy"
        assert rows["cpu_util"].corr(rows["cpu1_temp_c"]) > 0.5, node


def test_power_rises_with_utilisation_on_every_node(fleet: pd.DataFrame) -> None:
    bins = np.linspace(0, 1, 6)
    for node, rows in fleet.groupby("node"):
        median_w = rows.groupby(pd.cut(rows["cpu_util"], bins, include_lowest=True), observed=True)[
            "power_w"
        ].median()
        assert len(median_w) == 5, node
        assert np.all(np.diff(median_w.to_numpy()) > 0), f"{node}: {median_w.to_list()}"


def test_idle_share_per_node_inside_the_specpower_range(fleet: pd.DataFrame) -> None:
    sample_share = load_shapes()["share_000"]
    low, high = sample_share.min(), sample_share.max()
    spec = fleet_spec(NODES, SEED)
    assert np.all((spec.idle_share >= low) & (spec.idle_share <= high))
    # Heterogeneous: the fleet spans a good part of what real servers show.
    assert spec.idle_share.max() - spec.idle_share.min() > 0.2

    # Measured from the data: idle power over full-load power (fans push full load up a bit).
    for node, rows in fleet.groupby("node"):
        idle_w = rows["power_w"][rows["cpu_util"] < 0.02].median()
        busy_w = rows["power_w"][rows["cpu_util"] > 0.97].median()
        assert low * 0.85 <= idle_w / busy_w <= high, node


def test_cli_writes_parquet_and_csv(tmp_path: Path) -> None:
    for name in ("fleet.parquet", "fleet.csv"):
        out = tmp_path / name
        arguments = ["--nodes", "3", "--hours", "2", "--step", "60", "--seed", "1", "--quiet"]
        result = subprocess.run(
            [sys.executable, "-m", "training.synth", *arguments, "--out", str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        table = pd.read_parquet(out) if name.endswith("parquet") else pd.read_csv(out)
        assert list(table.columns) == [*CONTRACT_COLUMNS, *FACT_COLUMNS]
        assert set(table["node"]) == {"node-01", "node-02", "node-03"}


def test_cli_rejects_an_unknown_output_format(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "training.synth", "--out", str(tmp_path / "fleet.xlsx")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "fleet.xlsx" in result.stderr
    assert "Traceback" not in result.stderr


def test_output_passes_cleaning_losing_only_sensor_dropouts(fleet: pd.DataFrame) -> None:
    cleaned = clean_metrics(fleet, source="synthetic fleet")
    assert cleaned.rows_read == len(fleet)
    # Dropouts blank every temperature of a node; the first one checked names the reason.
    assert set(cleaned.dropped) == {"ambient_temp_c_missing"}
    assert cleaned.dropped["ambient_temp_c_missing"] == fleet["ambient_temp_c"].isna().sum()
    assert cleaned.frame["node"].nunique() == NODES
    kept = fleet.dropna(subset=["ambient_temp_c"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(cleaned.frame, kept, check_dtype=False)


def test_written_csv_and_parquet_load_back_identically(tmp_path: Path) -> None:
    fleet = synth_fleet(4, 0.5, 2.5, seed=11)  # half-second timestamps must survive CSV
    for name in ("fleet.csv", "fleet.parquet"):
        write_metrics(fleet, tmp_path / name)
    from_csv = load_metrics(tmp_path / "fleet.csv").frame
    from_parquet = load_metrics(tmp_path / "fleet.parquet").frame
    pd.testing.assert_frame_equal(from_csv, from_parquet, check_dtype=False)
    assert len(from_csv) == fleet["ambient_temp_c"].notna().sum()


def test_fleet_files_hold_every_node_once_and_stream_one_file_at_a_time(tmp_path: Path) -> None:
    files = write_fleet_files(tmp_path, 5, hours=2, step_s=60, seed=3, nodes_per_file=2)
    assert [f.name for f in files] == ["nodes-0.parquet", "nodes-1.parquet", "nodes-2.parquet"]
    stream = stream_metrics(tmp_path)
    assert stream.n_nodes == 5
    assert [len(group) for group in stream.groups] == [1, 1, 1]
    nodes = [sorted(batch.frame["node"].unique()) for batch in stream]
    assert nodes == [["node-01", "node-02"], ["node-03", "node-04"], ["node-05"]]
    again = write_fleet_files(tmp_path / "again", 5, hours=2, step_s=60, seed=3, nodes_per_file=2)
    for first, second in zip(files, again, strict=True):
        pd.testing.assert_frame_equal(pd.read_parquet(first), pd.read_parquet(second))


def test_held_levels_visit_every_level_and_nothing_between() -> None:
    fleet = synth_fleet(4, 72, 60, seed=2, sampling="levels")
    for node, rows in fleet.groupby("node"):
        util = rows["cpu_util"].to_numpy()
        nearest = np.round(util * 5) / 5
        assert np.mean(np.abs(util - nearest) < 0.08) > 0.999, node  # +-2 % jitter only
        assert set(np.unique(nearest)) == {0.0, 0.2, 0.4, 0.6, 0.8, 1.0}, node
        # held for hours: the level changes at most every 2 h
        changes = np.count_nonzero(np.diff(nearest))
        assert changes <= 72 / 2, node


def test_mostly_idle_nodes_idle_for_hours_and_peak_briefly() -> None:
    fleet = synth_fleet(4, 72, 60, seed=2, sampling="mostly-idle")
    for node, rows in fleet.groupby("node"):
        util = rows["cpu_util"]
        assert (util < 0.08).mean() > 0.75, node
        assert util.max() > 0.5, node


def test_lowload_never_goes_above_half() -> None:
    fleet = synth_fleet(4, 72, 60, seed=2, sampling="lowload")
    assert fleet["cpu_util"].max() <= 0.5
    assert (fleet.groupby("node")["cpu_util"].max() > 0.4).all()


def test_loose_temperatures_follow_load_less_closely_than_tight_ones() -> None:
    def correlation(temperature: str) -> pd.Series:
        fleet = synth_fleet(4, 72, 60, seed=2, temperature=temperature).dropna()
        return fleet.groupby("node").apply(lambda r: r["cpu_util"].corr(r["cpu1_temp_c"]))

    tight, loose = correlation("tight"), correlation("loose")
    assert (tight > 0.9).all()
    assert (loose < tight - 0.05).all()


def test_an_unknown_sampling_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown sampling 'weekly'; known: even, levels"):
        synth_fleet(2, 2, 60, seed=1, sampling="weekly")
    result = subprocess.run(
        [sys.executable, "-m", "training.synth", "--sampling", "levels", "--temperature",
         "loose", "--nodes", "2", "--hours", "6", "--out", str(tmp_path / "f.parquet")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert pd.read_parquet(tmp_path / "f.parquet")["node"].nunique() == 2


def test_the_command_line_draws_from_both_periods_and_code_from_the_ones_it_asks(
    tmp_path: Path,
) -> None:
    both = synth_fleet(40, 1, 300, seed=6, periods=("old", "modern"))
    told = {generation(m) for m in both.groupby("node")["cpu_model"].first()}
    assert told == {"old", "modern"}
    modern = synth_fleet(5, 1, 300, seed=6, periods=("modern",))
    assert {generation(m) for m in modern["cpu_model"].unique()} == {"modern"}
    result = subprocess.run(
        [sys.executable, "-m", "training.synth", "--periods", "old,future", "--out",
         str(tmp_path / "fleet.csv")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--periods: unknown future; known: old, modern" in result.stderr
    assert not (tmp_path / "fleet.csv").exists()
