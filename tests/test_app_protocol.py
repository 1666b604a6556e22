"""The extender v1 protocol through a real uvicorn server, with kube-scheduler's own bodies.

The bodies are the ones a real kube-scheduler v1.28 sent (``tests/fixtures``), for node-a,
node-b and node-c; the cluster is a snapshot file and the bundle holds real ONNX models fitted
on known curves, so the expected order of the power increases is computed from the curves.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.support.bundles import PowerCurveSpec, make_bundle
from tests.support.server import extender_service, write_snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28"
ALLOCATABLE_CPU = 8.0  # what the captured Node objects say (status.allocatable.cpu "8")
TEMP_C = 50.0  # the curves' reference temperature: the temperature term is 0

CURVES = {
    "node-a": PowerCurveSpec(idle_w=100.0, max_w=300.0, exponent=1),
    "node-b": PowerCurveSpec(idle_w=90.0, max_w=350.0, exponent=2),
    "node-c": PowerCurveSpec(idle_w=120.0, max_w=400.0, exponent=3),
    "node-d": PowerCurveSpec(idle_w=80.0, max_w=200.0, exponent=1),
    "node-e": PowerCurveSpec(idle_w=80.0, max_w=200.0, exponent=1),
}
UTIL = {"node-a": 0.5, "node-b": 0.2, "node-c": 0.8, "node-e": 0.1}  # node-d: no telemetry


def _node(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": name,
        "allocatable_cpu": ALLOCATABLE_CPU,
        "labels": labels or {},
    }
    if name in UTIL:
        entry["telemetry"] = {
            "cpu_util": UTIL[name],
            "ambient_temp_c": 22.0,
            "cpu1_temp_c": TEMP_C,
            "cpu2_temp_c": TEMP_C,
        }
    return entry


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("protocol")
    bundle = make_bundle(root / "bundle", CURVES)
    nodes = [_node(n) for n in ("node-a", "node-b", "node-c", "node-d")]
    nodes.append(_node("node-e", {"energy-status": "powerless"}))
    snapshot = write_snapshot(root / "cluster.json", nodes)
    limit = 64 * 1024
    with (
        extender_service(bundle.directory, snapshot, max_body_bytes=limit) as (url, runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        yield client, runtime, bundle


def body(mode: str, verb: str) -> bytes:
    return (FIXTURES / mode / f"{verb}-request.json").read_bytes()


def pod_demand_cores() -> float:
    pod = json.loads(body("cache-capable", "prioritize"))["Pod"]
    return float(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"].rstrip("m")) / 1000


def expected_increase_w(node: str) -> float:
    spec, u = CURVES[node], UTIL[node]
    d = pod_demand_cores() / ALLOCATABLE_CPU
    return float(spec.power_w(u + d, TEMP_C) - spec.power_w(u, TEMP_C))


def assert_integer_scores(raw: bytes) -> list[dict]:
    # Go's int decoding refuses 7.0: every Score must be an integer literal in the bytes.
    scores = re.findall(rb'"Score":([^,}]*)', raw)
    assert scores, raw
    for literal in scores:
        assert re.fullmatch(rb"(10|[0-9])", literal), f"Score literal {literal!r} in {raw!r}"
    answer = json.loads(raw)
    assert isinstance(answer, list)
    for entry in answer:
        assert set(entry) == {"Host", "Score"}
        assert type(entry["Score"]) is int and 0 <= entry["Score"] <= 10
    return answer


def test_fixture_pod_demand_is_what_the_curves_are_checked_with() -> None:
    assert pod_demand_cores() == pytest.approx(0.1)


@pytest.mark.parametrize("mode", ["cache-capable", "nocache"])
def test_prioritize_ranks_by_predicted_increase(service, mode: str) -> None:
    client, _, _ = service
    response = client.post("/prioritize", content=body(mode, "prioritize"))
    assert response.status_code == 200
    answer = assert_integer_scores(response.content)
    scores = {entry["Host"]: entry["Score"] for entry in answer}
    assert list(scores) == ["node-a", "node-b", "node-c"]  # request order, every candidate
    increases = {name: expected_increase_w(name) for name in scores}
    best = min(increases, key=increases.get)
    worst = max(increases, key=increases.get)
    assert best == "node-b"  # the test is only meaningful if the curves disagree with u
    assert scores[best] == 10 and scores[best] == max(scores.values())
    assert scores[worst] < scores[best]
    by_increase = sorted(scores, key=increases.get)
    assert [scores[n] for n in by_increase] == sorted(scores.values(), reverse=True)


def test_server_timing_splits_body_read_from_the_servers_own_work(service) -> None:
    client, _, _ = service
    response = client.post("/prioritize", content=body("cache-capable", "prioritize"))
    timing = dict(
        part.strip().split(";dur=") for part in response.headers["Server-Timing"].split(",")
    )
    assert set(timing) == {"read", "app"}
    assert all(float(ms) >= 0.0 for ms in timing.values())


def test_explain_reports_the_curves_increase(service) -> None:
    client, _, bundle = service
    response = client.post("/explain", content=body("cache-capable", "prioritize"))
    assert response.status_code == 200
    report = response.json()
    assert report["bundle_version"] == bundle.version
    assert report["demand_cores"] == pytest.approx(0.1)
    rows = {row["node"]: row for row in report["nodes"]}
    for name in ("node-a", "node-b", "node-c"):
        row = rows[name]
        assert row["u"] == pytest.approx(UTIL[name])
        assert row["a"] == 0.0
        assert row["d"] == pytest.approx(0.1 / ALLOCATABLE_CPU)
        assert row["increase_w"] == pytest.approx(expected_increase_w(name), rel=0.02)
        before = CURVES[name].power_w(UTIL[name], TEMP_C)
        assert row["power_before_w"] == pytest.approx(before, rel=1e-3)
        assert row["power_after_w"] == pytest.approx(
            row["power_before_w"] + row["increase_w"], rel=1e-12
        )
        assert row["energy_level"] == "grid"
    same = client.post("/prioritize?explain=1", content=body("cache-capable", "prioritize"))
    assert [r["score"] for r in same.json()["nodes"]] == [r["score"] for r in report["nodes"]]


def test_filter_names_echoes_passing_and_fails_powerless(service) -> None:
    client, _, _ = service
    request = json.loads(body("cache-capable", "filter"))
    request["NodeNames"] = ["node-a", "node-e", "node-b", "node-d"]
    response = client.post("/filter", content=json.dumps(request))
    assert response.status_code == 200
    answer = response.json()
    assert answer["NodeNames"] == ["node-a", "node-b", "node-d"]  # node-d: no telemetry, passes
    assert set(answer["FailedNodes"]) == {"node-e"}
    assert "powerless" in answer["FailedNodes"]["node-e"]
    # Evicting pods cannot give a node stored energy: preemption should not try it.
    assert list(answer["FailedAndUnresolvableNodes"]) == ["node-e"]
    assert answer["Error"] == ""
    assert "Nodes" not in answer or answer["Nodes"] is None


def test_filter_nodes_echoes_the_node_objects(service) -> None:
    client, _, _ = service
    request = json.loads(body("nocache", "filter"))
    powerless = copy.deepcopy(request["Nodes"]["items"][0])
    powerless["metadata"]["name"] = "node-e"
    powerless["metadata"]["labels"]["energy-status"] = "powerless"
    request["Nodes"]["items"].insert(1, powerless)
    response = client.post("/filter", content=json.dumps(request))
    assert response.status_code == 200
    answer = response.json()
    passing = [n for n in request["Nodes"]["items"] if n["metadata"]["name"] != "node-e"]
    assert answer["Nodes"]["items"] == passing  # the objects, unchanged, in request order
    assert list(answer["FailedNodes"]) == ["node-e"]
    assert answer["Error"] == ""


def test_nodes_mode_uses_the_request_labels(service) -> None:
    # The snapshot says node-c is unlabelled; the request object says powerless: with
    # nodeCacheCapable false the node objects are used as they come.
    client, _, _ = service
    request = json.loads(body("nocache", "filter"))
    request["Nodes"]["items"][2]["metadata"]["labels"]["energy-status"] = "powerless"
    answer = client.post("/filter", content=json.dumps(request)).json()
    assert list(answer["FailedNodes"]) == ["node-c"]


def test_node_without_telemetry_never_scores_best(service) -> None:
    client, _, _ = service
    request = json.loads(body("cache-capable", "prioritize"))
    request["NodeNames"] = ["node-d", "node-a", "node-b"]
    answer = assert_integer_scores(client.post("/prioritize", content=json.dumps(request)).content)
    scores = {e["Host"]: e["Score"] for e in answer}
    assert scores["node-d"] < scores["node-b"]
    assert scores["node-d"] == min(scores.values())
    explain = client.post("/explain", content=json.dumps(request)).json()
    row = next(r for r in explain["nodes"] if r["node"] == "node-d")
    assert row["plugins"]["PowerIncrease"]["points"] == 0.0 and row["increase_w"] is None
    assert "telemetry" in row["note"]


def test_unknown_nodes_score_zero_and_pass(service) -> None:
    client, _, _ = service
    request = json.loads(body("cache-capable", "prioritize"))
    request["NodeNames"] = ["node-a", "no-such-node"]
    answer = assert_integer_scores(client.post("/prioritize", content=json.dumps(request)).content)
    assert answer == [
        {"Host": "node-a", "Score": answer[0]["Score"]},
        {"Host": "no-such-node", "Score": 0},
    ]
    filtered = client.post("/filter", content=json.dumps(request)).json()
    assert filtered["NodeNames"] == ["node-a", "no-such-node"]


def test_empty_and_null_node_lists(service) -> None:
    client, _, _ = service
    request = json.loads(body("cache-capable", "prioritize"))
    request["NodeNames"] = []
    assert client.post("/prioritize", content=json.dumps(request)).json() == []
    empty = client.post("/filter", content=json.dumps(request)).json()
    assert empty["NodeNames"] == [] and empty["FailedNodes"] == {} and empty["Error"] == ""
    request["NodeNames"] = None
    request["Nodes"] = None
    both_null = client.post("/filter", content=json.dumps(request))
    assert both_null.status_code == 200
    assert not both_null.json().get("NodeNames")  # nothing passes


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not readable JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"Nodes": null, "NodeNames": ["node-a"]}', "Pod"),
        (b'{"Pod": null, "Nodes": null, "NodeNames": ["node-a"]}', "Pod"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": "node-a"}', "NodeNames"),
        (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}, "NodeNames": null}', "name"),
        (
            b'{"Pod": {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}},'
            b' "NodeNames": ["node-a"]}',
            "cpu",
        ),
        (b"", "JSON"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_unreadable_requests_get_400_with_a_reason(service, verb, raw, message) -> None:
    client, _, _ = service
    response = client.post(f"/{verb}", content=raw)
    assert response.status_code == 400
    assert message in response.json()["Error"]
    # ...and the server keeps serving.
    assert client.post(f"/{verb}", content=body("cache-capable", verb)).status_code == 200


def test_oversized_body_gets_413_and_the_server_keeps_serving(service) -> None:
    client, runtime, _ = service
    limit = runtime.config.max_body_bytes
    request = json.loads(body("cache-capable", "prioritize"))
    request["NodeNames"] = [f"node-{i:06d}" for i in range(limit // 8)]
    raw = json.dumps(request).encode()
    assert len(raw) > limit
    response = client.post("/prioritize", content=raw)
    assert response.status_code == 413
    assert "exceeds the limit" in response.json()["Error"]

    def chunks():  # no Content-Length: the cap must hold while streaming
        for start in range(0, len(raw), 4096):
            yield raw[start : start + 4096]

    streamed = client.post("/filter", content=chunks())
    assert streamed.status_code == 413
    assert client.post("/prioritize", content=body("nocache", "prioritize")).status_code == 200
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("verb", ["filter", "prioritize", "explain"])
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(body("cache-capable", "prioritize"), id="names"),
        pytest.param(body("nocache", "filter"), id="nodes"),
        pytest.param(b"{", id="bad-json"),
        pytest.param(b'{"Pod": {}, "NodeNames": ["node-a"]' + b" " * 70_000 + b"}", id="too-big"),
    ],
)
def test_the_verbs_fast_path_answers_what_fastapi_answers(service, verb: str, raw: bytes) -> None:
    # A verb's POST without a query string skips FastAPI; with one it is routed by FastAPI.
    # kube-scheduler must not be able to tell the two apart (Server-Timing aside).
    client, _, _ = service
    fast = client.post(f"/{verb}", content=raw)
    routed = client.post(f"/{verb}?via=fastapi", content=raw)
    assert fast.status_code == routed.status_code
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert int(fast.headers["content-length"]) == len(fast.content)
    assert "app;dur=" in fast.headers["server-timing"]
    if verb == "explain":  # the explanation carries times; compare its shape
        assert fast.json().keys() == routed.json().keys()
    else:
        assert fast.content == routed.content


def test_a_client_that_leaves_mid_body_is_counted_and_the_server_keeps_serving(service) -> None:
    client, runtime, _ = service
    name = "power_aware_extender_request_errors_total"
    labels = {"verb": "prioritize", "kind": "client_disconnect"}
    before = runtime.metrics.registry.get_sample_value(name, labels) or 0.0
    host, port = str(client.base_url.host), int(client.base_url.port or 80)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(
            b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + body("cache-capable", "prioritize")[:100]
        )
    deadline = time.monotonic() + 10
    while runtime.metrics.registry.get_sample_value(name, labels) != before + 1:
        assert time.monotonic() < deadline, "the disconnect was not counted"
        time.sleep(0.02)
    assert client.post("/prioritize", content=body("nocache", "prioritize")).status_code == 200


def test_errors_are_counted_by_verb_and_kind(service) -> None:
    client, runtime, _ = service
    name = "power_aware_extender_request_errors_total"
    labels = {"verb": "filter", "kind": "bad_request"}
    before = runtime.metrics.registry.get_sample_value(name, labels) or 0.0
    client.post("/filter", content=b"{")
    assert runtime.metrics.registry.get_sample_value(name, labels) == before + 1


def test_an_internal_error_gets_a_neutral_answer_a_log_and_a_count(
    service, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Fault injection: the cluster view fails as a bug would. kube-scheduler must still get
    # an answer it can read, one that neither blocks nor steers the pod.
    client, runtime, _ = service

    def broken_view(now_s: float) -> None:
        raise RuntimeError("injected fault")

    name = "power_aware_extender_request_errors_total"
    labels = {"verb": "prioritize", "kind": "internal"}
    before = runtime.metrics.registry.get_sample_value(name, labels) or 0.0
    monkeypatch.setattr(runtime.state, "view", broken_view)
    with caplog.at_level("ERROR", logger="extender.app"):
        scores = client.post("/prioritize", content=body("cache-capable", "prioritize"))
        filtered = client.post("/filter", content=body("nocache", "filter"))
    assert scores.status_code == 200
    assert scores.json() == [{"Host": n, "Score": 0} for n in ("node-a", "node-b", "node-c")]
    assert filtered.status_code == 200
    request_nodes = json.loads(body("nocache", "filter"))["Nodes"]["items"]
    assert filtered.json()["Nodes"]["items"] == request_nodes
    assert filtered.json()["Error"] == ""
    assert any("injected fault" in (r.exc_text or "") for r in caplog.records)
    monkeypatch.undo()
    assert runtime.metrics.registry.get_sample_value(name, labels) == before + 1
    assert client.post("/prioritize", content=body("cache-capable", "prioritize")).json()[1] == {
        "Host": "node-b",
        "Score": 10,
    }


def test_answers_after_nodes_change_are_what_a_fresh_service_answers(tmp_path: Path) -> None:
    """A node layout carries what the one before derived: the answers must not show it."""
    from extender.state import NodeInfo

    bundle = make_bundle(tmp_path / "bundle", CURVES)
    first_nodes = [_node(n) for n in ("node-a", "node-b", "node-c", "node-d")]
    first_nodes.append(_node("node-e", {"energy-status": "powerless"}))
    changes = [  # as the Kubernetes watch writes them
        NodeInfo("node-e", ALLOCATABLE_CPU, {"energy-status": "well-powered"}),
        NodeInfo("node-b", ALLOCATABLE_CPU, {"energy-status": "powerless"}),
        NodeInfo("node-f", ALLOCATABLE_CPU, {}),  # a new node: every node-set table changes
        NodeInfo("node-a", ALLOCATABLE_CPU, {"energy-status": "vulnerable"}),
    ]
    request = json.loads(body("cache-capable", "prioritize"))
    request["NodeNames"] = ["node-e", "node-d", "node-c", "node-b", "node-a"]
    raw = json.dumps(request)

    def answers(client: httpx.Client) -> tuple[bytes, bytes]:
        return client.post("/filter", content=raw).content, client.post(
            "/prioritize", content=raw
        ).content

    snapshot = write_snapshot(tmp_path / "first.json", first_nodes)
    with (
        extender_service(bundle.directory, snapshot) as (url, runtime),
        httpx.Client(base_url=url, timeout=10) as client,
    ):
        answers(client)  # the first layout derives everything
        nodes = {entry["name"]: entry for entry in first_nodes}
        for number, node in enumerate(changes):
            runtime.state.upsert_node(node)
            nodes[node.name] = _node(node.name, dict(node.labels))
            served = answers(client)
            fresh_file = write_snapshot(tmp_path / f"fresh-{number}.json", list(nodes.values()))
            with (
                extender_service(bundle.directory, fresh_file) as (fresh_url, _),
                httpx.Client(base_url=fresh_url, timeout=10) as fresh,
            ):
                assert served == answers(fresh), f"after {node.name} changed"
    filtered = json.loads(served[0])
    assert set(filtered["FailedNodes"]) == {"node-b"}  # the changes reached the answers
