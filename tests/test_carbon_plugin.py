"""The Carbon plugin over real curve tables (real ONNX through onnxruntime): grams per hour, neutral
scores without data, and deferral that never outlives a deadline or trusts a stale forecast. The
last tests run the whole service against the tests' carbon-aware-sdk WebAPI and a WattTime-shaped
server."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from extender.config import DEFAULT_BUNDLE_DIR
from extender.plugins.base import cost_ratio_points
from extender.plugins.carbon import CARBON_SIGNAL, Carbon, CarbonArgs
from extender.profile import Profile, build_profile
from extender.scoring import Assessment, assess
from extender.state import ClusterState, NodeInfo
from livedata.carbon import AVERAGE, MARGINAL, IntensityPoint, IntensityReading
from livedata.carbon_source import build_snapshot, node_g_per_kwh
from livedata.deferral import is_carbon_hold
from livedata.labels import (
    CARBON_HOLD_REASON,
    CARBON_INTENSITY_ANNOTATION,
    CARBON_INTENSITY_AT_ANNOTATION,
    CARBON_ZONE_LABEL,
    DEFER_UNTIL_ANNOTATION,
    REGION_LABEL,
)
from predictor.curves import CurveBuilder, CurveTable
from predictor.model import Predictor
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.carbon_services import Route, SdkData, carbon_aware_sdk, recorded_service
from tests.support.server import REPO_ROOT, extender_service, write_snapshot

NOW_S = 1_714_557_600.0  # 2024-05-01T10:00:00Z
HOUR = 3600.0
FLOAT32_W = 0.05

# Linear curves on 8 cores: one core adds (max - idle) / 8 watts.
CURVES = {
    "a1": PowerCurveSpec(100.0, 300.0),  # 25 W per core
    "a2": PowerCurveSpec(100.0, 300.0),
    "b1": PowerCurveSpec(100.0, 300.0),
    "b2": PowerCurveSpec(80.0, 180.0),  # 12.5 W per core
    "c1": PowerCurveSpec(100.0, 300.0),
    "n1": PowerCurveSpec(100.0, 300.0),
}
ZONES = {"a1": "zone-a", "a2": "zone-a", "b1": "zone-b", "b2": "zone-b", "c1": "zone-c"}


def profile(**args: object) -> Profile:
    return build_profile(
        {
            "plugins": {
                "filter": {"enabled": [{"name": "Carbon"}]},
                "score": {"enabled": [{"name": "Carbon", "weight": 0.5}]},
            },
            "pluginConfig": [{"name": "Carbon", "args": args}] if args else [],
        }
    )


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Predictor:
    directory: Path = tmp_path_factory.mktemp("carbon") / "bundle"
    make_bundle(directory, CURVES)
    return Predictor.load(directory)


def make_state(prof: Profile, annotations: dict[str, dict[str, str]] | None = None) -> ClusterState:
    state = ClusterState(node_attributes=prof.node_attributes)
    state.replace_nodes(
        NodeInfo(
            name,
            8.0,
            {REGION_LABEL: ZONES[name]} if name in ZONES else {},
            (annotations or {}).get(name, {}),
        )
        for name in CURVES
    )
    for name in CURVES:
        state.set_telemetry(
            name, {"cpu_util": 0.3, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0}, NOW_S - 5
        )
    return state


def publish(
    state: ClusterState,
    values: dict[str, float],
    *,
    observed_at_s: float = NOW_S - 600,
    forecasts: dict[str, Sequence[float]] | None = None,
    generated_at_s: float = NOW_S - 600,
    signal: str = AVERAGE,
) -> None:
    """Zone readings (and hourly forecasts from the current hour) as a source would publish."""
    readings = []
    hour_start = NOW_S - NOW_S % HOUR
    for zone in sorted(set(values) | set(forecasts or {})):
        points = tuple(
            IntensityPoint(hour_start + k * HOUR, hour_start + (k + 1) * HOUR, value)
            for k, value in enumerate((forecasts or {}).get(zone, ()))
        )
        readings.append(
            IntensityReading(
                zone,
                signal,
                "test",
                values.get(zone, math.nan),
                observed_at_s,
                points,
                generated_at_s if points else math.nan,
            )
        )
    state.set_signal(
        CARBON_SIGNAL,
        build_snapshot(
            readings, [], published_at_s=NOW_S, max_age_s=2 * HOUR, forecast_max_age_s=2 * HOUR
        ),
    )


def curves_for(predictor: Predictor, state: ClusterState) -> CurveTable:
    _, snapshot = state.telemetry_snapshot()
    return CurveBuilder().build(predictor, {n: v for n, (v, _) in snapshot.items()}, None)


def run(
    predictor: Predictor,
    state: ClusterState,
    prof: Profile,
    names: Sequence[str],
    *,
    pod: dict | None = None,
    now_s: float = NOW_S,
) -> Assessment:
    return assess(
        state.view(now_s),
        curves_for(predictor, state),
        list(names),
        1.0,
        prof,
        now_s=now_s,
        telemetry_ttl_s=None,
        pod=pod,
    )


def explain_rows(result: Assessment) -> dict[str, dict]:
    return {row["node"]: row for row in result.explain()}


def deferrable_pod(defer_until: str, created_s: float = NOW_S - 60) -> dict:
    created = datetime.fromtimestamp(created_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": "batch",
            "namespace": "default",
            "creationTimestamp": created,
            "annotations": {DEFER_UNTIL_ANNOTATION: defer_until},
        },
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
    }


# ---- score ---------------------------------------------------------------------------------------


def test_grams_per_hour_are_watts_times_intensity(predictor: Predictor) -> None:
    prof = profile()
    state = make_state(prof)
    publish(state, {"zone-a": 400.0, "zone-b": 100.0})
    result = run(predictor, state, prof, ["a1", "b1", "b2"])
    rows = explain_rows(result)
    # One core: 25 W on a1 and b1, 12.5 W on b2.
    assert rows["a1"]["carbon_g_per_h"] == pytest.approx(25.0 * 400 / 1000, abs=0.05)
    assert rows["b1"]["carbon_g_per_h"] == pytest.approx(25.0 * 100 / 1000, abs=0.05)
    assert rows["b2"]["carbon_g_per_h"] == pytest.approx(12.5 * 100 / 1000, abs=0.05)
    # Ratio points: b2 cleanest (10); b1 twice its g/h (5); a1 eight times (0).
    np.testing.assert_allclose(result.points("Carbon"), [0.0, 5.0, 10.0], atol=0.02)
    assert rows["a1"]["carbon_intensity_g_per_kwh"] == 400.0
    assert rows["a1"]["carbon_source"] == "test" and rows["a1"]["carbon_age_s"] == 600.0
    assert rows["a1"]["carbon_zone"] == "zone-a" and rows["a1"]["carbon_note"] == ""


def test_more_watts_in_a_cleaner_zone_can_win(predictor: Predictor) -> None:
    prof = profile()
    state = make_state(prof)
    publish(state, {"zone-a": 90.0, "zone-b": 300.0})
    result = run(predictor, state, prof, ["a1", "b2"])
    # a1 adds twice the watts of b2, in a zone a third as dirty: 2.25 g/h against 3.75 g/h.
    assert result.points("Carbon")[0] == pytest.approx(10.0)
    assert result.points("Carbon")[1] < 10.0


def test_a_zone_without_data_scores_neutral(predictor: Predictor) -> None:
    prof = profile()
    plugin = prof.plugin("Carbon")
    state = make_state(prof)
    publish(state, {"zone-a": 100.0, "zone-b": 300.0})  # nothing for zone-c; n1 has no zone
    result = run(predictor, state, prof, ["a1", "b1", "c1", "n1"])
    rows = explain_rows(result)
    increase = result.increase_w
    # As if at the mean of the candidates with data (200 g/kWh): neither best nor worst.
    expected = cost_ratio_points(
        increase * np.array([100.0, 300.0, 200.0, 200.0]) / 1000,
        points_per_doubling=5.0,
        floor=1e-6,
    )
    np.testing.assert_allclose(result.points("Carbon"), expected, atol=1e-9)
    assert 0 < result.points("Carbon")[2] < 10
    assert rows["c1"]["carbon_intensity_g_per_kwh"] is None
    assert rows["c1"]["carbon_g_per_h"] is None
    assert rows["c1"]["carbon_note"] == (
        "no average carbon intensity for zone zone-c: scored neutral (at the candidates' mean "
        "200 g/kWh)"
    )
    assert rows["n1"]["carbon_note"].startswith(f"no carbon zone (labels {CARBON_ZONE_LABEL}")
    assert isinstance(plugin, Carbon)

    # Stale values are no data: scored like the rest, by watts alone when nobody has any.
    publish(state, {"zone-a": 100.0, "zone-b": 300.0}, observed_at_s=NOW_S - 3 * HOUR)
    result = run(predictor, state, prof, ["a1", "b2", "c1"])
    rows = explain_rows(result)
    power_only = cost_ratio_points(result.increase_w / 1000, points_per_doubling=5.0, floor=1e-6)
    np.testing.assert_allclose(result.points("Carbon"), power_only, atol=1e-9)
    assert "stale (10800 s old, max 7200 s" in rows["a1"]["carbon_note"]
    assert rows["a1"]["carbon_note"].endswith(
        "scored by watts alone (no candidate has carbon data)"
    )


def test_the_configured_signal_only(predictor: Predictor) -> None:
    prof = profile(signal="marginal")
    state = make_state(prof)
    publish(state, {"zone-a": 100.0, "zone-b": 300.0}, signal=AVERAGE)
    rows = explain_rows(run(predictor, state, prof, ["a1"]))
    assert rows["a1"]["carbon_intensity_g_per_kwh"] is None  # average values never stand in
    assert rows["a1"]["carbon_note"].startswith("no marginal carbon intensity for zone zone-a")
    publish(state, {"zone-a": 700.0}, signal=MARGINAL)
    rows = explain_rows(run(predictor, state, prof, ["a1"]))
    assert rows["a1"]["carbon_intensity_g_per_kwh"] == 700.0
    assert rows["a1"]["carbon_signal"] == "marginal"


def test_a_node_on_its_own_supply_overrides_its_zone(predictor: Predictor) -> None:
    prof = profile()
    measured = datetime.fromtimestamp(NOW_S - 3 * HOUR, UTC).isoformat()
    state = make_state(
        prof,
        {
            "a1": {CARBON_INTENSITY_ANNOTATION: "25"},  # standing: never ages
            "a2": {CARBON_INTENSITY_ANNOTATION: "25", CARBON_INTENSITY_AT_ANNOTATION: measured},
            "b1": {CARBON_INTENSITY_ANNOTATION: "lots"},
        },
    )
    publish(state, {"zone-a": 400.0, "zone-b": 300.0})
    rows = explain_rows(run(predictor, state, prof, ["a1", "a2", "b1"]))
    assert (rows["a1"]["carbon_intensity_g_per_kwh"], rows["a1"]["carbon_source"]) == (
        25.0,
        "node annotation",
    )
    # Measured three hours ago, max age two: the zone's value again.
    assert rows["a2"]["carbon_intensity_g_per_kwh"] == 400.0
    assert rows["b1"]["carbon_intensity_g_per_kwh"] == 300.0  # unreadable: ignored

    # A node-local reading from a source (prometheus-node, file): below the annotation.
    zone_b = IntensityReading("zone-b", AVERAGE, "grid", 300.0, NOW_S - 60)
    own = [IntensityReading(n, AVERAGE, "site-meter", 15.0, NOW_S - 60) for n in ("a1", "b2")]
    state.set_signal(
        CARBON_SIGNAL,
        build_snapshot(
            [zone_b], own, published_at_s=NOW_S, max_age_s=HOUR, forecast_max_age_s=HOUR
        ),
    )
    rows = explain_rows(run(predictor, state, prof, ["a1", "b1", "b2"]))
    assert (rows["b2"]["carbon_intensity_g_per_kwh"], rows["b2"]["carbon_source"]) == (
        15.0,
        "site-meter",
    )
    assert rows["a1"]["carbon_source"] == "node annotation"
    assert rows["b1"]["carbon_source"] == "grid"


def test_an_explicit_carbon_zone_label_wins(predictor: Predictor) -> None:
    prof = profile()
    state = make_state(prof)
    state.upsert_node(NodeInfo("n1", 8.0, {REGION_LABEL: "zone-a", CARBON_ZONE_LABEL: "zone-b"}))
    publish(state, {"zone-a": 400.0, "zone-b": 100.0})
    rows = explain_rows(run(predictor, state, prof, ["n1"]))
    assert rows["n1"]["carbon_zone"] == "zone-b"


# ---- deferral ------------------------------------------------------------------------------------

CLEANER_LATER = {"zone-a": [400.0, 380.0, 90.0, 95.0, 400.0, 400.0], "zone-b": [300.0] * 6}


def test_a_cleaner_window_before_the_deadline_holds_the_pod(predictor: Predictor) -> None:
    prof = profile()
    state = make_state(prof)
    publish(state, {"zone-a": 400.0, "zone-b": 300.0}, forecasts=CLEANER_LATER)
    names = ["a1", "b1"]
    result = run(predictor, state, prof, names, pod=deferrable_pod("6h"))
    assert set(result.failed) == set(names) and result.unresolvable == set(names)
    reason = result.failed["a1"]
    assert reason == result.failed["b1"]  # one reason: kube-scheduler aggregates it
    assert is_carbon_hold(f"0/2 nodes are available: 2 {reason}.")
    # The candidates' mean: (400 + 300) / 2 now, (90 + 300) / 2 at 12:00.
    assert reason == (
        f"{CARBON_HOLD_REASON}: waiting for a cleaner window 2024-05-01T12:00Z-"
        "2024-05-01T13:00Z: the candidates' mean forecast 195 g/kWh against 350 now (44% "
        "cleaner; cleanest zone then zone-a at 90); released by the defer-until deadline "
        "2024-05-01T15:59Z"
    )
    # No annotation: no hold. A pod whose deadline comes before the window: no hold.
    assert run(predictor, state, prof, names).failed == {}
    assert run(predictor, state, prof, names, pod=deferrable_pod("90m")).failed == {}


def test_a_stale_or_missing_forecast_never_holds_a_pod(predictor: Predictor) -> None:
    prof = profile()
    plugin = prof.plugin("Carbon")
    state = make_state(prof)
    pod = deferrable_pod("6h")
    publish(state, {"zone-a": 400.0, "zone-b": 300.0}, forecasts=CLEANER_LATER)
    assert run(predictor, state, prof, ["a1", "b1"], pod=pod).failed  # fresh: held
    # The same forecast made three hours ago (max age two): stale, the pod passes.
    publish(
        state,
        {"zone-a": 400.0, "zone-b": 300.0},
        forecasts=CLEANER_LATER,
        generated_at_s=NOW_S - 3 * HOUR,
    )
    assert run(predictor, state, prof, ["a1", "b1"], pod=pod).failed == {}
    # One candidate's zone without any forecast: cannot tell, the pod passes.
    only_a = {"zone-a": CLEANER_LATER["zone-a"]}
    publish(state, {"zone-a": 400.0, "zone-b": 300.0}, forecasts=only_a)
    assert run(predictor, state, prof, ["a1", "b1"], pod=pod).failed == {}
    # A candidate without a usable current value: the pod passes.
    publish(state, {"zone-a": 400.0}, forecasts=CLEANER_LATER)
    assert run(predictor, state, prof, ["a1", "c1"], pod=pod).failed == {}
    assert plugin.decisions["held"] == 1 and plugin.decisions["no_forecast"] == 3


@settings(max_examples=60, deadline=None)
@given(
    forecast=st.lists(st.floats(10.0, 800.0), min_size=1, max_size=30),
    now_value=st.floats(10.0, 800.0),
    deadline_h=st.floats(0.0, 30.0),
    forecast_age_h=st.floats(0.0, 4.0),
    elapsed_h=st.floats(0.0, 32.0),
)
def test_deferral_never_outlives_the_deadline_nor_trusts_a_stale_forecast(
    predictor: Predictor,
    forecast: list[float],
    now_value: float,
    deadline_h: float,
    forecast_age_h: float,
    elapsed_h: float,
) -> None:
    prof = profile(deferMargin=0.0, deferMinSavingGPerKwh=0.0)
    state = make_state(prof)
    created_s = NOW_S - 60
    deadline_s = created_s + deadline_h * HOUR
    now_s = NOW_S + elapsed_h * HOUR
    generated_at_s = now_s - forecast_age_h * HOUR
    hour_start = generated_at_s - generated_at_s % HOUR
    points = tuple(
        IntensityPoint(hour_start + k * HOUR, hour_start + (k + 1) * HOUR, value)
        for k, value in enumerate(forecast)
    )
    state.set_signal(
        CARBON_SIGNAL,
        build_snapshot(
            [IntensityReading("zone-a", AVERAGE, "t", now_value, now_s, points, generated_at_s)],
            [],
            published_at_s=now_s,
            max_age_s=2 * HOUR,
            forecast_max_age_s=2 * HOUR,
        ),
    )
    pod = deferrable_pod(f"{deadline_h * 3600:.3f}s", created_s)
    result = run(predictor, state, prof, ["a1", "a2"], pod=pod, now_s=now_s)
    event("held" if result.failed else "passed")
    if not result.failed:
        return
    assert now_s < deadline_s  # never held at or past the deadline
    assert forecast_age_h <= 2.0  # never on a stale forecast
    reason = result.failed["a1"]
    window_start = datetime.strptime(reason.split("cleaner window ")[1][:17], "%Y-%m-%dT%H:%MZ")
    window_start_s = window_start.replace(tzinfo=UTC).timestamp()
    assert now_s < window_start_s + 60 and window_start_s <= deadline_s  # named window: ahead


def test_the_margin_decides_what_is_worth_waiting_for(predictor: Predictor) -> None:
    forecasts = {"zone-a": [300.0, 250.0, 250.0, 250.0]}
    pod = deferrable_pod("6h")
    for args, held in (
        ({"deferMargin": 0.2}, False),  # 17 % cleaner: not enough
        ({"deferMargin": 0.1}, True),
        ({"deferMargin": 0.1, "deferMinSavingGPerKwh": 60.0}, False),  # 50 g/kWh: not enough
    ):
        prof = profile(**args)
        state = make_state(prof)
        publish(state, {"zone-a": 300.0}, forecasts=forecasts)
        assert bool(run(predictor, state, prof, ["a1"], pod=pod).failed) is held, args


def test_an_unreadable_deadline_passes_and_is_counted(predictor: Predictor) -> None:
    prof = profile()
    state = make_state(prof)
    publish(state, {"zone-a": 400.0, "zone-b": 300.0}, forecasts=CLEANER_LATER)
    result = run(predictor, state, prof, ["a1", "b1"], pod=deferrable_pod("whenever"))
    assert result.failed == {}
    assert prof.plugin("Carbon").decisions["unreadable"] == 1


# ---- the whole service --------------------------------------------------------------------------


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def service_files(tmp_path: Path, sources: list[dict]) -> tuple[Path, Path]:
    nodes = [
        {
            "name": name,
            "allocatable_cpu": 16,
            "labels": {REGION_LABEL: zone},
            "telemetry": {"cpu_util": 0.3, "ambient_temp_c": 22.0, "cpu1_temp_c": 50.0},
        }
        for name, zone in (("node-01", "us-east"), ("node-02", "us-west"))
    ]
    cluster = write_snapshot(tmp_path / "cluster.json", nodes)
    config = tmp_path / "profile.yaml"
    config.write_text(
        json.dumps(
            {
                "plugins": {
                    "filter": {"enabled": [{"name": "Carbon"}]},
                    "score": {"enabled": [{"name": "Carbon", "weight": 0.4}]},
                },
                "pluginConfig": [
                    {"name": "Carbon", "args": {"signal": "marginal", "sources": sources}}
                ],
            }
        )
    )
    return cluster, config


def test_the_service_reads_the_carbon_aware_sdk_and_holds_a_deferrable_pod(tmp_path: Path) -> None:
    now_s = time.time()
    hour_start = now_s - now_s % HOUR
    data = SdkData(
        emissions={"eastus": [(now_s - 120, 450.0, 300)], "westus": [(now_s - 120, 380.0, 300)]},
        forecasts={
            "eastus": (
                now_s - 60,
                [(hour_start + k * HOUR, v) for k, v in enumerate([450, 440, 120, 130, 450, 450])],
                60,
            ),
            "westus": (now_s - 60, [(hour_start + k * HOUR, 380.0) for k in range(6)], 60),
        },
    )
    with carbon_aware_sdk(data) as sdk_url:
        cluster, config = service_files(
            tmp_path,
            [
                {
                    "kind": "carbon-aware-sdk",
                    "url": sdk_url,
                    "signal": "marginal",
                    "zones": {"us-east": "eastus", "us-west": "westus"},
                }
            ],
        )
        with extender_service(DEFAULT_BUNDLE_DIR, cluster, config_file=config) as (
            url,
            runtime,
        ):
            wait_for(
                lambda: runtime.state.view(time.time()).signal(CARBON_SIGNAL) is not None,
                "the first carbon snapshot",
            )
            body = {
                "Pod": deferrable_pod("6h", now_s - 30),
                "Nodes": None,
                "NodeNames": ["node-01", "node-02"],
            }
            explain = httpx.post(f"{url}/explain", json=body, timeout=10).json()
            answer = httpx.post(f"{url}/filter", json=body, timeout=10).json()
            status = httpx.get(f"{url}/status", timeout=10).json()
            metrics = httpx.get(f"{url}/metrics", timeout=10).text
    rows = {row["node"]: row for row in explain["nodes"]}
    assert rows["node-01"]["carbon_intensity_g_per_kwh"] == 450.0
    assert rows["node-02"]["carbon_intensity_g_per_kwh"] == 380.0
    assert rows["node-02"]["carbon_source"] == "carbon-aware-sdk-0"
    assert 110 <= rows["node-02"]["carbon_age_s"] < 180
    assert rows["node-02"]["carbon_g_per_h"] == pytest.approx(
        rows["node-02"]["increase_w"] * 380.0 / 1000
    )
    assert answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"]) == {"node-01", "node-02"}
    assert "cleanest zone then us-east at 120" in answer["FailedNodes"]["node-01"]
    assert answer["FailedNodes"]["node-01"].startswith(CARBON_HOLD_REASON)
    carbon = status["plugins"]["Carbon"]
    assert carbon["zones"]["us-east"]["g_per_kwh"] == 450.0
    assert carbon["sources"]["carbon-aware-sdk-0"]["last_error"] is None
    assert 'power_aware_extender_carbon_deferral_decisions_total{decision="held"}' in metrics
    assert 'zone="us-west"' in metrics


def test_the_service_converts_watttime_pounds(tmp_path: Path) -> None:
    now_s = time.time()
    answer = json.loads((REPO_ROOT / "tests/fixtures/carbon/watttime_v3_forecast.json").read_text())
    start_s = now_s - now_s % 300
    for k, point in enumerate(answer["data"]):  # the recorded shape, moved to now
        point["point_time"] = datetime.fromtimestamp(start_s + 300 * k, UTC).isoformat()
    answer["meta"]["generated_at"] = datetime.fromtimestamp(start_s, UTC).isoformat()
    (tmp_path / "user").write_text("u")
    (tmp_path / "password").write_text("p")
    routes = {"/login": Route({"token": "t"}), "/v3/forecast": Route(answer)}
    with recorded_service(routes) as (wt_url, _):
        cluster, config = service_files(
            tmp_path,
            [
                {
                    "kind": "watttime",
                    "url": wt_url,
                    "usernameFile": str(tmp_path / "user"),
                    "passwordFile": str(tmp_path / "password"),
                    "zones": {"us-west": "CAISO_NORTH"},
                }
            ],
        )
        with extender_service(DEFAULT_BUNDLE_DIR, cluster, config_file=config) as (
            url,
            runtime,
        ):
            wait_for(
                lambda: runtime.state.view(time.time()).signal(CARBON_SIGNAL) is not None,
                "the first carbon snapshot",
            )
            body = {
                "Pod": deferrable_pod("6h", now_s),
                "Nodes": None,
                "NodeNames": ["node-01", "node-02"],
            }
            rows = {
                row["node"]: row
                for row in httpx.post(f"{url}/explain", json=body, timeout=10).json()["nodes"]
            }
    assert rows["node-02"]["carbon_intensity_g_per_kwh"] == pytest.approx(
        1048.4131919701972 * 0.45359237
    )
    assert rows["node-01"]["carbon_intensity_g_per_kwh"] is None  # us-east: no WattTime region


@settings(max_examples=60, deadline=None)
@given(
    zone_age_h=st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),
    forecast_age_h=st.lists(st.floats(0.0, 4.0), min_size=3, max_size=3),
    with_forecast=st.lists(st.booleans(), min_size=3, max_size=3),
    local=st.dictionaries(
        st.sampled_from(sorted(CURVES)), st.floats(0.0, 3.0), max_size=3
    ),  # node -> hours since its node-local reading
    annotated=st.dictionaries(
        st.sampled_from(sorted(CURVES)), st.one_of(st.none(), st.floats(0.0, 4.0)), max_size=3
    ),  # node -> hours since its annotation was measured (None: standing, never ages)
)
def test_the_plugin_and_the_controllers_rule_give_each_node_the_same_intensity(
    predictor: Predictor,
    zone_age_h: list[float],
    forecast_age_h: list[float],
    with_forecast: list[bool],
    local: dict[str, float],
    annotated: dict[str, float | None],
) -> None:
    # The Carbon plugin computes intensities over the candidate arrays on the request path;
    # the node power controller and the simulation call livedata's scalar node_g_per_kwh. One
    # rule, written twice: they must agree on every node, whatever is fresh or stale.
    prof = profile()
    annotations = {
        node: {CARBON_INTENSITY_ANNOTATION: f"{20 + i}"}
        | (
            {}
            if age_h is None
            else {
                CARBON_INTENSITY_AT_ANNOTATION: datetime.fromtimestamp(
                    NOW_S - age_h * HOUR, UTC
                ).isoformat()
            }
        )
        for i, (node, age_h) in enumerate(sorted(annotated.items()))
    }
    state = make_state(prof, annotations)
    hour_start = NOW_S - NOW_S % HOUR
    zone_readings = [
        IntensityReading(
            zone,
            AVERAGE,
            "grid",
            100.0 * (k + 1),
            NOW_S - zone_age_h[k] * HOUR,
            tuple(
                IntensityPoint(hour_start + h * HOUR, hour_start + (h + 1) * HOUR, 50.0 + k + h)
                for h in range(-4, 4)
            )
            if with_forecast[k]
            else (),
            NOW_S - forecast_age_h[k] * HOUR if with_forecast[k] else math.nan,
        )
        for k, zone in enumerate(("zone-a", "zone-b", "zone-c"))
    ]
    node_readings = [
        IntensityReading(node, AVERAGE, "site-meter", 15.0, NOW_S - age_h * HOUR)
        for node, age_h in sorted(local.items())
    ]
    snapshot = build_snapshot(
        zone_readings,
        node_readings,
        published_at_s=NOW_S,
        max_age_s=2 * HOUR,
        forecast_max_age_s=2 * HOUR,
    )
    state.set_signal(CARBON_SIGNAL, snapshot)
    rows = explain_rows(run(predictor, state, prof, sorted(CURVES)))
    for node in CURVES:
        expected = node_g_per_kwh(
            snapshot,
            node,
            ZONES.get(node),
            AVERAGE,
            NOW_S,
            annotations=annotations.get(node),
            max_age_s=CarbonArgs().max_age_seconds,
        )
        got = rows[node]["carbon_intensity_g_per_kwh"]
        event("no intensity" if math.isnan(expected) else "an intensity")
        if math.isnan(expected):
            assert got is None, node
        else:
            assert got == pytest.approx(expected), node
