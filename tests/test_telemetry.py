"""TelemetryPoller against a real Prometheus scraping tiny exporters served by the test.

Two exporters stand in for two nodes: each serves node_exporter-like CPU counters and
ipmi_exporter-like BMC readings. Node A is found through `node_uname_info` (node_from: uname),
node B through an explicit instance mapping and has one CPU socket. The last test runs
`python -m extender` in live mode against that Prometheus and the real control plane
(tests/conftest.py), as the extender's own ServiceAccount. Waits are bounded polling loops on
observable state, never assertions on speed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from envtest import ControlPlane, NodeAgent
from extender.sources.telemetry import TelemetryPoller
from extender.state import ClusterState
from livedata.collect_config import CollectConfig
from tests.support.exporters import Exporter, two_nodes, wait_until
from tests.support.prometheus import (
    PrometheusServer,
    free_port,
    require_prometheus,
    start_prometheus,
)


@pytest.fixture
def exporters() -> Iterator[tuple[Exporter, Exporter]]:
    with two_nodes() as pair:
        yield pair


def collect_config(prom_url: str, node_b_target: str) -> CollectConfig:
    return CollectConfig(
        url=prom_url,
        cpu_rate_window="5s",  # five 1 s scrapes: follows a change within seconds
        instance_nodes={node_b_target: "node-b"},
    )


def telemetry(state: ClusterState) -> dict[str, tuple[dict[str, float], float]]:
    _, snapshot = state.telemetry_snapshot()
    return {
        node: (dict(values), observed_at_s) for node, (values, observed_at_s) in snapshot.items()
    }


def restart(prom: PrometheusServer) -> PrometheusServer:
    """Start the same server again: same port, same data directory, same configuration."""
    prom.stop()
    with prom.log_path.open("a") as log:
        process = subprocess.Popen(
            prom.process.args, stdout=subprocess.DEVNULL, stderr=log, cwd=prom.data_dir.parent
        )
    restarted = PrometheusServer(process, prom.url, prom.data_dir, prom.log_path)

    def answers() -> bool:
        try:
            restarted.query("up")
            return True
        except OSError:
            return False

    wait_until(answers, f"Prometheus to answer again at {prom.url}")
    return restarted


@pytest.mark.prometheus
@pytest.mark.slow
def test_poller_writes_telemetry_and_survives_an_outage(
    tmp_path: Path, exporters: tuple[Exporter, Exporter]
) -> None:
    require_prometheus()
    node_a, node_b = exporters
    prom = start_prometheus(tmp_path, scrape_targets=[node_a.target, node_b.target])
    poller: TelemetryPoller | None = None
    try:
        # A rate is only exact once its whole window is covered by scrapes (Prometheus does
        # not extrapolate far past the samples): wait for enough history from both targets.
        for target in (node_a.target, node_b.target):
            prom.wait_for(
                f'count_over_time(node_cpu_seconds_total{{instance="{target}",mode="idle",'
                f'cpu="0"}}[10s]) >= 8'
            )
        state = ClusterState()
        poller = TelemetryPoller(
            # 5 s over four queries: a budget that does not split into whole seconds.
            collect_config(prom.url, node_b.target),
            state,
            interval_s=0.5,
            timeout_s=5.0,
        )

        # One poll, by hand: every node and feature the exporters serve.
        wait_until(poller.poll_once, "a first successful poll")
        wait_until(lambda: len(telemetry(state)) == 2, "both nodes in one poll")
        values_a, observed_a = telemetry(state)["node-a"]
        values_b, _ = telemetry(state)["node-b"]
        assert values_a == pytest.approx(
            {
                "cpu_util": 0.25,
                "ambient_temp_c": 22.0,
                "cpu1_temp_c": 55.0,
                "cpu2_temp_c": 53.0,
                "power_w": 310.0,
            },
            abs=0.02,
        )
        # One socket: no cpu2 value at all (feature_fill decides later), not a NaN.
        assert values_b == pytest.approx(
            {"cpu_util": 0.6, "ambient_temp_c": 24.0, "cpu1_temp_c": 61.0, "power_w": 150.0},
            abs=0.02,
        )
        # Prometheus's evaluation time: a Unix time close to the test's clock.
        assert abs(observed_a - time.time()) < 120
        assert poller.consecutive_failures == 0 and poller.last_success_at_s is not None
        assert poller.nodes_last_poll == 2

        # In the background it follows the exporters.
        poller.start()
        node_a.host.power_w = 420.0
        node_b.host.cpu_util = 0.9
        wait_until(
            lambda: (
                telemetry(state)["node-a"][0]["power_w"] == 420.0
                and telemetry(state)["node-b"][0]["cpu_util"] == pytest.approx(0.9, abs=0.02)
            ),
            "the new readings",
        )

        # Prometheus goes away: failures are counted, the last values stay as they were.
        prom.stop()
        wait_until(lambda: poller.consecutive_failures >= 2, "failed polls to be counted")
        kept = telemetry(state)
        last_success_s = poller.last_success_at_s
        wait_until(lambda: poller.consecutive_failures >= 4, "more failed polls")
        assert telemetry(state) == kept
        assert poller.last_success_at_s == last_success_s
        assert poller.failures_total >= 4
        assert "cannot connect" in (poller.last_error or "")

        # Back again: it recovers by itself and reads fresh values.
        node_a.host.power_w = 390.0
        prom = restart(prom)
        wait_until(lambda: poller.consecutive_failures == 0, "recovery")
        wait_until(lambda: telemetry(state)["node-a"][0]["power_w"] == 390.0, "fresh values")
        assert telemetry(state)["node-a"][1] > kept["node-a"][1]
        assert poller.last_error is None
    finally:
        if poller is not None:
            poller.stop()
        prom.stop()


def test_unreachable_prometheus_fails_cleanly() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    state = ClusterState()
    # A bare URL stands for the default queries and node mapping.
    poller = TelemetryPoller(f"http://127.0.0.1:{closed_port}", state, timeout_s=2.0)
    assert poller.poll_once() is False
    assert poller.poll_once() is False
    assert (poller.consecutive_failures, poller.failures_total, poller.polls_total) == (2, 2, 2)
    assert poller.last_success_at_s is None
    assert f"127.0.0.1:{closed_port}" in (poller.last_error or "")
    assert telemetry(state) == {}


def test_a_silent_server_cannot_hold_a_poll() -> None:
    # Accepts connections but never answers: only the timeout can end the poll.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        poller = TelemetryPoller(CollectConfig(url=url), ClusterState(), timeout_s=1.0)
        results: list[bool] = []
        polling = threading.Thread(target=lambda: results.append(poller.poll_once()))
        polling.start()
        polling.join(timeout=60)
        assert not polling.is_alive(), "a poll must be bounded by its timeout"
    assert results == [False]
    assert "timeout" in (poller.last_error or "")


def test_background_thread_keeps_polling_through_failures() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    poller = TelemetryPoller(
        CollectConfig(url=f"http://127.0.0.1:{closed_port}"),
        ClusterState(),
        interval_s=0.05,
        timeout_s=1.0,
    )
    poller.start()
    try:
        wait_until(lambda: poller.failures_total >= 3, "several failed polls in the thread")
    finally:
        poller.stop()
    assert poller.status()["consecutive_failures"] == poller.failures_total


def test_rejects_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        TelemetryPoller(CollectConfig(), ClusterState(), interval_s=0)
    with pytest.raises(ValueError, match="timeout_s"):
        TelemetryPoller(CollectConfig(), ClusterState(), timeout_s=float("nan"))


FILTER_REQUEST = (
    Path(__file__).parent / "fixtures" / "kube-scheduler-v1.28" / "cache-capable"
) / "filter-request.json"


def _http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except (urllib.error.URLError, ConnectionError):
        return 0, {}


@pytest.mark.prometheus
@pytest.mark.slow
def test_live_mode_end_to_end(
    tmp_path: Path, control_plane: ControlPlane, node_agent: NodeAgent, namespace: str
) -> None:
    """`python -m extender --prometheus --kubeconfig`: both live sources feed the answers."""
    require_prometheus()
    # The cluster is shared with other tests: this test's nodes carry its namespace's name.
    node_a_name, node_b_name = f"{namespace}-node-a", f"{namespace}-node-b"
    process: subprocess.Popen | None = None
    with two_nodes(node_a_name) as (node_a, _):
        prom = start_prometheus(tmp_path, scrape_targets=[node_a.target])
        node_agent.add_node(node_a_name, cpu=8)
        node_agent.add_node(node_b_name, cpu=4)
        kubeconfig = control_plane.service_account_kubeconfig(
            "power-aware-scheduler", "power-extender", tmp_path / "extender.kubeconfig"
        )
        port = free_port()
        log_path = tmp_path / "extender.log"
        try:
            with log_path.open("w") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "extender",
                        "--port",
                        str(port),
                        "--prometheus",
                        prom.url,
                        "--kubeconfig",
                        str(kubeconfig),
                        "--refresh-interval",
                        "1",
                        # Other tests' nodes, never fresh here, may share the cluster: ready
                        # once any node has fresh telemetry, which only this test's node-a can.
                        "--ready-min-fresh-share",
                        "0.01",
                        "--log-format",
                        "text",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    cwd=Path(__file__).parent.parent,
                )
            base = f"http://127.0.0.1:{port}"

            def log_tail() -> str:
                return "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])

            # node-a's telemetry (found through node_uname_info) makes a node fresh.
            wait_until(
                lambda: _http(f"{base}/readyz")[0] == 200 or process.poll() is not None,
                "/readyz to answer 200",
            )
            assert process.poll() is None, log_tail()

            request = json.loads(FILTER_REQUEST.read_text())
            request["NodeNames"] = [node_a_name, node_b_name]
            status, answer = _http(f"{base}/filter", request)
            assert (status, answer["NodeNames"], answer["FailedNodes"]) == (
                200,
                [node_a_name, node_b_name],
                {},
            ), log_tail()
            _, explained = _http(f"{base}/explain", request)
            notes = {row["node"]: row["note"] for row in explained["nodes"]}
            # The default bundle has no curve for these names; what matters is what was read.
            assert "telemetry" not in notes[node_a_name], notes
            assert "no telemetry" in notes[node_b_name], notes

            # A label written through the API reaches the filter through the node watch.
            core = kubernetes.client.CoreV1Api(control_plane.api_client())
            core.patch_node(node_a_name, {"metadata": {"labels": {"energy-status": "powerless"}}})
            wait_until(
                lambda: (
                    node_a_name in (_http(f"{base}/filter", request)[1].get("FailedNodes") or {})
                ),
                "the powerless node to fail the filter",
            )
            assert _http(f"{base}/filter", request)[1]["NodeNames"] == [node_b_name]
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
            prom.stop()
