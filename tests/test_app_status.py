"""/status, /metrics and /readyz of the running service (real uvicorn on 127.0.0.1)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extender.runtime import VERB_CHECK_AFTER_REQUESTS, verb_problem
from extender.state import NodeInfo
from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import extender_service, write_snapshot

FIXTURE = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28" / "cache-capable"
CURVES = {
    "node-a": PowerCurveSpec(idle_w=100.0, max_w=300.0),
    "node-b": PowerCurveSpec(idle_w=90.0, max_w=350.0, exponent=2),
}
TELEMETRY = {"cpu_util": 0.4, "ambient_temp_c": 22.0, "cpu1_temp_c": 55.0, "cpu2_temp_c": 54.0}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):
    return make_bundle(tmp_path_factory.mktemp("status") / "bundle", CURVES)


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nodes = [
        {"name": "node-a", "allocatable_cpu": 8, "telemetry": TELEMETRY},
        {"name": "node-b", "allocatable_cpu": "8000m", "telemetry": TELEMETRY},
        {"name": "node-c", "allocatable_cpu": 8},  # no telemetry
    ]
    return write_snapshot(tmp_path_factory.mktemp("cluster") / "cluster.json", nodes)


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_status_metrics_and_readiness_in_snapshot_mode(bundle, snapshot: Path) -> None:
    with (
        extender_service(bundle.directory, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert client.get("/healthz").json() == {"status": "ok"}
        request = (FIXTURE / "prioritize-request.json").read_bytes()
        for _ in range(3):
            assert client.post("/prioritize", content=request).status_code == 200
        assert client.post("/filter", content=b"nope").status_code == 400

        status = client.get("/status").json()
        assert status["bundle_version"] == bundle.version
        assert status["mode"] == "snapshot"
        assert status["ready"] is True and status["not_ready_reasons"] == []
        assert status["nodes"]["known"] == 3
        assert status["nodes"]["with_fresh_telemetry"] == 2
        assert status["nodes"]["without_telemetry"] == 1
        assert status["telemetry"]["ttl_s"] is None  # snapshot telemetry never goes stale
        assert status["curves"]["nodes"] == 2
        assert status["last_refused"] is None

        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        samples = metric_samples(response.text)
        prefix = "power_aware_extender"
        prioritize_ok = (("code", "200"), ("verb", "prioritize"))
        assert samples[(f"{prefix}_requests_total", prioritize_ok)] == 3
        assert samples[(f"{prefix}_requests_total", (("code", "400"), ("verb", "filter")))] == 1
        count = samples[(f"{prefix}_request_duration_seconds_count", (("verb", "prioritize"),))]
        assert count == 3
        buckets = [
            float(dict(labels)["le"])
            for name, labels in samples
            if name == f"{prefix}_request_duration_seconds_bucket"
            and dict(labels)["verb"] == "prioritize"
        ]
        assert sum(1 for le in buckets if le < 0.001) >= 3  # sub-millisecond resolution
        info_key = next(k for k in samples if k[0] == f"{prefix}_bundle_info")
        assert dict(info_key[1])["version"] == bundle.version
        assert samples[(f"{prefix}_nodes", ())] == 3
        assert samples[(f"{prefix}_nodes_without_telemetry", ())] == 1
        assert samples[(f"{prefix}_ready", ())] == 1
        assert (f"{prefix}_telemetry_max_age_seconds", ()) in samples
        assert samples[(f"{prefix}_bundle_reload_refusals_total", ())] == 0
        # The fixture's candidates are node-a, node-b, node-c; node-c has no telemetry.
        assert samples[(f"{prefix}_nodes_scored_without_telemetry_total", ())] == 3


def test_without_a_bundle_not_ready_but_still_answering(tmp_path: Path, snapshot: Path) -> None:
    missing = tmp_path / "no-bundle-here"
    with (
        extender_service(missing, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert str(missing) in ready.json()["reasons"][0]
        status = client.get("/status").json()
        assert status["bundle_version"] is None
        assert str(missing) in status["last_refused"]["error"]
        # The scheduler is never blocked: scores come from the energy level alone.
        request = (FIXTURE / "prioritize-request.json").read_bytes()
        answer = client.post("/prioritize", content=request)
        assert answer.status_code == 200
        assert [e["Host"] for e in answer.json()] == ["node-a", "node-b", "node-c"]
        samples = metric_samples(client.get("/metrics").text)
        assert samples[("power_aware_extender_ready", ())] == 0
        assert not any(name == "power_aware_extender_bundle_info" for name, _ in samples)


def test_live_readiness_follows_telemetry_freshness(bundle) -> None:
    # Live mode without starting its sources: the test writes the state the way the
    # Kubernetes watch and the Prometheus poller do.
    settings = {
        "prometheus_url": "http://127.0.0.1:9",
        "in_cluster": True,
        "telemetry_ttl_s": 90.0,
        "ready_min_fresh_share": 0.5,
    }
    with (
        extender_service(bundle.directory, **settings) as (url, runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        assert client.get("/readyz").status_code == 503
        assert "no nodes known" in client.get("/readyz").json()["reasons"][0]
        runtime.state.replace_nodes(
            NodeInfo(name, allocatable_cpu=8.0) for name in ("node-a", "node-b", "node-c")
        )
        old_s = time.time() - 600.0
        for name in ("node-a", "node-b"):
            runtime.state.set_telemetry(name, TELEMETRY, observed_at_s=old_s)
        stale = client.get("/readyz")
        assert stale.status_code == 503
        assert "only 0 of 3 nodes" in stale.json()["reasons"][0]
        samples = metric_samples(client.get("/metrics").text)
        assert samples[("power_aware_extender_nodes_without_telemetry", ())] == 3
        assert samples[("power_aware_extender_telemetry_max_age_seconds", ())] >= 600.0

        now_s = time.time()
        for name in ("node-a", "node-b"):
            runtime.state.set_telemetry(name, TELEMETRY, observed_at_s=now_s)
        assert client.get("/readyz").status_code == 200
        status = client.get("/status").json()
        assert status["mode"] == "live"
        assert status["nodes"]["with_fresh_telemetry"] == 2
        assert status["telemetry"]["ttl_s"] == 90.0
        # Stale telemetry never scores: node-c (none) and a stale node rank below fresh ones.
        runtime.state.set_telemetry("node-b", TELEMETRY, observed_at_s=old_s)
        # What the background refresher does within curve_refresh_interval_s, done now.
        runtime.refresh_curves()
        assert runtime.model is not None and len(runtime.model.curves) == 2
        request = json.loads((FIXTURE / "prioritize-request.json").read_bytes())
        explain = client.post("/explain", content=json.dumps(request)).json()
        notes = {row["node"]: row["note"] for row in explain["nodes"]}
        assert "stale" in notes["node-b"]
        assert notes["node-a"] == ""


def test_status_says_what_each_accuracy_figure_is(tmp_path: Path, snapshot: Path) -> None:
    own = {"mape_pct": 1.5, "mae_w": 3.0}
    curves = {
        "node-a": PowerCurveSpec(100.0, 300.0, info={"metrics": own}),
        "node-b": PowerCurveSpec(90.0, 350.0, info={"metrics": {"mape_pct": 4.5, "mae_w": 9.0}}),
        "node-s": PowerCurveSpec(
            95.0,
            320.0,
            info={
                "metrics": {"mape_pct": 12.0, "mae_w": 20.0},
                "scaled_fallback": {"reason": "a load that never moved", "idle_w": 95.0},
            },
        ),
    }
    fleet_metrics = {"mape_pct": 33.2, "mae_w": 35.6, "p95_abs_err_w": 107.5}
    fleet = PowerCurveSpec(80.0, 250.0, info={"metrics": fleet_metrics, "rows_test": 5000})
    window = {"start": "2026-01-05T00:00:00Z", "end": "2026-01-11T23:59:00Z"}
    made = make_bundle(
        tmp_path / "bundle",
        curves,
        fallback=fleet,
        extra={"training_window": window, "training": {"test_fraction": 0.2}},
    )
    with (
        extender_service(made.directory, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        status = client.get("/status").json()
    assert status["bundle_version"] == made.version  # the contract's key stays
    assert status["curves"]["fallback"]["heldout_mape_pct"] == 33.2  # so does this one

    accuracy = status["bundle"]["accuracy"]
    assert accuracy["held_out_rows"] == (
        "the newest 20 % of each node's rows in the training window 2026-01-05T00:00:00Z .. "
        "2026-01-11T23:59:00Z, which no model was fitted on"
    )
    fleet_figures = accuracy["fleet_fallback"]
    assert {k: fleet_figures[k] for k in fleet_metrics} == fleet_metrics
    assert fleet_figures["rows"] == 5000
    means = fleet_figures["means"]
    assert "every node that has no model of its own" in means
    assert "not the error of the per-node models" in means
    assert status["curves"]["fallback"]["heldout_means"] == means  # said where the figure is

    own_figures = accuracy["own_models"]
    assert own_figures["nodes"] == 2  # node-s is a scaled fallback, not a model of its own
    assert own_figures["mape_pct"] == {"median": 3.0, "max": 4.5, "max_node": "node-b"}
    assert own_figures["mae_w"] == {"median": 6.0, "max": 9.0, "max_node": "node-b"}
    assert "its own held-out rows" in own_figures["means"]
    scaled = accuracy["scaled_fallbacks"]
    assert scaled["nodes"] == 1
    assert scaled["mape_pct"] == {"median": 12.0, "max": 12.0, "max_node": "node-s"}
    assert "scaled to the power the node was measured at" in scaled["means"]


def test_status_and_log_say_when_the_filter_verb_and_the_profile_disagree(
    bundle, snapshot: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The default profile filters; a scheduler entry without filterVerb never runs them.
    request = (FIXTURE / "prioritize-request.json").read_bytes()
    with (
        caplog.at_level("WARNING", logger="extender.runtime"),
        extender_service(bundle.directory, snapshot) as (url, _runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        for _ in range(VERB_CHECK_AFTER_REQUESTS - 1):
            assert client.post("/prioritize", content=request).status_code == 200
        assert client.get("/status").json()["verb_problem"] is None  # not yet: too few
        assert client.post("/prioritize", content=request).status_code == 200
        problem = client.get("/status").json()["verb_problem"]
        assert "never /filter" in problem and "PowerCap" in problem and "filterVerb" in problem
        deadline = time.monotonic() + 10  # the refresher (every second) logs it, once
        while not any("never /filter" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the disagreement was not logged"
            time.sleep(0.05)
        filter_request = (FIXTURE / "filter-request.json").read_bytes()
        assert client.post("/filter", content=filter_request).status_code == 200
        status = client.get("/status").json()
        assert status["verb_problem"] is None
        assert status["requests_answered"]["prioritize"] == VERB_CHECK_AFTER_REQUESTS
    assert sum("never /filter" in r.getMessage() for r in caplog.records) == 1


def test_a_filter_verb_without_filters_is_called_a_round_trip_for_nothing() -> None:
    assert verb_problem([], filter_requests=0, prioritize_requests=10_000) is None
    assert verb_problem(["PowerCap"], filter_requests=1, prioritize_requests=10_000) is None
    idle = verb_problem([], filter_requests=VERB_CHECK_AFTER_REQUESTS, prioritize_requests=0)
    assert idle is not None and "remove filterVerb" in idle
