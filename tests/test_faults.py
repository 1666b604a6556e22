"""Faults in what the extender depends on: it keeps answering, degrades as documented, recovers.

The world is real: Prometheus (started by the test) scrapes two tiny exporters standing in for
node-a and node-b; the real control plane (tests/conftest.py) holds node-a, node-b and node-c,
kept alive by a node agent (their names carry this run's id: the cluster is shared with other
tests); the service runs in live mode (``extender.__main__.prepare``: the same wiring as
``python -m extender --prometheus --kubeconfig --collect-config``) as the extender's
ServiceAccount, under uvicorn on 127.0.0.1. Between the poller and Prometheus
sits a small HTTP front the test switches between forwarding, down (not listening), slow (answers
after the poll timeout) and garbage (HTML, or JSON of the wrong shape).

Asserted for each fault, with bounded polling waits and no timing assertion:

- requests keep being answered (client timeout) from the last good data while it is fresher
  than the telemetry TTL, and ``/readyz`` stays 200;
- once it is stale, the documented neutral behaviour: every node passes the filter and gets
  the lowest power score (0), notes say "stale", ``/readyz`` is 503 with the reason;
- when the fault ends, fresh telemetry, scores and readiness come back by themselves.

The Kubernetes watch dropping (a fault proxy in front of the API server cut: open streams
and new connections reset) is resumed without a visible gap; the API unreachable for longer than
the TTL makes ``/readyz`` say so while answers continue from the last node view. The bundle
directory vanishing keeps the loaded model serving (and ``/status`` names the refusal) until a
bundle is back, which is then swapped in.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from kubernetes import client

from envtest import ControlPlane, NodeAgent
from extender.__main__ import prepare
from extender.app import create_app
from extender.config import ExtenderConfig
from extender.runtime import Runtime
from extender.sources.telemetry import TelemetryPoller
from tests.support.bundles import PowerCurveSpec, edit_manifest, make_bundle
from tests.support.exporters import two_nodes, wait_until
from tests.support.fault_proxy import FaultProxy, kubeconfig_through
from tests.support.prometheus import PrometheusServer, start_prometheus
from tests.support.server import REPO_ROOT, serve_app

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

FIXTURES = Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28"
# Unique in the shared cluster; node-c never has telemetry.
NODE_A, NODE_B, NODE_C = NODES = tuple(f"faults-{uuid.uuid4().hex[:6]}-node-{x}" for x in "abc")
TTL_S = 10.0
POLL_INTERVAL_S = 0.5
POLL_TIMEOUT_S = 1.0
SLOW_S = 4.0  # how long the slow front waits before answering: beyond the poll timeout
CLIENT_TIMEOUT_S = 5.0  # every answer must come within this (the scheduler's httpTimeout)
CURVES = {
    NODE_A: PowerCurveSpec(idle_w=100.0, max_w=300.0, exponent=1),
    NODE_B: PowerCurveSpec(idle_w=90.0, max_w=350.0, exponent=2),
    NODE_C: PowerCurveSpec(idle_w=120.0, max_w=400.0, exponent=1),
}
# Other tests' nodes, never fresh here, may share the cluster: the service is ready once any
# node has fresh telemetry (one in a hundred), which only this test's node-a and node-b can.
READY_MIN_FRESH_SHARE = 0.01


# ---- a switchable front of Prometheus ---------------------------------------------------------


class PrometheusFront:
    """Forwards to the real Prometheus, or plays a fault: "down", "slow", "garbage"."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.mode = "forward"
        self._served = 0
        self._server = self._bind(0)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _bind(self, port: int) -> http.server.ThreadingHTTPServer:
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                front._answer(self)

            def do_POST(self) -> None:
                front._answer(self)

        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        server.handle_error = lambda request, address: None  # a client that gave up
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def _answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        self._served += 1
        if self.mode == "garbage":
            garbage = [
                (b"<html><body>502 Bad Gateway</body></html>", "text/html"),
                (b'{"status":"success","data":{"resultType":"vector","result":"x"}}', JSON),
                (b'{"status":"success","data":[1,2,3]}', JSON),
                (b"\x00\xff\xfe not even text", "application/octet-stream"),
            ][self._served % 4]
            return self._reply(handler, 200, *garbage)
        if self.mode == "slow":
            time.sleep(SLOW_S)
        request = urllib.request.Request(
            self.upstream + handler.path,
            data=body,
            method=handler.command,
            headers={"Content-Type": handler.headers.get("Content-Type", JSON)},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as upstream:
                self._reply(
                    handler, upstream.status, upstream.read(), upstream.headers["Content-Type"]
                )
        except urllib.error.HTTPError as error:
            self._reply(handler, error.code, error.read(), JSON)

    @staticmethod
    def _reply(handler, status: int, payload: bytes, content_type: str) -> None:
        with contextlib.suppress(OSError):
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)

    def go_down(self) -> None:
        """Stop listening: the poller's connections are refused, as with a dead Prometheus."""
        self._server.shutdown()
        self._server.server_close()

    def come_back(self) -> None:
        self.mode = "forward"
        self._server = self._bind(self.port)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._server.shutdown()
            self._server.server_close()


JSON = "application/json"


# ---- the world: Prometheus, exporters, the control plane, bundle ------------------------------


@dataclass
class World:
    prometheus: PrometheusServer
    control_plane: ControlPlane
    collect_config: Path
    bundle_dir: Path
    kubeconfig: Path  # the extender's ServiceAccount, straight to the API server

    def label_node_c(self, energy_status: str | None) -> None:
        core = client.CoreV1Api(self.control_plane.api_client())
        core.patch_node(NODE_C, {"metadata": {"labels": {"energy-status": energy_status}}})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[World]:
    root = tmp_path_factory.mktemp("faults")
    exporters = contextlib.ExitStack()
    node_a, node_b = exporters.enter_context(two_nodes(NODE_A))
    # Both exporters listen on 127.0.0.1: node-b is mapped by instance, through the same
    # collect settings file training would use (--collect-config).
    collect_config = root / "collect.yaml"
    collect_config.write_text(
        yaml.safe_dump({"cpu_rate_window": "5s", "instance_nodes": {node_b.target: NODE_B}})
    )
    bundle = make_bundle(root / "bundle", CURVES)
    prometheus = start_prometheus(root, scrape_targets=[node_a.target, node_b.target])
    # The kubelets, straight to the API server: nodes stay Ready while the extender's way there
    # is cut.
    agent = NodeAgent(control_plane.api_client(), heartbeat_s=1.0).start()
    try:
        for name in NODES:
            agent.add_node(name, cpu=8)
        prometheus.wait_for('rate(node_cpu_seconds_total{mode="idle"}[5s])')
        yield World(
            prometheus,
            control_plane,
            collect_config,
            bundle.directory,
            control_plane.service_account_kubeconfig(
                "power-aware-scheduler", "power-extender", root / "extender.kubeconfig"
            ),
        )
    finally:
        agent.stop()
        for name in NODES:
            agent.remove_node(name)
        prometheus.stop()
        exporters.close()


@contextlib.contextmanager
def live_service(
    world: World,
    prometheus_url: str,
    bundle_dir: Path | None = None,
    kubeconfig: Path | None = None,
) -> Iterator[tuple[httpx.Client, Runtime]]:
    config = ExtenderConfig(
        port=0,
        bundle_dir=bundle_dir or world.bundle_dir,
        prometheus_url=prometheus_url,
        kubeconfig=kubeconfig or world.kubeconfig,
        collect_config=world.collect_config,
        refresh_interval_s=POLL_INTERVAL_S,
        prometheus_timeout_s=POLL_TIMEOUT_S,
        telemetry_ttl_s=TTL_S,
        bundle_poll_interval_s=0.2,
        curve_refresh_interval_s=0.2,
        ready_min_fresh_share=READY_MIN_FRESH_SHARE,
    ).validate()
    runtime = prepare(config)
    runtime.start_background()
    try:
        with (
            serve_app(create_app(runtime)) as url,
            httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as client,
        ):
            yield client, runtime
    finally:
        runtime.stop()


def poller_of(runtime: Runtime) -> TelemetryPoller:
    (poller,) = [s for s in runtime.live_sources if isinstance(s, TelemetryPoller)]
    return poller


def request(names: tuple[str, ...] = NODES) -> bytes:
    body = orjson.loads((FIXTURES / "cache-capable" / "prioritize-request.json").read_bytes())
    body["NodeNames"] = list(names)
    return orjson.dumps(body)


def explain(client: httpx.Client, names: tuple[str, ...] = NODES) -> dict[str, dict]:
    response = client.post("/explain", content=request(names))
    assert response.status_code == 200, response.text
    return {row["node"]: row for row in response.json()["nodes"]}


def ready(client: httpx.Client) -> bool:
    return client.get("/readyz").status_code == 200


def readiness_reasons(client: httpx.Client) -> list[str]:
    return client.get("/readyz").json()["reasons"]


def assert_scored_from_telemetry(client: httpx.Client) -> None:
    rows = explain(client)
    for name in (NODE_A, NODE_B):
        assert rows[name]["note"] == "", rows[name]
        assert rows[name]["power_after_w"] > rows[name]["power_before_w"] > 0
    assert rows[NODE_C]["note"] != ""  # no telemetry (or, when labelled, powerless)


def assert_neutral(client: httpx.Client) -> None:
    """Stale telemetry: all pass the filter, nobody gets a power score, answers still decode."""
    rows = explain(client)
    for name in (NODE_A, NODE_B):
        assert "stale" in rows[name]["note"], rows[name]
    assert all(
        row["plugins"]["PowerIncrease"]["points"] == 0.0 and row["passes"] for row in rows.values()
    ), rows
    filtered = client.post("/filter", content=request()).json()
    assert filtered["NodeNames"] == list(NODES) and filtered["FailedNodes"] == {}
    scores = client.post("/prioritize", content=request()).json()
    assert [entry["Host"] for entry in scores] == list(NODES)
    assert len({entry["Score"] for entry in scores}) == 1  # no power preference left


def fresh_and_ready(client: httpx.Client) -> bool:
    rows = explain(client)
    return ready(client) and rows[NODE_A]["note"] == "" and rows[NODE_B]["note"] == ""


# ---- Prometheus faults ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["down", "slow", "garbage"])
def test_prometheus_fault_last_good_data_then_neutral_then_recovery(
    world: World, fault: str
) -> None:
    front = PrometheusFront(world.prometheus.url)
    try:
        with live_service(world, front.url) as (client, runtime):
            poller = poller_of(runtime)
            wait_until(lambda: fresh_and_ready(client), "fresh telemetry and /readyz 200")
            assert_scored_from_telemetry(client)

            if fault == "down":
                front.go_down()
            else:
                front.mode = fault
            wait_until(lambda: poller.consecutive_failures >= 1, f"a poll to fail ({fault})")
            # Within the TTL the last good values keep scoring, and the service stays ready.
            assert_scored_from_telemetry(client)
            assert ready(client)
            status = client.get("/status").json()
            (poller_status,) = [s for s in status["live_sources"] if "polls_total" in s]
            assert poller_status["last_error"]

            wait_until(lambda: "stale" in explain(client)[NODE_A]["note"], "telemetry to age")
            assert_neutral(client)
            assert not ready(client)
            assert any("fresher than" in reason for reason in readiness_reasons(client))

            if fault == "down":
                front.come_back()
            else:
                front.mode = "forward"
            wait_until(lambda: fresh_and_ready(client), "recovery after the fault ended")
            assert_scored_from_telemetry(client)
            assert poller.consecutive_failures == 0
            assert client.get("/healthz").status_code == 200
    finally:
        front.close()


# ---- Kubernetes watch faults -------------------------------------------------------------------


def test_kubernetes_watch_drops_and_outage(world: World, tmp_path: Path) -> None:
    proxy = FaultProxy("127.0.0.1", world.control_plane.apiserver_port).start()
    kubeconfig = kubeconfig_through(world.kubeconfig, proxy.port, tmp_path / "proxy.kubeconfig")
    try:
        with live_service(world, world.prometheus.url, kubeconfig=kubeconfig) as (client, runtime):
            (watcher,) = [s for s in runtime.live_sources if hasattr(s, "healthy")]
            wait_until(lambda: fresh_and_ready(client), "fresh telemetry and /readyz 200")

            def failures() -> int:
                status = watcher.status()
                return status["nodes"]["failures_total"] + status["pods"]["failures_total"]

            # Dropped streams and a few failing requests (refused while the way is cut):
            # resumed, and a change made meanwhile still arrives (the watch continues from the
            # last resourceVersion it saw).
            before = failures()
            proxy.cut()
            world.label_node_c("powerless")
            wait_until(lambda: failures() >= before + 2, "a few failed requests")
            proxy.resume()
            wait_until(
                lambda: NODE_C in client.post("/filter", content=request()).json()["FailedNodes"],
                "the label changed during the drop to reach the filter",
            )
            wait_until(lambda: watcher.healthy, "the watches to be healthy again")
            assert ready(client)

            # The API unreachable for longer than the TTL: still answering from the last node
            # view, but /readyz says the view can no longer be trusted.
            proxy.cut()
            try:
                wait_until(
                    lambda: any("watch failing" in r for r in readiness_reasons(client)),
                    "/readyz to report the failing watch",
                    timeout_s=TTL_S * 6,
                )
                assert not ready(client)
                answer = client.post("/filter", content=request())
                assert answer.status_code == 200
                assert answer.json()["NodeNames"] == [NODE_A, NODE_B]  # node-c still powerless
                assert_scored_from_telemetry(client)
            finally:
                proxy.resume()
            wait_until(lambda: watcher.healthy and ready(client), "recovery of the watch")
            world.label_node_c(None)
            wait_until(
                lambda: client.post("/filter", content=request()).json()["FailedNodes"] == {},
                "a change after the outage to arrive",
            )
    finally:
        proxy.stop()
        world.label_node_c(None)


def test_not_ready_until_the_watch_has_listed(world: World, tmp_path: Path) -> None:
    proxy = FaultProxy("127.0.0.1", world.control_plane.apiserver_port).start()
    kubeconfig = kubeconfig_through(world.kubeconfig, proxy.port, tmp_path / "proxy.kubeconfig")
    proxy.cut()  # the API server out of reach from the start
    try:
        with live_service(world, world.prometheus.url, kubeconfig=kubeconfig) as (client, _):
            wait_until(
                lambda: any("has not synced" in r for r in readiness_reasons(client)),
                "/readyz to say the watch has not synced",
            )
            # Unknown nodes still get an answer the scheduler can use: all pass, all score 0.
            scores = client.post("/prioritize", content=request()).json()
            assert [(e["Host"], e["Score"]) for e in scores] == [(n, 0) for n in NODES]
            proxy.resume()
            wait_until(lambda: fresh_and_ready(client), "ready once the API answers")
    finally:
        proxy.stop()


# ---- the bundle directory vanishing ------------------------------------------------------------


def test_bundle_directory_vanishing_keeps_the_loaded_model(world: World, tmp_path: Path) -> None:
    bundle_dir = tmp_path / "bundle"
    make_bundle(bundle_dir, CURVES)
    with live_service(world, world.prometheus.url, bundle_dir) as (client, _runtime):
        wait_until(lambda: fresh_and_ready(client), "fresh telemetry and /readyz 200")
        version = client.get("/status").json()["bundle_version"]

        os.rename(bundle_dir, tmp_path / "gone")
        wait_until(
            lambda: (
                "missing"
                in ((client.get("/status").json()["last_refused"] or {}).get("error") or "")
            ),
            "the watcher to notice the missing directory",
        )
        response = client.post("/explain", content=request())
        assert response.status_code == 200
        assert response.json()["bundle_version"] == version
        assert_scored_from_telemetry(client)
        assert ready(client)  # the loaded model keeps serving

        os.rename(tmp_path / "gone", bundle_dir)
        edit_manifest(bundle_dir, version=f"{version}-back")
        wait_until(
            lambda: (
                client.post("/explain", content=request()).json()["bundle_version"]
                == f"{version}-back"
            ),
            "the returned bundle to be swapped in",
        )
        assert_scored_from_telemetry(client)
        assert ready(client)


def test_bad_collect_config_is_a_one_line_startup_error(tmp_path: Path) -> None:
    config = tmp_path / "collect.yaml"
    config.write_text("instance_nodes: {a: b}\nno_such_setting: 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "extender", "--port", "0", "--prometheus", "http://127.0.0.1:9",
         "--in-cluster", "--collect-config", str(config)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("python -m extender: error:")
    assert "no_such_setting" in result.stderr.splitlines()[-1] and "Traceback" not in result.stderr
