"""Reading and cleaning contract-1 metrics: good inputs load, bad inputs say what and where."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from livedata.metrics_table import CONTRACT_COLUMNS, FEATURES
from training.dataset import (
    CleanedMetrics,
    CleaningTally,
    MetricsInputError,
    clean_metrics,
    load_metrics,
    read_metrics,
    stream_metrics,
    write_metrics,
)

FIXTURES = Path(__file__).parent / "fixtures" / "dataset"


def fixture(name: str) -> Path:
    return FIXTURES / name


def assert_error_says(caught: pytest.ExceptionInfo[MetricsInputError], *fragments: str) -> None:
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message


def utc(text: str) -> pd.Timestamp:
    return pd.Timestamp(text).tz_convert("UTC")


# ---------------------------------------------------------------------------------------------
# Good inputs


def test_contract_constants() -> None:
    # The model inputs are the contract's columns minus identity, time and the target.
    assert CONTRACT_COLUMNS[:2] == ("node", "timestamp")
    assert CONTRACT_COLUMNS[-1] == "power_w"
    assert CONTRACT_COLUMNS[2:-1] == FEATURES
    assert "cpu2_temp_c" in FEATURES


def test_csv_with_rfc3339_timestamps_extra_column_and_one_socket_node() -> None:
    cleaned = load_metrics(fixture("good_rfc3339.csv"))
    frame = cleaned.frame
    assert isinstance(cleaned, CleanedMetrics)
    assert list(frame.columns) == list(CONTRACT_COLUMNS)  # the extra `rack` column is ignored
    assert cleaned.rows_read == 5
    assert cleaned.dropped == {}
    assert cleaned.sources == [str(fixture("good_rfc3339.csv"))]
    assert str(frame["timestamp"].dt.tz) == "UTC"
    node_a = frame[frame["node"] == "node-a"]
    # +01:00 offset converted to UTC; rows sorted by node then time.
    assert node_a["timestamp"].iloc[-1] == utc("2026-01-05T00:02:00Z")
    assert node_a["power_w"].to_list() == [120.0, 190.0, 260.0]
    node_b = frame[frame["node"] == "node-b"]
    assert node_b["timestamp"].iloc[0] == utc("2026-01-05T00:00:00.500Z")
    assert node_b["cpu2_temp_c"].isna().all()
    assert node_b["cpu1_temp_c"].to_list() == [45.0, 58.0]
    assert frame[[*FEATURES, "power_w"]].dtypes.map(pd.api.types.is_float_dtype).all()


def test_csv_with_unix_seconds_and_columns_in_any_order() -> None:
    frame = load_metrics(fixture("good_unix.csv")).frame
    assert list(frame.columns) == list(CONTRACT_COLUMNS)
    assert frame["timestamp"].to_list() == [
        utc("2026-01-05T00:00:00Z"),
        utc("2026-01-05T00:01:00.500Z"),
    ]
    assert frame["power_w"].to_list() == [150.0, 170.0]


def test_cpu2_column_absent_means_one_socket(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="training.dataset"):
        cleaned = load_metrics(fixture("one_socket_no_cpu2_column.csv"))
    assert cleaned.frame["cpu2_temp_c"].isna().all()
    assert len(cleaned.frame) == 2
    assert cleaned.dropped == {}
    assert "cpu2_temp_c" in caplog.text
    assert "one-socket" in caplog.text


def test_single_row_node_is_valid_input() -> None:
    cleaned = load_metrics(fixture("single_row.csv"))
    assert cleaned.frame["node"].to_list() == ["lonely"]
    assert cleaned.frame["power_w"].to_list() == [180.0]


def test_parquet_reads_like_csv(tmp_path: Path) -> None:
    from_csv = load_metrics(fixture("good_rfc3339.csv")).frame
    table = from_csv.assign(rack="r9")
    parquet = tmp_path / "metrics.parquet"
    table.to_parquet(parquet, index=False)
    from_parquet = load_metrics(parquet).frame
    pd.testing.assert_frame_equal(from_parquet, from_csv, check_dtype=False)


def test_parquet_with_unix_seconds_as_numbers(tmp_path: Path) -> None:
    table = pd.read_csv(fixture("good_unix.csv"))
    assert pd.api.types.is_numeric_dtype(table["timestamp"])
    parquet = tmp_path / "unix.parquet"
    table.to_parquet(parquet, index=False)
    frame = load_metrics(parquet).frame
    assert frame["timestamp"].iloc[1] == utc("2026-01-05T00:01:00.500Z")


def test_directory_reads_every_csv_and_parquet_file_sorted(tmp_path: Path) -> None:
    shutil.copy(fixture("good_rfc3339.csv"), tmp_path / "b.csv")
    pd.read_csv(fixture("good_unix.csv")).to_parquet(tmp_path / "a.parquet", index=False)
    shutil.copy(fixture("one_socket_no_cpu2_column.csv"), tmp_path / "c.csv")
    (tmp_path / "notes.txt").write_text("not metrics")

    raw = read_metrics(tmp_path)
    assert raw["_source_file"].unique().tolist() == [
        str(tmp_path / "a.parquet"),
        str(tmp_path / "b.csv"),
        str(tmp_path / "c.csv"),
    ]
    cleaned = load_metrics(tmp_path)
    assert cleaned.rows_read == 2 + 5 + 2
    assert sorted(cleaned.frame["node"].unique()) == ["edge-1", "node-a", "node-b", "node-c"]
    assert len(cleaned.sources) == 3
    assert cleaned.frame[cleaned.frame["node"] == "edge-1"]["cpu2_temp_c"].isna().all()


def test_frame_without_provenance_is_cleaned_and_located_by_row() -> None:
    raw = pd.DataFrame(
        {
            "node": ["n1", "n1", "n2"],
            "timestamp": pd.to_datetime(
                ["2026-01-05T00:00:00", "2026-01-05T00:01:00", "x"], errors="coerce"
            ),
            "cpu_util": [0.1, 0.2, 0.3],
            "ambient_temp_c": [20.0, 20.0, 20.0],
            "cpu1_temp_c": [40.0, 41.0, 42.0],
            "cpu2_temp_c": [np.nan, np.nan, 44.0],
            "power_w": [100.0, -1.0, 120.0],
        }
    )
    cleaned = clean_metrics(raw, source="collected")
    assert cleaned.frame["node"].to_list() == ["n1"]
    assert cleaned.dropped == {"timestamp_missing": 1, "power_w_negative": 1}
    assert cleaned.examples["power_w_negative"] == "collected, row 2, field power_w: value '-1.0'"
    assert cleaned.sources == ["collected"]


def test_percent_utilisation_accepted_when_declared() -> None:
    cleaned = load_metrics(fixture("percent.csv"), cpu_util_percent=True)
    assert cleaned.frame["cpu_util"].to_list() == pytest.approx([0.005, 0.125, 0.87, 1.0])
    assert cleaned.dropped == {}


# ---------------------------------------------------------------------------------------------
# Inputs refused as a whole


def test_missing_column_names_file_missing_and_found_columns() -> None:
    path = fixture("missing_column.csv")
    with pytest.raises(MetricsInputError) as caught:
        read_metrics(path)
    assert_error_says(
        caught,
        str(path),
        "missing required column(s) power_w",
        "found columns: node, timestamp, cpu_util",
        "'Power_W' for 'power_w'",
    )


def test_missing_column_in_a_frame_names_the_source() -> None:
    raw = pd.DataFrame({"node": ["a"], "timestamp": [0], "cpu_util": [0.5]})
    with pytest.raises(MetricsInputError, match=r"^collected: missing required column\(s\) "):
        clean_metrics(raw, source="collected")


def test_utilisation_in_percent_is_detected_with_an_example_line() -> None:
    path = fixture("percent.csv")
    with pytest.raises(MetricsInputError) as caught:
        load_metrics(path)
    assert_error_says(
        caught,
        "looks like a percentage",
        f"file {path}, line 3, field cpu_util: value '12.5'",
        "Divide it by 100",
        "cpu_util_percent=True",
        "--cpu-util-percent",
    )


def test_utilisation_in_percent_detected_in_a_single_row() -> None:
    raw = pd.DataFrame(
        {
            "node": ["a"],
            "timestamp": ["2026-01-05T00:00:00Z"],
            "cpu_util": [45.0],
            "ambient_temp_c": [20.0],
            "cpu1_temp_c": [40.0],
            "power_w": [100.0],
        }
    )
    with pytest.raises(MetricsInputError, match=re.escape("row 1, field cpu_util: value '45.0'")):
        clean_metrics(raw, source="one-row")


def test_column_non_numeric_in_most_rows_is_probably_the_wrong_column() -> None:
    path = fixture("non_numeric_column.csv")
    with pytest.raises(MetricsInputError) as caught:
        load_metrics(path)
    assert_error_says(
        caught,
        f"file {path}, line 2, field power_w: value 'ok' is not a number",
        "3 of the 4 non-empty power_w values",
        "right column",
    )


def test_empty_file() -> None:
    path = fixture("empty.csv")
    with pytest.raises(MetricsInputError, match=re.escape(f"file {path} is empty")):
        read_metrics(path)


def test_header_only_file_has_no_rows() -> None:
    path = fixture("header_only.csv")
    with pytest.raises(MetricsInputError, match=f"^{re.escape(f'file {path} has no rows')}$"):
        read_metrics(path)


def test_empty_parquet_has_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    pd.read_csv(fixture("header_only.csv")).to_parquet(path)
    with pytest.raises(MetricsInputError, match=f"^{re.escape(f'file {path} has no rows')}$"):
        load_metrics(path)


def test_nothing_left_after_cleaning_says_why(tmp_path: Path) -> None:
    path = tmp_path / "all_bad.csv"
    path.write_text(
        "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,cpu2_temp_c,power_w\n"
        "a,2026-01-05T00:00:00Z,0.5,20,40,40,-3\n"
        "a,2026-01-05T00:01:00Z,0.5,20,40,40,-4\n"
    )
    with pytest.raises(MetricsInputError) as caught:
        load_metrics(path)
    message = str(caught.value)
    assert message.startswith("all 2 rows dropped, none left to fit: 2 power_w negative")
    assert f"(input: {path})" in message
    assert f"file {path}, line 2, field power_w: value '-3'" in message


def test_nothing_left_leads_with_the_largest_reason_not_the_first_row(tmp_path: Path) -> None:
    # The case: most rows have negative power, a few earlier ones lack a temperature.
    # The message must lead with the counts, largest first, and quote the largest reason's row.
    header = "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,cpu2_temp_c,power_w\n"
    rows = [f"a,2026-01-05T00:0{i}:00Z,0.5,,40,40,120\n" for i in range(2)]
    rows += [f"a,2026-01-05T01:{i:02d}:00Z,0.5,21,40,40,-{i + 1}\n" for i in range(12)]
    path = tmp_path / "mostly_negative.csv"
    path.write_text(header + "".join(rows))
    with pytest.raises(MetricsInputError) as caught:
        load_metrics(path)
    message = str(caught.value)
    assert message.startswith(
        "all 14 rows dropped, none left to fit: 12 power_w negative, 2 ambient_temp_c missing"
    ), message
    assert f"first row power_w negative: file {path}, line 4, field power_w: value '-1'" in message
    assert "ambient_temp_c: value ''" not in message


def test_nothing_left_counts_are_readable_at_fleet_scale() -> None:
    from training.dataset import CleaningTally, nothing_left_error

    tally = CleaningTally(
        rows_read=12_734,
        dropped={"ambient_temp_c_missing": 148, "power_w_negative": 12_586},
        sources=[f"rack-{i}.parquet" for i in range(5)],
        examples={"ambient_temp_c_missing": "x", "power_w_negative": "y"},
    )
    message = str(nothing_left_error(tally))
    assert message.startswith(
        "all 12,734 rows dropped, none left to fit: 12,586 power_w negative, "
        "148 ambient_temp_c missing (input: rack-0.parquet, rack-1.parquet, rack-2.parquet "
        "and 2 more); first row power_w negative: y"
    ), message


def test_timestamp_column_that_is_mostly_not_times_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dates_us.csv"
    path.write_text(
        "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,power_w\n"
        "a,01/05/2026 00:00,0.5,20,40,100\n"
        "a,01/05/2026 00:01,0.5,20,40,100\n"
        "a,2026-01-05T00:02:00Z,0.5,20,40,100\n"
    )
    with pytest.raises(MetricsInputError) as caught:
        load_metrics(path)
    assert_error_says(
        caught,
        f"file {path}, line 2, field timestamp: value '01/05/2026 00:00' is not an RFC 3339 time",
        "so are 2 of the 3 non-empty timestamp values",
        "right column",
    )


def test_unix_milliseconds_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "ms.csv"
    path.write_text(
        "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,power_w\n"
        "a,1767571200000,0.5,20,40,100\n"
        "a,1767571260000,0.5,20,40,100\n"
    )
    with pytest.raises(MetricsInputError, match=r"line 2, field timestamp: .*milliseconds"):
        load_metrics(path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("does_not_exist.csv", "no such file or directory"),
        ("metrics.xlsx", "unknown format '.xlsx'"),
        ("empty_dir", "has no .csv or .parquet files"),
        ("broken.parquet", "not readable as Parquet"),
    ],
)
def test_unreadable_paths(tmp_path: Path, name: str, expected: str) -> None:
    path = tmp_path / name
    if name == "metrics.xlsx":
        path.write_bytes(b"PK")
    elif name == "empty_dir":
        path.mkdir()
    elif name == "broken.parquet":
        path.write_text("this is not parquet")
    with pytest.raises(MetricsInputError) as caught:
        read_metrics(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


# ---------------------------------------------------------------------------------------------
# Rows dropped one by one, counted by reason, first example logged with file/line/field/value


def test_non_numeric_cells_are_dropped_and_located(caplog: pytest.LogCaptureFixture) -> None:
    path = fixture("non_numeric_cells.csv")
    with caplog.at_level(logging.WARNING, logger="training.dataset"):
        cleaned = load_metrics(path)
    assert cleaned.dropped == {"ambient_temp_c_non_numeric": 1, "power_w_non_numeric": 1}
    assert cleaned.rows_read == 6
    assert len(cleaned.frame) == 4
    assert cleaned.examples["power_w_non_numeric"] == (
        f"file {path}, line 3, field power_w: value 'n/a-watts'"
    )
    assert f"file {path}, line 5, field ambient_temp_c: value 'warm'" in caplog.text


def test_duplicate_timestamps_keep_the_first_row() -> None:
    path = fixture("duplicates.csv")
    cleaned = load_metrics(path)
    assert cleaned.dropped == {"duplicate_timestamp": 2}
    node_a = cleaned.frame[cleaned.frame["node"] == "node-a"]
    assert node_a["power_w"].to_list() == [120.0, 135.0]  # not 999 (line 4) nor 888 (line 6)
    assert len(cleaned.frame[cleaned.frame["node"] == "node-b"]) == 1
    assert cleaned.examples["duplicate_timestamp"].startswith(
        f"file {path}, line 4, field timestamp: value '2026-01-05T00:01:00Z'"
    )


def test_every_bad_row_is_counted_under_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    path = fixture("bad_rows.csv")
    with caplog.at_level(logging.WARNING, logger="training.dataset"):
        cleaned = load_metrics(path)
    assert cleaned.dropped == {
        "blank_line": 1,
        "node_missing": 1,
        "timestamp_missing": 1,
        "timestamp_unparseable": 1,
        "cpu_util_missing": 1,
        "cpu1_temp_c_missing": 1,
        "power_w_negative": 1,
        "power_w_zero": 1,
        "power_w_absurd": 1,
        "cpu_util_out_of_range": 1,
        "cpu1_temp_c_out_of_range": 1,
        "cpu2_temp_c_out_of_range": 1,
    }
    # Nothing silently lost: every row read is either kept or counted.
    assert cleaned.rows_read == len(cleaned.frame) + sum(cleaned.dropped.values())
    assert cleaned.frame["timestamp"].to_list() == [
        utc("2026-01-05T00:00:00Z"),
        utc("2026-01-05T00:09:00Z"),
    ]
    where = f"file {path}, line"
    assert cleaned.examples == {
        "blank_line": f"{where} 10",
        "node_missing": f"{where} 11, field node: value ''",
        "timestamp_missing": f"{where} 15, field timestamp: value ''",
        "timestamp_unparseable": f"{where} 3, field timestamp: value 'yesterday-ish'",
        "cpu_util_missing": f"{where} 8, field cpu_util: value 'NaN'",
        "cpu1_temp_c_missing": f"{where} 9, field cpu1_temp_c: value ''",
        "power_w_negative": f"{where} 4, field power_w: value '-5'",
        "power_w_zero": f"{where} 14, field power_w: value '0' (a BMC reads 0 W when it has none)",
        "power_w_absurd": f"{where} 5, field power_w: value '25000' (over 20 kW)",
        "cpu_util_out_of_range": f"{where} 6, field cpu_util: value '1.70' (0..1)",
        "cpu1_temp_c_out_of_range": f"{where} 7, field cpu1_temp_c: value '212' (-40..150 C)",
        "cpu2_temp_c_out_of_range": f"{where} 13, field cpu2_temp_c: value '-60' (-40..150 C)",
    }
    for example in cleaned.examples.values():
        assert example in caplog.text


def test_parquet_rows_are_located_by_row_number(tmp_path: Path) -> None:
    table = pd.read_csv(fixture("good_rfc3339.csv"))
    table["power_w"] = table["power_w"].astype(float)
    table.loc[3, "power_w"] = -7.5
    path = tmp_path / "metrics.parquet"
    table.to_parquet(path, index=False)
    cleaned = load_metrics(path)
    assert cleaned.examples == {
        "power_w_negative": f"file {path}, row 4, field power_w: value '-7.5'"
    }


def test_cleaning_is_pure(tmp_path: Path) -> None:
    raw = read_metrics(fixture("bad_rows.csv"))
    before = raw.copy()
    first = clean_metrics(raw, source="bad_rows")
    second = clean_metrics(raw, source="bad_rows")
    pd.testing.assert_frame_equal(raw, before)
    pd.testing.assert_frame_equal(first.frame, second.frame)
    assert first.dropped == second.dropped


# ---------------------------------------------------------------------------------------------
# Property: whatever comes in, every row read is either kept (and valid) or counted


MESSY_NUMBERS = st.sampled_from(["0.5", "0.05", "1.2", "-3", "", "NaN", "abc", "250", "0", "1e9"])
MESSY_TIMES = st.sampled_from(
    ["2026-01-05T00:00:00Z", "2026-01-05T01:00:00+01:00", "1767571260", "", "soon", "1e15"]
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["a", "b", " a ", ""]),
            MESSY_TIMES,
            MESSY_NUMBERS,
            MESSY_NUMBERS,
            MESSY_NUMBERS,
            MESSY_NUMBERS,
            MESSY_NUMBERS,
        ),
        min_size=1,
        max_size=25,
    )
)
def test_every_row_is_kept_or_counted(rows: list[tuple[str, ...]]) -> None:
    raw = pd.DataFrame(rows, columns=list(CONTRACT_COLUMNS))
    try:
        cleaned = clean_metrics(raw, source="messy")
    except MetricsInputError as error:
        assert str(error).startswith(("messy", "all "))
        return
    frame = cleaned.frame
    assert cleaned.rows_read == len(raw) == len(frame) + sum(cleaned.dropped.values())
    assert set(cleaned.examples) == set(cleaned.dropped)
    assert frame["cpu_util"].between(0, 1).all()
    assert (frame["power_w"] > 0).all() and (frame["power_w"] <= 20_000).all()
    assert frame[["ambient_temp_c", "cpu1_temp_c"]].notna().all().all()
    assert not frame.duplicated(["node", "timestamp"]).any()
    assert set(frame["node"]) <= {"a", "b"}


# ---------------------------------------------------------------------------------------------
# Streaming: a directory read and cleaned one group of files at a time


def _stream_dir(tmp_path: Path) -> Path:
    shutil.copy(fixture("good_rfc3339.csv"), tmp_path / "b.csv")  # node-a, node-b
    pd.read_csv(fixture("good_unix.csv")).to_parquet(tmp_path / "a.parquet", index=False)
    shutil.copy(fixture("one_socket_no_cpu2_column.csv"), tmp_path / "c.csv")  # edge-1
    # a later hour of node-a in a file of its own: it must be cleaned together with b.csv
    (tmp_path / "d.csv").write_text(
        "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,cpu2_temp_c,power_w\n"
        "node-a,2026-01-05T01:00:00Z,0.40,22,50,49,170\n"
        " node-a ,2026-01-05T00:01:00Z,0.50,22,55,54,190\n"  # same node and time as in b.csv
    )
    return tmp_path


def test_stream_groups_files_that_share_a_node_and_matches_the_whole_table(
    tmp_path: Path,
) -> None:
    directory = _stream_dir(tmp_path)
    stream = stream_metrics(directory)
    assert stream.n_nodes == 4
    assert [[p.name for p in group] for group in stream.groups] == [
        ["a.parquet"],
        ["b.csv", "d.csv"],
        ["c.csv"],
    ]
    batches = list(stream)
    nodes_per_batch = [sorted(batch.frame["node"].unique()) for batch in batches]
    assert nodes_per_batch == [["node-c"], ["node-a", "node-b"], ["edge-1"]]

    whole = load_metrics(directory)
    streamed = pd.concat([batch.frame for batch in batches], ignore_index=True)
    streamed = streamed.sort_values(["node", "timestamp"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(streamed, whole.frame)
    tally = CleaningTally()
    for batch in batches:
        tally.add(batch)
    assert (tally.rows_read, tally.rows_kept) == (whole.rows_read, whole.rows_kept)
    assert tally.dropped == whole.dropped == {"duplicate_timestamp": 1}
    assert sorted(tally.sources) == sorted(whole.sources)


def test_stream_drops_bad_cells_naming_file_line_and_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.copy(fixture("good_unix.csv"), tmp_path / "a.csv")
    path = tmp_path / "z.csv"
    shutil.copy(fixture("non_numeric_cells.csv"), path)
    with caplog.at_level(logging.WARNING, logger="training.dataset"):
        batches = list(stream_metrics(tmp_path))
    assert len(batches) == 2
    assert f"file {path}, line 5, field ambient_temp_c: value 'warm'" in caplog.text
    assert batches[1].dropped == load_metrics(path).dropped


def test_stream_refuses_a_file_without_a_required_column_before_reading_rows(
    tmp_path: Path,
) -> None:
    shutil.copy(fixture("good_unix.csv"), tmp_path / "a.csv")
    shutil.copy(fixture("missing_column.csv"), tmp_path / "b.csv")
    with pytest.raises(MetricsInputError) as caught:
        stream_metrics(tmp_path)
    assert_error_says(caught, f"file {tmp_path / 'b.csv'}", "power_w", "'Power_W' for 'power_w'")


def test_stream_with_every_row_bad_says_so_for_the_whole_input(tmp_path: Path) -> None:
    header = "node,timestamp,cpu_util,ambient_temp_c,cpu1_temp_c,cpu2_temp_c,power_w\n"
    for node in ("node-a", "node-b"):
        (tmp_path / f"{node}.csv").write_text(
            f"{header}{node},2026-01-05T00:00:00Z,0.10,22,41,40,-5\n"
        )
    with pytest.raises(MetricsInputError) as caught:
        list(stream_metrics(tmp_path))
    assert_error_says(
        caught,
        "all 2 rows dropped, none left to fit: 2 power_w negative",
        str(tmp_path / "node-a.csv"),
        str(tmp_path / "node-b.csv"),
        f"file {tmp_path / 'node-a.csv'}, line 2, field power_w: value '-5'",
    )


def test_write_metrics_round_trips_and_refuses_unknown_formats(tmp_path: Path) -> None:
    cleaned = load_metrics(fixture("good_rfc3339.csv"))
    for name in ("t.csv", "t.parquet"):
        write_metrics(cleaned.frame, tmp_path / "out" / name)
        again = load_metrics(tmp_path / "out" / name)
        pd.testing.assert_frame_equal(again.frame, cleaned.frame)
    with pytest.raises(ValueError, match=r"t\.json"):
        write_metrics(cleaned.frame, tmp_path / "t.json")
