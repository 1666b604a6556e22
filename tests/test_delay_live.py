"""RTTs from Goldpinger through a real Prometheus, nodes and pods from the real control plane.

The world: four nodes in two edge sites and a cloud, each running a Goldpinger pod, plus the
series of a Goldpinger pod on a node that has left the cluster. An hour of Goldpinger's
histograms, shaped as a real deployment scraped by a ServiceMonitor leaves them
(`tests.support.goldpinger`), are backfilled with promtool, from half an hour before the tests
start to half an hour after. The nodes are registered with the real control plane
(tests/conftest.py) and kept alive by a node agent, which runs the Goldpinger pods; the Node and
Pod watch (`ClusterWatcher`) runs against the API server as the extender's ServiceAccount; the
RTT source reads Prometheus over HTTP; the live service is wired as `python -m extender
--prometheus --kubeconfig --config` wires it.
"""

from __future__ import annotations

import contextlib
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from kubernetes import client

from envtest import ControlPlane, NodeAgent
from extender.__main__ import prepare
from extender.app import create_app
from extender.config import DEFAULT_BUNDLE_DIR, ExtenderConfig
from extender.pods import PODS_SIGNAL
from extender.profile import build_profile
from extender.rtt import RTT_SIGNAL, RttMatrix
from extender.scoring import assess
from extender.sources.kube_watch import ClusterWatcher
from extender.sources.rtt import RttSource, RttSourceSettings
from extender.state import ClusterState
from tests.support.goldpinger import GoldpingerPod, goldpinger_openmetrics
from tests.support.prometheus import PrometheusServer, free_port, start_prometheus
from tests.support.server import serve_app

pytestmark = pytest.mark.prometheus

# Node names carry this run's id: the cluster is shared with other tests.
RUN = f"dl{uuid.uuid4().hex[:6]}"
E1A, E1B, E2A, C1 = (f"{RUN}-{site}" for site in ("edge-1a", "edge-1b", "edge-2a", "cloud-1"))
NODES = {  # node -> InternalIP
    E1A: "192.168.10.11",
    E1B: "192.168.10.12",
    E2A: "192.168.20.11",
    C1: "10.10.0.5",
}
GONE_NODE = f"{RUN}-edge-9z"  # its Goldpinger still has series in Prometheus; the node is gone
NAMESPACE = f"{RUN}-goldpinger"
PODS = [
    GoldpingerPod(f"goldpinger-{n}", node, f"10.244.{n}.7", ip, NAMESPACE)
    for n, (node, ip) in enumerate({**NODES, GONE_NODE: "192.168.90.11"}.items())
]
# Typical call times between nodes, ms (Goldpinger times HTTP: a little more than ping).
BASE_RTT_MS = {
    frozenset({E1A, E1B}): 0.8,
    frozenset({E1A, E2A}): 22.0,
    frozenset({E1B, E2A}): 23.0,
    frozenset({E1A, C1}): 38.0,
    frozenset({E1B, C1}): 41.0,
    frozenset({E2A, C1}): 33.0,
}
LOSSY = frozenset({E2A, C1})  # 30 % of its calls time out (300 ms)
QUERY_WINDOW_S = 300.0
SCRAPE_S = 15.0


def base_rtt_ms(a: str, b: str) -> float:
    return 0.6 if a == b else BASE_RTT_MS.get(frozenset({a, b}), 15.0)


@dataclass
class World:
    prometheus: PrometheusServer
    control_plane: ControlPlane
    kubeconfig: Path  # the extender's ServiceAccount
    end_s: float  # the last backfilled scrape (in the future: see the fixture)

    def extender_api(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.control_plane.api_client(self.kubeconfig))

    def admin_api(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.control_plane.api_client())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[World]:
    root = tmp_path_factory.mktemp("delay-live")
    # The series run from half an hour ago to half an hour ahead: the live service reads them
    # at its own clock, however long the tests before it take (the others read at `end_s`).
    now_s = float(int(time.time()))
    end_s = now_s + 1800.0
    # edge-2a's Goldpinger runs without HOSTNAME: its instance label is its pod name.
    text = goldpinger_openmetrics(
        PODS,
        base_rtt_ms,
        start_s=now_s - 1800.0,
        end_s=end_s,
        scrape_interval_s=SCRAPE_S,
        loss=lambda a, b: 0.3 if frozenset({a, b}) == LOSSY else 0.0,
        instance=lambda pod: pod.name if pod.node == E2A else pod.node,
        # A user's UI check: slow, and not a ping; the default selector leaves it out.
        extra_calls=[("goldpinger-0", "goldpinger-1", "check", 2.0)],
        seed=3,
    )
    prometheus = start_prometheus(root, openmetrics_text=text)
    admin = client.CoreV1Api(control_plane.api_client())
    agent = NodeAgent(control_plane.api_client(), heartbeat_s=1.0).start()
    try:
        for node, address in NODES.items():
            # The address Goldpinger's series name as host_ip.
            agent.add_node(node, cpu=16, internal_ip=address)
        admin.create_namespace({"metadata": {"name": NAMESPACE}})
        for pod in PODS:
            if pod.node in NODES:
                admin.create_namespaced_pod(NAMESPACE, pod.as_object())
        wait_until(
            lambda: all(
                p.status.phase == "Running" for p in admin.list_namespaced_pod(NAMESPACE).items
            ),
            "the node agent running the Goldpinger pods",
        )
        kubeconfig = control_plane.service_account_kubeconfig(
            "power-aware-scheduler", "power-extender", root / "extender.kubeconfig"
        )
        yield World(prometheus, control_plane, kubeconfig, end_s)
    finally:
        agent.stop()
        for node in NODES:
            agent.remove_node(node)
        with contextlib.suppress(client.ApiException):
            admin.delete_namespace(NAMESPACE)
        prometheus.stop()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def watched_state(world: World) -> Iterator[ClusterState]:
    state = ClusterState()
    watcher = ClusterWatcher(world.extender_api(), state, resync_backoff_s=0.05)
    watcher.start()
    try:
        wait_until(lambda: watcher.healthy, "the Kubernetes watch to sync")
        wait_until(lambda: state.view(time.time()).signal(PODS_SIGNAL) is not None, "pods")
        yield state
    finally:
        watcher.stop()


def source_for(world: World, state: ClusterState, clock_s: list[float], **settings) -> RttSource:
    return RttSource(
        RttSourceSettings(**settings),
        state,
        prometheus_url=world.prometheus.url,
        clock=lambda: clock_s[0],
    )


def rtt_ms(matrix: RttMatrix, a: str, b: str) -> float:
    return float(matrix.rtt_ms[matrix.positions[a], matrix.positions[b]])


def promql_quantiles(world: World, quantile: float) -> dict[tuple[str, str], float]:
    """Prometheus's own histogram_quantile per caller-callee, mapped to nodes by hand."""
    answer = world.prometheus.query(
        f"histogram_quantile({quantile}, sum by (goldpinger_instance, host_ip, pod_ip, le) "
        '(rate(goldpinger_peers_response_time_s_bucket{call_type="ping"}[5m])))',
        at_s=world.end_s,
    )
    node_of_instance = {p.name: p.node for p in PODS} | {node: node for node in NODES}
    node_of_ip = {ip: node for node, ip in NODES.items()}
    found: dict[tuple[str, str], float] = {}
    for series in answer:
        labels = series["metric"]
        caller = node_of_instance.get(labels["goldpinger_instance"])
        callee = node_of_ip.get(labels["host_ip"])
        if caller in NODES and callee is not None and caller != callee:
            found[(caller, callee)] = 1000.0 * float(series["value"][1])
    return found


def test_the_matrix_is_prometheus_histogram_quantile_mapped_to_nodes(world: World) -> None:
    with watched_state(world) as state:
        # The quantile read as is (no confidence bound): PromQL's own numbers.
        source = source_for(world, state, [world.end_s], estimate="interpolate", confidence=0.0)
        matrix = source.refresh()
    expected = promql_quantiles(world, 0.5)
    assert len(expected) == 12  # every ordered pair of the four nodes
    for (a, b), value in expected.items():
        larger = max(value, expected[(b, a)])
        assert rtt_ms(matrix, a, b) == pytest.approx(larger, rel=1e-9), (a, b)
    # edge-2a's instance is a pod name, mapped through the pod's node; every node is at 0
    # from itself, though Goldpinger's self-calls take ~0.6 ms.
    assert rtt_ms(matrix, E2A, C1) > 25.0
    assert np.all(np.diag(matrix.rtt_ms) == 0.0)
    # The slow UI checks (call_type="check") are not pings: edge-1a-edge-1b stays under 5 ms.
    assert rtt_ms(matrix, E1A, E1B) < 5.0
    assert matrix.summary(world.end_s)["pairs_known"] == 6


def test_upper_bucket_bounds_p90_and_the_confidence_bound(world: World) -> None:
    with watched_state(world) as state:
        upper = source_for(world, state, [world.end_s], confidence=0.0).refresh()  # upper
        p90 = source_for(world, state, [world.end_s], quantile=0.9, confidence=0.0).refresh()
        shipped = source_for(world, state, [world.end_s]).refresh()  # median, 95 % bound
        status = source_for(world, state, [world.end_s]).status()["goldpinger"]
    # Goldpinger's buckets: 5, 10, 25, 50 ms...: 22 ms reads as "at most 25 ms".
    assert rtt_ms(upper, E1A, E1B) == pytest.approx(5.0)
    assert rtt_ms(upper, E1A, E2A) == pytest.approx(25.0)
    assert rtt_ms(upper, E1A, C1) == pytest.approx(50.0)
    # A link losing 30 % of its calls: fine at the median, at the timeout at p90.
    assert rtt_ms(upper, E2A, C1) == pytest.approx(50.0)
    assert rtt_ms(p90, E2A, C1) == pytest.approx(500.0)
    # The shipped reading: the median's 95 % upper bound from the window's ~20 calls (a
    # 15 s scrape of 30 s pings over 5 minutes; rates x 300 s). Steady links read as their
    # median's bucket; the lossy one cannot promise its median is under 50 ms.
    assert rtt_ms(shipped, E1A, E2A) == pytest.approx(25.0)
    assert rtt_ms(shipped, E1A, C1) == pytest.approx(50.0)
    assert rtt_ms(shipped, E2A, C1) == pytest.approx(500.0)
    assert (status["quantile"], status["confidence"]) == (0.5, 0.95)


def test_series_that_map_to_no_node_are_reported(world: World) -> None:
    with watched_state(world) as state:
        source = source_for(world, state, [world.end_s])
        source.refresh()
    status = source.status()["goldpinger"]
    # edge-9z's instance calls five pods, and four instances call its pod: 9 series.
    assert status["unmapped_series"] == 9
    assert any(GONE_NODE in example for example in status["unmapped_examples"])
    assert status["consecutive_failures"] == 0 and status["links_last_read"] == 12


def test_a_silent_goldpinger_lets_the_matrix_expire(world: World) -> None:
    clock_s = [world.end_s]
    with watched_state(world) as state:
        source = source_for(world, state, clock_s, max_age_s=120.0)
        source.refresh()
        chosen = build_profile({"plugins": {"filter": {"enabled": [{"name": "Delay"}]}}})

        def failed(now_s: float) -> dict[str, str]:
            pod = {"metadata": {"name": "p", "labels": {f"delay_{E1A}": "25"}}}
            result = assess(state.view(now_s), None, list(NODES), 0.5, chosen, now_s=now_s,
                            telemetry_ttl_s=None, pod=pod)  # fmt: skip
            return dict(result.failed)

        assert set(failed(world.end_s)) == {C1}
        # Ten minutes later the histograms have no calls in their window: nothing new is read,
        # the links measured before keep their age and expire after max_age_s.
        clock_s[0] = world.end_s + 600.0
        source.refresh()
        assert source.last_links == 0 and source.consecutive_failures == 0
        assert source.matrix is not None and source.matrix.summary(clock_s[0])["pairs_known"] == 0
        late = failed(clock_s[0])
        assert set(late) == {E1B, E2A, C1}  # edge-1a is at 0 from itself
        assert late[E2A] == f"delay_{E1A} <= 25 ms: RTT to {E1A} unknown (never measured)"


def test_an_unreachable_prometheus_is_counted_and_the_file_still_serves(
    world: World, tmp_path: Path
) -> None:
    rtt_file = tmp_path / "rtt.yaml"
    rtt_file.write_text(f"links:\n  - {{from: {E1A}, to: tower-7, rttMs: 4}}\n")
    state = ClusterState()
    source = RttSource(
        RttSourceSettings(rtt_file=rtt_file, timeout_s=2.0),
        state,
        prometheus_url=f"http://127.0.0.1:{free_port()}",
    )
    matrix = source.refresh()
    status = source.status()
    assert status["goldpinger"]["consecutive_failures"] == 1
    assert "cannot connect" in status["goldpinger"]["last_error"]
    assert rtt_ms(matrix, "tower-7", E1A) == 4.0
    assert state.view(time.time()).signal(RTT_SIGNAL) is matrix


def test_the_live_service_filters_by_goldpinger_rtts(world: World, tmp_path: Path) -> None:
    config_file = tmp_path / "profile.yaml"
    config_file.write_text(
        textwrap.dedent(
            """
            plugins:
              filter: {enabled: [{name: Delay}]}
            pluginConfig:
              - name: Delay
                args: {refreshIntervalS: 1}
            """
        )
    )
    config = ExtenderConfig(
        port=0,
        bundle_dir=DEFAULT_BUNDLE_DIR,
        prometheus_url=world.prometheus.url,
        kubeconfig=world.kubeconfig,
        config_file=config_file,
    ).validate()
    runtime = prepare(config)
    runtime.start_background()
    admin = world.admin_api()
    admin.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "camera-5d8f-x1"},
            "spec": {"nodeName": E2A, "containers": [{"name": "c", "image": "cam"}]},
        },
    )
    try:
        with (
            serve_app(create_app(runtime)) as url,
            httpx.Client(base_url=url, timeout=10) as client,
        ):

            def known_pairs() -> int:
                matrix = client.get("/status").json()["plugins"]["Delay"]["matrix"]
                return matrix["pairs_known"] if matrix else 0

            wait_until(lambda: known_pairs() == 6, "the RTT matrix from Goldpinger")

            def body(labels: dict[str, str]) -> dict:
                return {
                    "Pod": {"metadata": {"name": "app", "namespace": NAMESPACE, "labels": labels},
                            "spec": {"containers": [{"name": "c"}]}},
                    "Nodes": None,
                    "NodeNames": list(NODES),
                }  # fmt: skip

            answer = client.post("/filter", json=body({f"delay_{E1A}": "25"})).json()
            assert answer["NodeNames"] == [E1A, E1B, E2A]
            assert answer["FailedNodes"][C1].startswith(
                f"delay_{E1A} <= 25 ms: RTT to {E1A} is 50.0 ms (measured"
            )
            wait_until(
                lambda: (
                    E2A
                    in client.post("/filter", json=body({"delay_camera-": "5"})).json()["NodeNames"]
                ),
                "the camera pod seen by the watch",
            )
            near_camera = client.post("/filter", json=body({"delay_camera-": "5"})).json()
            assert near_camera["NodeNames"] == [E2A]
            rows = client.post("/explain", json=body({"delay_camera-": "30"})).json()["nodes"]
            by_node = {row["node"]: row["delay"]["delay_camera-"] for row in rows}
            assert by_node[E1A]["rtt_ms"] == 25.0 and by_node[E1A]["passes"]
            assert by_node[E1A]["to"] == E2A
            # The lossy link (30 % of its calls time out): at the shipped 95 % confidence its
            # median is not promised under 50 ms, and it reads as the timeout's bucket.
            assert by_node[C1]["rtt_ms"] == 500.0 and not by_node[C1]["passes"]
            metrics = client.get("/metrics").text
            assert 'power_aware_extender_delay_rtt_reads_total{outcome="ok"}' in metrics
            # A read made before the pod watch listed cannot map edge-2a's pod-named instance
            # (13 unmapped series); the next one, a refresh interval later, does.
            wait_until(
                lambda: (
                    "power_aware_extender_delay_unmapped_series 9.0" in client.get("/metrics").text
                ),
                "a read mapping pod-named instances through the watched pods",
            )
    finally:
        runtime.stop()
        admin.delete_namespaced_pod("camera-5d8f-x1", NAMESPACE)
