"""Tests of the collect step (training.collect and the livedata settings, reader and node
mapping it uses) against a real Prometheus server, and of the test server itself."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from dataclasses import fields
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from livedata.collect_config import (
    DEFAULT_CPU_QUERY,
    DEFAULT_POWER_QUERY,
    PROMETHEUS_MAX_POINTS,
    CollectConfig,
    CollectConfigError,
    compile_sensor_rules,
    load_collect_config,
    parse_duration_s,
    parse_time,
    render_query,
)
from livedata.metrics_table import CONTRACT_COLUMNS
from livedata.node_mapping import CollectStats, assign_sensor_columns, instance_host, node_of
from livedata.prometheus import CollectError, PrometheusReader
from tests.support.prometheus import (
    free_port,
    require_prometheus,
    start_prometheus,
    write_openmetrics,
)
from training.collect import (
    FIRST_CHUNK_STEPS,
    chunk_steps,
    collect_instant,
    collect_metrics,
    collect_to_directory,
)
from training.dataset import clean_metrics, stream_metrics
from training.fit.node import iter_node_rows
from training.fit.settings import FEATURE_FILL

REPO_ROOT = Path(__file__).resolve().parents[1]
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
    equals the known utilisation away from segment edges (where rate windows mix segments).
    The node facts Prometheus has follow the contract columns: here the highest power read."""
    assert list(frame.columns) == [*CONTRACT_COLUMNS, "bmc_max_power_w"]
    assert (frame.groupby("node")["bmc_max_power_w"].nunique() == 1).all()
    assert (frame["bmc_max_power_w"] >= frame.groupby("node")["power_w"].transform("max")).all()
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
def test_a_sample_budget_bounds_every_chunk_and_changes_no_row(fleet_prometheus) -> None:
    prom, truth = fleet_prometheus
    end_s = T0_S + 3 * 3600
    budget = 400  # tiny, as if the fleet were a thousand times larger
    tight, roomy = CollectStats(), CollectStats()
    chunked = collect_metrics(
        _config(prom.url, max_samples_per_chunk=budget), _utc(T0_S), _utc(end_s),
        progress=False, stats=tight,
    )  # fmt: skip
    whole = collect_metrics(_config(prom.url), _utc(T0_S), _utc(end_s), progress=False, stats=roomy)
    # a short first chunk (the fleet's size is not known yet), then the rest in one go
    assert roomy.chunks == 2 and roomy.largest_chunk_samples > budget
    assert tight.chunks > 10
    # every chunk after the first within the budget
    first_chunk = collect_metrics(
        _config(prom.url), _utc(T0_S), _utc(T0_S + (FIRST_CHUNK_STEPS - 1) * STEP_S),
        progress=False, stats=(first := CollectStats()),
    )  # fmt: skip
    assert len(first_chunk) > 0
    assert tight.largest_chunk_samples <= max(budget, first.largest_chunk_samples)
    pd.testing.assert_frame_equal(chunked, whole)
    _assert_matches_truth(chunked, truth, T0_S, end_s)


@pytest.mark.prometheus
def test_an_idle_counter_running_fast_reads_as_zero_utilisation_not_a_dropped_row(
    tmp_path: Path,
) -> None:
    # Scrape jitter makes rate(idle) of an idle node exceed 1 now and then; 1 - rate would be
    # negative and cleaning would drop the idle rows, the ones that pin the curve's low end.
    samples = []
    for i in range(30):
        at_s = T0_S + i * SCRAPE_S
        host = {"instance": "10.0.0.1:9100", "job": "node"}
        idle = {**host, "cpu": "0", "mode": "idle"}
        samples += [
            ("node_cpu_seconds_total", idle, at_s, 5000.0 + 1.01 * i * SCRAPE_S),
            ("node_uname_info", {**host, "nodename": "node-a"}, at_s, 1.0),
            ("ipmi_dcmi_power_consumption_watts", {"instance": "10.0.0.1:9290"}, at_s, 90.0),
        ]
    with start_prometheus(tmp_path, openmetrics_text=write_openmetrics(samples)) as prom:
        frame = collect_metrics(
            CollectConfig(url=prom.url, step_s=SCRAPE_S), _utc(T0_S + 5 * SCRAPE_S),
            _utc(T0_S + 29 * SCRAPE_S), progress=False,
        )  # fmt: skip
    assert len(frame) == 25
    assert (frame["cpu_util"] == 0.0).all()


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
    assert list(frame.columns) == [*CONTRACT_COLUMNS, "bmc_max_power_w"]
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
def test_a_fractional_timeout_is_sent_in_a_form_prometheus_accepts(fleet_prometheus) -> None:
    # Prometheus refuses a query timeout of "1.25s" as bad_data; the live poller splits its
    # budget into such fractions.
    prom, _ = fleet_prometheus
    at_s = T0_S + 5 * SEGMENT_S + 900 + 30
    frame = collect_instant(
        CollectConfig(url=prom.url, step_s=STEP_S, timeout_s=1.25), at=_utc(at_s)
    )
    assert sorted(frame["node"]) == sorted(HOSTS)


@pytest.mark.prometheus
def test_a_query_prometheus_rejects_names_the_query_and_the_reason(fleet_prometheus) -> None:
    prom, _ = fleet_prometheus
    config = _config(prom.url, cpu_query="rate(node_cpu_seconds_total[")
    with pytest.raises(CollectError, match=r"HTTP 400.*bad_data") as raised:
        collect_metrics(config, _utc(T0_S), _utc(T0_S + 600), progress=False)
    assert "rate(node_cpu_seconds_total[" in str(raised.value)


# --------------------------------------------------------------------------------------------
# Prometheus unreachable, too slow, or answering garbage: CollectError naming the problem


@contextlib.contextmanager
def _serve(status: int, body: bytes, content_type: str, delay: threading.Event | None = None):
    """A tiny HTTP server on 127.0.0.1 answering every GET the same way; yields its URL.

    With `delay`, each answer waits until the event is set (or 30 s): a hung server.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if delay is not None:
                delay.wait(30)
            # The client may have given up already (the timeout test): nothing to report.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        if delay is not None:
            delay.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _collect_range(config: CollectConfig) -> pd.DataFrame:
    return collect_metrics(config, _utc(T0_S), _utc(T0_S + 600), progress=False)


def _collect_now(config: CollectConfig) -> pd.DataFrame:
    return collect_instant(config)


@pytest.mark.parametrize("collect", [_collect_range, _collect_now])
def test_unreachable_prometheus_raises_collect_error(collect) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(CollectError, match="cannot connect") as raised:
        collect(CollectConfig(url=url, timeout_s=2.0))
    assert url in str(raised.value)
    assert "node_uname_info" in str(raised.value)  # the query it was sending


GARBAGE = [
    (200, b"<html>Please log in to the proxy</html>", "text/html", "not JSON.*log in"),
    (
        200,
        b'{"status": "success", "data": {"result": {"a": 1}}}',
        "application/json",
        "data.result is dict, expected a list",
    ),
    (200, b"[1, 2, 3]", "application/json", "wrong shape: a list"),
    (
        200,
        b'{"status": "success", "data": {"result": [{"metric": {}, "values": 5}]}}',
        "application/json",
        r"result\[0\]\.value.* not a list of \[time, value\] pairs",
    ),
    (
        200,
        b'{"status": "success", "data": {"result": [{"metric": {}, "value": [1, "x"]}]}}',
        "application/json",
        r"result\[0\] .* non-numeric point",
    ),
    (
        200,
        b'{"status": "error", "errorType": "timeout", "error": "query timed out"}',
        "application/json",
        "status 'error': timeout: query timed out",
    ),
    (503, b"upstream unavailable", "text/plain", "HTTP 503.*upstream unavailable"),
]


@pytest.mark.parametrize(("status", "body", "content_type", "problem"), GARBAGE)
@pytest.mark.parametrize("collect", [_collect_range, _collect_now])
def test_garbage_answers_raise_collect_error_naming_the_problem(
    collect, status: int, body: bytes, content_type: str, problem: str
) -> None:
    with (
        _serve(status, body, content_type) as url,
        pytest.raises(CollectError, match=problem) as raised,
    ):
        collect(CollectConfig(url=url, timeout_s=5.0))
    assert url in str(raised.value)


def test_wrong_shape_in_a_range_answer_is_caught_too() -> None:
    body = b'{"status": "success", "data": {"result": [{"metric": {"instance": "h:1"}}]}}'
    with _serve(200, body, "application/json") as url:
        config = CollectConfig(url=url, node_from="label")  # no uname query: straight to ranges
        with pytest.raises(CollectError, match=r"result\[0\]\.values is not a list") as raised:
            _collect_range(config)
    assert "node_cpu_seconds_total" in str(raised.value)


@pytest.mark.parametrize("collect", [_collect_range, _collect_now])
def test_a_hung_prometheus_raises_collect_error_after_the_timeout(collect) -> None:
    with (
        _serve(200, b"{}", "application/json", delay=threading.Event()) as url,
        pytest.raises(CollectError, match=r"no answer within the 0\.3 s timeout"),
    ):
        collect(CollectConfig(url=url, timeout_s=0.3))


# --------------------------------------------------------------------------------------------
# Pure parts: sensor names, node mapping, times, chunks, config files


def _sensor_columns(names_and_ids: list[tuple[str, str]], config: CollectConfig | None = None):
    rules = compile_sensor_rules(config or CollectConfig())
    sensors = [{"name": name, "id": sensor_id} for name, sensor_id in names_and_ids]
    assignment = assign_sensor_columns(sensors, rules)
    return {column: names_and_ids[index][0] for index, column in assignment.items()}


@pytest.mark.parametrize(
    ("sensors", "expected"),
    [
        (
            [("Inlet Temp", "1"), ("Temp", "3"), ("Temp", "2"), ("Exhaust Temp", "4")],
            {"ambient_temp_c": "Inlet Temp", "cpu1_temp_c": "Temp", "cpu2_temp_c": "Temp"},
        ),
        (
            [("CPU1 VRM Temp", "1"), ("CPU1 Temp", "2"), ("P1-DIMMA1 Temp", "3"), ("Ambient", "4")],
            {"ambient_temp_c": "Ambient", "cpu1_temp_c": "CPU1 Temp"},
        ),
        (
            [("01-Inlet Ambient", "1"), ("02-CPU 1", "2"), ("03-CPU 2", "3"), ("CPU10", "4")],
            {
                "ambient_temp_c": "01-Inlet Ambient",
                "cpu1_temp_c": "02-CPU 1",
                "cpu2_temp_c": "03-CPU 2",
            },
        ),
        (
            [("System Board Inlet Temp", "1"), ("Processor 1 Temperature", "2")],
            {"ambient_temp_c": "System Board Inlet Temp", "cpu1_temp_c": "Processor 1 Temperature"},
        ),
    ],
)
def test_vendor_sensor_names_map_to_columns(sensors, expected) -> None:
    assert _sensor_columns(sensors) == expected


def test_dell_temp_sensors_follow_numeric_sensor_ids() -> None:
    rules = compile_sensor_rules(CollectConfig())
    sensors = [{"name": "Temp", "id": "10"}, {"name": "Temp", "id": "9"}]
    assert assign_sensor_columns(sensors, rules) == {1: "cpu1_temp_c", 0: "cpu2_temp_c"}


def test_instance_hosts_and_node_mapping() -> None:
    assert instance_host("10.0.0.1:9100") == "10.0.0.1"
    assert instance_host("[fd00::1]:9290") == "fd00::1"
    assert instance_host("worker-3") == "worker-3"
    config = CollectConfig(instance_nodes={"bmc-7.example:9290": "node-7"})
    host_nodes = {"10.0.0.1": "node-a"}
    assert node_of({"instance": "10.0.0.1:9290"}, config, host_nodes) == "node-a"
    assert node_of({"instance": "bmc-7.example:9290"}, config, host_nodes) == "node-7"
    assert node_of({"instance": "10.0.0.2:9290"}, config, host_nodes) is None
    by_label = CollectConfig(node_from="label")
    assert node_of({"instance": "x:1", "node": "node-q"}, by_label, {}) == "node-q"
    assert node_of({"instance": "x:1"}, by_label, {}) is None


def test_times_durations_and_chunks() -> None:
    now = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
    assert parse_time("now", now=now) == now
    assert parse_time("-7d", now=now) == datetime(2026, 1, 3, 12, 0, tzinfo=UTC)
    assert parse_time("now-1h30m", now=now) == datetime(2026, 1, 10, 10, 30, tzinfo=UTC)
    assert parse_time(str(T0_S)) == datetime(2026, 1, 5, tzinfo=UTC)
    assert parse_time("2026-01-05T01:00:00+01:00") == datetime(2026, 1, 5, tzinfo=UTC)
    with pytest.raises(CollectConfigError, match="no UTC offset"):
        parse_time("2026-01-05T00:00:00")
    with pytest.raises(CollectConfigError, match="bad time 'yesterday'"):
        parse_time("yesterday")
    assert parse_duration_s("1h30m") == 5400
    assert parse_duration_s("90") == 90
    with pytest.raises(CollectConfigError, match="bad duration '5 minutes'"):
        parse_duration_s("5 minutes")


def test_chunks_get_shorter_as_the_fleet_grows_so_memory_does_not() -> None:
    config = CollectConfig(max_samples_per_chunk=1_000_000)
    assert chunk_steps(config, 0) == FIRST_CHUNK_STEPS  # size unknown before the first answer
    assert chunk_steps(CollectConfig(max_points_per_series=40), 0) == 40
    assert chunk_steps(config, 10) == PROMETHEUS_MAX_POINTS  # small fleet: Prometheus's limit
    # 1,000 nodes x (CPU, 3 temperatures, power) series: 200 steps of 5,000 series each
    assert chunk_steps(config, 5_000) == 200
    assert chunk_steps(config, 50_000) == 20  # ten times the fleet, a tenth of the steps
    assert chunk_steps(config, 5_000_000) == 1  # never an empty chunk


def test_config_file_overrides_queries_and_some_sensor_columns(tmp_path: Path) -> None:
    path = tmp_path / "collect.yaml"
    path.write_text(
        "node_from: label\n"
        "power_query: sum by (instance, node) (my_power_watts)\n"
        "sensor_patterns:\n"
        "  ambient_temp_c: ['Front Air']\n"
    )
    config = load_collect_config(path, url="http://127.0.0.1:1")
    assert config.node_from == "label"
    assert config.url == "http://127.0.0.1:1"
    assert config.power_query == "sum by (instance, node) (my_power_watts)"
    mapped = _sensor_columns([("Front Air", "1"), ("Inlet Temp", "2"), ("CPU1 Temp", "3")], config)
    assert mapped == {"ambient_temp_c": "Front Air", "cpu1_temp_c": "CPU1 Temp"}

    path.write_text("nod_from: label\n")
    with pytest.raises(
        CollectConfigError, match=r"collect.yaml: unknown setting\(s\) \['nod_from'\]"
    ):
        load_collect_config(path)
    path.write_text("sensor_patterns: {cpu1_temp_c: ['CPU(1']}\n")
    with pytest.raises(
        CollectConfigError, match=r"sensor_patterns.cpu1_temp_c: bad regex 'CPU\(1'"
    ):
        load_collect_config(path)
    with pytest.raises(CollectConfigError, match="step_s must be a whole number"):
        CollectConfig(step_s=0.5)


def test_render_query_groups_by_node_label_in_label_mode() -> None:
    assert render_query(DEFAULT_CPU_QUERY, CollectConfig(cpu_rate_window="5m")) == (
        'clamp(1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])), 0, 1)'
    )
    assert "by (instance, node)" in render_query(
        DEFAULT_CPU_QUERY, CollectConfig(node_from="label")
    )


# --------------------------------------------------------------------------------------------
# The CLI, end to end


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "training.collect", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.prometheus
def test_cli_writes_parquet_and_csv_that_round_trip(fleet_prometheus, tmp_path: Path) -> None:
    prom, _ = fleet_prometheus
    start = "2026-01-05T02:00:00Z"
    end_s = T0_S + 4 * 3600
    expected = collect_metrics(
        CollectConfig(url=prom.url), _utc(T0_S + 2 * 3600), _utc(end_s), progress=False
    )
    assert len(expected) == 3 * 121
    for name in ("fleet.parquet", "fleet.csv"):
        out = tmp_path / name
        done = _run_cli(
            "--prometheus",
            prom.url,
            "--start",
            start,
            "--end",
            str(end_s),
            "--step",
            "1m",
            "--out",
            str(out),
        )
        assert done.returncode == 0, done.stderr
        assert "collected 363 rows for 3 nodes" in done.stderr
        assert "2 series map to no node" in done.stderr
        if out.suffix == ".parquet":
            written = pd.read_parquet(out)
        else:
            written = pd.read_csv(out)
            written["timestamp"] = pd.to_datetime(written["timestamp"], utc=True)
        pd.testing.assert_frame_equal(written, expected, check_dtype=False, check_index_type=False)
        assert written["timestamp"].dt.tz is not None


def test_cli_bad_input_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "x.parquet")
    bad_time = _run_cli("--prometheus", "http://127.0.0.1:1", "--start", "last week", "--out", out)
    assert bad_time.returncode == 2
    assert bad_time.stderr.strip().splitlines() == [
        "error: bad time 'last week': use RFC 3339 (2026-01-05T00:00:00Z), Unix seconds, "
        "'now' or relative like -7d"
    ]
    url = f"http://127.0.0.1:{free_port()}"
    unreachable = _run_cli("--prometheus", url, "--start", "-1h", "--out", out, "--quiet")
    assert unreachable.returncode == 1
    lines = unreachable.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: Prometheus at {url}")
    assert "Traceback" not in unreachable.stderr
    assert not Path(out).exists()


def test_example_config_file_documents_the_defaults() -> None:
    example = REPO_ROOT / "tests" / "fixtures" / "collect" / "collect-config.example.yaml"
    loaded = load_collect_config(example)
    defaults = CollectConfig()
    for setting in fields(CollectConfig):
        value, default = getattr(loaded, setting.name), getattr(defaults, setting.name)
        if setting.name == "sensor_patterns":
            value = {k: tuple(v) for k, v in value.items()}
        elif isinstance(default, tuple):
            value = tuple(value)
        assert value == default, setting.name
    assert set(yaml.safe_load(example.read_text())) == {f.name for f in fields(CollectConfig)} - {
        "url"
    }


@pytest.mark.prometheus
def test_a_range_without_data_gives_an_empty_table_and_a_cli_error(
    fleet_prometheus, tmp_path: Path
) -> None:
    prom, _ = fleet_prometheus
    before_s = T0_S - 30 * 86400
    frame = collect_metrics(
        _config(prom.url), _utc(before_s), _utc(before_s + 3600), progress=False
    )
    assert frame.empty
    assert list(frame.columns) == list(CONTRACT_COLUMNS)
    out = tmp_path / "none.csv"
    done = _run_cli(
        "--prometheus",
        prom.url,
        "--start",
        str(before_s),
        "--end",
        str(before_s + 3600),
        "--out",
        str(out),
        "--quiet",
    )
    assert done.returncode == 1
    assert "has no data for any node" in done.stderr
    assert not out.exists()


@pytest.mark.prometheus
def test_collect_to_directory_writes_node_groups_chunk_by_chunk(
    fleet_prometheus, tmp_path: Path
) -> None:
    prom, truth = fleet_prometheus
    end_s = T0_S + 3 * 3600
    config = _config(prom.url, max_points_per_series=40)  # many small chunks
    stats = CollectStats()
    files = collect_to_directory(
        config, _utc(T0_S), _utc(end_s), tmp_path / "out", nodes_per_file=2, progress=False,
        stats=stats,
    )  # fmt: skip
    assert stats.chunks == -(-((end_s - T0_S) // STEP_S + 1) // 40) > 3
    assert len(files) == -(-len(HOSTS) // 2)
    # every chunk became one row group per file it touched, never a whole-range table
    assert pq.ParquetFile(files[0]).num_row_groups == stats.chunks
    whole = collect_metrics(config, _utc(T0_S), _utc(end_s), progress=False)
    stream = stream_metrics(tmp_path / "out")
    assert [list(group) for group in stream.groups] == [[file] for file in files]
    streamed = pd.concat([pd.read_parquet(file) for file in files], ignore_index=True)
    streamed = streamed.sort_values(["node", "timestamp"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(streamed, whole, check_dtype=False)
    _assert_matches_truth(streamed, truth, T0_S, end_s)


@pytest.mark.prometheus
def test_cli_nodes_per_file_writes_a_directory_that_fit_streams(
    fleet_prometheus, tmp_path: Path
) -> None:
    prom, _ = fleet_prometheus
    end_s = T0_S + 4 * 3600
    expected = collect_metrics(
        CollectConfig(url=prom.url), _utc(T0_S + 2 * 3600), _utc(end_s), progress=False
    )
    out = tmp_path / "fleet"
    done = _run_cli(
        "--prometheus", prom.url, "--start", "2026-01-05T02:00:00Z", "--end", str(end_s),
        "--out", str(out), "--nodes-per-file", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "collected 363 rows for 3 nodes into 3 file(s)" in done.stderr
    stream = stream_metrics(out)
    assert (stream.n_nodes, len(stream.groups)) == (3, 3)
    streamed = pd.concat([batch.frame for batch in stream], ignore_index=True)
    pd.testing.assert_frame_equal(
        streamed.sort_values(["node", "timestamp"]).reset_index(drop=True),
        expected,
        check_dtype=False,
    )


@pytest.mark.prometheus
def test_node_facts_come_from_cpu_info_nfd_labels_and_the_highest_power_read(
    tmp_path: Path,
) -> None:
    samples = []
    nfd = "label_feature_node_kubernetes_io_cpu_model_"
    for i in range(40):
        at_s = T0_S + i * SCRAPE_S
        for host, node, watts in (("10.0.0.1", "node-a", 300.0), ("10.0.0.2", "node-b", 150.0)):
            exporter = {"instance": f"{host}:9100", "job": "node"}
            idle = {**exporter, "cpu": "0", "mode": "idle"}
            samples += [
                ("node_cpu_seconds_total", idle, at_s, 5000.0 + 0.5 * i * SCRAPE_S),
                ("node_uname_info", {**exporter, "nodename": node}, at_s, 1.0),
                (
                    "ipmi_dcmi_power_consumption_watts",
                    {"instance": f"{host}:9290"},
                    at_s,
                    watts + (200.0 if i == 3 else 0.0),  # one early peak, before the range
                ),
            ]
        for package in ("0", "1"):
            for core in ("0", "1"):
                for thread in ("0", "1"):
                    cpu = str(int(package) * 4 + int(core) * 2 + int(thread))
                    labels = {
                        "instance": "10.0.0.1:9100",
                        "job": "node",
                        "cpu": cpu,
                        "package": package,
                        "core": core,
                        "model_name": "AMD EPYC 9654 96-Core Processor",
                    }
                    samples.append(("node_cpu_info", labels, at_s, 1.0))
        samples.append(
            (
                "kube_node_labels",
                {
                    "node": "node-b",
                    nfd + "vendor_id": "Intel",
                    nfd + "family": "6",
                    nfd + "id": "79",
                },
                at_s,
                1.0,
            )
        )
    with start_prometheus(tmp_path, openmetrics_text=write_openmetrics(samples)) as prom:
        frame = collect_metrics(
            CollectConfig(url=prom.url, step_s=SCRAPE_S), _utc(T0_S + 10 * SCRAPE_S),
            _utc(T0_S + 39 * SCRAPE_S), progress=False,
        )  # fmt: skip
    assert list(frame.columns[: len(CONTRACT_COLUMNS)]) == list(CONTRACT_COLUMNS)
    facts = frame.groupby("node").last()
    assert facts.loc["node-a", "cpu_model"] == "AMD EPYC 9654 96-Core Processor"
    assert facts.loc["node-a", "cpu_sockets"] == 2 and facts.loc["node-a", "cpu_cores"] == 4
    assert facts.loc["node-b", "cpu_model"] == "GenuineIntel family 6 model 79"
    assert pd.isna(facts.loc["node-b", "cpu_cores"])
    # the peak before the collected range is the BMC's highest reading all the same
    assert facts.loc["node-a", "bmc_max_power_w"] == 500.0
    assert frame.loc[frame["node"] == "node-a", "power_w"].max() == 300.0
    # no temperatures were loaded here: the facts, not the features, are what is checked
    cleaned = clean_metrics(frame.assign(ambient_temp_c=22.0, cpu1_temp_c=40.0), source="collected")
    by_node = {rows.node: rows.facts for rows in iter_node_rows(cleaned.frame, FEATURE_FILL)}
    assert by_node["node-a"].generation == "modern" and by_node["node-b"].generation == "old"
