"""Carbon intensity sources: the services' answer shapes, units, the providers over real HTTP and a
real Prometheus, and the background source's snapshots (aging, failures, metrics)."""

from __future__ import annotations

import base64
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from extender.plugins.carbon import CARBON_SIGNAL
from extender.state import ClusterState
from livedata.carbon import (
    AVERAGE,
    MARGINAL,
    CarbonDataError,
    IntensityPoint,
    IntensityReading,
    lbs_per_mwh_to_g_per_kwh,
    parse_timestamp_s,
    window_means,
)
from livedata.carbon_apis import (
    carbon_aware_emissions,
    carbon_aware_forecasts,
    electricity_maps_forecast,
    electricity_maps_latest,
    read_intensity_file,
    watttime_forecast,
)
from livedata.carbon_providers import (
    CarbonSourceError,
    FileProvider,
    provider_from_config,
)
from livedata.carbon_source import CarbonSource, build_snapshot, node_g_per_kwh
from livedata.deferral import DeferralError, defer_deadline_s, parse_duration_s, pod_deadline_s
from livedata.labels import CARBON_INTENSITY_ANNOTATION, CARBON_INTENSITY_AT_ANNOTATION
from tests.support.carbon_services import Route, SdkData, carbon_aware_sdk, recorded_service
from tests.support.prometheus import start_prometheus, write_openmetrics

FIXTURES = Path(__file__).parent / "fixtures" / "carbon"


def recorded(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


def ts(text: str) -> float:
    return parse_timestamp_s(text, "test")


# ---- units and answer shapes -----------------------------------------------------------------


def test_watttime_lbs_per_mwh_are_converted_to_g_per_kwh() -> None:
    # 1 lb = 453.59237 g and 1 MWh = 1000 kWh: 1000 lbs/MWh is 453.59237 g/kWh.
    assert lbs_per_mwh_to_g_per_kwh(1000.0) == pytest.approx(453.59237, abs=1e-9)
    reading = watttime_forecast(recorded("watttime_v3_forecast.json"), "watttime")
    lbs = [1048.4131919701972, 1051.0880801214637, 998.2, 870.0]
    assert [p.g_per_kwh for p in reading.forecast] == pytest.approx([v * 0.45359237 for v in lbs])
    assert reading.g_per_kwh == pytest.approx(475.5523, abs=1e-3)  # the first point is now
    assert reading.signal == MARGINAL and reading.name == "CAISO_NORTH"
    assert reading.observed_at_s == ts("2022-07-15T00:00:00Z")
    assert [p.end_s - p.start_s for p in reading.forecast] == [300.0] * 4


def test_a_watttime_percentile_is_not_taken_for_an_intensity() -> None:
    with pytest.raises(CarbonDataError, match=r"meta\.units.*'percentile'"):
        watttime_forecast(recorded("watttime_v3_signal_index.json"), "watttime")


def test_electricity_maps_latest_and_forecast() -> None:
    latest = electricity_maps_latest(recorded("electricity_maps_latest.json"), "em")
    assert (latest.name, latest.signal, latest.g_per_kwh) == ("DE", AVERAGE, 302.0)
    assert latest.observed_at_s == ts("2018-04-25T18:00:00Z")
    zone, points, generated_at_s = electricity_maps_forecast(
        recorded("electricity_maps_forecast.json"), "em"
    )
    assert zone == "DE" and generated_at_s == ts("2018-04-25T18:07:01Z")
    assert [p.g_per_kwh for p in points] == [305.0, 280.0, 247.0, 231.0]
    # Hourly points each last until the next; the last one as long as the others.
    assert [p.end_s - p.start_s for p in points] == [3600.0] * 4


def test_carbon_aware_sdk_answers() -> None:
    current = carbon_aware_emissions(recorded("carbon_aware_sdk_bylocations.json"), MARGINAL, "sdk")
    by_location = {r.name: r for r in current}
    assert by_location["eastus"].g_per_kwh == 70.0  # the newest of its two values
    assert by_location["westus"].g_per_kwh == 64.0
    assert by_location["eastus"].observed_at_s == pytest.approx(ts("2022-05-17T20:45:11.509274Z"))
    assert carbon_aware_emissions(None, MARGINAL, "sdk") == []  # 204 No Content
    forecasts = carbon_aware_forecasts(
        recorded("carbon_aware_sdk_forecasts_current.json"), MARGINAL, "sdk"
    )
    points, generated_at_s = forecasts["northeurope"]
    assert generated_at_s == ts("2022-07-19T13:35:00Z")
    assert [p.end_s - p.start_s for p in points] == [600.0] * 3
    assert [p.g_per_kwh for p in points] == [532.02293146, 448.4451043375, 535.7318741001667]


@pytest.mark.parametrize(
    ("parse", "body", "message"),
    [
        (
            lambda b: electricity_maps_latest(b, "em"),
            {"zone": "DE", "carbonIntensity": None, "datetime": "2024-01-01T00:00:00Z"},
            r"em\.carbonIntensity: expected a number of g/kWh, got None",
        ),
        (
            lambda b: carbon_aware_emissions(b, AVERAGE, "sdk"),
            [{"location": "eastus", "time": "yesterday", "rating": 1}],
            r"sdk\[0\]\.time: 'yesterday' is not an RFC 3339 timestamp",
        ),
        (
            lambda b: watttime_forecast(b, "wt"),
            {"data": [], "meta": {"region": "X", "signal_type": "health_damage"}},
            r"wt\.meta\.signal_type: 'health_damage' is not a carbon intensity",
        ),
        (
            lambda b: carbon_aware_forecasts(b, AVERAGE, "sdk"),
            [
                {
                    "location": "x",
                    "generatedAt": "2024-01-01T00:00:00Z",
                    "forecastData": [
                        {"timestamp": "2024-01-01T00:00:00Z", "duration": 0, "value": 1}
                    ],
                }
            ],
            r"sdk\[0\]\.forecastData\[0\]\.duration: expected minutes > 0, got 0",
        ),
        (
            lambda b: electricity_maps_latest(b, "em"),
            {"zone": "DE", "carbonIntensity": -5, "datetime": "2024-01-01T00:00:00Z"},
            r"em\.carbonIntensity: expected a finite number >= 0, got -5",
        ),
    ],
)
def test_a_bad_answer_names_the_field_and_value(parse, body: object, message: str) -> None:
    with pytest.raises(CarbonDataError, match=message):
        parse(body)


def test_a_static_file_of_zones_and_nodes(tmp_path: Path) -> None:
    path = tmp_path / "intensity.yaml"
    path.write_text(
        """
intensities:
  - {zone: site-a, g_per_kwh: 45}
  - zone: site-a
    signal: marginal
    g_per_kwh: 400
    observed_at: 2024-05-01T10:00:00Z
    forecast:
      - {start: 2024-05-01T11:00:00Z, end: 2024-05-01T12:00:00Z, g_per_kwh: 350}
  - {node: edge-7, g_per_kwh: 20}
"""
    )
    os.utime(path, (1_700_000_000, 1_700_000_000))
    zones, nodes = read_intensity_file(path)
    assert [(r.name, r.signal, r.g_per_kwh) for r in zones] == [
        ("site-a", AVERAGE, 45.0),
        ("site-a", MARGINAL, 400.0),
    ]
    assert zones[0].observed_at_s == 1_700_000_000  # no observed_at: the file's mtime
    assert zones[1].forecast == (
        IntensityPoint(ts("2024-05-01T11:00:00Z"), ts("2024-05-01T12:00:00Z"), 350.0),
    )
    assert [(r.name, r.g_per_kwh) for r in nodes] == [("edge-7", 20.0)]

    path.write_text("intensities:\n  - {zone: a, g_per_kwh: 1}\n  - {zone: b, g_per_kwh: lots}\n")
    with pytest.raises(CarbonDataError, match=r"intensity\.yaml: intensities\[1\]\.g_per_kwh"):
        read_intensity_file(path)


def test_window_means_average_over_time_and_not_across_gaps_or_past_the_end() -> None:
    hour = 3600.0
    points = [
        IntensityPoint(0 * hour, 1 * hour, 100.0),
        IntensityPoint(1 * hour, 2 * hour, 200.0),
        IntensityPoint(2 * hour, 3 * hour, 50.0),
        IntensityPoint(5 * hour, 6 * hour, 10.0),  # after a gap
    ]
    starts = [0.0, 0.5 * hour, hour, 2 * hour, 5 * hour, -hour]
    means = window_means(points, starts, 1.5 * hour)
    expected = [(100 + 0.5 * 200) / 1.5, (50 + 200) / 1.5, (200 + 0.5 * 50) / 1.5]
    assert means[:3] == pytest.approx(expected)
    # Past a run's end (into the gap), past the last point, before the first: not covered.
    assert np.isnan(means[3:]).all()


# ---- the defer-until annotation ----------------------------------------------------------------


def test_defer_until_is_a_time_or_a_duration_from_creation() -> None:
    created = ts("2024-05-01T10:00:00Z")
    assert defer_deadline_s("6h", created) == created + 6 * 3600
    assert defer_deadline_s("1h30m", created) == created + 5400
    assert defer_deadline_s("2.5h", created) == created + 9000
    assert defer_deadline_s("2024-05-01T18:00:00Z", None) == ts("2024-05-01T18:00:00Z")
    assert parse_duration_s("90m") == 5400
    for bad in ("6 hours", "tomorrow", "-1h", "h", "2024-13-45T00:00:00Z"):
        with pytest.raises(DeferralError):
            defer_deadline_s(bad, created)
    with pytest.raises(DeferralError, match="creationTimestamp"):
        defer_deadline_s("6h", None)
    pod = {
        "metadata": {
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "annotations": {"power-aware-scheduler/defer-until": "6h"},
        }
    }
    assert pod_deadline_s(pod) == created + 6 * 3600
    assert pod_deadline_s({"metadata": {"annotations": None}}) is None
    assert pod_deadline_s(None) is None


# ---- providers over real HTTP ------------------------------------------------------------------


def test_watttime_provider_logs_in_and_converts(tmp_path: Path) -> None:
    (tmp_path / "user").write_text("ada\n")
    (tmp_path / "password").write_text("s3cret\n")
    basic = "Basic " + base64.b64encode(b"ada:s3cret").decode()
    routes = {
        "/login": Route({"token": "tok-1"}, header=("Authorization", basic)),
        "/v3/forecast": Route(
            recorded("watttime_v3_forecast.json"), header=("Authorization", "Bearer tok-1")
        ),
    }
    with recorded_service(routes) as (url, seen):
        provider = provider_from_config(
            {
                "kind": "watttime",
                "url": url,
                "usernameFile": str(tmp_path / "user"),
                "passwordFile": str(tmp_path / "password"),
                "zones": {"us-west": "CAISO_NORTH"},
            },
            "sources[0]",
            index=0,
            timeout_s=5.0,
            prometheus_url=None,
        )
        readings = provider.fetch(0.0, ["us-west", "eu-north"])
    (reading,) = readings.zones
    assert reading.name == "us-west" and reading.signal == MARGINAL
    assert reading.g_per_kwh == pytest.approx(1048.4131919701972 * 0.45359237)
    forecast_request = [q for path, q, _ in seen if path == "/v3/forecast"]
    assert forecast_request == [{"region": ["CAISO_NORTH"], "signal_type": ["co2_moer"]}]


def test_electricity_maps_provider_sends_the_token_and_asks_per_zone(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("em-token")
    header = ("auth-token", "em-token")
    routes = {
        "/v3/carbon-intensity/latest": Route(
            recorded("electricity_maps_latest.json"), header=header
        ),
        "/v3/carbon-intensity/forecast": Route(
            recorded("electricity_maps_forecast.json"), header=header
        ),
    }
    with recorded_service(routes) as (url, seen):
        provider = provider_from_config(
            {"kind": "electricity-maps", "url": url, "tokenFile": str(tmp_path / "token")},
            "sources[0]",
            index=0,
            timeout_s=5.0,
            prometheus_url=None,
        )
        (reading,) = provider.fetch(0.0, ["DE"]).zones
        assert (reading.name, reading.g_per_kwh, len(reading.forecast)) == ("DE", 302.0, 4)
        (tmp_path / "token").write_text("wrong")
        with pytest.raises(CarbonSourceError, match="HTTP 401"):
            provider.fetch(0.0, ["DE"])
    assert {tuple(q["zone"]) for _, q, _ in seen} == {("DE",)}


def test_carbon_aware_sdk_provider_reads_the_webapi() -> None:
    now_s = ts("2024-05-01T12:00:00Z")
    data = SdkData(
        emissions={
            "eastus": [(now_s - 900, 410.0, 300), (now_s - 300, 400.0, 300)],
            "westus": [(now_s - 300, 120.0, 300)],
        },
        forecasts={
            "eastus": (now_s - 60, [(now_s + 3600 * k, 400.0 - 20 * k) for k in range(6)], 60)
        },
    )
    with carbon_aware_sdk(data) as url:
        provider = provider_from_config(
            {
                "kind": "carbon-aware-sdk",
                "url": url,
                "signal": "marginal",
                "zones": {"us-east": "eastus", "us-west": "westus", "eu": "northeurope"},
            },
            "sources[0]",
            index=0,
            timeout_s=5.0,
            prometheus_url=None,
        )
        readings = {r.name: r for r in provider.fetch(now_s, []).zones}
        data.emissions.clear()
        data.forecasts.clear()
        assert provider.fetch(now_s, []).zones == ()  # 204 and an empty array: nothing known
    assert readings["us-east"].g_per_kwh == 400.0 and readings["us-west"].g_per_kwh == 120.0
    assert [p.g_per_kwh for p in readings["us-east"].forecast] == [400, 380, 360, 340, 320, 300]
    assert readings["us-east"].forecast_generated_at_s == now_s - 60
    assert readings["us-west"].forecast == () and "eu" not in readings
    path, query = data.requests[0]
    assert path == "/emissions/bylocations"
    assert query["location"] == ["eastus", "northeurope", "westus"]  # one parameter per location
    assert parse_timestamp_s(query["toTime"][0], "q") == now_s


def test_prometheus_provider_reads_zones_forecasts_and_nodes(tmp_path: Path) -> None:
    at_s = 1_767_571_200.0  # a fixed time the backfilled samples lead up to
    samples = []
    for back_s in (600.0, 300.0, 60.0):
        t = at_s - back_s
        samples += [
            ("grid_carbon_intensity_g_per_kwh", {"zone": "zone-a"}, t, 120.0),
            ("grid_carbon_intensity_g_per_kwh", {"zone": "zone-b"}, t, 540.0),
            ("node_carbon_intensity_g_per_kwh", {"node": "edge-1"}, t, 30.0),
        ]
        samples += [
            (
                "grid_carbon_intensity_forecast_g_per_kwh",
                {"zone": "zone-a", "hours_ahead": str(h)},
                t,
                120.0 - 10 * h,
            )
            for h in range(1, 4)
        ]
    with start_prometheus(tmp_path, openmetrics_text=write_openmetrics(samples)) as prom:
        zones = provider_from_config(
            {
                "kind": "prometheus",
                "query": "grid_carbon_intensity_g_per_kwh",
                "forecastQuery": "grid_carbon_intensity_forecast_g_per_kwh",
            },
            "sources[0]",
            index=0,
            timeout_s=5.0,
            prometheus_url=prom.url,
        ).fetch(at_s, [])
        nodes = provider_from_config(
            {"kind": "prometheus-node", "query": "node_carbon_intensity_g_per_kwh"},
            "sources[1]",
            index=1,
            timeout_s=5.0,
            prometheus_url=prom.url,
        ).fetch(at_s, [])
    by_zone = {r.name: r for r in zones.zones}
    assert by_zone["zone-a"].g_per_kwh == 120.0 and by_zone["zone-b"].g_per_kwh == 540.0
    # timestamp(): the sample's own time, not the query's.
    assert by_zone["zone-a"].observed_at_s == at_s - 60
    forecast = by_zone["zone-a"].forecast
    assert [(p.start_s - (at_s - 60), p.g_per_kwh) for p in forecast] == [
        (3600.0, 110.0),
        (7200.0, 100.0),
        (10800.0, 90.0),
    ]
    assert by_zone["zone-b"].forecast == ()
    assert [(r.name, r.g_per_kwh) for r in nodes.nodes] == [("edge-1", 30.0)]


# ---- the background source ----------------------------------------------------------------


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def test_a_failing_source_keeps_its_readings_until_they_expire(tmp_path: Path) -> None:
    path = tmp_path / "intensity.yaml"
    path.write_text("intensities:\n  - {zone: a, g_per_kwh: 80, observed_at: 1000}\n")
    clock = Clock(1000.0)
    state = ClusterState()
    registry = CollectorRegistry()
    source = CarbonSource(
        [FileProvider(name="site", max_age_s=None, timeout_s=1.0, path=str(path))],
        lambda snapshot: state.set_signal(CARBON_SIGNAL, snapshot),
        lambda: ["a"],
        interval_s=60.0,
        max_age_s=3600.0,
        forecast_max_age_s=3600.0,
        clock=clock,
        registry=registry,
    )
    snapshot = source.poll_once()
    assert state.view(clock()).signal(CARBON_SIGNAL) is snapshot
    entry = snapshot.zones[("a", AVERAGE)]
    assert entry.current_g_per_kwh(1000.0 + 3600.0) == 80.0
    assert math.isnan(entry.current_g_per_kwh(1000.0 + 3601.0))  # past the max age

    path.write_text("not: [valid")
    clock.now_s = 2000.0
    snapshot = source.poll_once()
    assert snapshot.zones[("a", AVERAGE)].reading.g_per_kwh == 80.0  # kept, aging
    status = source.status()["site"]
    assert status["consecutive_failures"] == 1 and "not valid YAML" in status["last_error"]
    text = generate_latest(registry).decode()
    labels = 'signal="average",source="site",zone="a"'
    assert f"power_aware_extender_carbon_intensity_g_per_kwh{{{labels}}} 80.0" in text
    assert f"power_aware_extender_carbon_intensity_age_seconds{{{labels}}} 1000.0" in text
    polls = 'power_aware_extender_carbon_source_polls_total{outcome="failure",source="site"}'
    assert f"{polls} 1.0" in text


def test_the_newest_reading_wins_and_each_source_may_have_its_own_max_age() -> None:
    old = IntensityReading("z", AVERAGE, "slow", 300.0, 1000.0)
    new = IntensityReading("z", AVERAGE, "fast", 200.0, 2000.0)
    snapshot = build_snapshot(
        [new, old],
        [],
        published_at_s=2000.0,
        max_age_s=100.0,
        forecast_max_age_s=100.0,
        source_max_age_s={"fast": 50.0},
    )
    entry = snapshot.zones[("z", AVERAGE)]
    assert entry.reading.source == "fast" and entry.valid_until_s == 2050.0


def test_configuration_errors_name_the_key() -> None:
    cases = [
        ({"kind": "nope"}, r"sources\[0\]\.kind: one of prometheus"),
        ({"kind": "carbon-aware-sdk", "url": "http://x"}, r"sources\[0\]\.signal"),
        ({"kind": "file", "path": "/x", "colour": "red"}, r"sources\[0\]\.colour: unknown key"),
        ({"kind": "watttime", "usernameFile": "/u"}, r"sources\[0\]\.passwordFile"),
        ({"kind": "prometheus", "query": "q"}, r"sources\[0\]\.url: required here"),
        ({"kind": "file", "path": "/x", "maxAgeSeconds": -1}, r"sources\[0\]\.maxAgeSeconds"),
    ]
    for raw, message in cases:
        with pytest.raises(ValueError, match=message):
            provider_from_config(raw, "sources[0]", index=0, timeout_s=1.0, prometheus_url=None)


def test_a_nodes_intensity_is_its_own_supply_then_its_node_reading_then_its_zone() -> None:
    now_s = 10_000.0
    snapshot = build_snapshot(
        [IntensityReading("grid", AVERAGE, "api", 300.0, now_s - 600.0)],
        [IntensityReading("solar-node", AVERAGE, "meter", 40.0, now_s - 60.0)],
        published_at_s=now_s,
        max_age_s=3600.0,
        forecast_max_age_s=3600.0,
    )
    own = {CARBON_INTENSITY_ANNOTATION: "20"}
    assert node_g_per_kwh(snapshot, "plain", "grid", AVERAGE, now_s) == 300.0
    assert node_g_per_kwh(snapshot, "solar-node", "grid", AVERAGE, now_s) == 40.0
    assert node_g_per_kwh(snapshot, "solar-node", "grid", AVERAGE, now_s, annotations=own) == 20.0
    stale_own = {**own, CARBON_INTENSITY_AT_ANNOTATION: "1970-01-01T00:00:00Z"}
    assert (
        node_g_per_kwh(
            snapshot, "plain", "grid", AVERAGE, now_s, annotations=stale_own, max_age_s=3600.0
        )
        == 300.0
    )
    # Unknown zone, other signal, or past the max age: no intensity, never a guess.
    assert math.isnan(node_g_per_kwh(snapshot, "plain", "elsewhere", AVERAGE, now_s))
    assert math.isnan(node_g_per_kwh(snapshot, "plain", "grid", MARGINAL, now_s))
    assert math.isnan(node_g_per_kwh(snapshot, "plain", "grid", AVERAGE, now_s + 3001.0))
    assert math.isnan(node_g_per_kwh(snapshot, "plain", None, AVERAGE, now_s))


# ---- the outlook: the mean over the next hours -----------------------------------------------


def _zone_with_forecast(now_s: float, points: list[tuple[float, float, float]]) -> object:
    """A snapshot of zone "grid": 300 g/kWh now, and `points` (start, end, g/kWh) ahead."""
    forecast = tuple(IntensityPoint(now_s + a, now_s + b, g) for a, b, g in points)
    return build_snapshot(
        [IntensityReading("grid", AVERAGE, "api", 300.0, now_s, forecast, now_s)],
        [],
        published_at_s=now_s,
        max_age_s=7200.0,
        forecast_max_age_s=7200.0,
    )


def test_the_outlook_is_the_time_weighted_mean_of_the_forecast_over_the_horizon() -> None:
    now_s = 36_000.0
    # Forecast from 30 min ago: 100 until 30 min ahead, then 700 for an hour, then 400.
    snapshot = _zone_with_forecast(
        now_s, [(-1800, 1800, 100.0), (1800, 5400, 700.0), (5400, 9000, 400.0)]
    )
    entry = snapshot.zones[("grid", AVERAGE)]
    # 2 h: 0.5 h at 100, 1 h at 700, 0.5 h at 400.
    assert entry.outlook_g_per_kwh(now_s, 7200.0) == pytest.approx((50 + 700 + 200) / 2)
    # Within the first point: its value, not the reading's.
    assert entry.outlook_g_per_kwh(now_s, 1200.0) == pytest.approx(100.0)
    # 0 is the present value (the reading), as without a horizon.
    assert entry.outlook_g_per_kwh(now_s, 0.0) == 300.0
    assert node_g_per_kwh(snapshot, "n", "grid", AVERAGE, now_s, horizon_s=7200.0) == (
        pytest.approx(475.0)
    )
    assert node_g_per_kwh(snapshot, "n", "grid", AVERAGE, now_s) == 300.0


def test_past_the_forecasts_end_and_without_one_the_outlook_holds_the_current_value() -> None:
    now_s = 36_000.0
    # The forecast ends 1 h ahead (at 700): the next 3 h are 1 h at 700, 2 h at the current 300.
    ends = _zone_with_forecast(now_s, [(0, 3600, 700.0)])
    assert node_g_per_kwh(ends, "n", "grid", AVERAGE, now_s, horizon_s=3 * 3600.0) == (
        pytest.approx((700 + 2 * 300) / 3)
    )
    # A gap counts at the current value too: 1 h at 100, 1 h gap (300), 1 h at 700.
    gap = _zone_with_forecast(now_s, [(0, 3600, 100.0), (7200, 10800, 700.0)])
    assert gap.zones[("grid", AVERAGE)].outlook_g_per_kwh(now_s, 10800.0) == pytest.approx(
        (100 + 300 + 700) / 3
    )
    # No forecast, or a stale one (generated more than forecast_max_age_s ago): the current value.
    none = _zone_with_forecast(now_s, [])
    assert node_g_per_kwh(none, "n", "grid", AVERAGE, now_s, horizon_s=4 * 3600.0) == 300.0
    later_s = now_s + 7201.0
    stale = build_snapshot(
        [
            IntensityReading(
                "grid",
                AVERAGE,
                "api",
                300.0,
                later_s,
                (IntensityPoint(later_s, later_s + 3600, 900.0),),
                now_s,
            )
        ],
        [],
        published_at_s=later_s,
        max_age_s=7200.0,
        forecast_max_age_s=7200.0,
    )
    assert node_g_per_kwh(stale, "n", "grid", AVERAGE, later_s, horizon_s=3600.0) == 300.0
    # A node's own-supply annotation has no forecast: it counts as it is over any horizon.
    own = {CARBON_INTENSITY_ANNOTATION: "20"}
    assert node_g_per_kwh(ends, "n", "grid", AVERAGE, now_s, annotations=own, horizon_s=3600.0) == (
        20.0
    )
    # Nothing current and nothing forecast now: unknown, whatever lies ahead.
    ahead_only = build_snapshot(
        [
            IntensityReading(
                "grid",
                AVERAGE,
                "api",
                math.nan,
                now_s,
                (IntensityPoint(now_s + 3600, now_s + 7200, 100.0),),
                now_s,
            )
        ],
        [],
        published_at_s=now_s,
        max_age_s=7200.0,
        forecast_max_age_s=7200.0,
    )
    assert math.isnan(node_g_per_kwh(ahead_only, "n", "grid", AVERAGE, now_s, horizon_s=7200.0))
