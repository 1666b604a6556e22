"""Tests of training.collect against a real Prometheus server, and of the test server itself."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from tests.support.prometheus import (
    free_port,
    require_prometheus,
    start_prometheus,
    write_openmetrics,
)
from training.collect import (
    DEFAULT_POWER_QUERY,
    CollectConfig,
    CollectError,
    CollectStats,
    PrometheusReader,
    collect_instant,
    collect_metrics,
)
from training.dataset import CONTRACT_COLUMNS

T0_S = 1_767_571_200  # 2026-01-05T00:00:00Z


# --------------------------------------------------------------------------------------------
# The test server (tests/support/prometheus.py)


def test_write_openmetrics_groups_families_and_orders_series() -> None:
    text = write_openmetrics(
        [
            ("power_watts", {"instance": 'a"b'}, T0_S + 60, 2.0),
            ("cpu_seconds_total", {"cpu": "0"}, T0_S, 1e6 + 0.25),
            ("power_watts", {"instance": 'a"b'}, T0_S, 1.0),
        ]
    )
    assert text.splitlines() == [
        "# TYPE power_watts gauge",
        f'power_watts{{instance="a\\"b"}} 1.0 {T0_S}.000',
        f'power_watts{{instance="a\\"b"}} 2.0 {T0_S + 60}.000',
        "# TYPE cpu_seconds counter",
        f'cpu_seconds_total{{cpu="0"}} 1000000.25 {T0_S}.000',
        "# EOF",
    ]


@pytest.mark.prometheus
def test_prometheus_serves_backfilled_and_scraped_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Gauge("live_power_watts", "test gauge", registry=registry).set(321.5)
    exporter_port = free_port()
    exporter, exporter_thread = start_http_server(exporter_port, "127.0.0.1", registry)
    text = write_openmetrics(
        [("old_power_watts", {"instance": "h:1"}, T0_S + 60 * i, 100.0 + i) for i in range(10)]
    )
    try:
        with start_prometheus(
            tmp_path,
            openmetrics_text=text,
            scrape_targets=[f"127.0.0.1:{exporter_port}"],
            scrape_interval_s=0.5,
        ) as prom:
            old = prom.query("old_power_watts", at_s=T0_S + 5 * 60)
            assert [float(s["value"][1]) for s in old] == [105.0]
            live = prom.wait_for("live_power_watts")
            assert float(live[0]["value"][1]) == 321.5
        assert prom.process.poll() is not None
    finally:
        exporter.shutdown()
        exporter_thread.join(timeout=5)


# --------------------------------------------------------------------------------------------
# A small fleet loaded into a real Prometheus
#
# Three nodes scraped every 60 s for 31 hours: node_exporter idle/user CPU counters with known
# per-segment utilisation, node_uname_info, ipmi_exporter temperatures under two vendors'
# sensor names (plus a one-socket node), DCMI power; and one BMC whose host has no
# node_exporter, so nothing maps it to a node.

SCRAPE_S = 60
SAMPLES = 31 * 60 + 1
SEGMENT_S = 1800  # utilisation is constant per CPU within each 30-minute segment
STEP_S = 10  # collection step: (31 h / 10 s) points is more than Prometheus's 11,000 limit
COLLECT_END_S = T0_S + 111_000  # 11,101 points per series at STEP_S: two chunks
HOSTS = {"node-a": "10.0.0.1", "node-b": "10.0.0.2", "node-c": "10.0.0.3"}
ORPHAN_HOST = "10.0.0.9"
SENSORS = {  # node -> [(sensor name, sensor id, column it must feed or None)]
    "node-a": [  # Dell: both CPU sensors are called "Temp"; ids 9 < 10 numerically
        ("Inlet Temp", "4", "ambient_temp_c"),
        ("Exhaust Temp", "5", None),
        ("Temp", "10", "cpu2_temp_c"),
        ("Temp", "9", "cpu1_temp_c"),
    ],
    "node-b": [
        ("Ambient", "1", "ambient_temp_c"),
        ("CPU1 Temp", "2", "cpu1_temp_c"),
        ("CPU2 Temp", "3", "cpu2_temp_c"),
        ("CPU1 VRM Temp", "4", None),
        ("P1-DIMMA1 Temp", "5", None),
    ],
    "node-c": [  # one socket
        ("System Board Inlet Temp", "1", "ambient_temp_c"),
        ("CPU 1 Temp", "2", "cpu1_temp_c"),
    ],
}


def _fleet() -> tuple[list, dict[str, dict[str, np.ndarray]]]:
    """OpenMetrics samples and, per node, the truth: per-sample gauges and CPU segment utils."""
    rng = np.random.default_rng(11)
    times_s = T0_S + SCRAPE_S * np.arange(SAMPLES)
    segments = (SAMPLES * SCRAPE_S) // SEGMENT_S + 1
    samples: list = []
    truth: dict[str, dict[str, np.ndarray]] = {}
    for node, host in HOSTS.items():
        node_labels = {"instance": f"{host}:9100", "job": "node", "node": node}
        ipmi_labels = {"instance": f"{host}:9290", "job": "ipmi", "node": node}
        cpu_utils = rng.uniform(0.05, 0.95, size=(2, segments))
        interval_segment = (times_s[:-1] - T0_S) // SEGMENT_S
        for cpu in range(2):
            busy_s = np.concatenate([[0.0], np.cumsum(cpu_utils[cpu, interval_segment] * SCRAPE_S)])
            idle_s = 50_000.0 + np.arange(SAMPLES) * SCRAPE_S - busy_s
            for mode, counter in (("idle", idle_s), ("user", 1_000.0 + busy_s)):
                labels = {**node_labels, "cpu": str(cpu), "mode": mode}
                samples += [
                    ("node_cpu_seconds_total", labels, t, v)
                    for t, v in zip(times_s, counter, strict=True)
                ]
        samples += [("node_uname_info", {**node_labels, "nodename": node}, t, 1.0) for t in times_s]
        node_truth = {"segment_util": cpu_utils.mean(axis=0)}
        for name, sensor_id, column in SENSORS[node]:
            temps_c = np.round(rng.uniform(18.0, 80.0, SAMPLES), 1)
            labels = {**ipmi_labels, "name": name, "id": sensor_id}
            samples += [
                ("ipmi_temperature_celsius", labels, t, v)
                for t, v in zip(times_s, temps_c, strict=True)
            ]
            if column:
                node_truth[column] = temps_c
        power_w = np.round(rng.uniform(90.0, 450.0, SAMPLES))
        samples += [
            ("ipmi_dcmi_power_consumption_watts", ipmi_labels, t, v)
            for t, v in zip(times_s, power_w, strict=True)
        ]
        node_truth["power_w"] = power_w
        truth[node] = node_truth
    orphan = {"instance": f"{ORPHAN_HOST}:9290", "job": "ipmi"}
    samples += [("ipmi_dcmi_power_consumption_watts", orphan, t, 200.0) for t in times_s]
    samples += [
        ("ipmi_temperature_celsius", {**orphan, "name": "Inlet Temp", "id": "1"}, t, 21.0)
        for t in times_s
    ]
    return samples, truth


@pytest.fixture(scope="module")
def fleet_prometheus(tmp_path_factory: pytest.TempPathFactory):
    """(Prometheus server, truth) for the small fleet; one server for the whole module."""
    require_prometheus()
    samples, truth = _fleet()
    with start_prometheus(
        tmp_path_factory.mktemp("fleet"), openmetrics_text=write_openmetrics(samples)
    ) as prom:
        yield prom, truth


def _config(url: str, **settings) -> CollectConfig:
    return CollectConfig(url=url, step_s=STEP_S, timeout_s=10.0, **settings)


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _assert_matches_truth(frame: pd.DataFrame, truth: dict, start_s: int, end_s: int) -> None:
    """Every node has every step; gauges equal the loaded samples at sample times; cpu_util
    equals the known utilisation away from segment edges (where rate windows mix segments)."""
    assert list(frame.columns) == list(CONTRACT_COLUMNS)
    assert pd.api.types.is_string_dtype(frame["node"])
    assert isinstance(frame["timestamp"].dtype, pd.DatetimeTZDtype)
    assert str(frame["timestamp"].dt.tz) == "UTC"
    for column in CONTRACT_COLUMNS[2:]:
        assert frame[column].dtype == np.float64, column
    assert sorted(frame["node"].unique()) == sorted(HOSTS)
    grid_s = np.arange(start_s, end_s + 1, STEP_S)
    for node, node_truth in truth.items():
        rows = frame[frame["node"] == node]
        times_s = (rows["timestamp"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy()
        np.testing.assert_array_equal(times_s, grid_s)
        at_sample = (times_s - T0_S) % SCRAPE_S == 0
        sample_index = ((times_s[at_sample] - T0_S) // SCRAPE_S).astype(int)
        for column in ("ambient_temp_c", "cpu1_temp_c", "cpu2_temp_c", "power_w"):
            if column in node_truth:
                np.testing.assert_array_equal(
                    rows[column].to_numpy()[at_sample], node_truth[column][sample_index]
                )
            else:
                assert rows[column].isna().all(), (node, column)
        into_segment_s = (times_s - T0_S) % SEGMENT_S
        clean = (into_segment_s >= 240) & (into_segment_s <= SEGMENT_S - 60)
        assert clean.sum() > 0.8 * len(times_s)
        expected_util = node_truth["segment_util"][((times_s - T0_S) // SEGMENT_S).astype(int)]
        np.testing.assert_allclose(
            rows["cpu_util"].to_numpy()[clean], expected_util[clean], rtol=0, atol=1e-9
        )


@pytest.mark.prometheus
def test_collect_metrics_matches_loaded_series_over_several_chunks(fleet_prometheus) -> None:
    prom, truth = fleet_prometheus
    stats = CollectStats()
    frame = collect_metrics(
        _config(prom.url), _utc(T0_S), _utc(COLLECT_END_S), progress=False, stats=stats
    )
    assert stats.chunks == 2
    _assert_matches_truth(frame, truth, T0_S, COLLECT_END_S)
    # The BMC on a host without node_exporter maps to no node: counted, not silently dropped.
    assert stats.unmapped_counts() == {"temperature": 1, "power_w": 1}
    assert stats.unmapped_instances() == [f"{ORPHAN_HOST}:9290"]
    assert stats.sensors["node-a"] == {
        "ambient_temp_c": "Inlet Temp",
        "cpu1_temp_c": "Temp",
        "cpu2_temp_c": "Temp",
    }


@pytest.mark.prometheus
def test_one_unchunked_query_would_exceed_the_prometheus_limit(fleet_prometheus) -> None:
    prom, _ = fleet_prometheus
    with (
        PrometheusReader(_config(prom.url)) as reader,
        pytest.raises(CollectError, match="11,000 points") as raised,
    ):
        reader.range(DEFAULT_POWER_QUERY, T0_S, COLLECT_END_S)
    assert prom.url in str(raised.value)
    assert DEFAULT_POWER_QUERY in str(raised.value)


@pytest.mark.prometheus
def test_node_label_mapping_and_static_instance_overrides(fleet_prometheus) -> None:
    prom, truth = fleet_prometheus
    end_s = T0_S + 3 * 3600
    stats = CollectStats()
    frame = collect_metrics(
        _config(prom.url, node_from="label", max_points_per_series=500),
        _utc(T0_S),
        _utc(end_s),
        progress=False,
        stats=stats,
    )
    assert stats.chunks == 3
    _assert_matches_truth(frame, truth, T0_S, end_s)
    assert stats.unmapped_counts() == {"temperature": 1, "power_w": 1}

    overridden = collect_metrics(
        _config(prom.url, instance_nodes={ORPHAN_HOST: "node-x"}),
        _utc(T0_S),
        _utc(T0_S + 600),
        progress=False,
    )
    orphan = overridden[overridden["node"] == "node-x"]
    assert len(orphan) == 61
    assert (orphan["power_w"] == 200.0).all()
    assert (orphan["ambient_temp_c"] == 21.0).all()
    assert orphan["cpu_util"].isna().all()


@pytest.mark.prometheus
def test_collect_instant_gives_one_row_per_node_like_the_range(fleet_prometheus) -> None:
    prom, truth = fleet_prometheus
    at_s = T0_S + 5 * SEGMENT_S + 900 + 30  # mid-segment, 30 s after a scrape
    stats = CollectStats()
    frame = collect_instant(_config(prom.url), at=_utc(at_s), stats=stats)
    assert list(frame.columns) == list(CONTRACT_COLUMNS)
    assert sorted(frame["node"]) == sorted(HOSTS)
    assert (frame["timestamp"] == pd.Timestamp(at_s, unit="s", tz="UTC")).all()
    last_sample = (at_s - T0_S) // SCRAPE_S
    for node, node_truth in truth.items():
        row = frame[frame["node"] == node].iloc[0]
        assert row["cpu_util"] == pytest.approx(node_truth["segment_util"][5], abs=1e-9)
        assert row["power_w"] == node_truth["power_w"][last_sample]
        assert row["cpu1_temp_c"] == node_truth["cpu1_temp_c"][last_sample]
    assert np.isnan(frame.loc[frame["node"] == "node-c", "cpu2_temp_c"].iloc[0])
    assert stats.unmapped_counts() == {"temperature": 1, "power_w": 1}

    # The range path at the same instant computes the same features.
    ranged = collect_metrics(_config(prom.url), _utc(at_s), _utc(at_s), progress=False)
    pd.testing.assert_frame_equal(ranged, frame)


@pytest.mark.prometheus
def test_a_query_prometheus_rejects_names_the_query_and_the_reason(fleet_prometheus) -> None:
    prom, _ = fleet_prometheus
    config = _config(prom.url, cpu_query="rate(node_cpu_seconds_total[")
    with pytest.raises(CollectError, match=r"HTTP 400.*bad_data") as raised:
        collect_metrics(config, _utc(T0_S), _utc(T0_S + 600), progress=False)
    assert "rate(node_cpu_seconds_total[" in str(raised.value)
